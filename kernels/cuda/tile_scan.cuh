// Block-level building blocks of the CUDA top-k passes (topk.cu): shared histograms, tiles
// claimed in order, a decoupled look-back over the tiles, the last-block hand-off and the digit
// pick over a histogram. Device code only; include from .cu files.
//
// A tile is kThreads x kItems entries, striped: item j of thread t is entry
// tile * kTile + j * kThreads + t, so each warp reads 128 contiguous bytes per row and the
// warp rows (j, warp) are in index order.
#pragma once

#include <cstdint>
#include <cub/block/block_scan.cuh>
#include <cuda/atomic>

#include "kernels/topk_plan.h"

namespace poseidon {
namespace cuda {
namespace tile_scan {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kItems = 16;
constexpr uint32_t kTile = kThreads * kItems;
constexpr int kRows = kItems * kWarps;  // warp rows per tile, in index order

// Counts one key in a shared histogram; the whole warp calls it (convergent), lanes with
// `count` false add nothing. Lanes with equal bins are grouped (__match_any_sync, sm_70+) and
// one of them adds the group's count: gradient keys crowd into a few bins.
__device__ __forceinline__ void AddToBin(uint32_t* local, uint32_t bin, bool count) {
  constexpr uint32_t kNone = 0xffffffffu;  // never a bin
  const uint32_t b = count ? bin : kNone;
  const unsigned peers = __match_any_sync(0xffffffffu, b);
  if (b != kNone && (threadIdx.x & 31u) == static_cast<unsigned>(__ffs(peers) - 1)) {
    atomicAdd(&local[b], static_cast<uint32_t>(__popc(peers)));
  }
}

// Whole block: true in the block that finished last (its reads then see every block's writes).
__device__ inline bool LastBlock(uint32_t* done) {
  __shared__ bool s_last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) s_last = atomicAdd(done, 1u) == gridDim.x - 1;
  __syncthreads();
  if (s_last) __threadfence();
  return s_last;
}

// Whole block: the next tile of this pass, in claim order.
__device__ inline uint32_t ClaimTile(uint32_t* counter) {
  __shared__ uint32_t s_tile;
  __syncthreads();  // the previous tile's readers are done with s_tile
  if (threadIdx.x == 0) s_tile = atomicAdd(counter, 1u);
  __syncthreads();
  return s_tile;
}

// Whole block: topk_plan::PickDigit over a shared histogram, split over the threads (each sums a
// group of bins from the top; a block scan gives the count above each group).
template <int kBins>
__device__ topk_plan::DigitPick BlockPickDigit(const uint32_t* s_hist, unsigned long long rank) {
  constexpr int kPer = kBins / kThreads;
  static_assert(kPer * kThreads == kBins, "bins per thread");
  using Scan = cub::BlockScan<unsigned long long, kThreads>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ topk_plan::DigitPick s_pick;
  const int top = kBins - static_cast<int>(threadIdx.x) * kPer;  // exclusive
  unsigned long long sum = 0;
  for (int q = 0; q < kPer; ++q) sum += s_hist[top - 1 - q];
  unsigned long long above = 0, total = 0;
  Scan(tmp).ExclusiveSum(sum, above, total);
  if (threadIdx.x == 0) s_pick = topk_plan::DigitPick{0, total, false};
  __syncthreads();
  if (above < rank && above + sum >= rank) {
    unsigned long long a = above;
    for (int q = 0; q < kPer; ++q) {
      const unsigned long long c = s_hist[top - 1 - q];
      if (a + c >= rank) {
        s_pick = topk_plan::DigitPick{static_cast<uint32_t>(top - 1 - q), a, true};
        break;
      }
      a += c;
    }
  }
  __syncthreads();
  topk_plan::DigitPick p = s_pick;
  __syncthreads();
  return p;
}

// Thread 0 of a tile: publishes the tile's kC counts and returns the counts of all tiles
// before it (decoupled look-back). Words are (epoch << 32) | count; a word from another call
// has another epoch and reads as "not yet". Tile 0 publishes its inclusive counts at once, so
// the walk back always ends. Counts stay below 2^32 (n <= 2^32 - 1).
template <int kC>
__device__ void LookBack(unsigned long long* agg, unsigned long long* inc, uint32_t tile,
                         uint32_t epoch, const uint32_t (&mine)[kC], uint32_t (&before)[kC]) {
  using Ref = ::cuda::atomic_ref<unsigned long long, ::cuda::thread_scope_device>;
  const unsigned long long tag = static_cast<unsigned long long>(epoch) << 32;
  for (int c = 0; c < kC; ++c) before[c] = 0;
  if (tile != 0) {
    for (int c = 0; c < kC; ++c) {
      Ref(agg[tile * kC + c]).store(tag | mine[c], ::cuda::std::memory_order_relaxed);
    }
    int64_t p = static_cast<int64_t>(tile) - 1;
    for (;;) {
      unsigned long long w[kC];
      bool ready = true;
      for (int c = 0; c < kC; ++c) {
        w[c] = Ref(inc[p * kC + c]).load(::cuda::std::memory_order_relaxed);
        ready = ready && (w[c] >> 32) == epoch;
      }
      if (ready) {
        for (int c = 0; c < kC; ++c) before[c] += static_cast<uint32_t>(w[c]);
        break;
      }
      ready = true;
      for (int c = 0; c < kC; ++c) {
        w[c] = Ref(agg[p * kC + c]).load(::cuda::std::memory_order_relaxed);
        ready = ready && (w[c] >> 32) == epoch;
      }
      if (ready) {
        for (int c = 0; c < kC; ++c) before[c] += static_cast<uint32_t>(w[c]);
        --p;  // tile 0 never publishes an aggregate, so p stays >= 0
      } else {
        __nanosleep(32);
      }
    }
  }
  for (int c = 0; c < kC; ++c) {
    Ref(inc[tile * kC + c]).store(tag | (before[c] + mine[c]), ::cuda::std::memory_order_relaxed);
  }
}

// Warp 0: exclusive prefix, in place, of the kRows counts of each of kC counters (row order is
// index order); returns the tile totals in every lane.
template <int kC>
__device__ void ScanRows(uint32_t (*s_cnt)[kRows], uint32_t (&total)[kC]) {
  constexpr int kPerLane = kRows / 32;
  const unsigned lane = threadIdx.x & 31u;
  for (int c = 0; c < kC; ++c) {
    uint32_t v[kPerLane], sum = 0;
    for (int q = 0; q < kPerLane; ++q) {
      v[q] = s_cnt[c][lane * kPerLane + q];
      sum += v[q];
    }
    uint32_t incl = sum;
    for (int d = 1; d < 32; d <<= 1) {
      const uint32_t up = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= static_cast<unsigned>(d)) incl += up;
    }
    uint32_t run = incl - sum;
    for (int q = 0; q < kPerLane; ++q) {
      s_cnt[c][lane * kPerLane + q] = run;
      run += v[q];
    }
    total[c] = __shfl_sync(0xffffffffu, incl, 31);
  }
}

}  // namespace tile_scan
}  // namespace cuda
}  // namespace poseidon
