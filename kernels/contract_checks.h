// Argument checks of the Kernels contract that do not depend on where memory lives, shared by
// the CPU kernels and their CUDA twins so both refuse the same inputs with the same message.
// Header-only: kernels/cpu and kernels/cuda are separate libraries.
#pragma once

#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "kernels/kernels.h"
#include "runtime/status.h"

namespace poseidon::kernel_checks {

inline bool NonNegativeFinite(float x) { return std::isfinite(x) && x >= 0.0f; }

// num gradient pieces at grads + g * stride, n floats each, must not overlap.
inline Status CheckPieces(const char* call, const float* grads, int num, size_t stride,
                          size_t n) {
  PSD_REQUIRE_ARG(num >= 1, call, ": num_grads is ", num, "; expected >= 1");
  PSD_REQUIRE_ARG(grads != nullptr, call, ": grads is null with n = ", n);
  PSD_REQUIRE_ARG(num == 1 || stride >= n, call, ": grad_stride is ", stride, " but n is ", n,
                  "; expected grad_stride >= n so the ", num, " pieces do not overlap");
  return Status::Ok();
}

// SgdStep's hyper-parameters and buffers (pointers checked only when n > 0).
inline Status CheckSgdArgs(const char* call, const float* param, const float* grads,
                           int num_grads, size_t grad_stride, float grad_scale,
                           const float* velocity, size_t n, const SgdParams& p) {
  PSD_REQUIRE_ARG(NonNegativeFinite(p.lr), call, ": lr is ", p.lr, "; expected finite >= 0");
  PSD_REQUIRE_ARG(NonNegativeFinite(p.momentum), call, ": momentum is ", p.momentum,
                  "; expected finite >= 0");
  PSD_REQUIRE_ARG(NonNegativeFinite(p.weight_decay), call, ": weight_decay is ",
                  p.weight_decay, "; expected finite >= 0");
  PSD_REQUIRE_ARG(!p.nesterov || p.momentum > 0.0f, call,
                  ": nesterov needs momentum > 0 (momentum is ", p.momentum, ")");
  PSD_REQUIRE_ARG(std::isfinite(grad_scale), call, ": grad_scale is ", grad_scale,
                  "; expected a finite factor");
  if (n == 0) return Status::Ok();
  PSD_CHECK(CheckPieces(call, grads, num_grads, grad_stride, n));
  PSD_REQUIRE_ARG(param != nullptr, call, ": param is null with n = ", n);
  PSD_REQUIRE_ARG(velocity != nullptr || p.momentum == 0.0f, call, ": momentum is ",
                  p.momentum, " but velocity is null; expected a buffer of n = ", n, " floats");
  return Status::Ok();
}

// AdamStep's hyper-parameters and buffers; on success *bc1 / *bc2 hold the bias corrections
// 1 - beta^step, computed in double (both implementations use exactly these values).
inline Status CheckAdamArgs(const char* call, const float* param, const float* grads,
                            int num_grads, size_t grad_stride, float grad_scale,
                            const float* m, const float* v, size_t n, const AdamParams& p,
                            double* bc1, double* bc2) {
  PSD_REQUIRE_ARG(NonNegativeFinite(p.lr), call, ": lr is ", p.lr, "; expected finite >= 0");
  PSD_REQUIRE_ARG(p.beta1 >= 0.0f && p.beta1 < 1.0f, call, ": beta1 is ", p.beta1,
                  "; expected 0 <= beta1 < 1");
  PSD_REQUIRE_ARG(p.beta2 >= 0.0f && p.beta2 < 1.0f, call, ": beta2 is ", p.beta2,
                  "; expected 0 <= beta2 < 1");
  PSD_REQUIRE_ARG(NonNegativeFinite(p.eps), call, ": eps is ", p.eps, "; expected finite >= 0");
  PSD_REQUIRE_ARG(NonNegativeFinite(p.weight_decay), call, ": weight_decay is ",
                  p.weight_decay, "; expected finite >= 0");
  PSD_REQUIRE_ARG(p.step >= 1, call, ": step is ", p.step,
                  "; expected the 1-based count of steps taken, >= 1");
  PSD_REQUIRE_ARG(std::isfinite(grad_scale), call, ": grad_scale is ", grad_scale,
                  "; expected a finite factor");
  *bc1 = *bc2 = 1.0;
  if (n == 0) return Status::Ok();
  PSD_CHECK(CheckPieces(call, grads, num_grads, grad_stride, n));
  PSD_REQUIRE_ARG(param != nullptr, call, ": param is null with n = ", n);
  PSD_REQUIRE_ARG(m != nullptr, call, ": m (first moment) is null with n = ", n);
  PSD_REQUIRE_ARG(v != nullptr, call, ": v (second moment) is null with n = ", n);
  const double t = static_cast<double>(p.step);
  *bc1 = 1.0 - std::pow(static_cast<double>(p.beta1), t);
  *bc2 = 1.0 - std::pow(static_cast<double>(p.beta2), t);
  PSD_REQUIRE_ARG(*bc1 > 0.0 && *bc2 > 0.0, call, ": bias correction vanished (beta1 = ",
                  p.beta1, ", beta2 = ", p.beta2, ", step = ", p.step, ")");
  return Status::Ok();
}

// FusedResidualTopK's sizes, factor and buffers (the workspace's maker is the implementation's
// own check).
inline Status CheckTopKArgs(const char* call, const float* grad, const float* residual,
                            const float* momentum_buf, float momentum, size_t n, size_t k,
                            const uint32_t* out_idx, const float* out_val,
                            const KernelWorkspace* ws) {
  PSD_REQUIRE_ARG(k > 0, call, ": k is 0 (n = ", n, "); expected 0 < k <= n");
  PSD_REQUIRE_ARG(k <= n, call, ": k is ", k, " but n is ", n, "; expected 0 < k <= n");
  PSD_REQUIRE_ARG(n <= std::numeric_limits<uint32_t>::max(), call, ": n is ", n,
                  "; expected at most 4294967295 (indices are uint32)");
  PSD_REQUIRE_ARG(grad != nullptr, call, ": grad is null with n = ", n);
  PSD_REQUIRE_ARG(residual != nullptr, call, ": residual is null with n = ", n);
  PSD_REQUIRE_ARG(out_idx != nullptr, call, ": out_idx is null with k = ", k);
  PSD_REQUIRE_ARG(out_val != nullptr, call, ": out_val is null with k = ", k);
  PSD_REQUIRE_ARG(std::isfinite(momentum), call, ": momentum is ", momentum,
                  "; expected a finite factor");
  PSD_REQUIRE_ARG(momentum_buf != nullptr || momentum == 0.0f, call, ": momentum is ", momentum,
                  " but momentum_buf is null; pass a buffer of n floats or momentum 0");
  PSD_REQUIRE_ARG(static_cast<const void*>(grad) != residual &&
                      static_cast<const void*>(grad) != momentum_buf && residual != momentum_buf,
                  call, ": grad, residual and momentum_buf must be distinct buffers");
  PSD_REQUIRE_ARG(ws != nullptr, call, ": workspace is null; expected one from NewWorkspace()");
  return Status::Ok();
}

// ScatterAdd's buffers, for m > 0 entries (index range: the implementation's, it needs them).
inline Status CheckScatterAddArgs(const uint32_t* idx, const float* val, size_t m,
                                  const float* dense) {
  PSD_REQUIRE_ARG(idx != nullptr, "ScatterAdd: idx is null with m = ", m);
  PSD_REQUIRE_ARG(val != nullptr, "ScatterAdd: val is null with m = ", m);
  PSD_REQUIRE_ARG(dense != nullptr, "ScatterAdd: dense is null with m = ", m, " entries to add");
  return Status::Ok();
}

// ScatterAddBlocks' shape: the blocks, dense and the workspace (k == 0 or no blocks: nothing
// to add, only the workspace is needed).
inline Status CheckScatterAddBlocksArgs(const void* blocks, int num_blocks, size_t k,
                                        const float* dense, size_t n, const void* ws) {
  constexpr const char* kCall = "ScatterAddBlocks";
  PSD_REQUIRE_ARG(ws != nullptr, kCall, ": workspace is null; expected one from "
                  "NewScatterWorkspace()");
  PSD_REQUIRE_ARG(num_blocks >= 0 && static_cast<uint64_t>(num_blocks) < (uint64_t{1} << 28),
                  kCall, ": num_blocks is ", num_blocks, "; expected 0 <= num_blocks < 2^28");
  PSD_REQUIRE_ARG(n <= 0xffffffffu, kCall, ": n is ", n, "; expected n <= 2^32 - 1");
  PSD_REQUIRE_ARG(k <= n, kCall, ": k is ", k, " but n is ", n,
                  "; expected k <= n (indices are distinct)");
  if (k == 0 || num_blocks == 0) return Status::Ok();
  PSD_REQUIRE_ARG(blocks != nullptr, kCall, ": blocks is null with ", num_blocks,
                  " blocks of k = ", k);
  PSD_REQUIRE_ARG(dense != nullptr, kCall, ": dense is null with n = ", n);
  return Status::Ok();
}

// SufficientFactorGemm's shape and factors; the buffers only when there is work (m, n > 0; u
// and v when rows > 0 and alpha != 0).
inline Status CheckGemmArgs(const char* call, const float* u, const float* v, size_t rows,
                            size_t m, size_t n, float alpha, float beta, const float* g) {
  PSD_REQUIRE_ARG(rows <= INT_MAX && m <= INT_MAX && n <= INT_MAX, call, ": shape rows = ", rows,
                  ", m = ", m, ", n = ", n,
                  " exceeds the BLAS index range; expected each <= ", INT_MAX);
  PSD_REQUIRE_ARG(std::isfinite(alpha) && std::isfinite(beta), call, ": alpha = ", alpha,
                  ", beta = ", beta, "; expected finite factors");
  if (m == 0 || n == 0) return Status::Ok();
  PSD_REQUIRE_ARG(g != nullptr, call, ": g is null with m = ", m, ", n = ", n);
  if (rows == 0 || alpha == 0.0f) return Status::Ok();
  PSD_REQUIRE_ARG(u != nullptr, call, ": u is null with rows = ", rows, ", m = ", m);
  PSD_REQUIRE_ARG(v != nullptr, call, ": v is null with rows = ", rows, ", n = ", n);
  return Status::Ok();
}

}  // namespace poseidon::kernel_checks
