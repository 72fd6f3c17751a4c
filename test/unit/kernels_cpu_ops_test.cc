// Unit tests of the CPU kernels other than top-k (kernels_cpu_test.cc): scatter-add, the
// sufficient-factor GEMM, pack / unpack, the fused optimizer steps, the memory calls and the
// dispatch by memory kind, with every bad argument.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/kernels.h"
#include "runtime/build_config.h"
#include "test/unit/kernels_cpu_test_util.h"

namespace poseidon {
namespace {

using testing::HasError;
using testing::K;
using testing::SameBits;

// ---------------------------------------------------------------------------------------------
// ScatterAdd

TEST(ScatterAdd, AddsWithDuplicates) {
  std::vector<float> dense = {1, 2, 3, 4, 5};
  std::vector<uint32_t> idx = {4, 0, 4, 2, 4};
  std::vector<float> val = {10, 20, 30, 0.5f, -1};
  ASSERT_TRUE(
      K().ScatterAdd(idx.data(), val.data(), idx.size(), dense.data(), dense.size(), nullptr).ok());
  EXPECT_EQ(dense, (std::vector<float>{21, 2, 3.5f, 4, 44}));
  EXPECT_TRUE(K().ScatterAdd(nullptr, nullptr, 0, nullptr, 0, nullptr).ok());  // empty is fine
}

TEST(ScatterAdd, OutOfRangeIndexIsAnErrorAndChangesNothing) {
  std::vector<float> dense = {1, 2, 3};
  std::vector<uint32_t> idx = {0, 2, 3, 1};
  std::vector<float> val = {1, 1, 1, 1};
  EXPECT_TRUE(HasError(K().ScatterAdd(idx.data(), val.data(), 4, dense.data(), 3, nullptr),
                       StatusCode::kInvalidArgument, {"ScatterAdd", "idx[2] is 3", "n is 3"}));
  EXPECT_EQ(dense, (std::vector<float>{1, 2, 3}));
  EXPECT_TRUE(HasError(K().ScatterAdd(nullptr, val.data(), 4, dense.data(), 3, nullptr),
                       StatusCode::kInvalidArgument, {"idx is null", "m = 4"}));
  EXPECT_TRUE(HasError(K().ScatterAdd(idx.data(), nullptr, 4, dense.data(), 3, nullptr),
                       StatusCode::kInvalidArgument, {"val is null"}));
  EXPECT_TRUE(HasError(K().ScatterAdd(idx.data(), val.data(), 4, nullptr, 3, nullptr),
                       StatusCode::kInvalidArgument, {"dense is null"}));
}

// ---------------------------------------------------------------------------------------------
// SufficientFactorGemm

TEST(SufficientFactorGemm, MatchesNaiveTripleLoop) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  struct Shape {
    size_t rows, m, n;
  };
  for (Shape s : {Shape{1, 1, 1}, Shape{1, 7, 5}, Shape{3, 17, 9}, Shape{64, 33, 65},
                  Shape{5, 128, 1}, Shape{2, 1, 40}}) {
    for (float beta : {0.0f, 1.0f, -0.5f}) {
      std::vector<float> u(s.rows * s.m), v(s.rows * s.n), g(s.m * s.n);
      for (float& x : u) x = uni(rng);
      for (float& x : v) x = uni(rng);
      for (float& x : g) x = uni(rng);
      const float alpha = 0.75f;
      std::vector<double> want(s.m * s.n);
      for (size_t i = 0; i < s.m; ++i) {
        for (size_t j = 0; j < s.n; ++j) {
          double acc = 0.0;
          for (size_t r = 0; r < s.rows; ++r) acc += double(u[r * s.m + i]) * v[r * s.n + j];
          want[i * s.n + j] = alpha * acc + double(beta) * g[i * s.n + j];
        }
      }
      ASSERT_TRUE(K().SufficientFactorGemm(u.data(), v.data(), s.rows, s.m, s.n, alpha, beta,
                                           g.data(), nullptr)
                      .ok());
      for (size_t i = 0; i < g.size(); ++i) {
        ASSERT_NEAR(g[i], want[i], 1e-5 * (s.rows + 1))
            << "rows=" << s.rows << " m=" << s.m << " n=" << s.n << " i=" << i;
      }
    }
  }
}

TEST(SufficientFactorGemm, NoFactorsScalesByBeta) {
  std::vector<float> g = {1, -2, std::nanf(""), 4};
  ASSERT_TRUE(
      K().SufficientFactorGemm(nullptr, nullptr, 0, 2, 2, 1.0f, 0.5f, g.data(), nullptr).ok());
  EXPECT_EQ(g[0], 0.5f);
  EXPECT_EQ(g[1], -1.0f);
  EXPECT_EQ(g[3], 2.0f);
  ASSERT_TRUE(
      K().SufficientFactorGemm(nullptr, nullptr, 0, 2, 2, 1.0f, 0.0f, g.data(), nullptr).ok());
  EXPECT_EQ(g, std::vector<float>(4, 0.0f));  // beta = 0 overwrites, even NaN
}

TEST(SufficientFactorGemm, BadArguments) {
  std::vector<float> u(6), v(6), g(4);
  const StatusCode kArg = StatusCode::kInvalidArgument;
  EXPECT_TRUE(
      HasError(K().SufficientFactorGemm(nullptr, v.data(), 3, 2, 2, 1, 0, g.data(), nullptr), kArg,
               {"SufficientFactorGemm", "u is null", "rows = 3"}));
  EXPECT_TRUE(
      HasError(K().SufficientFactorGemm(u.data(), nullptr, 3, 2, 2, 1, 0, g.data(), nullptr), kArg,
               {"v is null"}));
  EXPECT_TRUE(
      HasError(K().SufficientFactorGemm(u.data(), v.data(), 3, 2, 2, 1, 0, nullptr, nullptr), kArg,
               {"g is null"}));
  EXPECT_TRUE(HasError(
      K().SufficientFactorGemm(u.data(), v.data(), size_t{1} << 33, 2, 2, 1, 0, g.data(), nullptr),
      kArg, {"rows = 8589934592", "BLAS"}));
}

// ---------------------------------------------------------------------------------------------
// Pack / Unpack

TEST(PackUnpack, RoundTrip) {
  std::vector<char> a = {'a', 'b', 'c'}, b, c = {'x', 'y', 'z', 'w', 'v'};
  std::vector<ConstByteRange> parts = {{a.data(), a.size()}, {nullptr, 0}, {c.data(), c.size()}};
  std::vector<char> fused(8);
  ASSERT_TRUE(K().Pack(parts, fused.data(), nullptr).ok());
  EXPECT_EQ(std::string(fused.begin(), fused.end()), "abcxyzwv");
  std::vector<char> a2(3), c2(5);
  ASSERT_TRUE(
      K().Unpack(fused.data(), {{a2.data(), 3}, {nullptr, 0}, {c2.data(), 5}}, nullptr).ok());
  EXPECT_EQ(a2, a);
  EXPECT_EQ(c2, c);
  EXPECT_TRUE(K().Pack({}, nullptr, nullptr).ok());
  EXPECT_TRUE(HasError(K().Pack({{nullptr, 4}}, fused.data(), nullptr),
                       StatusCode::kInvalidArgument, {"Pack", "parts[0].data is null", "4 bytes"}));
  EXPECT_TRUE(HasError(K().Pack(parts, nullptr, nullptr), StatusCode::kInvalidArgument,
                       {"dst is null", "8 bytes"}));
  EXPECT_TRUE(HasError(K().Unpack(fused.data(), {{a2.data(), 3}, {nullptr, 2}}, nullptr),
                       StatusCode::kInvalidArgument, {"Unpack", "parts[1].data is null"}));
  EXPECT_TRUE(HasError(K().Unpack(nullptr, {{a2.data(), 3}}, nullptr), StatusCode::kInvalidArgument,
                       {"src is null", "3 bytes"}));
}

// ---------------------------------------------------------------------------------------------
// Optimizer steps

// Pieces laid out with a gap (stride > n) to catch stride mistakes.
std::vector<float> MakePieces(int num, size_t n, size_t stride, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> g(num * stride, std::nanf(""));
  for (int q = 0; q < num; ++q) {
    for (size_t i = 0; i < n; ++i) g[q * stride + i] = normal(rng);
  }
  return g;
}

TEST(SgdStep, MatchesScalarFormulaOverSteps) {
  const size_t n = 2500, stride = 2600;
  for (int num : {1, 3}) {
    for (bool nesterov : {false, true}) {
      for (float wd : {0.0f, 1e-2f}) {
        SgdParams p;
        p.lr = 0.1f;
        p.momentum = 0.9f;
        p.weight_decay = wd;
        p.nesterov = nesterov;
        const float scale = 1.0f / num;
        std::vector<float> param(n), vel(n, 0.0f);
        for (size_t i = 0; i < n; ++i) param[i] = 0.001f * i - 1.0f;
        std::vector<float> ref_p = param, ref_v = vel;
        for (int step = 0; step < 4; ++step) {
          std::vector<float> g = MakePieces(num, n, stride, 50 + step);
          ASSERT_TRUE(
              K().SgdStep(param.data(), g.data(), num, stride, scale, vel.data(), n, p, nullptr)
                  .ok());
          for (size_t i = 0; i < n; ++i) {  // same float operations in the same order
            float s = g[i];
            for (int q = 1; q < num; ++q) s += g[q * stride + i];
            float gp = s * scale;
            if (wd != 0.0f) gp = gp + wd * ref_p[i];
            ref_v[i] = p.momentum * ref_v[i] + gp;
            ref_p[i] = ref_p[i] - p.lr * (nesterov ? gp + p.momentum * ref_v[i] : ref_v[i]);
          }
          for (size_t i = 0; i < n; ++i) {
            ASSERT_EQ(param[i], ref_p[i]) << "num=" << num << " step=" << step << " i=" << i;
            ASSERT_EQ(vel[i], ref_v[i]);
          }
        }
      }
    }
  }
}

TEST(SgdStep, ExactSmallExampleAndPlainSgd) {
  // Two pieces of 1 each, momentum 0.9, lr 0.5: v = 2, p = 1 - 0.5 * 2 = 0; then v = 3.8.
  std::vector<float> param = {1.0f}, vel = {0.0f}, g = {1.0f, 1.0f};
  SgdParams p;
  p.lr = 0.5f;
  p.momentum = 0.9f;
  ASSERT_TRUE(K().SgdStep(param.data(), g.data(), 2, 1, 1.0f, vel.data(), 1, p, nullptr).ok());
  EXPECT_EQ(param[0], 0.0f);
  EXPECT_EQ(vel[0], 2.0f);
  ASSERT_TRUE(K().SgdStep(param.data(), g.data(), 2, 1, 1.0f, vel.data(), 1, p, nullptr).ok());
  EXPECT_FLOAT_EQ(vel[0], 3.8f);
  // Momentum 0 needs no velocity buffer.
  p.momentum = 0.0f;
  param = {1.0f};
  ASSERT_TRUE(K().SgdStep(param.data(), g.data(), 2, 1, 0.5f, nullptr, 1, p, nullptr).ok());
  EXPECT_EQ(param[0], 0.5f);
}

double Pow(double b, int64_t t) { return std::pow(b, static_cast<double>(t)); }

TEST(AdamStep, MatchesFormulaOverSteps) {
  const size_t n = 3000, stride = 3001;
  for (int num : {1, 4}) {
    for (float wd : {0.0f, 0.05f}) {
      AdamParams p;
      p.lr = 1e-2f;
      p.weight_decay = wd;
      std::vector<float> param(n), m(n, 0.0f), v(n, 0.0f);
      for (size_t i = 0; i < n; ++i) param[i] = std::sin(0.01 * i);
      std::vector<double> rp(param.begin(), param.end()), rm(n, 0.0), rv(n, 0.0);
      const float scale = 1.0f / num;
      for (int64_t step = 1; step <= 5; ++step) {
        p.step = step;
        std::vector<float> g = MakePieces(num, n, stride, 90 + step);
        ASSERT_TRUE(K().AdamStep(param.data(), g.data(), num, stride, scale, m.data(), v.data(), n,
                                 p, nullptr)
                        .ok());
        for (size_t i = 0; i < n; ++i) {  // the formula, in double precision
          double s = 0.0;
          for (int q = 0; q < num; ++q) s += g[q * stride + i];
          double gp = s * scale + double(wd) * rp[i];
          rm[i] = p.beta1 * rm[i] + (1.0 - p.beta1) * gp;
          rv[i] = p.beta2 * rv[i] + (1.0 - p.beta2) * gp * gp;
          double mhat = rm[i] / (1.0 - Pow(p.beta1, step));
          double vhat = rv[i] / (1.0 - Pow(p.beta2, step));
          rp[i] -= p.lr * mhat / (std::sqrt(vhat) + p.eps);
        }
        for (size_t i = 0; i < n; ++i) {
          ASSERT_NEAR(param[i], rp[i], 2e-5) << "num=" << num << " step=" << step << " i=" << i;
          ASSERT_NEAR(m[i], rm[i], 1e-5 * (1 + std::fabs(rm[i])));
          ASSERT_NEAR(v[i], rv[i], 1e-5 * (1 + std::fabs(rv[i])));
        }
      }
    }
  }
}

TEST(OptimizerSteps, BadArguments) {
  std::vector<float> param(4), vel(4), m(4), v(4), g(8);
  const StatusCode kArg = StatusCode::kInvalidArgument;
  SgdParams sp;
  EXPECT_TRUE(HasError(K().SgdStep(param.data(), g.data(), 0, 4, 1, vel.data(), 4, sp, nullptr),
                       kArg, {"SgdStep", "num_grads is 0"}));
  EXPECT_TRUE(HasError(K().SgdStep(param.data(), g.data(), 2, 3, 1, vel.data(), 4, sp, nullptr),
                       kArg, {"grad_stride is 3", "n is 4"}));
  EXPECT_TRUE(HasError(K().SgdStep(param.data(), nullptr, 1, 4, 1, vel.data(), 4, sp, nullptr),
                       kArg, {"grads is null"}));
  EXPECT_TRUE(HasError(K().SgdStep(nullptr, g.data(), 1, 4, 1, vel.data(), 4, sp, nullptr), kArg,
                       {"param is null"}));
  EXPECT_TRUE(HasError(K().SgdStep(param.data(), g.data(), 1, 4, 1, nullptr, 4, sp, nullptr), kArg,
                       {"velocity is null", "momentum is 0.9"}));
  SgdParams bad = sp;
  bad.lr = -1.0f;
  EXPECT_TRUE(HasError(K().SgdStep(param.data(), g.data(), 1, 4, 1, vel.data(), 4, bad, nullptr),
                       kArg, {"lr is -1"}));
  bad = sp;
  bad.momentum = 0.0f;
  bad.nesterov = true;
  EXPECT_TRUE(HasError(K().SgdStep(param.data(), g.data(), 1, 4, 1, vel.data(), 4, bad, nullptr),
                       kArg, {"nesterov needs momentum > 0"}));
  EXPECT_TRUE(
      HasError(K().SgdStep(param.data(), g.data(), 1, 4, std::nanf(""), vel.data(), 4, sp, nullptr),
               kArg, {"grad_scale is nan"}));
  AdamParams ap;
  EXPECT_TRUE(
      HasError(K().AdamStep(param.data(), g.data(), 1, 4, 1, nullptr, v.data(), 4, ap, nullptr),
               kArg, {"AdamStep", "m (first moment) is null"}));
  EXPECT_TRUE(
      HasError(K().AdamStep(param.data(), g.data(), 1, 4, 1, m.data(), nullptr, 4, ap, nullptr),
               kArg, {"v (second moment) is null"}));
  AdamParams bad_adam = ap;
  bad_adam.step = 0;
  EXPECT_TRUE(HasError(
      K().AdamStep(param.data(), g.data(), 1, 4, 1, m.data(), v.data(), 4, bad_adam, nullptr), kArg,
      {"step is 0"}));
  bad_adam = ap;
  bad_adam.beta1 = 1.0f;
  EXPECT_TRUE(HasError(
      K().AdamStep(param.data(), g.data(), 1, 4, 1, m.data(), v.data(), 4, bad_adam, nullptr), kArg,
      {"beta1 is 1"}));
  bad_adam = ap;
  bad_adam.eps = -1e-8f;
  EXPECT_TRUE(HasError(
      K().AdamStep(param.data(), g.data(), 1, 4, 1, m.data(), v.data(), 4, bad_adam, nullptr), kArg,
      {"eps is"}));
}

// ---------------------------------------------------------------------------------------------
// Memory: Allocate, Scale, Fill, Copy, Synchronize

TEST(Allocate, ZeroFilledAlignedHostMemory) {
  for (size_t bytes :
       {size_t{1}, size_t{4}, size_t{63}, size_t{64}, size_t{4001}, size_t{1} << 20}) {
    auto buf = K().Allocate(bytes);
    ASSERT_TRUE(buf.ok()) << buf.status().ToString();
    ASSERT_NE((*buf)->data(), nullptr);
    EXPECT_EQ((*buf)->bytes(), bytes);
    EXPECT_EQ((*buf)->memory(), MemoryKind::kHost);
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*buf)->data()) % 64, 0u) << bytes;
    const auto* p = (*buf)->as<unsigned char>();
    for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(p[i], 0) << "byte " << i << " of " << bytes;
    std::memset((*buf)->data(), 0xab, bytes);  // the whole range is writable
  }
  auto empty = K().Allocate(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ((*empty)->data(), nullptr);
  EXPECT_EQ((*empty)->bytes(), 0u);
  auto huge = K().Allocate(SIZE_MAX - 8);
  EXPECT_TRUE(HasError(huge.status(), StatusCode::kInvalidArgument, {"Allocate", "bytes"}));
}

