// Argument checks of the Kernels contract that do not depend on where memory lives, shared by
// the CPU kernels and their CUDA twins so both refuse the same inputs with the same message.
// Header-only: kernels/cpu and kernels/cuda are separate libraries.
#pragma once

#include <cmath>
#include <cstddef>

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

}  // namespace poseidon::kernel_checks
