// The CUDA kernels against their CPU twins (CpuKernels()) on fresh random inputs, plus the
// argument checks, which run (and must pass) on machines without a GPU: bad arguments are
// rejected before any CUDA call. With a GPU, every kernel except ScatterAdd with repeated
// indices must match the CPU kernel bit for bit (see kernels/cuda/cuda_kernels.h).
#include "kernels/cuda/cuda_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "kernels/kernels.h"
#include "runtime/cuda_util.h"
#include "runtime/half.h"
#include "runtime/half_cast.h"
#include "test/gpu/gpu_test_util.h"

namespace poseidon {
namespace {

using testing::DeviceBuffer;

const Kernels& Gpu() { return CudaKernels(); }
const Kernels& Cpu() { return CpuKernels(); }

using testing::RandomFloats;

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

void ExpectSameBits(const std::vector<float>& want, const std::vector<float>& got,
                    const char* what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(SameBits(want[i], got[i]))
        << what << "[" << i << "]: cpu " << want[i] << " cuda " << got[i];
  }
}

// ---- Runs everywhere: the seam and the argument checks (no CUDA call is reached). ----

TEST(CudaKernelsSeam, KernelsForDeviceIsTheCudaTwin) {
  auto k = KernelsFor(MemoryKind::kDevice);
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  EXPECT_EQ(*k, &CudaKernels());
  EXPECT_EQ((*k)->memory(), MemoryKind::kDevice);
  EXPECT_STREQ((*k)->name(), "cuda");
}

TEST(CudaKernelsArgs, TopKRejectsBadArguments) {
  auto ws = Gpu().NewWorkspace();
  float* f = reinterpret_cast<float*>(0x1000);  // never dereferenced: checks come first
  float* r = reinterpret_cast<float*>(0x2000);
  uint32_t* idx = reinterpret_cast<uint32_t*>(0x3000);
  auto code = [&](size_t n, size_t k, float* mom, float m, KernelWorkspace* w) {
    return Gpu().FusedResidualTopK(f, r, mom, m, n, k, idx, f + 64, w, nullptr);
  };
  Status s = code(10, 0, nullptr, 0.0f, ws.get());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("k is 0"), std::string::npos) << s.message();
  s = code(10, 11, nullptr, 0.0f, ws.get());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("k is 11 but n is 10"), std::string::npos) << s.message();
  s = code(10, 3, nullptr, 0.9f, ws.get());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("momentum_buf is null"), std::string::npos) << s.message();
  s = code(10, 3, nullptr, 0.0f, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("workspace is null"), std::string::npos) << s.message();
  auto cpu_ws = Cpu().NewWorkspace();
  s = code(10, 3, nullptr, 0.0f, cpu_ws.get());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("another Kernels implementation"), std::string::npos) << s.message();
  s = Gpu().FusedResidualTopK(f, reinterpret_cast<float*>(f), nullptr, 0.0f, 10, 3, idx, r,
                              ws.get(), nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("distinct"), std::string::npos) << s.message();
}

TEST(CudaKernelsArgs, OtherKernelsRejectBadArguments) {
  float* f = reinterpret_cast<float*>(0x1000);
  SgdParams sgd;
  sgd.lr = -1.0f;
  Status s = Gpu().SgdStep(f, f, 1, 4, 1.0f, f, 4, sgd, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("lr is -1"), std::string::npos) << s.message();
  AdamParams adam;
  adam.step = 0;
  s = Gpu().AdamStep(f, f, 1, 4, 1.0f, f, f, 4, adam, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("step is 0"), std::string::npos) << s.message();
  s = Gpu().SgdStep(f, f, 2, 3, 1.0f, f, 4, SgdParams{}, nullptr);  // stride 3 < n 4: overlap
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("grad_stride is 3 but n is 4"), std::string::npos) << s.message();
  s = Gpu().ScatterAdd(nullptr, f, 3, f, 10, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  s = Gpu().Pack({{nullptr, 8}}, f, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("parts[0].data is null"), std::string::npos) << s.message();
  // Empty calls are no-ops and need no GPU.
  EXPECT_TRUE(Gpu().ScatterAdd(nullptr, nullptr, 0, nullptr, 0, nullptr).ok());
  EXPECT_TRUE(Gpu().Pack({}, nullptr, nullptr).ok());
}

