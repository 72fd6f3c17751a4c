// FusedResidualTopK on device memory: residual accumulation (optional DGC momentum) fused with
// exact top-k selection by magnitude, RedSync-style radix select. No sort, and no host
// synchronization anywhere: every count the steps need stays in device memory.
//
// Keys: a value's key is the float bits of its magnitude (|x| orders like those bits); every
// NaN maps to 0x7f800001, just above +infinity, as in the CPU kernel (cpu::kNaNKey).
//
//  1. Fused pass over n: u = momentum * u + g (stored when a momentum buffer is given),
//     r = residual + u (stored), and a 256-bin histogram of key bits 31..24 (shared-memory
//     histograms per block, merged with global atomics).
//  2. FindDigit (one thread): walking the bins from the top, the bin holding the k-th largest
//     key; its digit joins the threshold prefix and k_rem becomes k minus the keys above it.
//  3. cub::DeviceSelect::If compacts the keys in that bin (the candidates, usually a small
//     fraction of n) into the workspace.
//  4. Three refine passes over only the candidates (bits 23..16, 15..8, 7..0): histogram of
//     the candidates matching the prefix so far, then FindDigit. Afterwards the prefix is the
//     exact k-th largest key T, and k_rem is how many keys equal to T belong to the top k.
//  5. cub::DevicePartition::If (three-way, stable) over the indices 0..n-1: indices with key > T
//     (fewer than k) and indices with key == T, both in ascending order.
//  6. Merge (one thread per output): the k - k_rem indices above T and the first k_rem ties
//     (smaller index wins a tie) are merged by index with a binary search in the other list;
//     each thread writes its (index, value) to its place, ascending, and zeroes the entry in
//     the residual and the momentum buffer (DGC's momentum factor masking).
//
// The workspace holds the state, histograms, candidates (n floats, reused for the tie
// indices), the above-threshold indices (k) and CUB's temporary storage. It grows on demand;
// growing frees the old block with cudaFree, which waits for the device: that happens only on
// the first call and when n or k grows, never in steady state.
#include <cuda_runtime.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/discard_iterator.h>

#include <algorithm>
#include <cub/device/device_partition.cuh>
#include <cub/device/device_select.cuh>

#include "kernels/cuda/launch.h"
#include "runtime/cuda_util.h"

namespace poseidon {
namespace cuda {
namespace {

constexpr uint32_t kNaNKey = 0x7f800001u;
constexpr int kBins = 256;
constexpr int kPasses = 4;  // 8 bits each, from the top
constexpr int kThreads = 256;

struct TopKState {
  uint32_t prefix;           // key bits fixed so far (then the threshold T)
  uint32_t k_rem;            // how many of the top k lie at or below the prefix
  long long cand_count;      // keys in the bin found by pass 1
  long long part_counts[2];  // [0]: keys > T, [1]: keys == T
};

__device__ __forceinline__ uint32_t KeyOf(float x) {
  uint32_t u = __float_as_uint(x) & 0x7fffffffu;
  return u > 0x7f800000u ? kNaNKey : u;
}

__global__ void InitState(TopKState* state, uint32_t* hist, uint32_t k) {
  for (int i = threadIdx.x; i < kPasses * kBins; i += blockDim.x) hist[i] = 0;
  if (threadIdx.x == 0) {
    state->prefix = 0;
    state->k_rem = k;
    state->cand_count = 0;
    state->part_counts[0] = 0;
    state->part_counts[1] = 0;
  }
}

// Counts one key in a shared histogram. The top byte of |x| is mostly the exponent, so for
// gradient-like data most lanes of a warp hit the same few bins; lanes with equal bins are
// grouped (__match_any_sync, sm_70+) and one of them adds the group's count, which removes the
// serialization of same-address shared atomics.
__device__ __forceinline__ void AddToBin(uint32_t* local, uint32_t bin) {
  const unsigned active = __activemask();
  const unsigned peers = __match_any_sync(active, bin);
  if ((threadIdx.x & 31u) == static_cast<unsigned>(__ffs(peers) - 1)) {
    atomicAdd(&local[bin], static_cast<uint32_t>(__popc(peers)));
  }
}

// Step 1. The expressions match the CPU kernel's, and the target is built with --fmad=false,
// so the residual and momentum come out bit-identical to CpuKernels().
template <bool kMom>
__global__ void __launch_bounds__(kThreads)
    FusedPass(const float* __restrict__ grad, float* __restrict__ residual, float* __restrict__ mom,
              float momentum, size_t n, uint32_t* hist) {
  __shared__ uint32_t local[kBins];
  for (int i = threadIdx.x; i < kBins; i += blockDim.x) local[i] = 0;
  __syncthreads();
  size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float u = grad[i];
    if (kMom) {
      u = momentum * mom[i] + u;
      mom[i] = u;
    }
    float r = residual[i] + u;
    residual[i] = r;
    AddToBin(local, KeyOf(r) >> 24);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kBins; i += blockDim.x) {
    if (local[i] != 0) atomicAdd(&hist[i], local[i]);
  }
}

// Step 2: the bin of the k_rem-th largest key among those matching the prefix.
__global__ void FindDigit(const uint32_t* hist, TopKState* state, int shift) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  uint64_t k_rem = state->k_rem;
  uint64_t above = 0;  // 64-bit: bins may sum to almost 2^32
  int digit = 0;
  for (int d = kBins - 1; d >= 0; --d) {
    uint64_t c = hist[d];
    if (above + c >= k_rem) {
      digit = d;
      break;
    }
    above += c;
  }
  state->prefix |= static_cast<uint32_t>(digit) << shift;
  state->k_rem = static_cast<uint32_t>(k_rem - above);
}

// Step 3 predicate: the key's top byte is pass 1's digit.
struct InTopBin {
  const TopKState* state;
  __device__ bool operator()(float r) const { return (KeyOf(r) >> 24) == (state->prefix >> 24); }
};

// Step 4: histogram of the candidates that match the prefix in the bits above `shift + 8`.
__global__ void __launch_bounds__(kThreads)
    RefinePass(const float* __restrict__ cand, const TopKState* state, uint32_t* hist, int shift) {
  __shared__ uint32_t local[kBins];
  for (int i = threadIdx.x; i < kBins; i += blockDim.x) local[i] = 0;
  __syncthreads();
  const long long count = state->cand_count;
  const uint32_t mask = ~0u << (shift + 8);
  const uint32_t want = state->prefix & mask;
  long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    uint32_t key = KeyOf(cand[i]);
    if ((key & mask) == want) atomicAdd(&local[(key >> shift) & 0xffu], 1u);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kBins; i += blockDim.x) {
    if (local[i] != 0) atomicAdd(&hist[i], local[i]);
  }
}

