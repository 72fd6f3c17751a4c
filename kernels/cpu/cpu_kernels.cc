// The host-memory Kernels: the small kernels (scatter-add, the sufficient-factor GEMM through
// BLAS, pack / unpack) and the CpuKernels() object that exposes every CPU kernel behind the
// Kernels interface (stream arguments are ignored: host kernels run synchronously).
#include "kernels/cpu/cpu_kernels.h"

#include <cblas.h>

#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "kernels/contract_checks.h"
#include "kernels/scatter_report.h"

namespace poseidon {
namespace cpu {

Status ScatterAdd(const uint32_t* idx, const float* val, size_t m, float* dense, size_t n) {
  if (m == 0) return Status::Ok();
  PSD_CHECK(kernel_checks::CheckScatterAddArgs(idx, val, m, dense));
  // Check every index before touching dense, so a bad index leaves it unchanged.
  for (size_t j = 0; j < m; ++j) {
    PSD_REQUIRE_ARG(idx[j] < n, "ScatterAdd: idx[", j, "] is ", idx[j], " but n is ", n,
                    "; expected every index < n");
  }
  // Duplicates accumulate in position order (j ascending), so results are deterministic.
  for (size_t j = 0; j < m; ++j) dense[idx[j]] += val[j];
  return Status::Ok();
}

Status ScatterAddBlocks(const void* blocks, int num_blocks, size_t k, float* dense, size_t n,
                        ::poseidon::ScatterWorkspace* ws) {
  PSD_CHECK(kernel_checks::CheckScatterAddBlocksArgs(blocks, num_blocks, k, dense, n, ws));
  auto* w = dynamic_cast<ScatterWorkspace*>(ws);
  PSD_REQUIRE_ARG(w != nullptr, "ScatterAddBlocks: workspace was made by another Kernels "
                  "implementation; expected one from CpuKernels().NewScatterWorkspace()");
  PSD_CHECK(w->fault);  // sticky, as on the device
  if (k == 0 || num_blocks == 0) return Status::Ok();
  const auto* base = static_cast<const unsigned char*>(blocks);
  auto index = [&](int b, size_t j) {
    uint32_t v;
    std::memcpy(&v, base + (2 * k * static_cast<size_t>(b) + j) * 4, 4);
    return v;
  };
  // The first fault by kind, then block, then position: what the device's atomic min keeps.
  scatter_report::Report report;
  for (int b = 0; b < num_blocks; ++b) {
    for (size_t j = 0; j < k; ++j) {
      const uint32_t i = index(b, j);
      uint64_t word = scatter_report::kClean;
      if (i >= n) {
        word = scatter_report::Encode(scatter_report::kIndexOutOfRange, b, j);
      } else if (j > 0 && i <= index(b, j - 1)) {
        word = scatter_report::Encode(scatter_report::kNotAscending, b, j);
      }
      if (word < report.word) {
        report.word = word;
        report.index = i;
        report.previous = j > 0 ? index(b, j - 1) : 0;
      }
    }
  }
  if (report.word != scatter_report::kClean) {
    w->fault = scatter_report::ReportStatus(report, n);
    return w->fault;
  }
  for (int b = 0; b < num_blocks; ++b) {
    const unsigned char* vals = base + (2 * k * static_cast<size_t>(b) + k) * 4;
    for (size_t j = 0; j < k; ++j) {
      float v;
      std::memcpy(&v, vals + 4 * j, 4);
      dense[index(b, j)] += v;
    }
  }
  return Status::Ok();
}

Status SufficientFactorGemm(const float* u, const float* v, size_t rows, size_t m, size_t n,
                            float alpha, float beta, float* g) {
  PSD_CHECK(kernel_checks::CheckGemmArgs("SufficientFactorGemm", u, v, rows, m, n, alpha, beta,
                                         g));
  if (m == 0 || n == 0) return Status::Ok();
  if (rows == 0 || alpha == 0.0f) {
    // No factors: G = beta * G. BLAS implementations differ on K = 0, so do it here; beta = 0
    // overwrites (NaN in G does not survive), as BLAS specifies.
    const size_t count = m * n;
    if (beta == 0.0f) {
      std::memset(g, 0, count * sizeof(float));
    } else if (beta != 1.0f) {
      for (size_t i = 0; i < count; ++i) g[i] *= beta;
    }
    return Status::Ok();
  }
  // Row-major G (m x n) = alpha * U^T (m x rows) * V (rows x n) + beta * G.
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(rows), alpha, u, static_cast<int>(m), v, static_cast<int>(n), beta,
              g, static_cast<int>(n));
  return Status::Ok();
}

Status Pack(const std::vector<ConstByteRange>& parts, void* dst) {
  size_t total = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    PSD_REQUIRE_ARG(parts[i].data != nullptr || parts[i].bytes == 0, "Pack: parts[", i,
                    "].data is null with ", parts[i].bytes, " bytes");
    total += parts[i].bytes;
  }
  if (total == 0) return Status::Ok();
  PSD_REQUIRE_ARG(dst != nullptr, "Pack: dst is null with ", total, " bytes to pack");
  auto* out = static_cast<char*>(dst);
  for (const ConstByteRange& part : parts) {
    if (part.bytes == 0) continue;
    std::memcpy(out, part.data, part.bytes);
    out += part.bytes;
  }
  return Status::Ok();
}