TEST(CudaKernelsArgs, ScatterAddBlocksRejectsBadArguments) {
  auto cpu_ws = Cpu().NewScatterWorkspace();
  std::vector<uint32_t> words(4);
  std::vector<float> dense(4);
  Status s = Gpu().ScatterAddBlocks(words.data(), 1, 2, dense.data(), 4, cpu_ws.get(), nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("NewScatterWorkspace"), std::string::npos) << s.message();
  auto gpu_ws = Gpu().NewScatterWorkspace();
  s = Gpu().ScatterAddBlocks(words.data(), 1, 5, dense.data(), 4, gpu_ws.get(), nullptr);
  EXPECT_NE(s.message().find("k is 5 but n is 4"), std::string::npos) << s.message();
  s = Cpu().ScatterAddBlocks(words.data(), 1, 2, dense.data(), 4, gpu_ws.get(), nullptr);
  EXPECT_NE(s.message().find("CpuKernels().NewScatterWorkspace()"), std::string::npos)
      << s.message();
}

TEST(CudaKernelsArgs, MemoryCallsRejectBadArguments) {
  float* f = reinterpret_cast<float*>(0x1000);
  Status s = Gpu().Scale(f, 4, std::numeric_limits<float>::infinity(), nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("Scale: scale is inf"), std::string::npos) << s.message();
  s = Gpu().Scale(nullptr, 4, 0.5f, nullptr);
  EXPECT_NE(s.message().find("Scale: data is null with n = 4"), std::string::npos) << s.message();
  s = Gpu().Fill(nullptr, 3, 0.0f, nullptr);
  EXPECT_NE(s.message().find("Fill: data is null with n = 3"), std::string::npos) << s.message();
  s = Gpu().Copy(nullptr, f, 8, nullptr);
  EXPECT_NE(s.message().find("Copy: dst is null with 8 bytes"), std::string::npos) << s.message();
  s = Gpu().Copy(f + 1, f, 64, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("overlap"), std::string::npos) << s.message();
  // Empty calls are no-ops and need no GPU; an empty buffer needs no cudaMalloc.
  EXPECT_TRUE(Gpu().Scale(nullptr, 0, 2.0f, nullptr).ok());
  EXPECT_TRUE(Gpu().Fill(nullptr, 0, 2.0f, nullptr).ok());
  EXPECT_TRUE(Gpu().Copy(nullptr, nullptr, 0, nullptr).ok());
  EXPECT_TRUE(Gpu().Copy(f, f, 64, nullptr).ok());
  auto empty = Gpu().Allocate(0);
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_EQ((*empty)->data(), nullptr);
  EXPECT_EQ((*empty)->memory(), MemoryKind::kDevice);
}

// The argument checks are Kernels' own (kernels/contract.cc), so both implementations refuse a
// bad call with the same code and message.
TEST(CudaKernelsArgs, RefusesWithTheCpuKernelsMessages) {
  float* f = reinterpret_cast<float*>(0x1000);  // never dereferenced: checks come first
  uint32_t* idx = reinterpret_cast<uint32_t*>(0x3000);
  SgdParams sgd;
  sgd.lr = -1.0f;
  AdamParams adam;
  adam.beta2 = 1.0f;
  const std::vector<std::function<Status(const Kernels&)>> calls = {
      [&](const Kernels& k) {
        auto ws = k.NewWorkspace();
        return k.FusedResidualTopK(f, f + 64, nullptr, 0.0f, 10, 11, idx, f + 128, ws.get(),
                                   nullptr);
      },
      [&](const Kernels& k) {
        return k.Unpack(f, {{f + 8, 4}, {nullptr, 4}}, nullptr);
      },
      [&](const Kernels& k) { return k.ScatterAdd(idx, nullptr, 3, f, 10, nullptr); },
      [&](const Kernels& k) {
        const float nan = std::numeric_limits<float>::quiet_NaN();
        return k.SufficientFactorGemm(f, f, 2, 3, 4, nan, 0.0f, f + 64, nullptr);
      },
      [&](const Kernels& k) { return k.SgdStep(f, f + 64, 1, 4, 1.0f, f, 4, sgd, nullptr); },
      [&](const Kernels& k) { return k.AdamStep(f, f + 64, 1, 4, 1.0f, f, f, 4, adam, nullptr); },
      [&](const Kernels& k) {
        auto ws = k.NewScatterWorkspace();
        return k.ScatterAddBlocks(f, 2, 5, f + 64, 4, ws.get(), nullptr);
      },
      [&](const Kernels& k) { return k.Copy(f + 1, f, 64, nullptr); },
  };
  for (size_t i = 0; i < calls.size(); ++i) {
    const Status cpu = calls[i](Cpu());
    const Status gpu = calls[i](Gpu());
    EXPECT_EQ(cpu.code(), StatusCode::kInvalidArgument) << "call " << i << ": " << cpu.ToString();
    EXPECT_EQ(gpu.code(), cpu.code()) << "call " << i << ": " << gpu.ToString();
    EXPECT_EQ(gpu.message(), cpu.message()) << "call " << i;
  }
}

