// Host-memory implementation of the Kernels contract (kernels/kernels.h). Callers normally use
// CpuKernels(); the free functions below are the same kernels without the virtual call, for
// other CPU code in Poseidon and for the tests and benchmarks.
//
// All functions are synchronous, thread-compatible (no shared mutable state; a workspace must
// not be used by two calls at once) and deterministic: the same inputs give bit-identical
// outputs on every run and every instruction set the dispatcher may pick.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/kernels.h"

namespace poseidon {
namespace cpu {

// Scratch for FusedResidualTopK: candidate buffers and radix histograms, grown on demand and
// kept across calls (any n may follow any other n).
class TopKWorkspace final : public KernelWorkspace {
 public:
  std::vector<uint32_t> cand_idx;
  std::vector<float> cand_val;
  std::vector<uint32_t> keys;  // sample keys, then candidate keys
  std::vector<uint32_t> hist;  // radix histogram (65536 buckets)
  // Statistics of the last call, for tests and benchmarks: whether the sampled threshold
  // produced the selection (true) or the exact radix select over the residual did (false).
  bool last_used_sample = false;
  size_t last_candidates = 0;
};

// The sort key of a value: its magnitude's float bits, which order like the magnitudes. Every
// NaN maps to one key above +infinity, so NaNs are selected first (smaller index first).
inline constexpr uint32_t kNaNKey = 0x7f800001u;

Status FusedResidualTopK(const float* grad, float* residual, float* momentum_buf, float momentum,
                         size_t n, size_t k, uint32_t* out_idx, float* out_val,
                         KernelWorkspace* ws);

Status ScatterAdd(const uint32_t* idx, const float* val, size_t m, float* dense, size_t n);

// Keeps the first fault found (ScatterWorkspace::Fault); no scratch is needed on the host.
class ScatterWorkspace final : public ::poseidon::ScatterWorkspace {
 public:
  Status Fault() const override { return fault; }
  Status fault;
};
// Checks every block before touching dense; a fault is returned and kept in ws.
Status ScatterAddBlocks(const void* blocks, int num_blocks, size_t k, float* dense, size_t n,
                        ::poseidon::ScatterWorkspace* ws);

Status SufficientFactorGemm(const float* u, const float* v, size_t rows, size_t m, size_t n,
                            float alpha, float beta, float* g);

Status Cast(const void* src, DType src_type, void* dst, DType dst_type, size_t count);

Status Pack(const std::vector<ConstByteRange>& parts, void* dst);
Status Unpack(const void* src, const std::vector<ByteRange>& parts);

Status SgdStep(float* param, const float* grads, int num_grads, size_t grad_stride,
               float grad_scale, float* velocity, size_t n, const SgdParams& p);
Status AdamStep(float* param, const float* grads, int num_grads, size_t grad_stride,
                float grad_scale, float* m, float* v, size_t n, const AdamParams& p);

Status SumInto(float* dst, const float* src, int num, size_t stride, size_t n);

// Zero-filled host memory aligned to 64 bytes (a cache line, the widest vector load).
Result<std::unique_ptr<KernelBuffer>> Allocate(size_t bytes);
Status Scale(float* data, size_t n, float scale);
Status Fill(float* data, size_t n, float value);
Status Copy(void* dst, const void* src, size_t bytes);

// Which vector width FusedResidualTopK's fused pass runs with: "avx512", "avx2" or "scalar".
const char* TopKIsa();
// Tests and benchmarks: pin the fused pass to "scalar", "avx2" or "avx512" ("auto" undoes it).
// Unavailable when the CPU lacks the instructions. Process-wide; not for production use.
Status ForceIsaForTesting(const std::string& isa);

}  // namespace cpu
}  // namespace poseidon