TEST(Scale, OneMultiplyPerElementBitwise) {
  std::vector<float> x = {1.0f,  -3.0f, 0.1f, 1e-30f, std::numeric_limits<float>::infinity(),
                          -0.0f, 7.0f};
  const float inv = 1.0f / 3.0f;
  std::vector<float> want = x;
  for (float& v : want) v = v * inv;
  ASSERT_TRUE(K().Scale(x.data(), x.size(), inv, nullptr).ok());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_TRUE(SameBits(x[i], want[i])) << i;
  // Only the first n change.
  std::vector<float> y = {2.0f, 2.0f, 2.0f};
  ASSERT_TRUE(K().Scale(y.data(), 2, 0.5f, nullptr).ok());
  EXPECT_EQ(y, (std::vector<float>{1.0f, 1.0f, 2.0f}));
  EXPECT_TRUE(K().Scale(nullptr, 0, 2.0f, nullptr).ok());
  EXPECT_TRUE(HasError(K().Scale(nullptr, 3, 2.0f, nullptr), StatusCode::kInvalidArgument,
                       {"Scale", "data is null", "n = 3"}));
  EXPECT_TRUE(HasError(K().Scale(y.data(), 3, std::numeric_limits<float>::quiet_NaN(), nullptr),
                       StatusCode::kInvalidArgument, {"Scale", "scale is nan", "finite"}));
  EXPECT_TRUE(HasError(K().Scale(y.data(), 3, std::numeric_limits<float>::infinity(), nullptr),
                       StatusCode::kInvalidArgument, {"scale is inf"}));
}

