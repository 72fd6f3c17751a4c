// Fusion and chunking plan for one cycle: which of the layers ready everywhere are packed into
// one fusion buffer, which are cut into pipelined chunks, and which run alone.
//
// Steps (pure arithmetic, identical on every rank because its inputs were agreed):
//   1. Walk the ready layers in the order given (lowest layer index first: the next forward
//      pass needs them first).
//   2. A fusible layer (float32 dense allreduce without factors; an optimizer is applied after
//      the sum by the collective) of at most fusion_bytes joins the open fusion group; the group
//      is closed when the next layer would push it past fusion_bytes, and before any layer that
//      is not fused (so order is kept: nothing is delayed behind a later layer).
//   3. A fusible layer larger than chunk_bytes becomes a chunked op (ChunkRanges).
//   4. Everything else runs alone through the hybrid collective's planned strategy.
// A group holding a single layer is run as a plain op on the layer's own buffer (no copy).
//
// Slicing (PlanSlices, before PlanOps): one cycle runs at most slice_bytes, so a layer that
// arrives while a large one is under way (conv1: last in the backward pass, first in the
// next forward) waits for one slice, not for the whole large layer:
//   1. Walk the ready layers lowest index first; the first always runs (progress).
//   2. A sliceable layer (fusible) runs min(remaining, budget left) bytes, rounded down to
//      whole elements; its remainder stays queued for the next cycle.
//   3. A layer that cannot be cut (strategy) runs whole if it fits in what is left of the
//      budget, else waits for the next cycle (where lower layers still come first).
//   4. Once the budget is spent, the remaining layers wait for the next cycle.
// Its inputs (agreed ready layers, agreed sizes, progress that every rank made alike) are the
// same on every rank, so every rank cuts the same slices.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace poseidon::engine {

struct WorkItem {
  int layer = 0;
  size_t bytes = 0;
  bool fusible = false;  // float32 dense allreduce without factors (optimizer or not)
};

enum class OpKind {
  kFused,    // pack items into the fusion buffer, one allreduce, unpack
  kChunked,  // one item cut into chunks, allreduce of chunk i+1 overlaps post-processing of i
  kDirect,   // one fusible item in one allreduce on its own buffer
  kStrategy  // one item through HybridCollective::Exchange (its planned strategy)
};

struct Op {
  OpKind kind = OpKind::kStrategy;
  std::vector<size_t> items;  // indices into the WorkItem list
};

struct SliceItem {
  size_t remaining_bytes = 0;  // bytes of the layer not yet exchanged
  size_t elem_bytes = 4;       // a slice never cuts an element
  bool sliceable = false;      // fusible layers only; the others run whole
};

// Bytes of each item to run this cycle (0: not this cycle; remaining_bytes: to the end).
// slice_bytes <= 0 runs everything whole.
std::vector<size_t> PlanSlices(const std::vector<SliceItem>& items, long long slice_bytes);

// fusion_bytes <= 0 disables fusion; chunk_bytes <= 0 disables chunking.
std::vector<Op> PlanOps(const std::vector<WorkItem>& items, long long fusion_bytes,
                        long long chunk_bytes);

// [begin, end) element ranges of at most chunk_elems each covering [0, count); one empty range
// for count == 0.
std::vector<std::pair<size_t, size_t>> ChunkRanges(size_t count, size_t chunk_elems);

}  // namespace poseidon::engine
