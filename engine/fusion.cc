// Fusion / chunking plan (see fusion.h for the steps).
#include "engine/fusion.h"

#include <algorithm>

namespace poseidon::engine {

std::vector<Op> PlanOps(const std::vector<WorkItem>& items, long long fusion_bytes,
                        long long chunk_bytes) {
  std::vector<Op> ops;
  Op group{OpKind::kFused, {}};
  size_t group_bytes = 0;
  auto close_group = [&] {
    if (group.items.empty()) return;
    if (group.items.size() == 1) group.kind = OpKind::kDirect;
    ops.push_back(group);
    group = Op{OpKind::kFused, {}};
    group_bytes = 0;
  };
  for (size_t i = 0; i < items.size(); ++i) {
    const WorkItem& it = items[i];
    const bool fuse = it.fusible && fusion_bytes > 0 &&
                      it.bytes <= static_cast<size_t>(fusion_bytes);
    if (fuse) {
      if (group_bytes + it.bytes > static_cast<size_t>(fusion_bytes)) close_group();
      group.items.push_back(i);
      group_bytes += it.bytes;
      continue;
    }
    close_group();
    if (it.fusible && chunk_bytes > 0 && it.bytes > static_cast<size_t>(chunk_bytes)) {
      ops.push_back(Op{OpKind::kChunked, {i}});
    } else if (it.fusible) {
      ops.push_back(Op{OpKind::kDirect, {i}});
    } else {
      ops.push_back(Op{OpKind::kStrategy, {i}});
    }
  }
  close_group();
  return ops;
}

std::vector<size_t> PlanSlices(const std::vector<SliceItem>& items, long long slice_bytes) {
  std::vector<size_t> take(items.size(), 0);
  if (slice_bytes <= 0) {
    for (size_t i = 0; i < items.size(); ++i) take[i] = items[i].remaining_bytes;
    return take;
  }
  size_t left = static_cast<size_t>(slice_bytes);
  for (size_t i = 0; i < items.size(); ++i) {
    const SliceItem& it = items[i];
    const bool first = i == 0;
    if (!it.sliceable) {
      // Whole or not at all; the first layer always runs so that every cycle makes progress.
      if (first || it.remaining_bytes <= left) {
        take[i] = it.remaining_bytes;
        left -= std::min(left, it.remaining_bytes);
      }
      continue;
    }
    if (it.remaining_bytes <= left) {
      take[i] = it.remaining_bytes;
      left -= it.remaining_bytes;
      continue;
    }
    const size_t elem = std::max<size_t>(1, it.elem_bytes);
    size_t bytes = left / elem * elem;
    if (bytes == 0 && first) bytes = std::min(it.remaining_bytes, elem);
    take[i] = bytes;
    left = 0;
  }
  return take;
}

std::vector<std::pair<size_t, size_t>> ChunkRanges(size_t count, size_t chunk_elems) {
  std::vector<std::pair<size_t, size_t>> out;
  if (count == 0 || chunk_elems == 0) {
    out.emplace_back(0, count);
    return out;
  }
  for (size_t b = 0; b < count; b += chunk_elems) out.emplace_back(b, std::min(count, b + chunk_elems));
  return out;
}

}  // namespace poseidon::engine
