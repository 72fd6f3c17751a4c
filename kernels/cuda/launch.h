// Internal: the host launchers of the CUDA kernels (topk.cu, scatter.cu, elementwise.cu),
// called by cuda_kernels.cc's Do hooks once the contract's checks (kernels/contract.cc) and the
// hook's own (workspace maker, device pointers) have passed. Plain C++ types only, so the .cc side
// needs no CUDA headers beyond the runtime API.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kernels/kernels.h"
#include "runtime/cuda_util.h"

namespace poseidon {
namespace cuda {

// Called first by every launcher: an error left by an earlier call on this thread (a failed
// cudaMalloc, a bad launch) is cleared, so the error a launcher returns is its own and a
// caller never retries work that already ran. A sticky error (the context is unusable, every
// call fails) is returned before anything is launched.
inline Status ClearStaleError(const char* call) {
  cudaError_t stale = cudaGetLastError();
  if (stale == cudaSuccess) return Status::Ok();
  cudaError_t again = cudaPeekAtLastError();
  if (again == cudaSuccess) return Status::Ok();  // not sticky: cleared
  return CudaStatus(again, StrCat(call, ": the CUDA context is unusable").c_str());
}

// The Status of an allocation; a failure is cleared from the thread's last error at once, so
// no later call reports it as its own.
inline Status AllocOrClear(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return Status::Ok();
  (void)cudaGetLastError();
  return CudaStatus(err, what.c_str());
}

std::unique_ptr<KernelWorkspace> NewTopKWorkspace();
// True when ws was made by NewTopKWorkspace.
bool IsTopKWorkspace(const KernelWorkspace* ws);

Status LaunchFusedResidualTopK(const float* grad, float* residual, float* momentum_buf,
                               float momentum, size_t n, size_t k, uint32_t* out_idx,
                               float* out_val, KernelWorkspace* ws, cudaStream_t stream);

std::unique_ptr<ScatterWorkspace> NewScatterWorkspace();
// True when ws was made by NewScatterWorkspace.
bool IsScatterWorkspace(const ScatterWorkspace* ws);
// Never waits; returns launch errors and ws->Fault() (faults of earlier calls).
Status LaunchScatterAddBlocks(const void* blocks, int num_blocks, size_t k, float* dense,
                              size_t n, ScatterWorkspace* ws, cudaStream_t stream);

// Synchronizes the stream once to read whether an index was out of range.
Status LaunchScatterAdd(const uint32_t* idx, const float* val, size_t m, float* dense, size_t n,
                        cudaStream_t stream);

Status LaunchSgdStep(float* param, const float* grads, int num_grads, size_t grad_stride,
                     float grad_scale, float* velocity, size_t n, const SgdParams& p,
                     cudaStream_t stream);
// step_size = lr / (1 - beta1^t), inv_bc2_sqrt = 1 / sqrt(1 - beta2^t), computed on the host
// in double precision exactly as the CPU kernel does.
Status LaunchAdamStep(float* param, const float* grads, int num_grads, size_t grad_stride,
                      float grad_scale, float* m, float* v, size_t n, const AdamParams& p,
                      float step_size, float inv_bc2_sqrt, cudaStream_t stream);
// data[i] *= scale (one multiply, bitwise the CPU's) and data[i] = value.
Status LaunchScale(float* data, size_t n, float scale, cudaStream_t stream);
Status LaunchFill(float* data, size_t n, float value, cudaStream_t stream);

}  // namespace cuda
}  // namespace poseidon
