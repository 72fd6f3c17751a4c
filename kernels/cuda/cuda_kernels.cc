// CudaKernelsImpl, the Do hooks of CudaKernels(). The contract's checks have run (Kernels'
// public calls, kernels/contract.cc); a hook checks what depends on device memory (the
// workspace is CudaKernels()', every buffer is device memory), then calls the launchers of
// topk.cu / scatter.cu / elementwise.cu, cuBLAS for the sufficient-factor GEMM, cudaMemcpyAsync
// for pack / unpack / copy and cudaMalloc for the buffers strategies keep their state in.
#include "kernels/cuda/cuda_kernels.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "kernels/cuda/launch.h"
#include "kernels/owned_buffer.h"
#include "runtime/cuda_util.h"

namespace poseidon {
namespace {

cudaStream_t ToStream(void* s) { return static_cast<cudaStream_t>(s); }

// The num gradient pieces (already checked by the contract) must be device memory, all of the
// span from the first to the end of the last.
Status CheckPiecesOnDevice(const char* call, const float* grads, int num, size_t stride,
                           size_t n) {
  const size_t span = (static_cast<size_t>(num) - 1) * stride + n;
  return CheckDevicePointer(call, "grads", grads, span * sizeof(float));
}

// One cuBLAS handle per thread and device, made on first use. Never destroyed: it lives as
// long as the thread, and destroying handles from thread-exit destructors can run after the
// CUDA runtime has shut down.
Result<cublasHandle_t> CublasHandle() {
  thread_local cublasHandle_t handle = nullptr;
  thread_local int handle_device = -1;
  int device = 0;
  PSD_CUDA_CHECK(cudaGetDevice(&device));
  if (handle == nullptr || handle_device != device) {
    cublasHandle_t h = nullptr;
    cublasStatus_t st = cublasCreate(&h);
    PSD_REQUIRE(st == CUBLAS_STATUS_SUCCESS, StatusCode::kBackendError,
                "SufficientFactorGemm: cublasCreate failed: ", cublasGetStatusString(st));
    // Full float32 (no TF32): the result must match the CPU GEMM to float32 rounding.
    cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH);
    handle = h;
    handle_device = device;
  }
  return handle;
}

// Frees a block of Allocate (cudaMalloc). cudaFree waits for the device, so a buffer may be
// dropped while kernels that use it are still queued.
void FreeDevice(void* data) { (void)cudaFree(data); }

class CudaKernelsImpl final : public Kernels {
 public:
  CudaKernelsImpl() : Kernels(MemoryKind::kDevice, "cuda") {}

 private:
  std::unique_ptr<KernelWorkspace> DoNewWorkspace() const override {
    return cuda::NewTopKWorkspace();
  }

  Status DoFusedResidualTopK(const float* grad, float* residual, float* momentum_buf,
                             float momentum, size_t n, size_t k, uint32_t* out_idx,
                             float* out_val, KernelWorkspace* ws, void* stream) const override {
    constexpr const char* kCall = "FusedResidualTopK";
    PSD_REQUIRE_ARG(cuda::IsTopKWorkspace(ws), kCall,
                    ": workspace was made by another Kernels implementation; expected one from "
                    "CudaKernels().NewWorkspace()");
    PSD_CHECK(CheckDevicePointer(kCall, "grad", grad, n * sizeof(float)));
    PSD_CHECK(CheckDevicePointer(kCall, "residual", residual, n * sizeof(float)));
    if (momentum_buf != nullptr) {
      PSD_CHECK(CheckDevicePointer(kCall, "momentum_buf", momentum_buf, n * sizeof(float)));
    }
    PSD_CHECK(CheckDevicePointer(kCall, "out_idx", out_idx, k * sizeof(uint32_t)));
    PSD_CHECK(CheckDevicePointer(kCall, "out_val", out_val, k * sizeof(float)));
    return cuda::LaunchFusedResidualTopK(grad, residual, momentum_buf, momentum, n, k, out_idx,
                                         out_val, ws, ToStream(stream));
  }

  std::unique_ptr<ScatterWorkspace> DoNewScatterWorkspace() const override {
    return cuda::NewScatterWorkspace();
  }

