// FusedResidualTopK on device memory: residual accumulation (optional DGC momentum) fused with
// exact top-k selection by magnitude. Four launches, no host synchronization, no single-thread
// kernels; in steady state one streaming pass over n (the floor: read grad, read and write the
// residual, and the momentum when there is one) plus passes over a small candidate buffer.
// The decisions are in kernels/topk_plan.h (shared with the CPU tests); the keys are the
// magnitude's float bits with every NaN just above +infinity.
//
//  1. FusedPass over n, in tiles of 4096 entries claimed in order (a tile counter): update
//     momentum and residual, count key bits 30..20 in a 2048-bin histogram (per block in
//     shared memory, merged with global atomics), and compact the entries whose key reaches the
//     guess into (index, value) candidates in index order. The order comes from a single-pass
//     scan: counts per warp row in shared memory, then a decoupled look-back over the tiles
//     (each tile publishes its count, then its inclusive prefix, tagged with the call's epoch,
//     so no status array is ever cleared). The last block to finish (a done counter) picks the
//     first digit of the k-th key T, chooses the candidate path or the full path
//     (topk_plan::CandidatesSuffice) and sets the next call's guess (topk_plan::GuessAim,
//     NextGuess: corrected for the drift between the last prediction and this count).
//  2. Refine over the chosen input (the candidates, or the whole residual): histogram of key
//     bits 19..10 among the keys matching the prefix; its last block picks the digit.
//  3. The same for bits 9..0: the prefix is now T, and k_rem how many ties with T belong to
//     the top k.
//  4. Emit over the chosen input, tiles in order again with a two-count look-back (entries
//     above T, ties with T): each selected entry's slot is topk_plan::OutputSlot, so the output
//     is in ascending index order and the smaller index wins a tie; it is written and zeroed in
//     the residual and the momentum. The last block checks that exactly k were written and
//     advances the epoch.
// A 32-byte outcome (consistency errors, which path ran, the candidate count) is copied to
// pinned host memory at the end; the next call reads it without waiting and refuses to go on
// after an inconsistency (a bug, reported, never a silently wrong selection).
//
// The workspace grows on demand (cudaMalloc, cudaFree of the old block, which waits for the
// device): only on the first call and when n or k grows, never in steady state, so a warmed-up
// call can be captured in a CUDA graph.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_block.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/tile_scan.cuh"
#include "kernels/topk_plan.h"

