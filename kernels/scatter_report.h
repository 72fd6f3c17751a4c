// How ScatterAddBlocks reports a block that breaks its contract (an index >= n, or indices not
// strictly ascending), the same way on both implementations. The CUDA kernels find the fault
// on the device and the host reads it later without waiting for the stream, so the report is
// one 64-bit word that every checking thread lowers with an atomic min (the first fault by
// kind, block and position wins, whatever the thread order), plus the offending index values
// written by the thread that owns that position. The CPU kernel builds the same word.
#pragma once

#include <cstdint>

#include "runtime/status.h"

#if defined(__CUDACC__)
#define PSD_SCATTER_HD __host__ __device__
#else
#define PSD_SCATTER_HD
#endif

namespace poseidon {
namespace scatter_report {

enum Fault : uint32_t {
  kIndexOutOfRange = 1,  // idx[j] >= n
  kNotAscending = 2,     // idx[j] <= idx[j - 1]
};

inline constexpr uint64_t kClean = ~uint64_t{0};
inline constexpr uint64_t kMaxBlocks = uint64_t{1} << 28;

// [fault: 4 bits][block: 28 bits][position: 32 bits]; smaller words are earlier faults.
PSD_SCATTER_HD inline uint64_t Encode(uint32_t fault, uint64_t block, uint64_t position) {
  return (static_cast<uint64_t>(fault) << 60) | ((block & (kMaxBlocks - 1)) << 32) |
         (position & 0xffffffffu);
}
PSD_SCATTER_HD inline uint32_t FaultOf(uint64_t word) { return static_cast<uint32_t>(word >> 60); }
PSD_SCATTER_HD inline uint64_t BlockOf(uint64_t word) { return (word >> 32) & (kMaxBlocks - 1); }
PSD_SCATTER_HD inline uint64_t PositionOf(uint64_t word) { return word & 0xffffffffu; }

// What the host reads back: the word and the indices at the faulting position (idx[j], and
// idx[j - 1] for kNotAscending).
struct Report {
  uint64_t word = kClean;
  uint32_t index = 0;
  uint32_t previous = 0;
};

// kInvalidArgument naming the block, the position and the values; Ok for a clean report.
inline Status ReportStatus(const Report& r, uint64_t n) {
  if (r.word == kClean) return Status::Ok();
  const uint64_t block = BlockOf(r.word), j = PositionOf(r.word);
  switch (FaultOf(r.word)) {
    case kIndexOutOfRange:
      return InvalidArgument("ScatterAddBlocks: block ", block, " idx[", j, "] is ", r.index,
                             " but n is ", n,
                             "; expected every index < n (dense was left unchanged)");
    case kNotAscending:
      return InvalidArgument("ScatterAddBlocks: block ", block, " idx[", j, "] is ", r.index,
                             " after idx[", j - 1, "] = ", r.previous,
                             "; expected strictly ascending indices in each block (dense was "
                             "left unchanged)");
    default:
      return InternalError("ScatterAddBlocks: unknown fault word ", r.word);
  }
}

}  // namespace scatter_report
}  // namespace poseidon