  // Deterministic and sync-free (scatter.cu); faults reach ws->Fault() a call later.
  Status DoScatterAddBlocks(const void* blocks, int num_blocks, size_t k, float* dense, size_t n,
                            ScatterWorkspace* ws, void* stream) const override {
    constexpr const char* kCall = "ScatterAddBlocks";
    PSD_REQUIRE_ARG(cuda::IsScatterWorkspace(ws), kCall,
                    ": workspace was made by another Kernels implementation; expected one from "
                    "CudaKernels().NewScatterWorkspace()");
    if (k > 0 && num_blocks > 0) {
      PSD_CHECK(CheckDevicePointer(kCall, "blocks", blocks,
                                   8 * k * static_cast<size_t>(num_blocks)));
      PSD_CHECK(CheckDevicePointer(kCall, "dense", dense, n * sizeof(float)));
    }
    return cuda::LaunchScatterAddBlocks(blocks, num_blocks, k, dense, n, ws, ToStream(stream));
  }

  // Float atomics: see cuda_kernels.h (not bit-reproducible with repeated indices). Waits for
  // the stream once to report an out-of-range index (dense is then left unchanged).
  Status DoScatterAdd(const uint32_t* idx, const float* val, size_t m, float* dense, size_t n,
                      void* stream) const override {
    PSD_CHECK(CheckDevicePointer("ScatterAdd", "idx", idx, m * sizeof(uint32_t)));
    PSD_CHECK(CheckDevicePointer("ScatterAdd", "val", val, m * sizeof(float)));
    PSD_CHECK(CheckDevicePointer("ScatterAdd", "dense", dense, n * sizeof(float)));
    return cuda::LaunchScatterAdd(idx, val, m, dense, n, ToStream(stream));
  }

  // Row-major G (M x N) is column-major G^T (N x M, leading dimension N); likewise row-major
  // U (rows x M) and V (rows x N) are column-major U^T (M x rows) and V^T (N x rows). So
  //   G^T = alpha * V^T U + beta * G^T,
  // one column-major cublasSgemm with A = V^T (no transpose, lda N) and B = U^T transposed
  // (op(B) = U, ldb M), m = N, n = M, k = rows: no copies, no explicit transposes.
  Status DoSufficientFactorGemm(const float* u, const float* v, size_t rows, size_t m, size_t n,
                                float alpha, float beta, float* g, void* stream) const override {
    constexpr const char* kCall = "SufficientFactorGemm";
    PSD_CHECK(CheckDevicePointer(kCall, "g", g, m * n * sizeof(float)));
    if (rows > 0 && alpha != 0.0f) {  // else cuBLAS reads neither factor
      PSD_CHECK(CheckDevicePointer(kCall, "u", u, rows * m * sizeof(float)));
      PSD_CHECK(CheckDevicePointer(kCall, "v", v, rows * n * sizeof(float)));
    }
    PSD_ASSIGN_OR_RETURN(cublasHandle_t h, CublasHandle());
    cublasStatus_t st = cublasSetStream(h, ToStream(stream));
    PSD_REQUIRE(st == CUBLAS_STATUS_SUCCESS, StatusCode::kBackendError, kCall,
                ": cublasSetStream failed: ", cublasGetStatusString(st));
    // k = 0 (no factors) is valid for cuBLAS and scales G by beta, as the contract asks.
    st = cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(n), static_cast<int>(m),
                     static_cast<int>(rows), &alpha, v, static_cast<int>(n), u, static_cast<int>(m),
                     &beta, g, static_cast<int>(n));
    PSD_REQUIRE(st == CUBLAS_STATUS_SUCCESS, StatusCode::kBackendError, kCall,
                ": cublasSgemm(m = ", n, ", n = ", m, ", k = ", rows,
                ") failed: ", cublasGetStatusString(st));
    return Status::Ok();
  }

