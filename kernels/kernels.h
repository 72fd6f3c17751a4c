// The Kernels seam: compute on gradient buffers, one contract with a CPU implementation
// (kernels/cpu, C++ and BLAS) and a CUDA twin (kernels/cuda, CUB and cuBLAS), chosen by where
// the memory lives (KernelsFor). Strategies call only this interface.
//
// Contracts every implementation keeps (the tests check the CUDA twin against the CPU one):
//  - FusedResidualTopK: one fused pass adds the gradient into the residual (optionally through
//    a momentum buffer, DGC's momentum correction) and selects exactly k entries of largest
//    magnitude, ties broken by the smaller index; the selected entries leave the residual.
//    Output indices are ascending. Invariant, exact in float32:
//        sent[i] + residual_after[i] == residual_before[i] + update[i]
//    where update = gradient (no momentum) or the new momentum (with momentum).
//  - ScatterAdd: dense[idx[j]] += val[j]; indices must be < n (checked, error otherwise).
//  - ScatterAddBlocks: the same for several blocks of top-k output at once (one block per
//    rank, strictly ascending indices), added block after block: bitwise the same on both
//    implementations and on every rank. The CUDA twin never waits for the stream: a bad block
//    is reported through its ScatterWorkspace once the device has found it.
//  - SufficientFactorGemm: G (M x N, row-major) = alpha * U^T V + beta * G for U (rows x M)
//    and V (rows x N), both row-major: one GEMM over all gathered factors.
//  - Pack / Unpack: copy a list of byte ranges into / out of one contiguous fusion buffer.
//  - Optimizer steps on a shard, fused with the aggregation: the gradient is the sum of
//    num_grads vectors laid out at grads + g * grad_stride, scaled by grad_scale (1/P to
//    average), all in the same pass as the update.
//  - Memory: Allocate gives zero-filled memory of the implementation's kind (host for the CPU
//    kernels, cudaMalloc for CUDA), so a strategy keeps its scratch and state wherever its
//    buffers live; Scale (x *= s, one float32 multiply, bitwise the same on both sides), Fill
//    and Copy work on it; Synchronize waits for the stream before the host reads the result.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/status.h"

namespace poseidon {

struct SgdParams {
  float lr = 0.01f;
  float momentum = 0.9f;
  float weight_decay = 0.0f;
  bool nesterov = false;
};

struct AdamParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int64_t step = 1;  // 1-based step count, for bias correction
};

struct ByteRange {
  void* data;
  size_t bytes;
};
struct ConstByteRange {
  const void* data;
  size_t bytes;
};

// Memory owned through a Kernels implementation (Kernels::Allocate): host memory for the CPU
// kernels, device memory (cudaMalloc) for the CUDA kernels. Freed by the destructor (for device
// memory cudaFree, which waits for the device to finish using it).
class KernelBuffer {
 public:
  virtual ~KernelBuffer() = default;
  virtual void* data() const = 0;  // null when bytes() == 0
  virtual size_t bytes() const = 0;
  virtual MemoryKind memory() const = 0;
  template <typename T>
  T* as() const {
    return static_cast<T*>(data());
  }
};

// Scratch a kernel keeps between calls (sized on first use, reused across steps). Each
// implementation defines its own; callers own it through this handle.
class KernelWorkspace {
 public:
  virtual ~KernelWorkspace() = default;
};

// Scratch and the fault report of ScatterAddBlocks, one per layer, reused every step.
class ScatterWorkspace {
 public:
  virtual ~ScatterWorkspace() = default;
  // The first contract fault (an index >= n, indices not strictly ascending) that an earlier
  // ScatterAddBlocks call with this workspace found, once that call's work has finished:
  // kInvalidArgument naming the block, position and values; Ok when none is known yet. Never
  // waits: on the CUDA side the report reaches host memory at the end of the call's stream
  // work, so a fault shows here one call later at the latest (and at once on the CPU side).
  // A fault is sticky: every later call leaves dense unchanged and reports it again.
  virtual Status Fault() const = 0;
};

// The seam is a non-virtual interface. Each public call checks its arguments against the
// contract once, whichever implementation runs (kernels/contract.cc: sizes and ranges, null
// pointers where there is work, finite factors, supported dtype pairs, overlapping buffers, a
// non-null workspace; one rule, one message), returns Ok for the empty calls described below
// without reaching the implementation, and otherwise calls the implementation's private Do
// hook. A hook checks only what depends on its memory kind (that a workspace is its own, that
// pointers are device memory for CUDA) or needs the data itself (an index out of range), and
// returns its launch and allocation errors. NewWorkspace, NewScatterWorkspace, Allocate and
// Synchronize have nothing to check and call their hooks; memory() and name() are fixed when
// the implementation is constructed.
class Kernels {
 public:
  virtual ~Kernels() = default;
  Kernels(const Kernels&) = delete;
  Kernels& operator=(const Kernels&) = delete;

