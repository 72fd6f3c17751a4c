// Helpers of the CUDA edge-case tests (cuda_edge_test.cc, cuda_edge_test_calls.cc): the CPU
// and CUDA kernels, value generators, copies on a stream, comparisons that name the first
// difference, and a runner that checks a top-k case step by step on both implementations.
//
// NaN bits: CUDA's float arithmetic returns the canonical NaN (0x7fffffff) where x86 keeps the
// sign and payload of the first NaN operand, so a NaN that went through an addition may carry
// other bits on each side. SameFloats takes any NaN for a NaN (every other value bit for bit;
// indices always exactly) and prints a NOTE line with the number of NaNs whose bits differ.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/kernels.h"
#include "test/gpu/gpu_test_util.h"

namespace poseidon::edge_test {

using testing::DeviceBuffer;

inline const Kernels& Gpu() { return CudaKernels(); }
inline const Kernels& Cpu() { return CpuKernels(); }

#define EDGE_CUDA(expr)                                                    \
  do {                                                                     \
    cudaError_t e_ = (expr);                                               \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_); \
  } while (0)

inline uint32_t Bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}
inline float FromBits(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof(x));
  return x;
}
// "25.0 GiB"
inline std::string GiB(double bytes) {
  char s[32];
  std::snprintf(s, sizeof(s), "%.1f GiB", bytes / (1 << 30));
  return s;
}

// Quiet and signaling NaNs, both signs, several payloads.
inline const uint32_t kNaNs[] = {0x7fc00000u, 0x7fc00001u, 0x7f800001u, 0x7fffffffu,
                                 0xffc00000u, 0xff800001u, 0xfffffffeu, 0x7fa5a5a5u};
inline const float kInf = std::numeric_limits<float>::infinity();

// N(0, scale), never zero, from a fixed seed.
inline std::vector<float> Normal(size_t n, uint32_t seed, float scale = 1.0f) {
  return testing::RandomFloats(n, seed, scale);
}

// A cheap value for entry i of a large buffer: nonzero, |x| < 4 in 2^22 levels (so many
// magnitudes tie), either sign. Filled on every core.
inline float HashValue(uint64_t i, uint64_t seed) {
  uint64_t z = i + seed * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  float mag = (static_cast<float>(z >> 42) + 1.0f) * (1.0f / (1 << 20));
  return (z & 1) ? -mag : mag;
}
inline void HashFill(std::vector<float>* v, uint64_t seed) {
  const size_t n = v->size(), parts = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> threads;
  for (size_t p = 0; p < parts; ++p) {
    threads.emplace_back([v, seed, n, p, parts] {
      for (size_t i = n * p / parts; i < n * (p + 1) / parts; ++i) (*v)[i] = HashValue(i, seed);
    });
  }
  for (auto& t : threads) t.join();
}

template <typename T>
inline void Put(T* dst, const std::vector<T>& src, cudaStream_t s) {
  EDGE_CUDA(cudaMemcpyAsync(dst, src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice, s));
}
// Copies back on stream s and waits for that stream only.
template <typename T>
inline std::vector<T> Get(const T* src, size_t n, cudaStream_t s) {
  std::vector<T> host(n);
  cudaError_t e = cudaMemcpyAsync(host.data(), src, n * sizeof(T), cudaMemcpyDeviceToHost, s);
  EXPECT_EQ(e, cudaSuccess) << "copy back: " << cudaGetErrorString(e);
  e = cudaStreamSynchronize(s);
  EXPECT_EQ(e, cudaSuccess) << "stream synchronize: " << cudaGetErrorString(e);
  return host;
}

inline std::string Hex(uint32_t b) {
  char s[16];
  std::snprintf(s, sizeof(s), "0x%08x", b);
  return s;
}

// Same bits, or NaN on both sides (see the top of the file); names the first difference.
inline ::testing::AssertionResult SameFloats(const float* want, const float* got, size_t n,
                                             const std::string& what, size_t base = 0) {
  size_t nan_bits = 0;
  for (size_t i = 0; i < n; ++i) {
    if (Bits(want[i]) == Bits(got[i])) continue;
    if (std::isnan(want[i]) && std::isnan(got[i])) {
      ++nan_bits;
      continue;
    }
    return ::testing::AssertionFailure()
           << what << "[" << base + i << "]: cpu " << want[i] << " (" << Hex(Bits(want[i]))
           << "), cuda " << got[i] << " (" << Hex(Bits(got[i])) << ")";
  }
  if (nan_bits > 0) {
    std::printf("[   NOTE   ] %s: %zu NaN(s) with other bits than the CPU's\n", what.c_str(),
                nan_bits);
  }
  return ::testing::AssertionSuccess();
}
inline ::testing::AssertionResult SameFloats(const std::vector<float>& want,
                                             const std::vector<float>& got,
                                             const std::string& what) {
  if (want.size() != got.size()) {
    return ::testing::AssertionFailure()
           << what << ": sizes " << want.size() << " and " << got.size();
  }
  return SameFloats(want.data(), got.data(), want.size(), what);
}
inline ::testing::AssertionResult SameIndices(const std::vector<uint32_t>& want,
                                              const std::vector<uint32_t>& got,
                                              const std::string& what) {
  for (size_t j = 0; j < want.size() && j < got.size(); ++j) {
    if (want[j] != got[j]) {
      return ::testing::AssertionFailure()
             << what << " idx[" << j << "]: cpu " << want[j] << ", cuda " << got[j];
    }
  }
  if (want.size() == got.size()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": " << want.size() << " and " << got.size() << " indices";
}

// A non-blocking stream, destroyed at scope exit.
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess); }
  ~Stream() {
    if (s != nullptr) cudaStreamDestroy(s);
  }
};

