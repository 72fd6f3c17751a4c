// ScatterAddBlocks on device memory: every rank's top-k block added into one dense gradient,
// deterministic and without a host synchronization.
//
//  1. CheckAndSplit, one thread per (block, position): checks the index (< n, above the
//     previous one) and lowers the fault word with an atomic min (scatter_report.h), and
//     records where each block's entries cross into each segment of dense (starts[b][s]: the
//     first position whose index is in segment s or later; segments are 2^shift entries).
//  2. AddSegments, one warp per segment: if the fault word is clean, for block 0, 1, ... in
//     turn the lanes add that block's entries of the segment (distinct indices within a block,
//     so no two lanes touch one element), with __syncwarp between blocks. Each element
//     therefore receives its additions in block order, as ScatterAdd block by block on the
//     host does: bitwise the same result on every rank and on the CPU. With a fault, dense is
//     left unchanged and the first block thread records the faulting values for the report.
//  3. The report (16 bytes) is copied to pinned host memory on the stream; Fault() reads it
//     there later without waiting.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>

#include "kernels/cuda/device_block.h"
#include "kernels/cuda/launch.h"
#include "kernels/scatter_report.h"
#include "runtime/cuda_util.h"

namespace poseidon {
namespace cuda {
namespace {

constexpr int kThreads = 256;
// Entries of one block per segment, on average: a warp adds them in one pass.
constexpr uint64_t kEntriesPerBlock = 32;

// The first 16 bytes are what the host reads (scatter_report::Report); `recorded` is set once
// the faulting values are in, after which later calls change nothing (the fault is sticky and
// keeps describing the first bad block).
struct DeviceReport {
  unsigned long long word;
  uint32_t index;
  uint32_t previous;
  uint32_t recorded;
  uint32_t pad;
};
static_assert(offsetof(DeviceReport, recorded) == sizeof(scatter_report::Report), "report layout");

__device__ __forceinline__ uint32_t IndexAt(const uint32_t* blocks, uint64_t k, uint64_t b,
                                            uint64_t j) {
  return blocks[2 * k * b + j];
}

__global__ void __launch_bounds__(kThreads)
    CheckAndSplit(const uint32_t* __restrict__ blocks, int num_blocks, uint64_t k, uint64_t n,
                  int shift, uint32_t segments, uint32_t* __restrict__ starts,
                  DeviceReport* report) {
  if (*reinterpret_cast<volatile uint32_t*>(&report->recorded) != 0) return;  // sticky fault
  const uint64_t total = k * static_cast<uint64_t>(num_blocks);
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t e = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += stride) {
    const uint64_t b = e / k, j = e % k;
    const uint32_t i = IndexAt(blocks, k, b, j);
    const bool has_prev = j > 0;
    const uint32_t prev = has_prev ? IndexAt(blocks, k, b, j - 1) : 0;
    if (i >= n) {
      atomicMin(&report->word, scatter_report::Encode(scatter_report::kIndexOutOfRange, b, j));
      continue;
    }
    if (has_prev && i <= prev) {
      atomicMin(&report->word, scatter_report::Encode(scatter_report::kNotAscending, b, j));
      continue;
    }
    // Segments s in (seg(prev), seg(i)] start at j; past the last entry they start at k.
    uint32_t* row = starts + b * (static_cast<uint64_t>(segments) + 1);
    const int64_t first = has_prev ? static_cast<int64_t>(uint64_t{prev} >> shift) + 1 : 0;
    const int64_t last = static_cast<int64_t>(uint64_t{i} >> shift);
    for (int64_t s = first; s <= last; ++s) row[s] = static_cast<uint32_t>(j);
    if (j + 1 == k) {
      for (int64_t s = last + 1; s <= static_cast<int64_t>(segments); ++s) {
        row[s] = static_cast<uint32_t>(k);
      }
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    AddSegments(const uint32_t* __restrict__ blocks, int num_blocks, uint64_t k, uint32_t segments,
                const uint32_t* __restrict__ starts, float* dense, DeviceReport* report) {
  const unsigned long long word = *reinterpret_cast<volatile unsigned long long*>(&report->word);
  if (word != scatter_report::kClean) {
    // The values of a fault found by this call's check (an earlier call's are kept).
    if (blockIdx.x == 0 && threadIdx.x == 0 && report->recorded == 0) {
      const uint64_t b = scatter_report::BlockOf(word), j = scatter_report::PositionOf(word);
      if (b < static_cast<uint64_t>(num_blocks) && j < k) {
        report->index = IndexAt(blocks, k, b, j);
        report->previous = j > 0 ? IndexAt(blocks, k, b, j - 1) : 0;
      }
      report->recorded = 1;
    }
    return;
  }
  const unsigned lane = threadIdx.x & 31u;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * (blockDim.x / 32);
  const uint64_t row = static_cast<uint64_t>(segments) + 1;
  for (uint64_t s = (static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
       s < segments; s += warps) {
    for (int base = 0; base < num_blocks; base += 32) {
      // Lane l fetches the bounds of block base + l; the warp then walks the blocks in order.
      uint32_t lo = 0, hi = 0;
      if (base + static_cast<int>(lane) < num_blocks) {
        const uint32_t* r = starts + static_cast<uint64_t>(base + lane) * row;
        lo = r[s];
        hi = r[s + 1];
      }
      const int count = min(32, num_blocks - base);
      for (int q = 0; q < count; ++q) {
        const uint32_t b_lo = __shfl_sync(0xffffffffu, lo, q);
        const uint32_t b_hi = __shfl_sync(0xffffffffu, hi, q);
        const uint32_t* idx = blocks + 2 * k * static_cast<uint64_t>(base + q);
        for (uint32_t j = b_lo + lane; j < b_hi; j += 32) {
          dense[idx[j]] += __uint_as_float(idx[k + j]);
        }
        __syncwarp();
      }
    }
  }
}

class CudaScatterWorkspace final : public ScatterWorkspace {
 public:
  // The members free the memory (cudaFree waits for the device, so queued calls finish
  // first).

  Status Fault() const override {
    if (seen_) return scatter_report::ReportStatus(first_, first_n_);
    scatter_report::Report a;
    // No copy yet, one landing now (read again next call), or a clean report.
    if (!host_.Read(&a) || a.word == scatter_report::kClean) return Status::Ok();
    // Kept as first seen, with the n of that moment: later calls may pass another n.
    first_ = a;
    first_n_ = n_;
    seen_ = true;
    return scatter_report::ReportStatus(first_, first_n_);
  }

  // Room for `words` start entries on the current device; the report is made once.
  Status Reserve(uint64_t words, cudaStream_t stream) {
    int device = 0;
    PSD_CUDA_CHECK(cudaGetDevice(&device));
    if (report_.data() != nullptr && device != device_) {
      return InvalidArgument("ScatterAddBlocks: this workspace was made for device ", device_,
                             " but the current device is ", device,
                             "; expected one workspace per device");
    }
    if (report_.data() == nullptr) {
      PSD_CHECK(report_.Grow(sizeof(DeviceReport), "report"));
      device_ = device;
      // A clean device report: the word all ones, the rest zero (memsets, no host copy).
      DeviceReport* r = report();
      PSD_CUDA_CHECK(cudaMemsetAsync(r, 0xff, sizeof(unsigned long long), stream));
      PSD_CUDA_CHECK(cudaMemsetAsync(&r->index, 0, sizeof(DeviceReport) - 8, stream));
    }
    PSD_CHECK(host_.Make(scatter_report::Report{}, "report"));
    // Growth (first calls, a larger layer or world): cudaFree waits for the device.
    PSD_CHECK(starts_.Grow(words * sizeof(uint32_t), "segment starts"));
    return Status::Ok();
  }

  uint32_t* starts() const { return starts_.as<uint32_t>(); }
  DeviceReport* report() const { return report_.as<DeviceReport>(); }

  int device_ = -1;
  uint64_t n_ = 0;
  mutable bool seen_ = false;
  mutable scatter_report::Report first_;
  mutable uint64_t first_n_ = 0;
  // Declared in reverse order of destruction: the device blocks are freed first.
  PinnedMirror<scatter_report::Report> host_;  // the report's first 16 bytes, after every call
  DeviceBlock report_;                         // the DeviceReport, made once
  DeviceBlock starts_;                         // segment starts, grown as needed
};

unsigned GridFor(uint64_t threads) { return GridStrideBlocks(threads, kThreads); }

}  // namespace

std::unique_ptr<ScatterWorkspace> NewScatterWorkspace() {
  return std::make_unique<CudaScatterWorkspace>();
}
bool IsScatterWorkspace(const ScatterWorkspace* ws) {
  return dynamic_cast<const CudaScatterWorkspace*>(ws) != nullptr;
}

Status LaunchScatterAddBlocks(const void* blocks, int num_blocks, size_t k, float* dense, size_t n,
                              ScatterWorkspace* ws, cudaStream_t stream) {
  auto* w = static_cast<CudaScatterWorkspace*>(ws);
  PSD_CHECK(ClearStaleError("ScatterAddBlocks"));
  if (k == 0 || num_blocks == 0) return w->Fault();
  // Segments of 2^shift entries, about kEntriesPerBlock entries of each block per segment
  // (full warps; the segment starts grow linearly with the number of blocks).
  const uint64_t entries = static_cast<uint64_t>(k) * num_blocks;
  const uint64_t want = std::max<uint64_t>(1, k / kEntriesPerBlock);
  int shift = 0;
  while (((static_cast<uint64_t>(n) + (uint64_t{1} << shift) - 1) >> shift) > want) ++shift;
  const uint32_t segments =
      static_cast<uint32_t>((static_cast<uint64_t>(n) + (uint64_t{1} << shift) - 1) >> shift);
  PSD_CHECK(w->Reserve((static_cast<uint64_t>(segments) + 1) * num_blocks, stream));
  w->n_ = n;
  const auto* words = static_cast<const uint32_t*>(blocks);
  CheckAndSplit<<<GridFor(entries), kThreads, 0, stream>>>(words, num_blocks, k, n, shift, segments,
                                                           w->starts(), w->report());
  AddSegments<<<GridFor(static_cast<uint64_t>(segments) * 32), kThreads, 0, stream>>>(
      words, num_blocks, k, segments, w->starts(), dense, w->report());
  PSD_CUDA_CHECK(cudaGetLastError());
  PSD_CUDA_CHECK(w->host_.CopyFrom(w->report(), stream));
  return w->Fault();
}

}  // namespace cuda
}  // namespace poseidon
