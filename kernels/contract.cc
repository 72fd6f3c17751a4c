// The public calls of Kernels (kernels/kernels.h): the argument checks of the contract that do
// not depend on where memory lives, written once for every implementation (so all of them refuse
// the same inputs with the same message), the early return of the empty calls, then the
// implementation's Do... hook. Built as poseidon_kernels_contract, which the CPU and the CUDA
// kernels both link; host code only, no CUDA.
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "kernels/kernels.h"
#include "runtime/status.h"

namespace poseidon {
namespace {

bool NonNegativeFinite(float x) { return std::isfinite(x) && x >= 0.0f; }

// Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte.
bool Overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

// num gradient pieces at grads + g * stride, n floats each, must not overlap.
Status CheckPieces(const char* call, const float* grads, int num, size_t stride, size_t n) {
  PSD_REQUIRE_ARG(num >= 1, call, ": num_grads is ", num, "; expected >= 1");
  PSD_REQUIRE_ARG(grads != nullptr, call, ": grads is null with n = ", n);
  PSD_REQUIRE_ARG(num == 1 || stride >= n, call, ": grad_stride is ", stride, " but n is ", n,
                  "; expected grad_stride >= n so the ", num, " pieces do not overlap");
  return Status::Ok();
}

// The parts of a Pack / Unpack: non-null wherever they hold bytes. Sets *total to their size.
template <typename Range>
Status CheckParts(const char* call, const std::vector<Range>& parts, size_t* total) {
  *total = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    PSD_REQUIRE_ARG(parts[i].data != nullptr || parts[i].bytes == 0, call, ": parts[", i,
                    "].data is null with ", parts[i].bytes, " bytes");
    *total += parts[i].bytes;
  }
  return Status::Ok();
}

}  // namespace

Status Kernels::FusedResidualTopK(const float* grad, float* residual, float* momentum_buf,
                                  float momentum, size_t n, size_t k, uint32_t* out_idx,
                                  float* out_val, KernelWorkspace* ws, void* stream) const {
  constexpr const char* kCall = "FusedResidualTopK";
  PSD_REQUIRE_ARG(k > 0, kCall, ": k is 0 (n = ", n, "); expected 0 < k <= n");
  PSD_REQUIRE_ARG(k <= n, kCall, ": k is ", k, " but n is ", n, "; expected 0 < k <= n");
  PSD_REQUIRE_ARG(n <= std::numeric_limits<uint32_t>::max(), kCall, ": n is ", n,
                  "; expected at most 4294967295 (indices are uint32)");
  PSD_REQUIRE_ARG(grad != nullptr, kCall, ": grad is null with n = ", n);
  PSD_REQUIRE_ARG(residual != nullptr, kCall, ": residual is null with n = ", n);
  PSD_REQUIRE_ARG(out_idx != nullptr, kCall, ": out_idx is null with k = ", k);
  PSD_REQUIRE_ARG(out_val != nullptr, kCall, ": out_val is null with k = ", k);
  PSD_REQUIRE_ARG(std::isfinite(momentum), kCall, ": momentum is ", momentum,
                  "; expected a finite factor");
  PSD_REQUIRE_ARG(momentum_buf != nullptr || momentum == 0.0f, kCall, ": momentum is ", momentum,
                  " but momentum_buf is null; pass a buffer of n floats or momentum 0");
  PSD_REQUIRE_ARG(grad != residual && grad != momentum_buf && residual != momentum_buf, kCall,
                  ": grad, residual and momentum_buf must be distinct buffers");
  PSD_REQUIRE_ARG(ws != nullptr, kCall, ": workspace is null; expected one from NewWorkspace()");
  return DoFusedResidualTopK(grad, residual, momentum_buf, momentum, n, k, out_idx, out_val, ws,
                             stream);
}

Status Kernels::ScatterAdd(const uint32_t* idx, const float* val, size_t m, float* dense, size_t n,
                           void* stream) const {
  if (m == 0) return Status::Ok();
  PSD_REQUIRE_ARG(idx != nullptr, "ScatterAdd: idx is null with m = ", m);
  PSD_REQUIRE_ARG(val != nullptr, "ScatterAdd: val is null with m = ", m);
  PSD_REQUIRE_ARG(dense != nullptr, "ScatterAdd: dense is null with m = ", m, " entries to add");
  return DoScatterAdd(idx, val, m, dense, n, stream);
}