  MemoryKind memory() const { return memory_; }
  const char* name() const { return name_; }

  // Makes the scratch FusedResidualTopK needs; reuse it for every step of a layer.
  std::unique_ptr<KernelWorkspace> NewWorkspace() const { return DoNewWorkspace(); }

  // residual (and momentum, when non-null, with factor `momentum`) are updated in place;
  // out_idx / out_val receive exactly k entries, indices ascending. Requires 0 < k <= n,
  // n <= 2^32 - 1, non-null grad / residual / out_idx / out_val, distinct grad / residual /
  // momentum_buf, a finite momentum, momentum == 0 when momentum_buf is null, and a workspace
  // from this implementation's NewWorkspace() (kInvalidArgument otherwise).
  // Order: magnitude, NaN above +infinity (all NaNs equal), ties to the smaller index. The
  // selection is exact and deterministic (independent of vector width and of earlier calls).
  Status FusedResidualTopK(const float* grad, float* residual, float* momentum_buf,
                           float momentum, size_t n, size_t k, uint32_t* out_idx, float* out_val,
                           KernelWorkspace* ws, void* stream) const;

  // Every index is checked before dense is touched; duplicates accumulate in position order.
  // m == 0 does nothing; otherwise idx, val and dense must be non-null.
  Status ScatterAdd(const uint32_t* idx, const float* val, size_t m, float* dense, size_t n,
                    void* stream) const;

  // Top-k blocks from num_blocks ranks, each 2 k 32-bit words at blocks + 8 k b bytes:
  // k indices (strictly ascending, each < n) then k float32 values. dense[idx] += value for
  // block 0, then block 1, ...: the additions of one index happen in block order, so the
  // result is bitwise the same as ScatterAdd applied block by block, on either
  // implementation. Contract faults in the data leave dense unchanged and go to ws->Fault()
  // (the CPU kernel also returns them); argument and launch errors are returned. No host
  // synchronization on the CUDA side. Requires a workspace from this implementation's
  // NewScatterWorkspace(), 0 <= num_blocks < 2^28, k <= n <= 2^32 - 1, and non-null blocks and
  // dense when k > 0 and num_blocks > 0 (an empty call still reports the workspace's fault).
  std::unique_ptr<ScatterWorkspace> NewScatterWorkspace() const {
    return DoNewScatterWorkspace();
  }
  Status ScatterAddBlocks(const void* blocks, int num_blocks, size_t k, float* dense, size_t n,
                          ScatterWorkspace* ws, void* stream) const;

  // rows, m, n <= INT_MAX and finite alpha, beta; m == 0 or n == 0 does nothing. g must be
  // non-null, and u and v too unless rows == 0 or alpha == 0 (then G = beta * G, and beta == 0
  // overwrites G, NaNs included, as BLAS specifies).
  Status SufficientFactorGemm(const float* u, const float* v, size_t rows, size_t m, size_t n,
                              float alpha, float beta, float* g, void* stream) const;

  // Every part with bytes > 0 needs non-null data; no bytes at all does nothing, otherwise the
  // fusion buffer (dst / src) must be non-null.
  Status Pack(const std::vector<ConstByteRange>& parts, void* dst, void* stream) const;
  Status Unpack(const void* src, const std::vector<ByteRange>& parts, void* stream) const;

  // velocity is the momentum buffer (n floats, owned by the shard owner); it may be null when
  // p.momentum == 0. Pieces are summed in order g = 0..num_grads-1 (deterministic); with
  // num_grads > 1, grad_stride must be >= n. Hyper-parameters and grad_scale are checked
  // (finite, in range) even when n == 0, which then does nothing.
  Status SgdStep(float* param, const float* grads, int num_grads, size_t grad_stride,
                 float grad_scale, float* velocity, size_t n, const SgdParams& p,
                 void* stream) const;
  Status AdamStep(float* param, const float* grads, int num_grads, size_t grad_stride,
                  float grad_scale, float* m, float* v, size_t n, const AdamParams& p,
                  void* stream) const;

  // ---- Memory (the buffers strategies keep their scratch and state in) ----

  // `bytes` of zero-filled memory of this implementation's kind (bytes == 0 gives an empty
  // buffer with a null data()). Allocation is rare (state made on a layer's first step) and
  // synchronous: the zeros are in place when it returns. When the memory is not there: an error
  // naming the size (kBackendError with the CUDA error, kUnavailable for host memory).
  Result<std::unique_ptr<KernelBuffer>> Allocate(size_t bytes) const { return DoAllocate(bytes); }

