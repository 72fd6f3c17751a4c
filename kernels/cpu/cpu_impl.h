// Internal to kernels/cpu: the CPU kernels that live in their own files (topk.cc,
// optimizer.cc), called by CpuKernels()' Do hooks (cpu_kernels.cc). Unchecked: each assumes
// the arguments passed the Kernels contract's checks (kernels/contract.cc) and meets its hook's
// preconditions (kernels/kernels.h: non-empty, pointers non-null, buffers as the contract
// requires); they check only what needs the data. Callers outside kernels/cpu use CpuKernels().
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/kernels.h"

namespace poseidon {
namespace cpu {

// 0 < k <= n <= 2^32 - 1. The only error is an internal one (the selection lost an entry).
Status FusedResidualTopK(const float* grad, float* residual, float* momentum_buf, float momentum,
                         size_t n, size_t k, uint32_t* out_idx, float* out_val, TopKWorkspace* ws);

// n > 0; step_size and inv_bc2_sqrt as Kernels::AdamStep computes them.
void SgdStep(float* param, const float* grads, int num_grads, size_t grad_stride, float grad_scale,
             float* velocity, size_t n, const SgdParams& p);
void AdamStep(float* param, const float* grads, int num_grads, size_t grad_stride, float grad_scale,
              float* m, float* v, size_t n, const AdamParams& p, float step_size,
              float inv_bc2_sqrt);
}  // namespace cpu
}  // namespace poseidon