// One top-k case: the buffers before the first step and one gradient per step. Cases run 3 or
// 4 steps on one workspace, so that the later calls, which may use what earlier ones learned,
// meet the edge cases too.
struct TopKCase {
  std::vector<float> residual, momentum;  // momentum empty: no momentum buffer
  std::vector<std::vector<float>> grads;
  size_t k = 1;
  float m = 0.9f;        // the momentum factor, used with a momentum buffer
  bool first_k = false;  // all magnitudes equal at step 0: expect indices 0 .. k-1
};

// Workspaces kept across calls (see WorkspaceGrowsAndShrinks).
struct Workspaces {
  std::unique_ptr<KernelWorkspace> cpu = Cpu().NewWorkspace(), gpu = Gpu().NewWorkspace();
};

// Runs every step on both implementations, the device buffers `offset` floats past their
// allocation and the work on stream s, and compares indices, values, residual and momentum
// after each step. The outputs, one entry longer than k, are poisoned (all bits set) before
// each call: the first k must all be written, the one past them never.
inline void ExpectTopKMatches(TopKCase c, const std::string& what, size_t offset = 0,
                              cudaStream_t s = nullptr, Workspaces* shared = nullptr) {
  const size_t n = c.residual.size(), k = c.k;
  const bool mom = !c.momentum.empty();
  const float m = mom ? c.m : 0.0f;
  Workspaces own;
  Workspaces& ws = shared != nullptr ? *shared : own;
  DeviceBuffer<float> d_grad(n + offset), d_res(n + offset), d_mom(mom ? n + offset : 0);
  DeviceBuffer<float> d_val(k + 1);  // one more: nothing may be written past k
  DeviceBuffer<uint32_t> d_idx(k + 1);
  float* g = d_grad.get() + offset;
  float* r = d_res.get() + offset;
  float* u = mom ? d_mom.get() + offset : nullptr;
  Put(r, c.residual, s);
  if (mom) Put(u, c.momentum, s);
  for (size_t step = 0; step < c.grads.size(); ++step) {
    const std::string at = what + ", n " + std::to_string(n) + ", k " + std::to_string(k) +
                           (mom ? ", momentum" : "") + ", step " + std::to_string(step);
    Put(g, c.grads[step], s);
    EDGE_CUDA(cudaMemsetAsync(d_idx.get(), 0xff, (k + 1) * sizeof(uint32_t), s));
    EDGE_CUDA(cudaMemsetAsync(d_val.get(), 0xff, (k + 1) * sizeof(float), s));
    std::vector<uint32_t> idx(k);
    std::vector<float> val(k);
    Status cs = Cpu().FusedResidualTopK(c.grads[step].data(), c.residual.data(),
                                        mom ? c.momentum.data() : nullptr, m, n, k, idx.data(),
                                        val.data(), ws.cpu.get(), nullptr);
    ASSERT_TRUE(cs.ok()) << at << ": " << cs.ToString();
    Status gs =
        Gpu().FusedResidualTopK(g, r, u, m, n, k, d_idx.get(), d_val.get(), ws.gpu.get(), s);
    ASSERT_TRUE(gs.ok()) << at << ": " << gs.ToString();
    std::vector<uint32_t> got_idx = Get(d_idx.get(), k + 1, s);
    ASSERT_EQ(got_idx[k], 0xffffffffu) << at << ": out_idx[k] was written";
    ASSERT_EQ(Bits(Get(d_val.get() + k, 1, s)[0]), 0xffffffffu) << at << ": out_val[k] was written";
    got_idx.pop_back();
    ASSERT_TRUE(SameIndices(idx, got_idx, at));
    if (step == 0 && c.first_k) {
      for (size_t j = 0; j < k; ++j) ASSERT_EQ(got_idx[j], j) << at << ": ties to smaller index";
    }
    ASSERT_TRUE(SameFloats(val, Get(d_val.get(), k, s), at + " values"));
    ASSERT_TRUE(SameFloats(c.residual, Get(r, n, s), at + " residual"));
    if (mom) {
      ASSERT_TRUE(SameFloats(c.momentum, Get(u, n, s), at + " momentum"));
    }
  }
}

// Normal data: `steps` gradients of N(0, grad_scale), momentum buffer when mom.
inline TopKCase NormalCase(size_t n, size_t k, bool mom, uint32_t seed, int steps = 3,
                           float grad_scale = 1.0f) {
  TopKCase c;
  c.residual = Normal(n, seed);
  if (mom) c.momentum = Normal(n, seed + 1, 0.1f);
  for (int i = 0; i < steps; ++i) c.grads.push_back(Normal(n, seed + 2 + i, grad_scale));
  c.k = k;
  return c;
}

// Every magnitude equal at step 0 (signs random, +-0 in the other buffers): the first k indices.
inline TopKCase AllEqualCase(size_t n, size_t k, bool mom) {
  TopKCase c;
  std::mt19937 gen(9);
  auto sign = [&](float x) { return (gen() & 1) ? -x : x; };
  c.k = k;
  c.first_k = true;
  c.residual.resize(n);
  for (auto& x : c.residual) x = sign(0.0f);
  if (mom) {
    c.momentum.resize(n);
    for (auto& x : c.momentum) x = sign(0.0f);
  }
  c.grads.assign(4, std::vector<float>(n));
  for (auto& gr : c.grads) {
    for (auto& x : gr) x = sign(0.75f);
  }
  return c;
}

}  // namespace poseidon::edge_test