Status Kernels::ScatterAddBlocks(const void* blocks, int num_blocks, size_t k, float* dense,
                                 size_t n, ScatterWorkspace* ws, void* stream) const {
  constexpr const char* kCall = "ScatterAddBlocks";
  PSD_REQUIRE_ARG(ws != nullptr, kCall,
                  ": workspace is null; expected one from NewScatterWorkspace()");
  PSD_REQUIRE_ARG(num_blocks >= 0 && static_cast<uint64_t>(num_blocks) < (uint64_t{1} << 28), kCall,
                  ": num_blocks is ", num_blocks, "; expected 0 <= num_blocks < 2^28");
  PSD_REQUIRE_ARG(n <= 0xffffffffu, kCall, ": n is ", n, "; expected n <= 2^32 - 1");
  PSD_REQUIRE_ARG(k <= n, kCall, ": k is ", k, " but n is ", n,
                  "; expected k <= n (indices are distinct)");
  if (k > 0 && num_blocks > 0) {
    PSD_REQUIRE_ARG(blocks != nullptr, kCall, ": blocks is null with ", num_blocks,
                    " blocks of k = ", k);
    PSD_REQUIRE_ARG(dense != nullptr, kCall, ": dense is null with n = ", n);
  }
  // Called even with nothing to add: the hook checks the workspace's maker and reports its
  // sticky fault.
  return DoScatterAddBlocks(blocks, num_blocks, k, dense, n, ws, stream);
}

Status Kernels::SufficientFactorGemm(const float* u, const float* v, size_t rows, size_t m,
                                     size_t n, float alpha, float beta, float* g,
                                     void* stream) const {
  constexpr const char* kCall = "SufficientFactorGemm";
  PSD_REQUIRE_ARG(rows <= INT_MAX && m <= INT_MAX && n <= INT_MAX, kCall, ": shape rows = ", rows,
                  ", m = ", m, ", n = ", n,
                  " exceeds the BLAS index range; expected each <= ", INT_MAX);
  PSD_REQUIRE_ARG(std::isfinite(alpha) && std::isfinite(beta), kCall, ": alpha = ", alpha,
                  ", beta = ", beta, "; expected finite factors");
  if (m == 0 || n == 0) return Status::Ok();
  PSD_REQUIRE_ARG(g != nullptr, kCall, ": g is null with m = ", m, ", n = ", n);
  if (rows > 0 && alpha != 0.0f) {  // else neither factor is read
    PSD_REQUIRE_ARG(u != nullptr, kCall, ": u is null with rows = ", rows, ", m = ", m);
    PSD_REQUIRE_ARG(v != nullptr, kCall, ": v is null with rows = ", rows, ", n = ", n);
  }
  return DoSufficientFactorGemm(u, v, rows, m, n, alpha, beta, g, stream);
}

Status Kernels::Pack(const std::vector<ConstByteRange>& parts, void* dst, void* stream) const {
  size_t total = 0;
  PSD_CHECK(CheckParts("Pack", parts, &total));
  if (total == 0) return Status::Ok();
  PSD_REQUIRE_ARG(dst != nullptr, "Pack: dst is null with ", total, " bytes to pack");
  return DoPack(parts, dst, total, stream);
}

Status Kernels::Unpack(const void* src, const std::vector<ByteRange>& parts, void* stream) const {
  size_t total = 0;
  PSD_CHECK(CheckParts("Unpack", parts, &total));
  if (total == 0) return Status::Ok();
  PSD_REQUIRE_ARG(src != nullptr, "Unpack: src is null with ", total, " bytes to unpack");
  return DoUnpack(src, parts, total, stream);
}

Status Kernels::SgdStep(float* param, const float* grads, int num_grads, size_t grad_stride,
                        float grad_scale, float* velocity, size_t n, const SgdParams& p,
                        void* stream) const {
  constexpr const char* kCall = "SgdStep";
  PSD_REQUIRE_ARG(NonNegativeFinite(p.lr), kCall, ": lr is ", p.lr, "; expected finite >= 0");
  PSD_REQUIRE_ARG(NonNegativeFinite(p.momentum), kCall, ": momentum is ", p.momentum,
                  "; expected finite >= 0");
  PSD_REQUIRE_ARG(NonNegativeFinite(p.weight_decay), kCall, ": weight_decay is ", p.weight_decay,
                  "; expected finite >= 0");
  PSD_REQUIRE_ARG(!p.nesterov || p.momentum > 0.0f, kCall,
                  ": nesterov needs momentum > 0 (momentum is ", p.momentum, ")");
  PSD_REQUIRE_ARG(std::isfinite(grad_scale), kCall, ": grad_scale is ", grad_scale,
                  "; expected a finite factor");
  if (n == 0) return Status::Ok();
  PSD_CHECK(CheckPieces(kCall, grads, num_grads, grad_stride, n));
  PSD_REQUIRE_ARG(param != nullptr, kCall, ": param is null with n = ", n);
  PSD_REQUIRE_ARG(velocity != nullptr || p.momentum == 0.0f, kCall, ": momentum is ", p.momentum,
                  " but velocity is null; expected a buffer of n = ", n, " floats");
  return DoSgdStep(param, grads, num_grads, grad_stride, grad_scale, velocity, n, p, stream);
}