TEST(CudaKernelsNoGpu, AllocateFailsWithTheCudaError) {
  if (testing::NoGpuReason().empty()) {
    GTEST_SKIP() << "a GPU is present: this checks the no-GPU path";
  }
  auto buf = Gpu().Allocate(1024);
  ASSERT_FALSE(buf.ok());
  EXPECT_EQ(buf.status().code(), StatusCode::kBackendError);
  EXPECT_NE(buf.status().message().find("Allocate: cudaMalloc(1024 bytes)"), std::string::npos)
      << buf.status().message();
  EXPECT_FALSE(Gpu().Synchronize(nullptr).ok());
}

TEST(CudaKernelsNoGpu, CallsFailWithTheCudaError) {
  if (testing::NoGpuReason().empty()) {
    GTEST_SKIP() << "a GPU is present: this checks the no-GPU path";
  }
  std::vector<float> host(16, 1.0f);
  Status s = Gpu().Scale(host.data(), 16, 2.0f, nullptr);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cuda"), std::string::npos) << s.message();
}

// ---- With a GPU: each kernel against its CPU twin. ----

struct TopKCase {
  size_t n, k;
  bool momentum;
  bool ties;  // values drawn from a few levels, so many magnitudes are equal
};

class CudaTopK : public ::testing::TestWithParam<TopKCase> {};

