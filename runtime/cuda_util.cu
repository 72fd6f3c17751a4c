// The runtime's own device kernels: the float16 / bfloat16 <-> float32 casts (the device twins
// of runtime/half_cast.h) that let the NCCL backend accumulate half-precision sums in float32.
// Grid-stride loops, one element per thread and step.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "runtime/cuda_util.h"

namespace poseidon {
namespace {

constexpr int kThreads = 256;

unsigned GridFor(size_t n) { return GridStrideBlocks(n, kThreads); }

template <typename Half>
__device__ float ToFloat(Half h);
template <>
__device__ float ToFloat<__half>(__half h) {
  return __half2float(h);
}
template <>
__device__ float ToFloat<__nv_bfloat16>(__nv_bfloat16 h) {
  return __bfloat162float(h);
}

template <typename Half>
__device__ Half FromFloat(float f);
template <>
__device__ __half FromFloat<__half>(float f) {
  return __float2half_rn(f);
}
template <>
__device__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float f) {
  return __float2bfloat16_rn(f);
}

template <typename Half>
__global__ void WidenKernel(const Half* __restrict__ src, float* __restrict__ dst, size_t n) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[i] = ToFloat<Half>(src[i]);
  }
}

template <typename Half>
__global__ void NarrowKernel(const float* __restrict__ src, Half* __restrict__ dst, size_t n) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[i] = FromFloat<Half>(src[i]);
  }
}

Status CheckHalf(const char* call, DType dtype) {
  PSD_REQUIRE_ARG(IsHalfDType(dtype), call, ": dtype is ", DTypeName(dtype),
                  "; expected float16 or bfloat16");
  return Status::Ok();
}

}  // namespace

Status LaunchWidenToFloat32(DType dtype, const void* src, float* dst, size_t n,
                            cudaStream_t stream) {
  PSD_CHECK(CheckHalf("LaunchWidenToFloat32", dtype));
  if (n == 0) return Status::Ok();
  if (dtype == DType::kFloat16) {
    WidenKernel<<<GridFor(n), kThreads, 0, stream>>>(static_cast<const __half*>(src), dst, n);
  } else {
    WidenKernel<<<GridFor(n), kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(src),
                                                     dst, n);
  }
  return CudaStatus(cudaGetLastError(), "widen to float32 kernel launch");
}

Status LaunchNarrowFromFloat32(DType dtype, const float* src, void* dst, size_t n,
                               cudaStream_t stream) {
  PSD_CHECK(CheckHalf("LaunchNarrowFromFloat32", dtype));
  if (n == 0) return Status::Ok();
  if (dtype == DType::kFloat16) {
    NarrowKernel<<<GridFor(n), kThreads, 0, stream>>>(src, static_cast<__half*>(dst), n);
  } else {
    NarrowKernel<<<GridFor(n), kThreads, 0, stream>>>(src, static_cast<__nv_bfloat16*>(dst), n);
  }
  return CudaStatus(cudaGetLastError(), "narrow from float32 kernel launch");
}

}  // namespace poseidon