namespace poseidon {
namespace cuda {
namespace {

namespace plan = ::poseidon::topk_plan;

using namespace tile_scan;  // NOLINT: the tile building blocks and their sizes

enum Mode : uint32_t { kModeCandidates = 1, kModeFull = 2 };
enum Pass : int { kFused = 0, kRefine2 = 1, kRefine3 = 2, kEmit = 3, kPasses = 4 };
enum Fault : uint32_t { kFaultCounts = 1, kFaultSlot = 2, kFaultEmitted = 3 };

// Copied to pinned host memory after every call.
struct Outcome {
  uint32_t fault;                 // a Fault, 0 when consistent (sticky)
  uint32_t mode;                  // the path of the last call (Mode)
  unsigned long long candidates;  // entries at or above the guess in the last call
  unsigned long long emitted;     // entries written by the last call
  unsigned long long calls;       // finished calls
};

struct TopKState {
  uint32_t epoch;  // tags this call's look-back words; >= 1, advanced at the end of each call
  uint32_t guess;  // candidates have key >= guess; the next call's guess once pass 1 is done
  uint32_t mode;
  uint32_t prefix;           // the bits of T fixed so far, then T
  unsigned long long k_rem;  // how many of the top k lie in the prefix's range
  unsigned long long cand_count;
  unsigned long long predicted;  // the count the guess had in the histogram it came from
  uint32_t tiles[kPasses];       // tile counters
  uint32_t done[kPasses];        // finished blocks
  Outcome outcome;
};

struct Work {
  TopKState* state;
  uint32_t* hist1;  // plan::kBins1
  uint32_t* hist2;  // plan::kBins2, one per refine pass
  uint32_t* hist3;
  uint32_t* cand_idx;
  float* cand_val;
  unsigned long long* fused_agg;  // one word per tile
  unsigned long long* fused_inc;
  unsigned long long* emit_agg;  // two words per tile
  unsigned long long* emit_inc;
  unsigned long long cap;  // candidate slots this call may use
};

__device__ __forceinline__ uint32_t KeyOf(float x) { return plan::KeyOfBits(__float_as_uint(x)); }

template <bool kMom>
__global__ void __launch_bounds__(kThreads)
    FusedPass(const float* __restrict__ grad, float* __restrict__ residual, float* __restrict__ mom,
              float momentum, unsigned long long n, unsigned long long k, Work w) {
  __shared__ uint32_t s_hist[plan::kBins1];
  __shared__ uint32_t s_cnt[1][kRows];
  __shared__ uint32_t s_before;
  TopKState* st = w.state;
  for (int i = threadIdx.x; i < plan::kBins1; i += kThreads) s_hist[i] = 0;
  const uint32_t epoch = st->epoch;
  const uint32_t guess = st->guess;
  const uint32_t num_tiles = static_cast<uint32_t>((n + kTile - 1) / kTile);
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x / 32;
  const unsigned lanes_below = (1u << lane) - 1u;
  __syncthreads();
  for (;;) {
    const uint32_t tile = ClaimTile(&st->tiles[kFused]);
    if (tile >= num_tiles) break;
    const unsigned long long base = static_cast<unsigned long long>(tile) * kTile + threadIdx.x;
    // Loads first, all of them in flight at once; striped, so every warp reads 128 contiguous
    // bytes per row.
    float g[kItems], r[kItems], m[kItems];
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const unsigned long long i = base + static_cast<unsigned long long>(j) * kThreads;
      if (i < n) {
        g[j] = grad[i];
        r[j] = residual[i];
        if (kMom) m[j] = mom[i];
      }
    }
    unsigned ballot[kItems];
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const unsigned long long i = base + static_cast<unsigned long long>(j) * kThreads;
      bool cand = false;
      uint32_t bin = 0;
      if (i < n) {
        // The CPU kernel's expressions; --fmad=false keeps them bit-identical.
        float u = g[j];
        if (kMom) {
          u = momentum * m[j] + u;
          mom[i] = u;
        }
        const float v = r[j] + u;
        residual[i] = v;
        r[j] = v;
        const uint32_t key = KeyOf(v);
        bin = key >> plan::kShift1;
        cand = key >= guess;
      }
      AddToBin(s_hist, bin, i < n);
      ballot[j] = __ballot_sync(0xffffffffu, cand);
      if (lane == 0) s_cnt[0][j * kWarps + warp] = __popc(ballot[j]);
    }
    __syncthreads();
    if (warp == 0) {
      uint32_t total[1];
      ScanRows<1>(s_cnt, total);
      if (lane == 0) {
        uint32_t before[1];
        LookBack<1>(w.fused_agg, w.fused_inc, tile, epoch, total, before);
        s_before = before[0];
        if (tile + 1 == num_tiles)
          st->cand_count = static_cast<unsigned long long>(before[0]) + total[0];
      }
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      if ((ballot[j] >> lane) & 1u) {
        const unsigned long long slot = static_cast<unsigned long long>(s_before) +
                                        s_cnt[0][j * kWarps + warp] +
                                        __popc(ballot[j] & lanes_below);
        if (slot < w.cap) {
          w.cand_idx[slot] =
              static_cast<uint32_t>(base + static_cast<unsigned long long>(j) * kThreads);
          w.cand_val[slot] = r[j];
        }
      }
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < plan::kBins1; i += kThreads) {
    if (s_hist[i] != 0) atomicAdd(&w.hist1[i], s_hist[i]);
  }
  if (!LastBlock(&st->done[kFused])) return;

