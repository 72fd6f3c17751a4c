// Internal: the device memory the CUDA kernels keep between calls (topk.cu, scatter.cu,
// elementwise.cu). DeviceBlock is one cudaMalloc block, replaced (freed first) when it must
// grow; PinnedMirror is the pinned host copy (cudaMallocHost) of a report the kernels write in
// device memory, which the stream copies there and the host reads without waiting.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/launch.h"
#include "runtime/cuda_util.h"

namespace poseidon {
namespace cuda {

// One cudaMalloc block, freed on destruction (cudaFree waits for the device, so queued calls
// that use it finish first). Empty (null, 0 bytes) until the first Grow or Replace.
class DeviceBlock {
 public:
  DeviceBlock() = default;
  ~DeviceBlock() {
    if (data_ != nullptr) (void)cudaFree(data_);
  }
  DeviceBlock(const DeviceBlock&) = delete;
  DeviceBlock& operator=(const DeviceBlock&) = delete;

  // At least `bytes`: nothing happens when the block is that large already; otherwise Replace.
  Status Grow(size_t bytes, const char* what) {
    if (data_ != nullptr && bytes <= bytes_) return Status::Ok();
    return Replace(bytes, what);
  }

  // A new block of exactly `bytes`, uninitialized: the old one is freed first (cudaFree waits
  // for the device; its contents are not kept, and peak memory stays lower), then cudaMalloc.
  // The error names `what`: "cudaMalloc(<bytes> bytes of <what>)". Empty after a failure.
  Status Replace(size_t bytes, const char* what) {
    if (data_ != nullptr) {
      PSD_CUDA_CHECK(cudaFree(data_));
      data_ = nullptr;
      bytes_ = 0;
    }
    void* p = nullptr;
    PSD_CHECK(AllocOrClear(cudaMalloc(&p, bytes),
                           StrCat("cudaMalloc(", bytes, " bytes of ", what, ")")));
    data_ = p;
    bytes_ = bytes;
    return Status::Ok();
  }

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// The pinned host copy of a device report of type T. The stream writes it (CopyFrom) while
// the host may be reading it, so Read takes two copies and keeps them only when they agree.
// Freed on destruction (cudaFreeHost). Absent until Make.
template <typename T>
class PinnedMirror {
  static_assert(std::is_trivially_copyable<T>::value, "a report is copied byte by byte");

 public:
  PinnedMirror() = default;
  ~PinnedMirror() {
    if (host_ != nullptr) (void)cudaFreeHost(const_cast<T*>(host_));
  }
  PinnedMirror(const PinnedMirror&) = delete;
  PinnedMirror& operator=(const PinnedMirror&) = delete;

  // Allocates the pinned copy, holding `initial`, on the first call; later calls keep it. The
  // error names `what`: "cudaMallocHost(<sizeof(T)> bytes of <what>)".
  Status Make(const T& initial, const char* what) {
    if (host_ != nullptr) return Status::Ok();
    void* h = nullptr;
    PSD_CHECK(AllocOrClear(cudaMallocHost(&h, sizeof(T)),
                           StrCat("cudaMallocHost(", sizeof(T), " bytes of ", what, ")")));
    std::memcpy(h, &initial, sizeof(T));
    host_ = static_cast<T*>(h);
    return Status::Ok();
  }
  bool made() const { return host_ != nullptr; }

  // Queues on `stream` the copy of sizeof(T) bytes of device memory at `report` into the
  // pinned copy (made already); returns the error of the enqueue.
  cudaError_t CopyFrom(const void* report, cudaStream_t stream) {
    return cudaMemcpyAsync(const_cast<T*>(host_), report, sizeof(T), cudaMemcpyDeviceToHost,
                           stream);
  }

  // The pinned copy as it stands, without waiting: two reads that agree byte for byte are one
  // consistent report, stored in *out. False, *out untouched, when there is no copy yet or a
  // copy was landing between the reads (a torn report).
  bool Read(T* out) const {
    if (host_ == nullptr) return false;
    T a, b;
    std::memcpy(&a, const_cast<const T*>(host_), sizeof(a));
    std::atomic_thread_fence(std::memory_order_acquire);
    std::memcpy(&b, const_cast<const T*>(host_), sizeof(b));
    if (std::memcmp(&a, &b, sizeof(a)) != 0) return false;
    *out = a;
    return true;
  }

 private:
  volatile T* host_ = nullptr;
};

}  // namespace cuda
}  // namespace poseidon