  // data[i] *= scale for i < n: one float32 multiply per element, so both implementations and
  // the engine's host average give bitwise identical results. scale must be finite.
  Status Scale(float* data, size_t n, float scale, void* stream) const;

  // data[i] = value for i < n.
  Status Fill(float* data, size_t n, float value, void* stream) const;

  // Copies `bytes` bytes; dst and src must not overlap unless equal (then nothing is done).
  // Each side may be this implementation's memory or host memory (CUDA: cudaMemcpyDefault, so
  // host <-> device works too); ordered on the stream, so the host must Synchronize before it
  // reads a host dst written from device memory.
  Status Copy(void* dst, const void* src, size_t bytes, void* stream) const;

  // Waits until the work queued on `stream` (null: the default stream) has finished. The CPU
  // kernels are synchronous, so for them it returns at once.
  Status Synchronize(void* stream) const { return DoSynchronize(stream); }

 protected:
  Kernels(MemoryKind memory, const char* name) : memory_(memory), name_(name) {}

 private:
  // The implementation hooks. Each is called only by its public call above, after that call's
  // checks passed, and never for the calls the comments above call empty (those return Ok
  // first): FusedResidualTopK has 0 < k <= n, ScatterAdd m > 0, SufficientFactorGemm m, n > 0,
  // Pack and Unpack total_bytes > 0 (the sum of the parts' sizes), SgdStep / AdamStep / Scale /
  // Fill n > 0, Copy bytes > 0 and dst != src; every pointer the call needs is non-null. The
  // workspaces are non-null but may come from another implementation (the hook checks).
  // ScatterAddBlocks is called even when it has nothing to add (k == 0 or num_blocks == 0).
  virtual std::unique_ptr<KernelWorkspace> DoNewWorkspace() const = 0;
  virtual Status DoFusedResidualTopK(const float* grad, float* residual, float* momentum_buf,
                                     float momentum, size_t n, size_t k, uint32_t* out_idx,
                                     float* out_val, KernelWorkspace* ws, void* stream) const = 0;
  virtual Status DoScatterAdd(const uint32_t* idx, const float* val, size_t m, float* dense,
                              size_t n, void* stream) const = 0;
  virtual std::unique_ptr<ScatterWorkspace> DoNewScatterWorkspace() const = 0;
  virtual Status DoScatterAddBlocks(const void* blocks, int num_blocks, size_t k, float* dense,
                                    size_t n, ScatterWorkspace* ws, void* stream) const = 0;
  virtual Status DoSufficientFactorGemm(const float* u, const float* v, size_t rows, size_t m,
                                        size_t n, float alpha, float beta, float* g,
                                        void* stream) const = 0;
  virtual Status DoPack(const std::vector<ConstByteRange>& parts, void* dst, size_t total_bytes,
                        void* stream) const = 0;
  virtual Status DoUnpack(const void* src, const std::vector<ByteRange>& parts,
                          size_t total_bytes, void* stream) const = 0;
  virtual Status DoSgdStep(float* param, const float* grads, int num_grads, size_t grad_stride,
                           float grad_scale, float* velocity, size_t n, const SgdParams& p,
                           void* stream) const = 0;
  // step_size = lr / (1 - beta1^step) and inv_bc2_sqrt = 1 / sqrt(1 - beta2^step), computed
  // once by AdamStep in double precision, so every implementation uses the same two floats.
  virtual Status DoAdamStep(float* param, const float* grads, int num_grads, size_t grad_stride,
                            float grad_scale, float* m, float* v, size_t n, const AdamParams& p,
                            float step_size, float inv_bc2_sqrt, void* stream) const = 0;
  virtual Result<std::unique_ptr<KernelBuffer>> DoAllocate(size_t bytes) const = 0;
  virtual Status DoScale(float* data, size_t n, float scale, void* stream) const = 0;
  virtual Status DoFill(float* data, size_t n, float value, void* stream) const = 0;
  virtual Status DoCopy(void* dst, const void* src, size_t bytes, void* stream) const = 0;
  virtual Status DoSynchronize(void* stream) const = 0;

  const MemoryKind memory_;
  const char* const name_;
};

// The CPU kernels (always built) and, when CUDA is built, the CUDA kernels.
const Kernels& CpuKernels();
// kUnavailable when this build has no CUDA.
Result<const Kernels*> KernelsFor(MemoryKind memory);

}  // namespace poseidon
