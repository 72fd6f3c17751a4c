// Optimizer steps on a parameter shard, fused with the aggregation of the gathered gradient
// pieces (PyTorch semantics), and SumInto.
//
//  1. The shard is walked in blocks of kBlock elements (a few KiB, stays in L1).
//  2. Per block, the num_grads pieces are summed in a fixed order (piece 0, then 1, ...), so
//     every rank and every run gets bit-identical sums; the sum is scaled by grad_scale and the
//     L2 weight decay term is added: g' = sum * scale + wd * p.
//  3. The update runs over the block:
//     SGD:  v = momentum * v + g';  p -= lr * (nesterov ? g' + momentum * v : v)
//           (momentum 0: p -= lr * g', no velocity needed).
//     Adam: m = b1 m + (1 - b1) g';  v = b2 v + (1 - b2) g'^2;
//           p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps),
//           which is torch.optim.Adam's arrangement of mhat / (sqrt(vhat) + eps); the bias
//           corrections are computed once per call in double precision.
#include <algorithm>
#include <cmath>

#include "kernels/contract_checks.h"
#include "kernels/cpu/cpu_kernels.h"
#include "runtime/multiversion.h"

namespace poseidon {
namespace cpu {
namespace {

constexpr size_t kBlock = 1024;

// acc[j] = sum over q of grads[q * stride + base + j], q ascending.
void SumBlock(const float* __restrict grads, int num, size_t stride, size_t base, size_t len,
              float* __restrict acc) {
  const float* g0 = grads + base;
  for (size_t j = 0; j < len; ++j) acc[j] = g0[j];
  for (int q = 1; q < num; ++q) {
    const float* gq = grads + static_cast<size_t>(q) * stride + base;
    for (size_t j = 0; j < len; ++j) acc[j] += gq[j];
  }
}

using kernel_checks::CheckPieces;

}  // namespace

PSD_MULTIVERSION
Status SgdStep(float* param, const float* grads, int num_grads, size_t grad_stride,
               float grad_scale, float* velocity, size_t n, const SgdParams& p) {
  PSD_CHECK(kernel_checks::CheckSgdArgs("SgdStep", param, grads, num_grads, grad_stride,
                                        grad_scale, velocity, n, p));
  if (n == 0) return Status::Ok();

  const float lr = p.lr;
  const float mu = p.momentum;
  const float wd = p.weight_decay;
  alignas(64) float acc[kBlock];
  for (size_t base = 0; base < n; base += kBlock) {
    const size_t len = std::min(kBlock, n - base);
    SumBlock(grads, num_grads, grad_stride, base, len, acc);
    float* __restrict pp = param + base;
    for (size_t j = 0; j < len; ++j) acc[j] = acc[j] * grad_scale;
    if (wd != 0.0f) {  // PyTorch adds the decay term only when it is non-zero
      for (size_t j = 0; j < len; ++j) acc[j] = acc[j] + wd * pp[j];
    }
    if (mu == 0.0f) {
      for (size_t j = 0; j < len; ++j) pp[j] = pp[j] - lr * acc[j];
      continue;
    }
    float* __restrict vv = velocity + base;
    if (p.nesterov) {
      for (size_t j = 0; j < len; ++j) {
        const float v = mu * vv[j] + acc[j];
        vv[j] = v;
        pp[j] = pp[j] - lr * (acc[j] + mu * v);
      }
    } else {
      for (size_t j = 0; j < len; ++j) {
        const float v = mu * vv[j] + acc[j];
        vv[j] = v;
        pp[j] = pp[j] - lr * v;
      }
    }
  }
  return Status::Ok();
}

PSD_MULTIVERSION
Status AdamStep(float* param, const float* grads, int num_grads, size_t grad_stride,
                float grad_scale, float* m, float* v, size_t n, const AdamParams& p) {
  double bc1 = 1.0, bc2 = 1.0;
  PSD_CHECK(kernel_checks::CheckAdamArgs("AdamStep", param, grads, num_grads, grad_stride,
                                         grad_scale, m, v, n, p, &bc1, &bc2));
  if (n == 0) return Status::Ok();
  const float step_size = static_cast<float>(p.lr / bc1);
  const float inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  const float b1 = p.beta1;
  const float b2 = p.beta2;
  const float one_minus_b1 = 1.0f - b1;
  const float one_minus_b2 = 1.0f - b2;
  const float eps = p.eps;
  const float wd = p.weight_decay;
  alignas(64) float acc[kBlock];
  for (size_t base = 0; base < n; base += kBlock) {
    const size_t len = std::min(kBlock, n - base);
    SumBlock(grads, num_grads, grad_stride, base, len, acc);
    float* __restrict pp = param + base;
    float* __restrict mm = m + base;
    float* __restrict vv = v + base;
    for (size_t j = 0; j < len; ++j) acc[j] = acc[j] * grad_scale;
    if (wd != 0.0f) {
      for (size_t j = 0; j < len; ++j) acc[j] = acc[j] + wd * pp[j];
    }
    for (size_t j = 0; j < len; ++j) {
      const float g = acc[j];
      const float m1 = b1 * mm[j] + one_minus_b1 * g;
      const float v1 = b2 * vv[j] + one_minus_b2 * (g * g);
      mm[j] = m1;
      vv[j] = v1;
      const float denom = std::sqrt(v1) * inv_bc2_sqrt + eps;
      pp[j] = pp[j] - step_size * (m1 / denom);
    }
  }
  return Status::Ok();
}

Status SumInto(float* dst, const float* src, int num, size_t stride, size_t n) {
  constexpr const char* kCall = "SumInto";
  PSD_REQUIRE_ARG(num >= 0, kCall, ": num is ", num, "; expected >= 0");
  if (n == 0) return Status::Ok();
  PSD_REQUIRE_ARG(dst != nullptr, kCall, ": dst is null with n = ", n);
  if (num == 0) {  // the empty sum
    std::fill(dst, dst + n, 0.0f);
    return Status::Ok();
  }
  PSD_CHECK(CheckPieces(kCall, src, num, stride, n));
  // Blocked like the optimizer steps so that dst may be piece 0 itself (in-place reduction):
  // each block is summed into scratch before it is written.
  alignas(64) float acc[kBlock];
  for (size_t base = 0; base < n; base += kBlock) {
    const size_t len = std::min(kBlock, n - base);
    SumBlock(src, num, stride, base, len, acc);
    std::copy(acc, acc + len, dst + base);
  }
  return Status::Ok();
}

}  // namespace cpu
}  // namespace poseidon