TEST(Fill, WritesTheValueToTheFirstN) {
  std::vector<float> x(9, 5.0f);
  ASSERT_TRUE(K().Fill(x.data(), 7, -0.25f, nullptr).ok());
  for (size_t i = 0; i < 7; ++i) EXPECT_EQ(x[i], -0.25f);
  EXPECT_EQ(x[7], 5.0f);
  EXPECT_EQ(x[8], 5.0f);
  ASSERT_TRUE(K().Fill(x.data(), 9, 0.0f, nullptr).ok());
  for (float v : x) EXPECT_TRUE(SameBits(v, 0.0f));
  EXPECT_TRUE(K().Fill(nullptr, 0, 1.0f, nullptr).ok());
  EXPECT_TRUE(HasError(K().Fill(nullptr, 2, 1.0f, nullptr), StatusCode::kInvalidArgument,
                       {"Fill", "n = 2"}));
}

TEST(Copy, BytesBetweenDisjointRanges) {
  std::vector<unsigned char> src(1000), dst(1000, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7 + 3);
  ASSERT_TRUE(K().Copy(dst.data() + 1, src.data() + 2, 997, nullptr).ok());
  EXPECT_EQ(dst[0], 0);
  for (size_t i = 0; i < 997; ++i) ASSERT_EQ(dst[i + 1], src[i + 2]) << i;
  EXPECT_EQ(dst[998], 0);
  EXPECT_TRUE(K().Copy(dst.data(), dst.data(), 1000, nullptr).ok());  // dst == src: nothing
  EXPECT_TRUE(K().Copy(nullptr, nullptr, 0, nullptr).ok());
  EXPECT_TRUE(HasError(K().Copy(nullptr, src.data(), 4, nullptr), StatusCode::kInvalidArgument,
                       {"Copy", "dst is null", "4 bytes"}));
  EXPECT_TRUE(HasError(K().Copy(dst.data(), nullptr, 4, nullptr), StatusCode::kInvalidArgument,
                       {"Copy", "src is null"}));
  EXPECT_TRUE(HasError(K().Copy(dst.data() + 10, dst.data(), 100, nullptr),
                       StatusCode::kInvalidArgument, {"Copy", "overlap", "10 bytes apart"}));
  // Into and out of an allocated buffer.
  auto buf = K().Allocate(1000);
  ASSERT_TRUE(buf.ok());
  ASSERT_TRUE(K().Copy((*buf)->data(), src.data(), 1000, nullptr).ok());
  std::vector<unsigned char> back(1000);
  ASSERT_TRUE(K().Copy(back.data(), (*buf)->data(), 1000, nullptr).ok());
  EXPECT_TRUE(K().Synchronize(nullptr).ok());
  EXPECT_EQ(back, src);
}

// ---------------------------------------------------------------------------------------------
// Dispatch

TEST(KernelsFor, HostIsCpuDeviceUnavailableHere) {
  Result<const Kernels*> host = KernelsFor(MemoryKind::kHost);
  ASSERT_TRUE(host.ok());
  EXPECT_EQ(*host, &CpuKernels());
  EXPECT_EQ((*host)->memory(), MemoryKind::kHost);
  EXPECT_STREQ((*host)->name(), "cpu");
  Result<const Kernels*> bogus = KernelsFor(static_cast<MemoryKind>(9));
  EXPECT_TRUE(HasError(bogus.status(), StatusCode::kInvalidArgument, {"unknown memory kind 9"}));
#if !POSEIDON_CUDA_ENABLED
  Result<const Kernels*> device = KernelsFor(MemoryKind::kDevice);
  EXPECT_TRUE(HasError(device.status(), StatusCode::kUnavailable, {"KernelsFor", "device"}));
#endif
}

}  // namespace
}  // namespace poseidon
