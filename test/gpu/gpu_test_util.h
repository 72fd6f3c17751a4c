// Helpers for the GPU tests: the skip rule (no device -> GTEST_SKIP with the CUDA error string)
// and a small owning device buffer.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "runtime/cuda_util.h"

namespace poseidon::testing {

// Empty when a GPU is usable; otherwise why not, e.g. "no usable GPU: cudaGetDeviceCount
// returned cudaErrorInsufficientDriver (35): CUDA driver version is insufficient ...".
inline std::string NoGpuReason() {
  auto count = CudaDeviceCount();
  return count.ok() ? std::string() : count.status().message();
}

#define PSD_SKIP_WITHOUT_GPU()                                    \
  do {                                                            \
    std::string psd_no_gpu_ = ::poseidon::testing::NoGpuReason(); \
    if (!psd_no_gpu_.empty()) GTEST_SKIP() << psd_no_gpu_;        \
  } while (0)

// N(0, scale), never zero (so every entry has a sign and a magnitude), from a fixed seed.
inline std::vector<float> RandomFloats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) {
    do {
      x = dist(gen);
    } while (x == 0.0f);
  }
  return v;
}

// Device memory holding n elements of T; copies to and from host vectors.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n_ > 0) {
      EXPECT_EQ(cudaMalloc(&p_, n_ * sizeof(T)), cudaSuccess);
    }
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { Upload(host); }
  ~DeviceBuffer() {
    if (p_ != nullptr) cudaFree(p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return p_; }
  size_t size() const { return n_; }
  void Upload(const std::vector<T>& host) {
    ASSERT_EQ(host.size(), n_);
    if (n_ > 0) {
      ASSERT_EQ(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  std::vector<T> Download() const {
    std::vector<T> host(n_);
    if (n_ > 0) {
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return host;
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace poseidon::testing