  // The plan, in the last block: s_hist takes the merged histogram (and the global one is
  // cleared for the next call).
  for (int i = threadIdx.x; i < plan::kBins1; i += kThreads) {
    s_hist[i] = __ldcg(&w.hist1[i]);
    w.hist1[i] = 0;
  }
  __syncthreads();
  const unsigned long long count = __ldcg(&st->cand_count);
  const plan::DigitPick first = BlockPickDigit<plan::kBins1>(s_hist, k);
  const plan::DigitPick next =
      BlockPickDigit<plan::kBins1>(s_hist, plan::GuessAim(k, st->predicted, count));
  if (threadIdx.x == 0) {
    const bool candidates = plan::CandidatesSuffice(count, k, w.cap);
    st->mode = candidates ? kModeCandidates : kModeFull;
    st->prefix = first.digit << plan::kShift1;
    st->k_rem = k - first.above;
    if (!first.found) st->outcome.fault = kFaultCounts;
    st->guess = plan::NextGuessFromPick(next);
    st->predicted = plan::PredictedCount(next, s_hist);
    st->outcome.mode = st->mode;
    st->outcome.candidates = count;
    st->tiles[kFused] = 0;
    st->done[kFused] = 0;
  }
}

// Passes 2 and 3: the digit at `shift` (10 or 0) among the keys that match the prefix above it.
template <int kShift>
__global__ void __launch_bounds__(kThreads)
    Refine(const float* __restrict__ residual, unsigned long long n, Work w, uint32_t* hist,
           int pass) {
  __shared__ uint32_t s_hist[plan::kBins2];
  TopKState* st = w.state;
  for (int i = threadIdx.x; i < plan::kBins2; i += kThreads) s_hist[i] = 0;
  __syncthreads();
  const bool candidates = st->mode == kModeCandidates;
  const unsigned long long m = candidates ? st->cand_count : n;
  const float* src = candidates ? w.cand_val : residual;
  constexpr int kHigh = kShift + plan::kBits2;
  const uint32_t want = st->prefix >> kHigh;
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * kThreads;
  // The loop bound is the warp's first index, so every lane runs every iteration (AddToBin is
  // convergent); lanes past m count nothing.
  const unsigned lane = threadIdx.x & 31u;
  for (unsigned long long i = static_cast<unsigned long long>(blockIdx.x) * kThreads + threadIdx.x;
       i - lane < m; i += stride) {
    const bool in = i < m;
    const uint32_t key = in ? KeyOf(src[i]) : 0;
    AddToBin(s_hist, (key >> kShift) & (plan::kBins2 - 1), in && (key >> kHigh) == want);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < plan::kBins2; i += kThreads) {
    if (s_hist[i] != 0) atomicAdd(&hist[i], s_hist[i]);
  }
  if (!LastBlock(&st->done[pass])) return;
  for (int i = threadIdx.x; i < plan::kBins2; i += kThreads) {
    s_hist[i] = __ldcg(&hist[i]);
    hist[i] = 0;
  }
  __syncthreads();
  const plan::DigitPick pick = BlockPickDigit<plan::kBins2>(s_hist, st->k_rem);
  if (threadIdx.x == 0) {
    if (!pick.found) st->outcome.fault = kFaultCounts;
    st->prefix |= pick.digit << kShift;
    st->k_rem -= pick.above;
    st->done[pass] = 0;
  }
}

template <bool kMom>
__global__ void __launch_bounds__(kThreads)
    Emit(float* __restrict__ residual, float* __restrict__ mom, unsigned long long n,
         unsigned long long k, uint32_t* __restrict__ out_idx, float* __restrict__ out_val,
         Work w) {
  __shared__ uint32_t s_cnt[2][kRows];
  __shared__ uint32_t s_before[2];
  TopKState* st = w.state;
  const uint32_t epoch = st->epoch;
  const bool candidates = st->mode == kModeCandidates;
  const unsigned long long m = candidates ? st->cand_count : n;
  const uint32_t t_key = st->prefix;
  const unsigned long long k_rem = st->k_rem;
  const uint32_t num_tiles = static_cast<uint32_t>((m + kTile - 1) / kTile);
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x / 32;
  const unsigned lanes_below = (1u << lane) - 1u;
  for (;;) {
    const uint32_t tile = ClaimTile(&st->tiles[kEmit]);
    if (tile >= num_tiles) break;
    const unsigned long long base = static_cast<unsigned long long>(tile) * kTile + threadIdx.x;
    uint32_t idx[kItems];
    float val[kItems];
    unsigned above[kItems], ties[kItems];
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const unsigned long long p = base + static_cast<unsigned long long>(j) * kThreads;
      bool a = false, t = false;
      if (p < m) {
        idx[j] = candidates ? w.cand_idx[p] : static_cast<uint32_t>(p);
        val[j] = candidates ? w.cand_val[p] : residual[p];
        const uint32_t key = KeyOf(val[j]);
        a = key > t_key;
        t = key == t_key;
      }
      above[j] = __ballot_sync(0xffffffffu, a);
      ties[j] = __ballot_sync(0xffffffffu, t);
      if (lane == 0) {
        s_cnt[0][j * kWarps + warp] = __popc(above[j]);
        s_cnt[1][j * kWarps + warp] = __popc(ties[j]);
      }
    }
    __syncthreads();
    if (warp == 0) {
      uint32_t total[2];
      ScanRows<2>(s_cnt, total);
      if (lane == 0) {
        uint32_t before[2];
        LookBack<2>(w.emit_agg, w.emit_inc, tile, epoch, total, before);
        s_before[0] = before[0];
        s_before[1] = before[1];
        if (tile + 1 == num_tiles) {
          st->outcome.emitted =
              plan::OutputSlot(static_cast<unsigned long long>(before[0]) + total[0],
                               static_cast<unsigned long long>(before[1]) + total[1], k_rem);
        }
      }
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const bool a = (above[j] >> lane) & 1u, t = (ties[j] >> lane) & 1u;
      if (!a && !t) continue;
      const int row = j * kWarps + warp;
      const unsigned long long a_before = static_cast<unsigned long long>(s_before[0]) +
                                          s_cnt[0][row] + __popc(above[j] & lanes_below);
      const unsigned long long t_before = static_cast<unsigned long long>(s_before[1]) +
                                          s_cnt[1][row] + __popc(ties[j] & lanes_below);
      if (t && t_before >= k_rem) continue;  // a tie beyond the top k
      const unsigned long long slot = plan::OutputSlot(a_before, t_before, k_rem);
      if (slot >= k) {
        st->outcome.fault = kFaultSlot;
        continue;
      }
      out_idx[slot] = idx[j];
      out_val[slot] = val[j];
      residual[idx[j]] = 0.0f;
      if (kMom) mom[idx[j]] = 0.0f;
    }
  }
  if (!LastBlock(&st->done[kEmit])) return;
  if (threadIdx.x == 0) {
    if (__ldcg(&st->outcome.emitted) != k) st->outcome.fault = kFaultEmitted;
    st->outcome.calls += 1;
    st->epoch = epoch + 1 == 0 ? 1 : epoch + 1;
    st->tiles[kEmit] = 0;
    st->done[kEmit] = 0;
  }
}

// Only when the workspace is (re)made: everything zero but the epoch and the guess.
__global__ void InitState(TopKState* st) {
  if (threadIdx.x == 0) {
    st->epoch = 1;
    st->guess = plan::kGuessNone;
  }
}

class TopKWorkspace final : public KernelWorkspace {
 public:
  // The members free the memory (cudaFree waits for the device, so queued calls finish
  // first).