  Status DoPack(const std::vector<ConstByteRange>& parts, void* dst, size_t total_bytes,
                void* stream) const override {
    PSD_CHECK(CheckDevicePointer("Pack", "dst", dst, total_bytes));
    size_t off = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (parts[i].bytes == 0) continue;
      // cudaMemcpyDefault: a part may live in managed memory as well as device memory.
      PSD_CHECK(CudaStatus(cudaMemcpyAsync(static_cast<unsigned char*>(dst) + off, parts[i].data,
                                           parts[i].bytes, cudaMemcpyDefault, ToStream(stream)),
                           StrCat("Pack: cudaMemcpyAsync(parts[", i, "])").c_str()));
      off += parts[i].bytes;
    }
    return Status::Ok();
  }

  Status DoUnpack(const void* src, const std::vector<ByteRange>& parts, size_t total_bytes,
                  void* stream) const override {
    PSD_CHECK(CheckDevicePointer("Unpack", "src", src, total_bytes));
    size_t off = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (parts[i].bytes == 0) continue;
      PSD_CHECK(
          CudaStatus(cudaMemcpyAsync(parts[i].data, static_cast<const unsigned char*>(src) + off,
                                     parts[i].bytes, cudaMemcpyDefault, ToStream(stream)),
                     StrCat("Unpack: cudaMemcpyAsync(parts[", i, "])").c_str()));
      off += parts[i].bytes;
    }
    return Status::Ok();
  }

  Status DoSgdStep(float* param, const float* grads, int num_grads, size_t grad_stride,
                   float grad_scale, float* velocity, size_t n, const SgdParams& p,
                   void* stream) const override {
    constexpr const char* kCall = "SgdStep";
    PSD_CHECK(CheckPiecesOnDevice(kCall, grads, num_grads, grad_stride, n));
    PSD_CHECK(CheckDevicePointer(kCall, "param", param, n * sizeof(float)));
    if (p.momentum != 0.0f) {
      PSD_CHECK(CheckDevicePointer(kCall, "velocity", velocity, n * sizeof(float)));
    }
    return cuda::LaunchSgdStep(param, grads, num_grads, grad_stride, grad_scale, velocity, n, p,
                               ToStream(stream));
  }

  Status DoAdamStep(float* param, const float* grads, int num_grads, size_t grad_stride,
                    float grad_scale, float* m, float* v, size_t n, const AdamParams& p,
                    float step_size, float inv_bc2_sqrt, void* stream) const override {
    constexpr const char* kCall = "AdamStep";
    PSD_CHECK(CheckPiecesOnDevice(kCall, grads, num_grads, grad_stride, n));
    PSD_CHECK(CheckDevicePointer(kCall, "param", param, n * sizeof(float)));
    PSD_CHECK(CheckDevicePointer(kCall, "m", m, n * sizeof(float)));
    PSD_CHECK(CheckDevicePointer(kCall, "v", v, n * sizeof(float)));
    return cuda::LaunchAdamStep(param, grads, num_grads, grad_stride, grad_scale, m, v, n, p,
                                step_size, inv_bc2_sqrt, ToStream(stream));
  }

  Result<std::unique_ptr<KernelBuffer>> DoAllocate(size_t bytes) const override {
    if (bytes == 0) {
      return std::unique_ptr<KernelBuffer>(
          new OwnedKernelBuffer(nullptr, 0, MemoryKind::kDevice, FreeDevice));
    }
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      return CudaStatus(err, StrCat("Allocate: cudaMalloc(", bytes, " bytes)").c_str());
    }
    auto buf = std::unique_ptr<KernelBuffer>(
        new OwnedKernelBuffer(p, bytes, MemoryKind::kDevice, FreeDevice));
    // Zeros in place before any stream (blocking or not) can use the buffer.
    PSD_CHECK(CudaStatus(cudaMemset(p, 0, bytes), "Allocate: cudaMemset"));
    PSD_CHECK(CudaStatus(cudaStreamSynchronize(nullptr), "Allocate: cudaStreamSynchronize"));
    return buf;
  }

  Status DoScale(float* data, size_t n, float scale, void* stream) const override {
    PSD_CHECK(CheckDevicePointer("Scale", "data", data, n * sizeof(float)));
    return cuda::LaunchScale(data, n, scale, ToStream(stream));
  }

  Status DoFill(float* data, size_t n, float value, void* stream) const override {
    PSD_CHECK(CheckDevicePointer("Fill", "data", data, n * sizeof(float)));
    return cuda::LaunchFill(data, n, value, ToStream(stream));
  }

  // cudaMemcpyDefault: the runtime reads where each pointer lives (unified addressing), so
  // device <-> device and host <-> device take the same call.
  Status DoCopy(void* dst, const void* src, size_t bytes, void* stream) const override {
    return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, ToStream(stream)),
                      "Copy: cudaMemcpyAsync");
  }

  Status DoSynchronize(void* stream) const override {
    return CudaStatus(cudaStreamSynchronize(ToStream(stream)),
                      "Synchronize: cudaStreamSynchronize");
  }
};

}  // namespace

const Kernels& CudaKernels() {
  static const CudaKernelsImpl kernels;
  return kernels;
}

}  // namespace poseidon