Status Unpack(const void* src, const std::vector<ByteRange>& parts) {
  size_t total = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    PSD_REQUIRE_ARG(parts[i].data != nullptr || parts[i].bytes == 0, "Unpack: parts[", i,
                    "].data is null with ", parts[i].bytes, " bytes");
    total += parts[i].bytes;
  }
  if (total == 0) return Status::Ok();
  PSD_REQUIRE_ARG(src != nullptr, "Unpack: src is null with ", total, " bytes to unpack");
  const auto* in = static_cast<const char*>(src);
  for (const ByteRange& part : parts) {
    if (part.bytes == 0) continue;
    std::memcpy(part.data, in, part.bytes);
    in += part.bytes;
  }
  return Status::Ok();
}

namespace {

// Host memory from std::aligned_alloc, zero-filled, freed with std::free.
class HostBuffer final : public KernelBuffer {
 public:
  HostBuffer(void* data, size_t bytes) : data_(data), bytes_(bytes) {}
  ~HostBuffer() override { std::free(data_); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  void* data() const override { return data_; }
  size_t bytes() const override { return bytes_; }
  MemoryKind memory() const override { return MemoryKind::kHost; }

 private:
  void* data_;
  size_t bytes_;
};

constexpr size_t kAlignment = 64;

}  // namespace

Result<std::unique_ptr<KernelBuffer>> Allocate(size_t bytes) {
  if (bytes == 0) return std::unique_ptr<KernelBuffer>(new HostBuffer(nullptr, 0));
  PSD_REQUIRE_ARG(bytes <= SIZE_MAX - kAlignment, "Allocate: ", bytes,
                  " bytes is beyond the address space; expected a buffer size that fits");
  // aligned_alloc needs a size that is a multiple of the alignment.
  const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded);
  PSD_REQUIRE(p != nullptr, StatusCode::kUnavailable, "Allocate: ", bytes,
              " bytes of host memory are not available (aligned_alloc failed)");
  std::memset(p, 0, rounded);
  return std::unique_ptr<KernelBuffer>(new HostBuffer(p, bytes));
}

Status Scale(float* data, size_t n, float scale) {
  PSD_REQUIRE_ARG(std::isfinite(scale), "Scale: scale is ", scale, "; expected a finite factor");
  if (n == 0) return Status::Ok();
  PSD_REQUIRE_ARG(data != nullptr, "Scale: data is null with n = ", n);
  // One multiply per element, nothing fused: the CUDA twin and the engine's host average
  // compute the same float32 products.
  for (size_t i = 0; i < n; ++i) data[i] *= scale;
  return Status::Ok();
}

Status Fill(float* data, size_t n, float value) {
  if (n == 0) return Status::Ok();
  PSD_REQUIRE_ARG(data != nullptr, "Fill: data is null with n = ", n);
  for (size_t i = 0; i < n; ++i) data[i] = value;
  return Status::Ok();
}