  // The outcome of the calls whose copy has landed (the last one once the stream has passed);
  // all zero before the first copy or while one is landing.
  Outcome Read() const {
    Outcome o{};
    (void)host_.Read(&o);
    return o;
  }

  Status EarlierFault() const {
    if (!broken_.empty()) return BackendError(broken_);
    const Outcome o = Read();
    if (o.fault == 0) return Status::Ok();
    return InternalError(
        "FusedResidualTopK: an earlier call on this workspace found inconsistent "
        "counts on the device (fault ",
        o.fault, " after ", o.calls,
        " calls), so its selection may not be exact; the workspace refuses "
        "further calls. Please report this with n and k.");
  }

  // Makes room for (n, k) on the current device (first call, growth, another device).
  Status Reserve(size_t n, size_t k, cudaStream_t stream) {
    int device = 0;
    PSD_CUDA_CHECK(cudaGetDevice(&device));
    const uint64_t cap = plan::CandidateCapacity(n, k);
    if (block_.data() != nullptr && device == device_ && n <= cap_n_ && cap <= cap_slots_) {
      return Status::Ok();
    }
    if (device != device_) {
      PSD_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device));
      int per_sm = 0;
      PSD_CUDA_CHECK(
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, FusedPass<true>, kThreads, 0));
      fused_blocks_ = std::max(1, per_sm) * sm_count_;
      PSD_CUDA_CHECK(
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, Emit<true>, kThreads, 0));
      emit_blocks_ = std::max(1, per_sm) * sm_count_;
    }
    const uint64_t want_n = device == device_ ? std::max<uint64_t>(n, cap_n_) : n;
    const uint64_t want_slots = device == device_ ? std::max<uint64_t>(cap, cap_slots_) : cap;
    const uint64_t tiles = (want_n + kTile - 1) / kTile;
    auto align = [](uint64_t b) { return (b + 255) & ~uint64_t{255}; };
    const uint64_t off_h1 = align(sizeof(TopKState));
    const uint64_t off_h2 = off_h1 + align(plan::kBins1 * 4);
    const uint64_t off_h3 = off_h2 + align(plan::kBins2 * 4);
    const uint64_t off_ci = off_h3 + align(plan::kBins2 * 4);
    const uint64_t off_cv = off_ci + align(want_slots * 4);
    const uint64_t off_fa = off_cv + align(want_slots * 4);
    const uint64_t off_fi = off_fa + align(tiles * 8);
    const uint64_t off_ea = off_fi + align(tiles * 8);
    const uint64_t off_ei = off_ea + align(2 * tiles * 8);
    const uint64_t total = off_ei + align(2 * tiles * 8);
    // Frees the old block first, which waits for the device: first call, growth and another
    // device only (on another device the block may shrink, so this is not a Grow).
    PSD_CHECK(block_.Replace(total, "FusedResidualTopK workspace"));
    Outcome zero;
    std::memset(&zero, 0, sizeof(zero));
    PSD_CHECK(host_.Make(zero, "FusedResidualTopK outcome"));
    void* p = block_.data();
    auto* base = static_cast<unsigned char*>(p);
    work_.state = reinterpret_cast<TopKState*>(base);
    work_.hist1 = reinterpret_cast<uint32_t*>(base + off_h1);
    work_.hist2 = reinterpret_cast<uint32_t*>(base + off_h2);
    work_.hist3 = reinterpret_cast<uint32_t*>(base + off_h3);
    work_.cand_idx = reinterpret_cast<uint32_t*>(base + off_ci);
    work_.cand_val = reinterpret_cast<float*>(base + off_cv);
    work_.fused_agg = reinterpret_cast<unsigned long long*>(base + off_fa);
    work_.fused_inc = reinterpret_cast<unsigned long long*>(base + off_fi);
    work_.emit_agg = reinterpret_cast<unsigned long long*>(base + off_ea);
    work_.emit_inc = reinterpret_cast<unsigned long long*>(base + off_ei);
    // Zeros everywhere (histograms, counters, look-back words of epoch 0, which no call uses),
    // then the first epoch and a guess that collects nothing (the first call takes the full
    // path and sets a real guess).
    PSD_CUDA_CHECK(cudaMemsetAsync(p, 0, total, stream));
    InitState<<<1, 32, 0, stream>>>(work_.state);
    PSD_CUDA_CHECK(cudaGetLastError());
    cap_n_ = want_n;
    cap_slots_ = want_slots;
    device_ = device;
    return Status::Ok();
  }

  int device_ = -1;
  int sm_count_ = 1;
  int fused_blocks_ = 1, emit_blocks_ = 1;
  uint64_t cap_n_ = 0, cap_slots_ = 0;
  // Declared in reverse order of destruction: the device block is freed first.
  PinnedMirror<Outcome> host_;  // the outcome, copied after every call
  DeviceBlock block_;           // the TopKState, histograms, candidates and look-back words
  Work work_{};
  // Set when a launch failed part-way through a call: the device state (counters, epoch) is
  // then mid-call, so the workspace refuses further calls.
  std::string broken_;
};

}  // namespace

