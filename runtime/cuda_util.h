// Small helpers for the CUDA runtime API shared by the device backends, the CUDA kernels, the
// engine's stream seam (engine/stream_sync.cc), the GPU tests and poseidon-info. Only the
// runtime API is used (never libcuda / the driver API), so binaries start on machines without
// a GPU and report a clean error instead.
//
// Built only when POSEIDON_CUDA_ENABLED; include it only from CUDA-enabled code.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/status.h"

namespace poseidon {

// OK for cudaSuccess; otherwise kBackendError "<what> failed: cudaErrorX (n): <description>".
// A failure is also cleared from the runtime's last-error state (cudaGetLastError), so that a
// non-sticky error (a failed cudaMalloc, a bad launch configuration) reported here is not
// reported again by the next, unrelated check. Sticky errors (a fault that corrupted the
// context) cannot be cleared and keep failing every later call, as they must.
Status CudaStatus(cudaError_t err, const char* what);

// Evaluates a cudaError_t expression and returns its Status (with the location) on failure.
#define PSD_CUDA_CHECK(expr) PSD_CHECK(::poseidon::CudaStatus((expr), #expr))

// The grid of a grid-stride loop over `work` items with `threads` per block: one block per
// `threads` items, at least 1 and at most 65535 (the loop covers the rest; plenty to fill any
// current GPU).
inline unsigned GridStrideBlocks(uint64_t work, int threads) {
  const uint64_t t = static_cast<uint64_t>(threads);
  return static_cast<unsigned>(std::clamp<uint64_t>((work + t - 1) / t, 1, 65535));
}

// Number of visible GPUs. kUnavailable (with the CUDA error string) when the runtime cannot
// reach a driver or sees no device, so callers can tell "no GPU here" from a broken call.
Result<int> CudaDeviceCount();

// One line describing the GPUs and driver, for poseidon-info and the test skip messages:
// "2 x NVIDIA H100 80GB HBM3 (sm_90), driver 13.0, runtime 13.0" or the reason there is none.
std::string DescribeCudaDevices();

// Checks that p (holding `bytes` bytes) is device or managed memory, which NCCL and the device
// copies need; names the call, the buffer and what the pointer is instead. null with
// bytes == 0 is accepted.
Status CheckDevicePointer(const char* call, const char* which, const void* p, size_t bytes);

// Enqueues on `stream` the widening of n float16 / bfloat16 elements (dtype) to float32, so
// that a sum of half-precision values accumulates in float32 (the Backend contract). Exact.
Status LaunchWidenToFloat32(DType dtype, const void* src, float* dst, size_t n,
                            cudaStream_t stream);
// Enqueues on `stream` the rounding of n float32 elements to float16 / bfloat16 (to nearest,
// ties to even, as the host backend rounds). src and dst may not overlap.
Status LaunchNarrowFromFloat32(DType dtype, const float* src, void* dst, size_t n,
                               cudaStream_t stream);

// A cudaEvent_t owned by value (timing disabled); the engine's Event (engine/stream_sync.h)
// holds one.
class CudaEvent {
 public:
  static Result<CudaEvent> Create();
  CudaEvent() = default;
  CudaEvent(CudaEvent&& o) noexcept : ev_(o.ev_) { o.ev_ = nullptr; }
  CudaEvent& operator=(CudaEvent&& o) noexcept;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  ~CudaEvent();
  cudaEvent_t get() const { return ev_; }
  Status Record(cudaStream_t stream);
  // True once all work captured by the last Record has finished.
  Result<bool> Query() const;
  Status Synchronize() const;

 private:
  cudaEvent_t ev_ = nullptr;
};

// Pinned (page-locked) host buffers, grown and reused: the staged backend copies device data
// through them. Acquire returns a buffer of at least `bytes`; releasing it (destruction of the
// handle) puts it back for the next caller. A buffer is never freed before the pool is
// destroyed (cudaFreeHost synchronizes the device, which may deadlock against collective
// kernels waiting for peers): when no free buffer fits, a new one is allocated at least twice
// the largest free one (device::GrowCapacity), so a steady workload stops allocating after a
// few calls and a growing one allocates O(log(size)) times. The pool is thread-safe.
class PinnedPool : public std::enable_shared_from_this<PinnedPool> {
 public:
  class Buffer {
   public:
    Buffer() = default;
    Buffer(Buffer&& o) noexcept;
    Buffer& operator=(Buffer&& o) noexcept;
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    ~Buffer();
    void* data() const { return data_; }
    size_t capacity() const { return capacity_; }

   private:
    friend class PinnedPool;
    void Release();
    std::shared_ptr<PinnedPool> pool_;
    void* data_ = nullptr;
    size_t capacity_ = 0;
  };

  static std::shared_ptr<PinnedPool> Make() {
    return std::shared_ptr<PinnedPool>(new PinnedPool());
  }
  ~PinnedPool();
  Result<Buffer> Acquire(size_t bytes);

 private:
  PinnedPool() = default;
  void Return(void* data, size_t capacity);

  std::mutex mu_;
  // Free buffers; guarded by mu_.
  std::vector<std::pair<void*, size_t>> free_;
};

}  // namespace poseidon