Status Copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return Status::Ok();
  PSD_REQUIRE_ARG(dst != nullptr, "Copy: dst is null with ", bytes, " bytes to copy");
  PSD_REQUIRE_ARG(src != nullptr, "Copy: src is null with ", bytes, " bytes to copy");
  const auto d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
  PSD_REQUIRE_ARG(d + bytes <= s || s + bytes <= d, "Copy: dst and src overlap (", bytes,
                  " bytes, ", d > s ? d - s : s - d,
                  " bytes apart); expected disjoint ranges or dst == src");
  std::memcpy(dst, src, bytes);
  return Status::Ok();
}

namespace {

class CpuKernelsImpl final : public Kernels {
 public:
  MemoryKind memory() const override { return MemoryKind::kHost; }
  const char* name() const override { return "cpu"; }

  std::unique_ptr<KernelWorkspace> NewWorkspace() const override {
    return std::make_unique<TopKWorkspace>();
  }

  Status FusedResidualTopK(const float* grad, float* residual, float* momentum_buf, float momentum,
                           size_t n, size_t k, uint32_t* out_idx, float* out_val,
                           KernelWorkspace* ws, void* /*stream*/) const override {
    return cpu::FusedResidualTopK(grad, residual, momentum_buf, momentum, n, k, out_idx, out_val,
                                  ws);
  }
  std::unique_ptr<::poseidon::ScatterWorkspace> NewScatterWorkspace() const override {
    return std::make_unique<cpu::ScatterWorkspace>();
  }
  Status ScatterAddBlocks(const void* blocks, int num_blocks, size_t k, float* dense, size_t n,
                          ::poseidon::ScatterWorkspace* ws, void* /*stream*/) const override {
    return cpu::ScatterAddBlocks(blocks, num_blocks, k, dense, n, ws);
  }

  Status ScatterAdd(const uint32_t* idx, const float* val, size_t m, float* dense, size_t n,
                    void* /*stream*/) const override {
    return cpu::ScatterAdd(idx, val, m, dense, n);
  }
  Status SufficientFactorGemm(const float* u, const float* v, size_t rows, size_t m, size_t n,
                              float alpha, float beta, float* g, void* /*stream*/) const override {
    return cpu::SufficientFactorGemm(u, v, rows, m, n, alpha, beta, g);
  }
  Status Cast(const void* src, DType src_type, void* dst, DType dst_type, size_t count,
              void* /*stream*/) const override {
    return cpu::Cast(src, src_type, dst, dst_type, count);
  }
  Status Pack(const std::vector<ConstByteRange>& parts, void* dst,
              void* /*stream*/) const override {
    return cpu::Pack(parts, dst);
  }
  Status Unpack(const void* src, const std::vector<ByteRange>& parts,
                void* /*stream*/) const override {
    return cpu::Unpack(src, parts);
  }
  Status SgdStep(float* param, const float* grads, int num_grads, size_t grad_stride,
                 float grad_scale, float* velocity, size_t n, const SgdParams& p,
                 void* /*stream*/) const override {
    return cpu::SgdStep(param, grads, num_grads, grad_stride, grad_scale, velocity, n, p);
  }
  Status AdamStep(float* param, const float* grads, int num_grads, size_t grad_stride,
                  float grad_scale, float* m, float* v, size_t n, const AdamParams& p,
                  void* /*stream*/) const override {
    return cpu::AdamStep(param, grads, num_grads, grad_stride, grad_scale, m, v, n, p);
  }
  Status SumInto(float* dst, const float* src, int num, size_t stride, size_t n,
                 void* /*stream*/) const override {
    return cpu::SumInto(dst, src, num, stride, n);
  }
  Result<std::unique_ptr<KernelBuffer>> Allocate(size_t bytes) const override {
    return cpu::Allocate(bytes);
  }
  Status Scale(float* data, size_t n, float scale, void* /*stream*/) const override {
    return cpu::Scale(data, n, scale);
  }
  Status Fill(float* data, size_t n, float value, void* /*stream*/) const override {
    return cpu::Fill(data, n, value);
  }
  Status Copy(void* dst, const void* src, size_t bytes, void* /*stream*/) const override {
    return cpu::Copy(dst, src, bytes);
  }
  Status Synchronize(void* /*stream*/) const override { return Status::Ok(); }
};

}  // namespace
}  // namespace cpu

const Kernels& CpuKernels() {
  static const cpu::CpuKernelsImpl kernels;
  return kernels;
}

}  // namespace poseidon