TEST_P(CudaTopK, MatchesCpuOverSteps) {
  PSD_SKIP_WITHOUT_GPU();
  const TopKCase c = GetParam();
  std::vector<float> residual = RandomFloats(c.n, 7), mom = RandomFloats(c.n, 8, 0.1f);
  if (c.ties) {
    for (auto& x : residual) x = static_cast<float>(static_cast<int>(x * 2.0f)) * 0.5f + 0.25f;
  }
  DeviceBuffer<float> d_res(residual), d_mom(mom), d_grad(c.n), d_val(c.k);
  DeviceBuffer<uint32_t> d_idx(c.k);
  auto cpu_ws = Cpu().NewWorkspace();
  auto gpu_ws = Gpu().NewWorkspace();
  const float m = c.momentum ? 0.9f : 0.0f;
  for (int step = 0; step < 3; ++step) {  // the workspace is reused across steps
    std::vector<float> grad = RandomFloats(c.n, 100 + static_cast<uint32_t>(step));
    if (c.ties) {
      for (auto& x : grad) x = static_cast<float>(static_cast<int>(x * 2.0f)) * 0.5f + 0.25f;
    }
    d_grad.Upload(grad);
    std::vector<uint32_t> idx(c.k);
    std::vector<float> val(c.k);
    ASSERT_TRUE(Cpu()
                    .FusedResidualTopK(grad.data(), residual.data(),
                                       c.momentum ? mom.data() : nullptr, m, c.n, c.k, idx.data(),
                                       val.data(), cpu_ws.get(), nullptr)
                    .ok());
    Status s =
        Gpu().FusedResidualTopK(d_grad.get(), d_res.get(), c.momentum ? d_mom.get() : nullptr, m,
                                c.n, c.k, d_idx.get(), d_val.get(), gpu_ws.get(), nullptr);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(d_idx.Download(), idx) << "step " << step;
    ExpectSameBits(val, d_val.Download(), "values");
    ExpectSameBits(residual, d_res.Download(), "residual");
    if (c.momentum) ExpectSameBits(mom, d_mom.Download(), "momentum");
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaTopK,
    ::testing::Values(TopKCase{1, 1, false, false}, TopKCase{1000, 1, false, false},
                      TopKCase{1000, 1000, false, false}, TopKCase{4097, 41, true, false},
                      TopKCase{100003, 100, false, false}, TopKCase{100003, 1000, true, false},
                      TopKCase{100003, 5000, false, true}, TopKCase{1 << 20, 1049, true, true}));

// Gradient-like steps: after the first two calls (no guess, then no drift estimate) the
// candidate path must carry the selection, still bit-identical to the CPU kernel.
TEST(CudaTopKPath, SteadyStateUsesTheCandidatesAndStaysExact) {
  PSD_SKIP_WITHOUT_GPU();
  const size_t n = size_t{1} << 21, k = 2097;  // 0.1%
  std::vector<float> residual(n, 0.0f), mom(n, 0.0f);
  DeviceBuffer<float> d_res(residual), d_mom(mom), d_grad(n), d_val(k);
  DeviceBuffer<uint32_t> d_idx(k);
  auto cpu_ws = Cpu().NewWorkspace();
  auto gpu_ws = Gpu().NewWorkspace();
  for (int step = 0; step < 10; ++step) {
    std::vector<float> grad = RandomFloats(n, 500 + static_cast<uint32_t>(step), 1e-3f);
    d_grad.Upload(grad);
    std::vector<uint32_t> idx(k);
    std::vector<float> val(k);
    ASSERT_TRUE(Cpu().FusedResidualTopK(grad.data(), residual.data(), mom.data(), 0.9f, n, k,
                                        idx.data(), val.data(), cpu_ws.get(), nullptr)
                    .ok());
    Status s = Gpu().FusedResidualTopK(d_grad.get(), d_res.get(), d_mom.get(), 0.9f, n, k,
                                       d_idx.get(), d_val.get(), gpu_ws.get(), nullptr);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(d_idx.Download(), idx) << "step " << step;  // Download synchronizes the device
    ExpectSameBits(val, d_val.Download(), "values");
    ExpectSameBits(residual, d_res.Download(), "residual");
    Result<CudaTopKCall> call = LastCudaTopKCall(*gpu_ws);
    ASSERT_TRUE(call.ok());
    EXPECT_EQ(call->calls, static_cast<uint64_t>(step + 1));
    EXPECT_EQ(call->fault, 0u);
    if (step == 0) {
      EXPECT_FALSE(call->used_candidates) << "no guess on the first call";
    }
    if (step >= 2) {
      EXPECT_TRUE(call->used_candidates) << "step " << step << ": " << call->candidates;
    }
  }
}

// Every rank's block in one call: bitwise the CPU result (repeated indices across blocks are
// added in block order), and a bad block reported through the workspace after the stream.
TEST(CudaKernels, ScatterAddBlocksMatchesCpuAndReportsFaults) {
  PSD_SKIP_WITHOUT_GPU();
  const size_t n = 100000, k = 4000;
  const int world = 9;
  std::mt19937 gen(11);
  std::vector<uint32_t> words;
  for (int b = 0; b < world; ++b) {
    std::vector<uint32_t> idx;
    for (size_t i = gen() % 20; idx.size() < k; i += 1 + gen() % 40) {
      idx.push_back(static_cast<uint32_t>(i % n));
    }
    std::sort(idx.begin(), idx.end());
    idx.erase(std::unique(idx.begin(), idx.end()), idx.end());
    while (idx.size() < k) idx.push_back(idx.back() + 1);  // stays < n for these sizes
    std::vector<float> val = RandomFloats(k, 900 + static_cast<uint32_t>(b), 10.0f);
    words.insert(words.end(), idx.begin(), idx.end());
    for (float v : val) {
      uint32_t w;
      std::memcpy(&w, &v, 4);
      words.push_back(w);
    }
  }
  std::vector<float> dense(n, 0.0f);
  DeviceBuffer<uint32_t> d_words(words);
  DeviceBuffer<float> d_dense(dense);
  auto cpu_ws = Cpu().NewScatterWorkspace();
  auto gpu_ws = Gpu().NewScatterWorkspace();
  ASSERT_TRUE(
      Cpu().ScatterAddBlocks(words.data(), world, k, dense.data(), n, cpu_ws.get(), nullptr).ok());
  Status s =
      Gpu().ScatterAddBlocks(d_words.get(), world, k, d_dense.get(), n, gpu_ws.get(), nullptr);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ExpectSameBits(dense, d_dense.Download(), "dense");
  EXPECT_TRUE(gpu_ws->Fault().ok());

  // Block 4 repeats an index: nothing is added, the next look at the workspace names it.
  std::vector<uint32_t> bad = words;
  bad[4 * 2 * k + 10] = bad[4 * 2 * k + 9];
  d_words.Upload(bad);
  const std::vector<float> before = d_dense.Download();
  ASSERT_TRUE(
      Gpu().ScatterAddBlocks(d_words.get(), world, k, d_dense.get(), n, gpu_ws.get(), nullptr)
          .ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  Status fault = gpu_ws->Fault();
  auto cpu_ws2 = Cpu().NewScatterWorkspace();
  Status cpu_fault =
      Cpu().ScatterAddBlocks(bad.data(), world, k, dense.data(), n, cpu_ws2.get(), nullptr);
  EXPECT_EQ(fault.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(fault.message(), cpu_fault.message());
  ExpectSameBits(before, d_dense.Download(), "dense after a bad block (unchanged)");
  // Sticky: the next call fails at once.
  EXPECT_FALSE(
      Gpu().ScatterAddBlocks(d_words.get(), world, k, d_dense.get(), n, gpu_ws.get(), nullptr)
          .ok());
}

TEST(CudaKernels, ScatterAddMatchesCpu) {
  PSD_SKIP_WITHOUT_GPU();
  const size_t n = 50000, m = 3000;
  std::vector<float> dense = RandomFloats(n, 1), val = RandomFloats(m, 2);
  std::vector<uint32_t> idx(m);
  for (size_t j = 0; j < m; ++j) idx[j] = static_cast<uint32_t>((j * 7919) % n);  // distinct
  DeviceBuffer<float> d_dense(dense), d_val(val);
  DeviceBuffer<uint32_t> d_idx(idx);
  ASSERT_TRUE(Cpu().ScatterAdd(idx.data(), val.data(), m, dense.data(), n, nullptr).ok());
  Status s = Gpu().ScatterAdd(d_idx.get(), d_val.get(), m, d_dense.get(), n, nullptr);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ExpectSameBits(dense, d_dense.Download(), "dense");  // distinct indices: exact

  // Repeated indices: float atomics add in any order, so compare with a tolerance.
  std::vector<uint32_t> rep(m);
  for (size_t j = 0; j < m; ++j) rep[j] = static_cast<uint32_t>(j % 17);
  d_idx.Upload(rep);
  ASSERT_TRUE(Cpu().ScatterAdd(rep.data(), val.data(), m, dense.data(), n, nullptr).ok());
  ASSERT_TRUE(Gpu().ScatterAdd(d_idx.get(), d_val.get(), m, d_dense.get(), n, nullptr).ok());
  std::vector<float> got = d_dense.Download();
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(got[i], dense[i], 1e-3f) << i;

  rep[5] = static_cast<uint32_t>(n + 3);
  rep[9] = static_cast<uint32_t>(n);
  d_idx.Upload(rep);
  s = Gpu().ScatterAdd(d_idx.get(), d_val.get(), m, d_dense.get(), n, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("idx[5] is 50003 but n is 50000"), std::string::npos) << s.message();
  std::vector<float> after = d_dense.Download();
  ExpectSameBits(got, after, "dense after a bad index (unchanged)");
}

// The runtime's device casts (the NCCL backend's float32 accumulation) against its host ones.
TEST(CudaKernels, HalfCastsMatchHost) {
  PSD_SKIP_WITHOUT_GPU();
  const size_t n = 100001;
  std::vector<float> src = RandomFloats(n, 3, 1000.0f);
  DeviceBuffer<float> d_src(src), d_back(n);
  DeviceBuffer<uint16_t> d_half(n);
  for (DType t : {DType::kFloat16, DType::kBFloat16}) {
    std::vector<uint16_t> half(n);
    std::vector<float> back(n);
    NarrowFromFloat32(t, src.data(), half.data(), n);
    WidenToFloat32(t, half.data(), back.data(), n);
    ASSERT_TRUE(LaunchNarrowFromFloat32(t, d_src.get(), d_half.get(), n, nullptr).ok());
    ASSERT_TRUE(LaunchWidenToFloat32(t, d_half.get(), d_back.get(), n, nullptr).ok());
    ASSERT_EQ(d_half.Download(), half) << DTypeName(t);
    ExpectSameBits(back, d_back.Download(), "widened");
  }
}

TEST(CudaKernels, PackUnpackRoundTrip) {
  PSD_SKIP_WITHOUT_GPU();
  std::vector<float> a = RandomFloats(1000, 4), b = RandomFloats(3, 5), c = RandomFloats(777, 6);
  DeviceBuffer<float> da(a), db(b), dc(c), fused(a.size() + b.size() + c.size());
  ASSERT_TRUE(Gpu()
                  .Pack({{da.get(), a.size() * 4},
                         {db.get(), 0},
                         {db.get(), b.size() * 4},
                         {dc.get(), c.size() * 4}},
                        fused.get(), nullptr)
                  .ok());
  std::vector<float> want = a;
  want.insert(want.end(), b.begin(), b.end());
  want.insert(want.end(), c.begin(), c.end());
  ExpectSameBits(want, fused.Download(), "packed");
  DeviceBuffer<float> ra(a.size()), rb(b.size()), rc(c.size());
  ASSERT_TRUE(
      Gpu()
          .Unpack(fused.get(),
                  {{ra.get(), a.size() * 4}, {rb.get(), b.size() * 4}, {rc.get(), c.size() * 4}},
                  nullptr)
          .ok());
  ExpectSameBits(a, ra.Download(), "a");
  ExpectSameBits(b, rb.Download(), "b");
  ExpectSameBits(c, rc.Download(), "c");
}

TEST(CudaKernels, MemoryCallsMatchCpu) {
  PSD_SKIP_WITHOUT_GPU();
  // Allocate: device memory, zero-filled.
  auto buf = Gpu().Allocate(4001 * sizeof(float));
  ASSERT_TRUE(buf.ok()) << buf.status().ToString();
  EXPECT_EQ((*buf)->memory(), MemoryKind::kDevice);
  EXPECT_EQ((*buf)->bytes(), 4001 * sizeof(float));
  ASSERT_TRUE(CheckDevicePointer("test", "buf", (*buf)->data(), (*buf)->bytes()).ok());
  std::vector<float> host(4001, 1.0f);
  ASSERT_TRUE(Gpu().Copy(host.data(), (*buf)->data(), host.size() * 4, nullptr).ok());
  ASSERT_TRUE(Gpu().Synchronize(nullptr).ok());
  for (float v : host) ASSERT_TRUE(SameBits(v, 0.0f));
  // Copy host -> device -> device -> host, then Scale and Fill against the CPU twins.
  std::vector<float> x = RandomFloats(4001, 21, 3.0f);
  x[5] = std::numeric_limits<float>::infinity();
  x[6] = -0.0f;
  x[7] = 1e-38f;  // the product underflows to a subnormal: no flush to zero either side
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  DeviceBuffer<float> other(x.size());
  ASSERT_TRUE(Gpu().Copy((*buf)->data(), x.data(), x.size() * 4, stream).ok());
  ASSERT_TRUE(Gpu().Copy(other.get(), (*buf)->data(), x.size() * 4, stream).ok());
  const float inv = 1.0f / 3.0f;
  ASSERT_TRUE(Gpu().Scale(other.get(), x.size() - 1, inv, stream).ok());
  ASSERT_TRUE(Gpu().Fill((*buf)->as<float>() + 10, 20, -2.5f, stream).ok());
  std::vector<float> got_scaled(x.size()), got_filled(x.size());
  ASSERT_TRUE(Gpu().Copy(got_scaled.data(), other.get(), x.size() * 4, stream).ok());
  ASSERT_TRUE(Gpu().Copy(got_filled.data(), (*buf)->data(), x.size() * 4, stream).ok());
  ASSERT_TRUE(Gpu().Synchronize(stream).ok());
  std::vector<float> want_scaled = x, want_filled = x;
  ASSERT_TRUE(Cpu().Scale(want_scaled.data(), x.size() - 1, inv, nullptr).ok());
  ASSERT_TRUE(Cpu().Fill(want_filled.data() + 10, 20, -2.5f, nullptr).ok());
  ExpectSameBits(want_scaled, got_scaled, "scaled");
  ExpectSameBits(want_filled, got_filled, "filled");
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  // Device pointers are checked where the contract needs device memory.
  Status s = Gpu().Scale(host.data(), host.size(), 2.0f, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("expected device"), std::string::npos) << s.message();
}

TEST(CudaKernels, OptimizerStepsMatchCpu) {
  PSD_SKIP_WITHOUT_GPU();
  const size_t n = 30011, stride = 30016;
  const int num = 3;
  std::vector<float> grads = RandomFloats(stride * num, 9);
  DeviceBuffer<float> d_grads(grads);
  for (bool nesterov : {false, true}) {
    std::vector<float> p = RandomFloats(n, 10), vel = RandomFloats(n, 11);
    DeviceBuffer<float> dp(p), dv(vel);
    SgdParams sp;
    sp.lr = 0.05f;
    sp.momentum = 0.9f;
    sp.weight_decay = 1e-4f;
    sp.nesterov = nesterov;
    ASSERT_TRUE(
        Cpu()
            .SgdStep(p.data(), grads.data(), num, stride, 1.0f / 3, vel.data(), n, sp, nullptr)
            .ok());
    ASSERT_TRUE(
        Gpu()
            .SgdStep(dp.get(), d_grads.get(), num, stride, 1.0f / 3, dv.get(), n, sp, nullptr)
            .ok());
    ExpectSameBits(p, dp.Download(), "sgd param");
    ExpectSameBits(vel, dv.Download(), "sgd velocity");
  }
  std::vector<float> p = RandomFloats(n, 12), m = RandomFloats(n, 13, 0.1f), v(n);
  for (auto& x : v) x = std::abs(RandomFloats(1, 14)[0]) * 0.01f + 1e-6f;
  DeviceBuffer<float> dp(p), dm(m), dv(v);
  AdamParams ap;
  ap.step = 7;
  ap.weight_decay = 0.01f;
  ASSERT_TRUE(
      Cpu()
          .AdamStep(p.data(), grads.data(), num, stride, 0.5f, m.data(), v.data(), n, ap, nullptr)
          .ok());
  ASSERT_TRUE(
      Gpu()
          .AdamStep(dp.get(), d_grads.get(), num, stride, 0.5f, dm.get(), dv.get(), n, ap, nullptr)
          .ok());
  ExpectSameBits(p, dp.Download(), "adam param");
  ExpectSameBits(m, dm.Download(), "adam m");
  ExpectSameBits(v, dv.Download(), "adam v");
}

TEST(CudaKernels, SufficientFactorGemmMatchesCpu) {
  PSD_SKIP_WITHOUT_GPU();
  const size_t rows = 24, m = 130, n = 77;
  std::vector<float> u = RandomFloats(rows * m, 15), v = RandomFloats(rows * n, 16);
  std::vector<float> g = RandomFloats(m * n, 17);
  DeviceBuffer<float> du(u), dv(v), dg(g);
  ASSERT_TRUE(
      Cpu()
          .SufficientFactorGemm(u.data(), v.data(), rows, m, n, 0.25f, 1.0f, g.data(), nullptr)
          .ok());
  Status s =
      Gpu().SufficientFactorGemm(du.get(), dv.get(), rows, m, n, 0.25f, 1.0f, dg.get(), nullptr);
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::vector<float> got = dg.Download();
  // Summation order inside the GEMMs differs (BLAS vs cuBLAS blocking): float32 tolerance.
  for (size_t i = 0; i < m * n; ++i) ASSERT_NEAR(got[i], g[i], 1e-4f * (1.0f + std::abs(g[i])));
}

}  // namespace
}  // namespace poseidon