Status Kernels::AdamStep(float* param, const float* grads, int num_grads, size_t grad_stride,
                         float grad_scale, float* m, float* v, size_t n, const AdamParams& p,
                         void* stream) const {
  constexpr const char* kCall = "AdamStep";
  PSD_REQUIRE_ARG(NonNegativeFinite(p.lr), kCall, ": lr is ", p.lr, "; expected finite >= 0");
  PSD_REQUIRE_ARG(p.beta1 >= 0.0f && p.beta1 < 1.0f, kCall, ": beta1 is ", p.beta1,
                  "; expected 0 <= beta1 < 1");
  PSD_REQUIRE_ARG(p.beta2 >= 0.0f && p.beta2 < 1.0f, kCall, ": beta2 is ", p.beta2,
                  "; expected 0 <= beta2 < 1");
  PSD_REQUIRE_ARG(NonNegativeFinite(p.eps), kCall, ": eps is ", p.eps, "; expected finite >= 0");
  PSD_REQUIRE_ARG(NonNegativeFinite(p.weight_decay), kCall, ": weight_decay is ", p.weight_decay,
                  "; expected finite >= 0");
  PSD_REQUIRE_ARG(p.step >= 1, kCall, ": step is ", p.step,
                  "; expected the 1-based count of steps taken, >= 1");
  PSD_REQUIRE_ARG(std::isfinite(grad_scale), kCall, ": grad_scale is ", grad_scale,
                  "; expected a finite factor");
  if (n == 0) return Status::Ok();
  PSD_CHECK(CheckPieces(kCall, grads, num_grads, grad_stride, n));
  PSD_REQUIRE_ARG(param != nullptr, kCall, ": param is null with n = ", n);
  PSD_REQUIRE_ARG(m != nullptr, kCall, ": m (first moment) is null with n = ", n);
  PSD_REQUIRE_ARG(v != nullptr, kCall, ": v (second moment) is null with n = ", n);
  // The bias corrections 1 - beta^step, in double; the hook gets them as two floats.
  const double t = static_cast<double>(p.step);
  const double bc1 = 1.0 - std::pow(static_cast<double>(p.beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(p.beta2), t);
  PSD_REQUIRE_ARG(bc1 > 0.0 && bc2 > 0.0, kCall, ": bias correction vanished (beta1 = ", p.beta1,
                  ", beta2 = ", p.beta2, ", step = ", p.step, ")");
  return DoAdamStep(param, grads, num_grads, grad_stride, grad_scale, m, v, n, p,
                    static_cast<float>(p.lr / bc1), static_cast<float>(1.0 / std::sqrt(bc2)),
                    stream);
}

Status Kernels::Scale(float* data, size_t n, float scale, void* stream) const {
  PSD_REQUIRE_ARG(std::isfinite(scale), "Scale: scale is ", scale, "; expected a finite factor");
  if (n == 0) return Status::Ok();
  PSD_REQUIRE_ARG(data != nullptr, "Scale: data is null with n = ", n);
  return DoScale(data, n, scale, stream);
}

Status Kernels::Fill(float* data, size_t n, float value, void* stream) const {
  if (n == 0) return Status::Ok();
  PSD_REQUIRE_ARG(data != nullptr, "Fill: data is null with n = ", n);
  return DoFill(data, n, value, stream);
}

Status Kernels::Copy(void* dst, const void* src, size_t bytes, void* stream) const {
  if (bytes == 0 || dst == src) return Status::Ok();
  PSD_REQUIRE_ARG(dst != nullptr, "Copy: dst is null with ", bytes, " bytes to copy");
  PSD_REQUIRE_ARG(src != nullptr, "Copy: src is null with ", bytes, " bytes to copy");
  const auto d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
  PSD_REQUIRE_ARG(!Overlap(dst, bytes, src, bytes), "Copy: dst and src overlap (", bytes,
                  " bytes, ", d > s ? d - s : s - d,
                  " bytes apart); expected disjoint ranges or dst == src");
  return DoCopy(dst, src, bytes, stream);
}

}  // namespace poseidon
