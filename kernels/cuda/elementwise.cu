// Elementwise CUDA kernels: ScatterAdd, the optimizer steps, Scale and Fill.
//
// Each kernel is a grid-stride loop that evaluates the CPU twin's expressions in the same
// order; with --fmad=false (set on the target) nothing is contracted into an FMA, and CUDA's
// sqrtf and division are correctly rounded by default, so results are bit-identical to
// CpuKernels(). ScatterAdd is the exception (float atomics, see LaunchScatterAdd).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <memory>

#include "kernels/cuda/device_block.h"
#include "kernels/cuda/launch.h"
#include "runtime/cuda_util.h"

namespace poseidon {
namespace cuda {
namespace {

constexpr int kThreads = 256;

unsigned GridFor(size_t n) { return GridStrideBlocks(n, kThreads); }

#define PSD_GRID_STRIDE(i, n)                                                          \
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<size_t>(gridDim.x) * blockDim.x)

// Records the smallest position j whose index is >= n.
__global__ void FindBadIndex(const uint32_t* __restrict__ idx, size_t m, size_t n,
                             unsigned long long* first_bad) {
  PSD_GRID_STRIDE(j, m) {
    if (idx[j] >= n) atomicMin(first_bad, static_cast<unsigned long long>(j));
  }
}

// Adds val[j] at idx[j], unless FindBadIndex found a bad index (then dense stays unchanged, as
// with the CPU kernel).
__global__ void ScatterAddKernel(const uint32_t* __restrict__ idx, const float* __restrict__ val,
                                 size_t m, float* dense, const unsigned long long* first_bad) {
  if (*first_bad != ~0ull) return;
  PSD_GRID_STRIDE(j, m) { atomicAdd(dense + idx[j], val[j]); }
}

// The sum of the num pieces at element i, piece 0 first (the CPU order), times scale.
__device__ __forceinline__ float SumPieces(const float* grads, int num, size_t stride, size_t i) {
  float acc = grads[i];
  for (int q = 1; q < num; ++q) acc += grads[static_cast<size_t>(q) * stride + i];
  return acc;
}

__global__ void SgdKernel(float* param, const float* grads, int num, size_t stride, float scale,
                          float* velocity, size_t n, float lr, float mu, float wd, bool nesterov) {
  PSD_GRID_STRIDE(i, n) {
    float g = SumPieces(grads, num, stride, i) * scale;
    float p = param[i];
    if (wd != 0.0f) g = g + wd * p;
    if (mu == 0.0f) {
      param[i] = p - lr * g;
      continue;
    }
    const float v = mu * velocity[i] + g;
    velocity[i] = v;
    param[i] = nesterov ? p - lr * (g + mu * v) : p - lr * v;
  }
}

__global__ void AdamKernel(float* param, const float* grads, int num, size_t stride, float scale,
                           float* m, float* v, size_t n, float b1, float b2, float one_minus_b1,
                           float one_minus_b2, float eps, float wd, float step_size,
                           float inv_bc2_sqrt) {
  PSD_GRID_STRIDE(i, n) {
    float g = SumPieces(grads, num, stride, i) * scale;
    float p = param[i];
    if (wd != 0.0f) g = g + wd * p;
    const float m1 = b1 * m[i] + one_minus_b1 * g;
    const float v1 = b2 * v[i] + one_minus_b2 * (g * g);
    m[i] = m1;
    v[i] = v1;
    const float denom = sqrtf(v1) * inv_bc2_sqrt + eps;
    param[i] = p - step_size * (m1 / denom);
  }
}

// One float32 multiply per element (no FMA to contract with: bitwise the CPU's x *= s).
__global__ void ScaleKernel(float* data, size_t n, float scale) {
  PSD_GRID_STRIDE(i, n) { data[i] = data[i] * scale; }
}

__global__ void FillKernel(float* data, size_t n, float value) {
  PSD_GRID_STRIDE(i, n) { data[i] = value; }
}

// Per-thread, per-device scratch for ScatterAdd's bad-index report (device word + pinned
// mirror), made on first use on each device. Never freed: it lives as long as the thread, and
// freeing CUDA memory from thread-exit destructors can run after the runtime has shut down, so
// each thread keeps a pointer to a heap copy that is never deleted (a switch to another device
// makes a new one and leaves the old one allocated).
struct ScatterScratch {
  DeviceBlock bad;                       // the first bad position, ULLONG_MAX when none
  PinnedMirror<unsigned long long> host;  // its copy, read once the stream has finished
};

Result<ScatterScratch*> GetScatterScratch() {
  thread_local int scratch_device = -1;
  thread_local ScatterScratch* scratch = nullptr;
  int device = 0;
  PSD_CUDA_CHECK(cudaGetDevice(&device));
  if (scratch_device != device) {
    auto s = std::make_unique<ScatterScratch>();
    PSD_CHECK(s->bad.Grow(sizeof(unsigned long long), "ScatterAdd's bad-index word"));
    PSD_CHECK(s->host.Make(ULLONG_MAX, "ScatterAdd's bad-index word"));
    scratch = s.release();
    scratch_device = device;
  }
  return scratch;
}

}  // namespace

// Float atomics: with repeated indices the additions land in an unspecified order, so sums can
// differ in the last bits between runs (distinct indices are exact). Every index is checked on
// the device before anything is added, so a bad index leaves dense unchanged; the host waits
// for the stream once, to read that check and name the first bad position.
Status LaunchScatterAdd(const uint32_t* idx, const float* val, size_t m, float* dense, size_t n,
                        cudaStream_t stream) {
  PSD_CHECK(ClearStaleError("ScatterAdd"));
  PSD_ASSIGN_OR_RETURN(ScatterScratch * s, GetScatterScratch());
  auto* d_bad = s->bad.as<unsigned long long>();
  PSD_CUDA_CHECK(cudaMemsetAsync(d_bad, 0xff, sizeof(unsigned long long), stream));
  FindBadIndex<<<GridFor(m), kThreads, 0, stream>>>(idx, m, n, d_bad);
  ScatterAddKernel<<<GridFor(m), kThreads, 0, stream>>>(idx, val, m, dense, d_bad);
  PSD_CUDA_CHECK(cudaGetLastError());
  PSD_CUDA_CHECK(s->host.CopyFrom(d_bad, stream));
  PSD_CUDA_CHECK(cudaStreamSynchronize(stream));
  // The stream has finished, so nothing writes the copy and the two reads agree.
  unsigned long long bad = ULLONG_MAX;
  (void)s->host.Read(&bad);
  if (bad == ULLONG_MAX) return Status::Ok();
  uint32_t value = 0;
  PSD_CUDA_CHECK(cudaMemcpy(&value, idx + bad, sizeof(value), cudaMemcpyDeviceToHost));
  return InvalidArgument("ScatterAdd: idx[", bad, "] is ", value, " but n is ", n,
                         "; expected every index < n (dense was left unchanged)");
}

Status LaunchSgdStep(float* param, const float* grads, int num_grads, size_t grad_stride,
                     float grad_scale, float* velocity, size_t n, const SgdParams& p,
                     cudaStream_t stream) {
  SgdKernel<<<GridFor(n), kThreads, 0, stream>>>(param, grads, num_grads, grad_stride, grad_scale,
                                                 velocity, n, p.lr, p.momentum, p.weight_decay,
                                                 p.nesterov);
  return CudaStatus(cudaGetLastError(), "SgdStep kernel launch");
}

Status LaunchAdamStep(float* param, const float* grads, int num_grads, size_t grad_stride,
                      float grad_scale, float* m, float* v, size_t n, const AdamParams& p,
                      float step_size, float inv_bc2_sqrt, cudaStream_t stream) {
  AdamKernel<<<GridFor(n), kThreads, 0, stream>>>(
      param, grads, num_grads, grad_stride, grad_scale, m, v, n, p.beta1, p.beta2, 1.0f - p.beta1,
      1.0f - p.beta2, p.eps, p.weight_decay, step_size, inv_bc2_sqrt);
  return CudaStatus(cudaGetLastError(), "AdamStep kernel launch");
}

Status LaunchScale(float* data, size_t n, float scale, cudaStream_t stream) {
  ScaleKernel<<<GridFor(n), kThreads, 0, stream>>>(data, n, scale);
  return CudaStatus(cudaGetLastError(), "Scale kernel launch");
}

Status LaunchFill(float* data, size_t n, float value, cudaStream_t stream) {
  FillKernel<<<GridFor(n), kThreads, 0, stream>>>(data, n, value);
  return CudaStatus(cudaGetLastError(), "Fill kernel launch");
}

}  // namespace cuda
}  // namespace poseidon