// Step 5 predicates over indices.
struct AboveThreshold {
  const float* residual;
  const TopKState* state;
  __device__ bool operator()(uint32_t i) const { return KeyOf(residual[i]) > state->prefix; }
};
struct AtThreshold {
  const float* residual;
  const TopKState* state;
  __device__ bool operator()(uint32_t i) const { return KeyOf(residual[i]) == state->prefix; }
};

// First position in sorted a[0..len) whose value is >= x.
__device__ __forceinline__ long long LowerBound(const uint32_t* a, long long len, uint32_t x) {
  long long lo = 0, hi = len;
  while (lo < hi) {
    long long mid = (lo + hi) / 2;
    if (a[mid] < x)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// Step 6.
__global__ void __launch_bounds__(kThreads)
    MergeEmit(const uint32_t* __restrict__ above, const uint32_t* __restrict__ ties,
              const TopKState* state, size_t k, float* residual, float* mom,
              uint32_t* __restrict__ out_idx, float* __restrict__ out_val) {
  size_t t = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= k) return;
  const long long n_above = state->part_counts[0];
  const long long take = static_cast<long long>(k) - n_above;  // == state->k_rem
  uint32_t idx;
  long long pos;
  if (static_cast<long long>(t) < n_above) {
    idx = above[t];
    pos = static_cast<long long>(t) + LowerBound(ties, take, idx);
  } else {
    long long j = static_cast<long long>(t) - n_above;
    idx = ties[j];
    pos = j + LowerBound(above, n_above, idx);
  }
  out_idx[pos] = idx;
  out_val[pos] = residual[idx];
  residual[idx] = 0.0f;
  if (mom != nullptr) mom[idx] = 0.0f;
}

class TopKWorkspace final : public KernelWorkspace {
 public:
  ~TopKWorkspace() override {
    if (block_ != nullptr) cudaFree(block_);
  }

  // Makes room for (n, k) on the current device.
  Status Reserve(size_t n, size_t k, cudaStream_t stream) {
    int device = 0;
    PSD_CUDA_CHECK(cudaGetDevice(&device));
    if (block_ != nullptr && device == device_ && n <= cap_n_ && k <= cap_k_) return Status::Ok();
    if (device != device_) {
      PSD_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device));
    }
    size_t want_n = std::max(n, cap_n_), want_k = std::max(k, cap_k_);
    if (device != device_) want_n = n, want_k = k;
    // CUB's temporary storage for the largest n (its size grows with n only).
    size_t select_bytes = 0, partition_bytes = 0;
    // Size queries only: CUB dereferences none of these pointers.
    const TopKState* null_state = nullptr;
    long long* null_counts = nullptr;
    PSD_CUDA_CHECK(cub::DeviceSelect::If(
        nullptr, select_bytes, static_cast<const float*>(nullptr), static_cast<float*>(nullptr),
        null_counts, static_cast<int64_t>(want_n), InTopBin{null_state}, stream));
    PSD_CUDA_CHECK(cub::DevicePartition::If(
        nullptr, partition_bytes, thrust::counting_iterator<uint32_t>(0),
        static_cast<uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
        thrust::make_discard_iterator(), null_counts, static_cast<int64_t>(want_n),
        AboveThreshold{nullptr, null_state}, AtThreshold{nullptr, null_state}, stream));
    size_t temp = std::max(select_bytes, partition_bytes);

    auto align = [](size_t b) { return (b + 255) & ~static_cast<size_t>(255); };
    size_t off_hist = align(sizeof(TopKState));
    size_t off_cand = off_hist + align(kPasses * kBins * sizeof(uint32_t));
    size_t off_above = off_cand + align(want_n * sizeof(float));
    size_t off_temp = off_above + align(want_k * sizeof(uint32_t));
    size_t total = off_temp + align(temp);
    if (block_ != nullptr) {
      // cudaFree waits for the device: only on first use and growth (see the file comment).
      PSD_CUDA_CHECK(cudaFree(block_));
      block_ = nullptr;
    }
    void* p = nullptr;
    PSD_CHECK(
        CudaStatus(cudaMalloc(&p, total),
                   StrCat("FusedResidualTopK: cudaMalloc(", total, " bytes workspace)").c_str()));
    block_ = p;
    auto* base = static_cast<unsigned char*>(p);
    state_ = reinterpret_cast<TopKState*>(base);
    hist_ = reinterpret_cast<uint32_t*>(base + off_hist);
    cand_ = reinterpret_cast<float*>(base + off_cand);
    above_ = reinterpret_cast<uint32_t*>(base + off_above);
    temp_ = base + off_temp;
    temp_bytes_ = align(temp);
    cap_n_ = want_n;
    cap_k_ = want_k;
    device_ = device;
    return Status::Ok();
  }

  int device_ = -1;
  int sm_count_ = 1;
  size_t cap_n_ = 0, cap_k_ = 0, temp_bytes_ = 0;
  void* block_ = nullptr;
  TopKState* state_ = nullptr;
  uint32_t* hist_ = nullptr;
  float* cand_ = nullptr;
  uint32_t* above_ = nullptr;
  void* temp_ = nullptr;
};

