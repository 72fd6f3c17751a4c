// Response cache: once the per-step schedule repeats, the engine skips its negotiation round.
//
// In negotiation mode every cycle costs one small allreduce before any data moves. When the
// engine has run the same schedule two steps in a row (the same fused groups of whole dense
// layers with the same descriptors, in the same order; decided from agreed rounds only, so
// every rank knows it at the same cycle), it switches to cached mode: each op of the schedule
// runs as soon as its layers are submitted locally, as ONE allreduce that carries the op's data
// and a trailer of control words (ready count, error / shutdown flags, and the descriptors'
// hash as (x, x^2) pairs of 8-bit pieces). From the summed trailer alone every rank decides the
// same thing:
//   - commit (every rank ready, every hash piece with zero variance, no flag): the data is
//     the sum, the layers complete;
//   - otherwise nobody unpacks (every rank keeps its input), and all return to negotiation
//     mode, whose next round sees the true state: a mismatch (kMismatch naming the ranks), a
//     stall, an error, a shutdown.
// A rank that cannot run the op as cached (a shutdown or an error here, a submission of a layer
// the schedule does not hold, a descriptor that differs, a user thread waiting on a group that
// is incomplete, or a group incomplete for longer than the patience) enters the same allreduce
// with ready = 0: a deviation costs one round and is detected within that step.
// Zero variance of sums: sum(x^2) * P == sum(x)^2 exactly when every rank's x is equal; with
// x < 256 and P <= 256 every sum is an integer below 2^24, exact in float32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/negotiation.h"

namespace poseidon::engine {

// One op of the cached schedule: whole dense layers fused into one allreduce.
struct CachedOp {
  std::vector<int> layers;
  std::vector<Descriptor> descs;  // as submitted, step ignored
  size_t elems = 0;
  bool operator==(const CachedOp& o) const;
};

// Learns the schedule from the ops the negotiated engine runs (the same on every rank).
class ScheduleRecorder {
 public:
  // One op the engine is about to run: its descriptors (one per layer) and whether it can be
  // cached (whole float32 dense layers in one fused allreduce).
  void Record(bool cacheable, const std::vector<Descriptor>& descs, size_t elems);
  // True when the last two complete steps ran the same cacheable schedule and the ops of the
  // current step so far are its prefix; then *schedule / *next_op say where to go on.
  bool Ready(std::vector<CachedOp>* schedule, size_t* next_op) const;
  void Reset();

 private:
  struct StepRecord {
    int64_t step = -1;
    bool cacheable = true;
    std::vector<CachedOp> ops;
  };
  StepRecord cur_, prev_, prev2_;
};

// The trailer of a cached op.
constexpr int kHashPieces = 6;  // 48 bits of the hash in 8-bit pieces
// One 64-byte line (the last float is padding): the trailer is the first piece of the
// shared-memory sum, so the data after it keeps the window's alignment (an 11-float trailer
// left every vector load of the sum straddling two cache lines).
constexpr int kTrailerFloats = 16;
static_assert(3 + 2 * kHashPieces <= kTrailerFloats, "the trailer holds the flags and the hash");
constexpr int kMaxCachedWorld = 256;

// Into *out (resized to kTrailerFloats; its capacity is reused, so a round allocates nothing).
void EncodeTrailer(bool ready, bool error, bool shutdown, uint64_t hash, std::vector<float>* out);

struct TrailerVerdict {
  bool all_ready = false;
  bool agree = false;  // every rank's hash equal
  bool error = false;
  bool shutdown = false;
  bool commit() const { return all_ready && agree && !error && !shutdown; }
};
TrailerVerdict DecodeTrailer(const float* sum, int world);

// The hash a rank contributes for op `index` given its queue heads (step included).
uint64_t CachedOpHash(size_t index, const std::vector<Descriptor>& heads);

}  // namespace poseidon::engine
