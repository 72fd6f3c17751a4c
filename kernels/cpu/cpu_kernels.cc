// The host-memory Kernels: CpuKernels(), whose Do hooks run after the contract's checks
// (kernels/contract.cc). The small kernels (scatter-add, the sufficient-factor GEMM through BLAS,
// pack / unpack, the memory calls) are written here; the top-k, the casts and the optimizer
// steps are in their own files (cpu_impl.h). What is checked here needs the host side: that a
// workspace is CpuKernels()', the indices of a scatter-add (read from the data), host memory.
// Stream arguments are ignored: host kernels run synchronously.
#include <cblas.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/owned_buffer.h"
#include "kernels/scatter_report.h"

namespace poseidon {
namespace cpu {
namespace {

// Keeps the first fault found (ScatterWorkspace::Fault); no scratch is needed on the host.
class HostScatterWorkspace final : public ScatterWorkspace {
 public:
  Status Fault() const override { return fault; }
  Status fault;
};

// Frees a block of Allocate (std::aligned_alloc).
void FreeHost(void* data) { std::free(data); }

// The alignment of Allocate: a cache line, the widest vector load.
constexpr size_t kAlignment = 64;

class CpuKernelsImpl final : public Kernels {
 public:
  CpuKernelsImpl() : Kernels(MemoryKind::kHost, "cpu") {}

 private:
  std::unique_ptr<KernelWorkspace> DoNewWorkspace() const override {
    return std::make_unique<TopKWorkspace>();
  }

  Status DoFusedResidualTopK(const float* grad, float* residual, float* momentum_buf,
                             float momentum, size_t n, size_t k, uint32_t* out_idx,
                             float* out_val, KernelWorkspace* ws, void* /*stream*/) const override {
    auto* w = dynamic_cast<TopKWorkspace*>(ws);
    PSD_REQUIRE_ARG(w != nullptr,
                    "FusedResidualTopK: workspace was made by another Kernels implementation; "
                    "expected one from CpuKernels().NewWorkspace()");
    return cpu::FusedResidualTopK(grad, residual, momentum_buf, momentum, n, k, out_idx, out_val,
                                  w);
  }

  Status DoScatterAdd(const uint32_t* idx, const float* val, size_t m, float* dense, size_t n,
                      void* /*stream*/) const override {
    // Check every index before touching dense, so a bad index leaves it unchanged.
    for (size_t j = 0; j < m; ++j) {
      PSD_REQUIRE_ARG(idx[j] < n, "ScatterAdd: idx[", j, "] is ", idx[j], " but n is ", n,
                      "; expected every index < n");
    }
    // Duplicates accumulate in position order (j ascending), so results are deterministic.
    for (size_t j = 0; j < m; ++j) dense[idx[j]] += val[j];
    return Status::Ok();
  }

  std::unique_ptr<ScatterWorkspace> DoNewScatterWorkspace() const override {
    return std::make_unique<HostScatterWorkspace>();
  }

  // Checks every block before touching dense; a fault is returned and kept in ws.
  Status DoScatterAddBlocks(const void* blocks, int num_blocks, size_t k, float* dense, size_t n,
                            ScatterWorkspace* ws, void* /*stream*/) const override {
    auto* w = dynamic_cast<HostScatterWorkspace*>(ws);
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

  Status DoSufficientFactorGemm(const float* u, const float* v, size_t rows, size_t m, size_t n,
                                float alpha, float beta, float* g,
                                void* /*stream*/) const override {
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
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(m),
                static_cast<int>(n), static_cast<int>(rows), alpha, u, static_cast<int>(m), v,
                static_cast<int>(n), beta, g, static_cast<int>(n));
    return Status::Ok();
  }

  Status DoPack(const std::vector<ConstByteRange>& parts, void* dst, size_t /*total_bytes*/,
                void* /*stream*/) const override {
    auto* out = static_cast<char*>(dst);
    for (const ConstByteRange& part : parts) {
      if (part.bytes == 0) continue;
      std::memcpy(out, part.data, part.bytes);
      out += part.bytes;
    }
    return Status::Ok();
  }

  Status DoUnpack(const void* src, const std::vector<ByteRange>& parts, size_t /*total_bytes*/,
                  void* /*stream*/) const override {
    const auto* in = static_cast<const char*>(src);
    for (const ByteRange& part : parts) {
      if (part.bytes == 0) continue;
      std::memcpy(part.data, in, part.bytes);
      in += part.bytes;
    }
    return Status::Ok();
  }

  Status DoSgdStep(float* param, const float* grads, int num_grads, size_t grad_stride,
                   float grad_scale, float* velocity, size_t n, const SgdParams& p,
                   void* /*stream*/) const override {
    cpu::SgdStep(param, grads, num_grads, grad_stride, grad_scale, velocity, n, p);
    return Status::Ok();
  }

  Status DoAdamStep(float* param, const float* grads, int num_grads, size_t grad_stride,
                    float grad_scale, float* m, float* v, size_t n, const AdamParams& p,
                    float step_size, float inv_bc2_sqrt, void* /*stream*/) const override {
    cpu::AdamStep(param, grads, num_grads, grad_stride, grad_scale, m, v, n, p, step_size,
                  inv_bc2_sqrt);
    return Status::Ok();
  }

  // Zero-filled host memory aligned to kAlignment.
  Result<std::unique_ptr<KernelBuffer>> DoAllocate(size_t bytes) const override {
    if (bytes == 0) {
      return std::unique_ptr<KernelBuffer>(
          new OwnedKernelBuffer(nullptr, 0, MemoryKind::kHost, FreeHost));
    }
    PSD_REQUIRE_ARG(bytes <= SIZE_MAX - kAlignment, "Allocate: ", bytes,
                    " bytes is beyond the address space; expected a buffer size that fits");
    // aligned_alloc needs a size that is a multiple of the alignment.
    const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, rounded);
    PSD_REQUIRE(p != nullptr, StatusCode::kUnavailable, "Allocate: ", bytes,
                " bytes of host memory are not available (aligned_alloc failed)");
    std::memset(p, 0, rounded);
    return std::unique_ptr<KernelBuffer>(
        new OwnedKernelBuffer(p, bytes, MemoryKind::kHost, FreeHost));
  }

  Status DoScale(float* data, size_t n, float scale, void* /*stream*/) const override {
    // One multiply per element, nothing fused: the CUDA twin and the engine's host average
    // compute the same float32 products.
    for (size_t i = 0; i < n; ++i) data[i] *= scale;
    return Status::Ok();
  }

  Status DoFill(float* data, size_t n, float value, void* /*stream*/) const override {
    for (size_t i = 0; i < n; ++i) data[i] = value;
    return Status::Ok();
  }

  Status DoCopy(void* dst, const void* src, size_t bytes, void* /*stream*/) const override {
    std::memcpy(dst, src, bytes);
    return Status::Ok();
  }

  Status DoSynchronize(void* /*stream*/) const override { return Status::Ok(); }
};

}  // namespace
}  // namespace cpu

const Kernels& CpuKernels() {
  static const cpu::CpuKernelsImpl kernels;
  return kernels;
}

}  // namespace poseidon