unsigned GridFor(size_t n, int sm_count) {
  size_t blocks = (n + kThreads - 1) / kThreads;
  size_t cap = static_cast<size_t>(sm_count) * 8;  // enough to fill the GPU; loops do the rest
  return static_cast<unsigned>(std::max<size_t>(1, std::min(blocks, cap)));
}

}  // namespace

std::unique_ptr<KernelWorkspace> NewTopKWorkspace() { return std::make_unique<TopKWorkspace>(); }

bool IsTopKWorkspace(const KernelWorkspace* ws) {
  return dynamic_cast<const TopKWorkspace*>(ws) != nullptr;
}

Status LaunchFusedResidualTopK(const float* grad, float* residual, float* momentum_buf,
                               float momentum, size_t n, size_t k, uint32_t* out_idx,
                               float* out_val, KernelWorkspace* ws, cudaStream_t stream) {
  auto* w = static_cast<TopKWorkspace*>(ws);
  PSD_CHECK(w->Reserve(n, k, stream));
  const unsigned grid = GridFor(n, w->sm_count_);
  TopKState* state = w->state_;

  InitState<<<1, kThreads, 0, stream>>>(state, w->hist_, static_cast<uint32_t>(k));
  if (momentum_buf != nullptr) {
    FusedPass<true>
        <<<grid, kThreads, 0, stream>>>(grad, residual, momentum_buf, momentum, n, w->hist_);
  } else {
    FusedPass<false><<<grid, kThreads, 0, stream>>>(grad, residual, nullptr, momentum, n, w->hist_);
  }
  FindDigit<<<1, 1, 0, stream>>>(w->hist_, state, 24);
  PSD_CUDA_CHECK(cudaGetLastError());

  size_t temp = w->temp_bytes_;
  PSD_CUDA_CHECK(cub::DeviceSelect::If(w->temp_, temp, static_cast<const float*>(residual),
                                       w->cand_, &state->cand_count, static_cast<int64_t>(n),
                                       InTopBin{state}, stream));
  for (int pass = 1; pass < kPasses; ++pass) {
    int shift = 24 - 8 * pass;
    uint32_t* hist = w->hist_ + pass * kBins;
    // The candidate count lives on the device, so the grid is sized for the worst case (all
    // n) and threads past the count exit at once.
    RefinePass<<<grid, kThreads, 0, stream>>>(w->cand_, state, hist, shift);
    FindDigit<<<1, 1, 0, stream>>>(hist, state, shift);
  }
  PSD_CUDA_CHECK(cudaGetLastError());

  // The candidate buffer is free now: it receives the indices of the ties.
  uint32_t* ties = reinterpret_cast<uint32_t*>(w->cand_);
  temp = w->temp_bytes_;
  PSD_CUDA_CHECK(cub::DevicePartition::If(
      w->temp_, temp, thrust::counting_iterator<uint32_t>(0), w->above_, ties,
      thrust::make_discard_iterator(), state->part_counts, static_cast<int64_t>(n),
      AboveThreshold{residual, state}, AtThreshold{residual, state}, stream));

  unsigned merge_grid = static_cast<unsigned>((k + kThreads - 1) / kThreads);
  MergeEmit<<<merge_grid, kThreads, 0, stream>>>(w->above_, ties, state, k, residual, momentum_buf,
                                                 out_idx, out_val);
  PSD_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

}  // namespace cuda
}  // namespace poseidon