std::unique_ptr<KernelWorkspace> NewTopKWorkspace() { return std::make_unique<TopKWorkspace>(); }

bool IsTopKWorkspace(const KernelWorkspace* ws) {
  return dynamic_cast<const TopKWorkspace*>(ws) != nullptr;
}

Status LaunchFusedResidualTopK(const float* grad, float* residual, float* momentum_buf,
                               float momentum, size_t n, size_t k, uint32_t* out_idx,
                               float* out_val, KernelWorkspace* ws, cudaStream_t stream) {
  PSD_CHECK(ClearStaleError("FusedResidualTopK"));
  auto* w = static_cast<TopKWorkspace*>(ws);
  PSD_CHECK(w->Reserve(n, k, stream));
  // After Reserve: a growth waited for the device (cudaFree), so the last call's outcome has
  // landed in host memory by then and a fault it reports is not lost with the old state.
  PSD_CHECK(w->EarlierFault());
  Work work = w->work_;
  work.cap = std::min<uint64_t>(plan::CandidateCapacity(n, k), w->cap_slots_);
  const uint64_t tiles = (n + kTile - 1) / kTile;
  const unsigned fused_grid =
      static_cast<unsigned>(std::max<uint64_t>(1, std::min<uint64_t>(tiles, w->fused_blocks_)));
  const unsigned emit_grid =
      static_cast<unsigned>(std::max<uint64_t>(1, std::min<uint64_t>(tiles, w->emit_blocks_)));
  // The refine passes read the candidates or all n: a grid that fills the GPU either way.
  const unsigned refine_grid = static_cast<unsigned>(std::max<uint64_t>(
      1, std::min<uint64_t>((n + kThreads - 1) / kThreads, 4ull * w->sm_count_)));
  const unsigned long long nn = n, kk = k;
  if (momentum_buf != nullptr) {
    FusedPass<true>
        <<<fused_grid, kThreads, 0, stream>>>(grad, residual, momentum_buf, momentum, nn, kk, work);
  } else {
    FusedPass<false>
        <<<fused_grid, kThreads, 0, stream>>>(grad, residual, nullptr, momentum, nn, kk, work);
  }
  Refine<10><<<refine_grid, kThreads, 0, stream>>>(residual, nn, work, work.hist2, kRefine2);
  Refine<0><<<refine_grid, kThreads, 0, stream>>>(residual, nn, work, work.hist3, kRefine3);
  if (momentum_buf != nullptr) {
    Emit<true><<<emit_grid, kThreads, 0, stream>>>(residual, momentum_buf, nn, kk, out_idx, out_val,
                                                   work);
  } else {
    Emit<false>
        <<<emit_grid, kThreads, 0, stream>>>(residual, nullptr, nn, kk, out_idx, out_val, work);
  }
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) {
    err = w->host_.CopyFrom(&work.state->outcome, stream);
  }
  const Status launched = CudaStatus(err, "FusedResidualTopK: kernel launches and outcome copy");
  if (!launched.ok()) {
    w->broken_ = StrCat(launched.message(),
                        "; the workspace's device state is mid-call, so it "
                        "refuses further calls (make a new one)");
    return BackendError(w->broken_);
  }
  return Status::Ok();
}

}  // namespace cuda

Result<CudaTopKCall> LastCudaTopKCall(const KernelWorkspace& ws) {
  const auto* w = dynamic_cast<const cuda::TopKWorkspace*>(&ws);
  PSD_REQUIRE_ARG(w != nullptr, "LastCudaTopKCall: the workspace is not CudaKernels()'s");
  const cuda::Outcome o = w->Read();
  CudaTopKCall c;
  c.calls = o.calls;
  c.used_candidates = o.mode == cuda::kModeCandidates;
  c.candidates = o.candidates;
  c.fault = o.fault;
  return c;
}

}  // namespace poseidon
