// Pure shard arithmetic: how n elements split over P ranks. The first n % P ranks get one
// element more, so any n and any P work (shards may be empty when n < P).
#pragma once

#include <cstddef>
#include <vector>

namespace poseidon {

inline size_t ShardCount(size_t n, int world, int rank) {
  size_t base = n / static_cast<size_t>(world);
  size_t extra = n % static_cast<size_t>(world);
  return base + (static_cast<size_t>(rank) < extra ? 1 : 0);
}

inline size_t ShardOffset(size_t n, int world, int rank) {
  size_t base = n / static_cast<size_t>(world);
  size_t extra = n % static_cast<size_t>(world);
  size_t r = static_cast<size_t>(rank);
  return r * base + (r < extra ? r : extra);
}

inline std::vector<size_t> ShardCounts(size_t n, int world) {
  std::vector<size_t> c(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) c[static_cast<size_t>(r)] = ShardCount(n, world, r);
  return c;
}

// counts' prefix sums, counts.size() + 1 of them, into *off (reusing its storage: no
// allocation once it has the capacity).
inline void PrefixOffsets(const std::vector<size_t>& counts, std::vector<size_t>* off) {
  off->resize(counts.size() + 1);
  (*off)[0] = 0;
  for (size_t i = 0; i < counts.size(); ++i) (*off)[i + 1] = (*off)[i] + counts[i];
}
inline std::vector<size_t> PrefixOffsets(const std::vector<size_t>& counts) {
  std::vector<size_t> off;
  PrefixOffsets(counts, &off);
  return off;
}

}  // namespace poseidon
