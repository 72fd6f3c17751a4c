// Unit tests of the CPU kernels (kernels/cpu) against brute-force references: exact top-k with
// residuals (every vector width this CPU has) and its bad arguments. The other kernels are in
// kernels_cpu_ops_test.cc (the same test executable).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/kernels.h"
#include "runtime/build_config.h"
#include "runtime/half.h"
#include "test/unit/kernels_cpu_test_util.h"

namespace poseidon {
namespace {

using testing::HasError;
using testing::K;
using testing::SameBits;

// ---------------------------------------------------------------------------------------------
// FusedResidualTopK

uint32_t RefKey(float x) {
  if (std::isnan(x)) return 0x7f800001u;
  return FloatBits(x) & 0x7fffffffu;
}

struct TopKCase {
  std::vector<float> grad, residual, mom;  // mom empty: no momentum
  float momentum = 0.0f;
};

struct TopKResult {
  std::vector<uint32_t> idx;
  std::vector<float> val, residual, mom;
};

// Full sort by (magnitude key descending, index ascending), the documented tie-break.
TopKResult Reference(const TopKCase& c, size_t k) {
  const size_t n = c.grad.size();
  TopKResult out;
  out.residual = c.residual;
  out.mom = c.mom;
  for (size_t i = 0; i < n; ++i) {
    float u = c.grad[i];
    if (!c.mom.empty()) {
      u = c.momentum * c.mom[i] + u;
      out.mom[i] = u;
    }
    out.residual[i] = c.residual[i] + u;
  }
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    uint32_t ka = RefKey(out.residual[a]), kb = RefKey(out.residual[b]);
    return ka != kb ? ka > kb : a < b;
  });
  order.resize(k);
  std::sort(order.begin(), order.end());
  for (uint32_t i : order) {
    out.idx.push_back(i);
    out.val.push_back(out.residual[i]);
    out.residual[i] = 0.0f;
    if (!out.mom.empty()) out.mom[i] = 0.0f;
  }
  return out;
}

TopKResult RunKernel(TopKCase c, size_t k, KernelWorkspace* ws) {
  TopKResult out;
  out.idx.assign(k, 0xdeadbeefu);
  out.val.assign(k, -1.0f);
  Status s = K().FusedResidualTopK(c.grad.data(), c.residual.data(),
                                   c.mom.empty() ? nullptr : c.mom.data(), c.momentum,
                                   c.grad.size(), k, out.idx.data(), out.val.data(), ws, nullptr);
  EXPECT_TRUE(s.ok()) << s.ToString();
  out.residual = std::move(c.residual);
  out.mom = std::move(c.mom);
  return out;
}

void ExpectSameBits(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(SameBits(a[i], b[i])) << what << "[" << i << "]: " << a[i] << " vs " << b[i];
  }
}

void ExpectMatchesReference(const TopKCase& c, size_t k, KernelWorkspace* ws) {
  TopKResult want = Reference(c, k);
  TopKResult got = RunKernel(c, k, ws);
  ASSERT_EQ(got.idx, want.idx) << "n = " << c.grad.size() << ", k = " << k;
  ASSERT_TRUE(std::is_sorted(got.idx.begin(), got.idx.end()));
  ExpectSameBits(got.val, want.val, "val");
  ExpectSameBits(got.residual, want.residual, "residual");
  ExpectSameBits(got.mom, want.mom, "momentum");
}

enum class Data { kNormal, kFewLevels, kNaNs, kZeros, kNegative };

TopKCase MakeCase(size_t n, Data data, bool momentum, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> level(-2, 2);
  TopKCase c;
  c.grad.resize(n);
  c.residual.resize(n);
  for (size_t i = 0; i < n; ++i) {
    switch (data) {
      case Data::kNormal:
        c.grad[i] = normal(rng);
        c.residual[i] = 0.5f * normal(rng);
        break;
      case Data::kFewLevels:  // many equal magnitudes: ties decide the selection
        c.grad[i] = static_cast<float>(level(rng));
        c.residual[i] = 0.0f;
        break;
      case Data::kNaNs:
        c.grad[i] = normal(rng);
        c.residual[i] = (rng() % 97 == 0) ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
        if (rng() % 211 == 0) c.grad[i] = std::numeric_limits<float>::infinity();
        break;
      case Data::kZeros:
        c.grad[i] = 0.0f;
        c.residual[i] = (i % 2) ? -0.0f : 0.0f;
        break;
      case Data::kNegative:
        c.grad[i] = -std::fabs(normal(rng)) - 1.0f;
        c.residual[i] = -std::fabs(normal(rng));
        break;
    }
  }
  if (momentum) {
    c.momentum = 0.9f;
    c.mom.resize(n);
    for (size_t i = 0; i < n; ++i) {
      c.mom[i] = data == Data::kZeros       ? 0.0f
                 : data == Data::kFewLevels ? static_cast<float>(level(rng))
                                            : normal(rng);
    }
  }
  return c;
}

std::vector<std::string> IsasHere() {
  std::vector<std::string> isas = {"scalar"};
  for (const char* isa : {"avx2", "avx512"}) {
    if (cpu::ForceIsaForTesting(isa).ok()) isas.push_back(isa);
  }
  EXPECT_TRUE(cpu::ForceIsaForTesting("auto").ok());
  return isas;
}

class TopKIsaTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    Status s = cpu::ForceIsaForTesting(GetParam());
    if (s.code() == StatusCode::kUnavailable) GTEST_SKIP() << s.ToString();
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  void TearDown() override { EXPECT_TRUE(cpu::ForceIsaForTesting("auto").ok()); }
};

TEST_P(TopKIsaTest, MatchesBruteForceOverSizesAndData) {
  auto ws = K().NewWorkspace();  // one workspace for every size: reuse across n
  uint32_t seed = 1;
  for (size_t n : {size_t{1}, size_t{2}, size_t{7}, size_t{1000}, size_t{9000}}) {
    for (Data data :
         {Data::kNormal, Data::kFewLevels, Data::kNaNs, Data::kZeros, Data::kNegative}) {
      for (bool momentum : {false, true}) {
        TopKCase c = MakeCase(n, data, momentum, seed++);
        std::vector<size_t> ks = {1, n, std::max<size_t>(1, n / 2), std::max<size_t>(1, n / 100),
                                  std::max<size_t>(1, n - 1)};
        for (size_t k : ks) {
          SCOPED_TRACE(::testing::Message() << "n=" << n << " data=" << static_cast<int>(data)
                                            << " momentum=" << momentum << " k=" << k);
          ExpectMatchesReference(c, k, ws.get());
        }
      }
    }
  }
}

TEST_P(TopKIsaTest, LargeInputsUseBothSelectionPaths) {
  const size_t n = size_t{1} << 20;
  auto ws = K().NewWorkspace();
  auto* cws = dynamic_cast<cpu::TopKWorkspace*>(ws.get());
  ASSERT_NE(cws, nullptr);
  uint32_t seed = 100;
  for (bool momentum : {false, true}) {
    TopKCase c = MakeCase(n, Data::kNormal, momentum, seed++);
    for (size_t k : {size_t{1}, size_t{1000}, size_t{10486}}) {  // density 0.1%, 1%
      SCOPED_TRACE(::testing::Message() << "normal momentum=" << momentum << " k=" << k);
      ExpectMatchesReference(c, k, ws.get());
      EXPECT_TRUE(cws->last_used_sample) << "random data should take the sampled path";
      EXPECT_GE(cws->last_candidates, k);
    }
    for (size_t k : {n / 3, n - 1, n}) {  // large k: the radix select
      SCOPED_TRACE(::testing::Message() << "normal momentum=" << momentum << " k=" << k);
      ExpectMatchesReference(c, k, ws.get());
      EXPECT_FALSE(cws->last_used_sample);
    }
    // Few distinct magnitudes: the sampled threshold collects far too many entries (or is
    // zero), so the exact radix select decides, with index tie-breaks.
    TopKCase levels = MakeCase(n, Data::kFewLevels, momentum, seed++);
    for (size_t k : {size_t{1}, size_t{1000}, n / 2}) {
      SCOPED_TRACE(::testing::Message() << "levels momentum=" << momentum << " k=" << k);
      ExpectMatchesReference(levels, k, ws.get());
      EXPECT_FALSE(cws->last_used_sample);
    }
    TopKCase nans = MakeCase(n, Data::kNaNs, momentum, seed++);
    SCOPED_TRACE("nans");
    ExpectMatchesReference(nans, 20000, ws.get());
  }
}

// Sparse gradients: all but `nonzeros` entries (at distinct pseudo-random positions) are exact
// zeros, half of them -0.0f in the gradient and half in the residual (-0 + -0 stays -0, so the
// selection must hand back the sign bit as the update left it). With `levels`, the nonzero
// magnitudes are 1 or 2 (ties among them); with momentum, the momentum buffer is nonzero only
// where the gradient is, so the update keeps the same zeros.
TopKCase MakeSparseCase(size_t n, size_t nonzeros, bool levels, bool momentum, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  TopKCase c;
  c.grad.assign(n, 0.0f);
  c.residual.assign(n, 0.0f);
  for (size_t i = 0; i < n; ++i) {
    if (i % 2 == 1) c.grad[i] = -0.0f;  // i % 4 == 1: +0 + -0 = +0
    if (i % 4 >= 2) c.residual[i] = -0.0f;  // i % 4 == 3: -0 + -0 = -0
  }
  std::vector<uint32_t> pos(n);
  std::iota(pos.begin(), pos.end(), 0u);
  std::shuffle(pos.begin(), pos.end(), rng);
  pos.resize(nonzeros);
  for (uint32_t i : pos) {
    c.grad[i] = levels ? static_cast<float>(1 + rng() % 2) * (rng() % 2 ? 1.0f : -1.0f)
                       : normal(rng);
  }
  if (momentum) {
    c.momentum = 0.9f;
    c.mom.assign(n, 0.0f);
    for (uint32_t i : pos) c.mom[i] = levels ? 1.0f : normal(rng);
  }
  return c;
}

TEST_P(TopKIsaTest, MostlyZeroInputsCollectOnlyTheNonzeros) {
  const size_t n = size_t{1} << 20;  // large enough for the sampled threshold
  auto ws = K().NewWorkspace();
  auto* cws = dynamic_cast<cpu::TopKWorkspace*>(ws.get());
  ASSERT_NE(cws, nullptr);
  const size_t k = 1000;
  uint32_t seed = 300;
  for (bool momentum : {false, true}) {
    // Nonzero counts around k: more than k (the candidates decide), exactly k, k - 1 and far
    // fewer (every nonzero plus the lowest-index zeros), none at all; 0.1% density (1049).
    for (size_t nonzeros : {size_t{1049}, k + 1, k, k - 1, size_t{10}, size_t{0}}) {
      for (bool levels : {false, true}) {
        TopKCase c = MakeSparseCase(n, nonzeros, levels, momentum, seed++);
        SCOPED_TRACE(::testing::Message() << "momentum=" << momentum << " nonzeros=" << nonzeros
                                          << " levels=" << levels << " k=" << k);
        ExpectMatchesReference(c, k, ws.get());
        EXPECT_TRUE(cws->last_used_sample) << "the nonzero entries should decide the selection";
        EXPECT_EQ(cws->last_candidates, nonzeros) << "exactly the nonzero entries are collected";
      }
    }
    // Large k on sparse data: almost all of the selection is zeros.
    TopKCase c = MakeSparseCase(n, 1049, false, momentum, seed++);
    for (size_t kk : {size_t{1}, size_t{10486}, n / 3, n - 1}) {
      SCOPED_TRACE(::testing::Message() << "momentum=" << momentum << " k=" << kk);
      ExpectMatchesReference(c, kk, ws.get());
    }
  }
}

TEST_P(TopKIsaTest, AllZerosSelectTheLowestIndicesWithTheirSigns) {
  const size_t n = size_t{1} << 17;
  auto ws = K().NewWorkspace();
  for (bool momentum : {false, true}) {
    TopKCase c = MakeSparseCase(n, 0, false, momentum, 7);
    for (size_t k : {size_t{1}, size_t{5}, size_t{131}, size_t{4096}, n - 1, n}) {
      SCOPED_TRACE(::testing::Message() << "momentum=" << momentum << " k=" << k);
      TopKResult got = RunKernel(c, k, ws.get());
      ASSERT_EQ(got.idx.size(), k);
      // Index 3 mod 4 held -0 in both the gradient and the residual: the sum is -0. With
      // momentum the update is 0.9 * (+0) + (-0) = +0, and -0 + +0 = +0.
      auto negative = [&](size_t i) { return !momentum && i % 4 == 3; };
      for (size_t j = 0; j < k; ++j) {
        ASSERT_EQ(got.idx[j], j);
        ASSERT_EQ(FloatBits(got.val[j]), negative(j) ? 0x80000000u : 0u) << "j = " << j;
      }
      for (size_t i = 0; i < n; ++i) {
        uint32_t want = i >= k && negative(i) ? 0x80000000u : 0u;
        ASSERT_EQ(FloatBits(got.residual[i]), want) << "residual[" << i << "]";
      }
      ExpectMatchesReference(c, k, ws.get());
    }
  }
}

// Several steps on one sparse layer: the residual keeps the unsent nonzeros, so their count
// (and the path) changes from step to step; each step must match the reference.
TEST_P(TopKIsaTest, SparseStepsMatchReference) {
  const size_t n = size_t{1} << 18, k = 300;
  auto ws = K().NewWorkspace();
  for (bool momentum : {false, true}) {
    TopKCase state = MakeSparseCase(n, 0, false, momentum, 11);
    for (int step = 0; step < 4; ++step) {
      TopKCase c = MakeSparseCase(n, 200, false, momentum, 20 + step);
      c.residual = state.residual;
      c.mom = state.mom;
      SCOPED_TRACE(::testing::Message() << "momentum=" << momentum << " step=" << step);
      TopKResult want = Reference(c, k);
      TopKResult got = RunKernel(c, k, ws.get());
      ASSERT_EQ(got.idx, want.idx);
      ExpectSameBits(got.val, want.val, "val");
      ExpectSameBits(got.residual, want.residual, "residual");
      ExpectSameBits(got.mom, want.mom, "momentum");
      state.residual = got.residual;
      state.mom = got.mom;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, TopKIsaTest, ::testing::ValuesIn(IsasHere()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST(TopK, NaNIsSelectedFirstAndTiesGoToSmallerIndex) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> grad = {1.0f, -3.0f, 3.0f, nan, -inf, 2.0f, nan, -3.0f};
  std::vector<float> residual(grad.size(), 0.0f);
  std::vector<uint32_t> idx(5);
  std::vector<float> val(5);
  auto ws = K().NewWorkspace();
  ASSERT_TRUE(K().FusedResidualTopK(grad.data(), residual.data(), nullptr, 0.0f, grad.size(), 5,
                                    idx.data(), val.data(), ws.get(), nullptr)
                  .ok());
  // NaNs (3, 6) above -inf (4) above |3| at 1 and 2; |3| at 7 loses the tie to index 1 and 2.
  EXPECT_EQ(idx, (std::vector<uint32_t>{1, 2, 3, 4, 6}));
  EXPECT_EQ(val[0], -3.0f);
  EXPECT_EQ(val[1], 3.0f);
  EXPECT_TRUE(std::isnan(val[2]));
  EXPECT_EQ(val[3], -inf);
  EXPECT_TRUE(std::isnan(val[4]));
  EXPECT_EQ(residual, (std::vector<float>{1.0f, 0, 0, 0, 0, 2.0f, 0, -3.0f}));
}

TEST(TopK, ConservationOverSteps) {
  // sent + residual_after == residual_before + update, bit-exact in float32, step after step.
  const size_t n = 200000, k = 200;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (bool with_momentum : {false, true}) {
    std::vector<float> residual(n, 0.0f), mom(n, 0.0f), grad(n);
    std::vector<uint32_t> idx(k);
    std::vector<float> val(k);
    auto ws = K().NewWorkspace();
    const float m = with_momentum ? 0.5f : 0.0f;
    for (int step = 0; step < 4; ++step) {
      for (float& g : grad) g = normal(rng);
      std::vector<float> before = residual, update(n);
      for (size_t i = 0; i < n; ++i) update[i] = with_momentum ? m * mom[i] + grad[i] : grad[i];
      ASSERT_TRUE(K().FusedResidualTopK(grad.data(), residual.data(),
                                        with_momentum ? mom.data() : nullptr, m, n, k, idx.data(),
                                        val.data(), ws.get(), nullptr)
                      .ok());
      std::vector<float> sent(n, 0.0f);
      ASSERT_TRUE(std::is_sorted(idx.begin(), idx.end()));
      ASSERT_EQ(std::adjacent_find(idx.begin(), idx.end()), idx.end()) << "duplicate index";
      for (size_t j = 0; j < k; ++j) sent[idx[j]] = val[j];
      for (size_t i = 0; i < n; ++i) {
        ASSERT_TRUE(SameBits(sent[i] + residual[i], before[i] + update[i])) << "i = " << i;
      }
      if (with_momentum) {
        for (size_t j = 0; j < k; ++j) ASSERT_EQ(mom[idx[j]], 0.0f);  // momentum masking
      }
    }
  }
}

TEST(TopK, BadArguments) {
  std::vector<float> g(10, 1.0f), r(10, 0.0f), mom(10, 0.0f);
  std::vector<uint32_t> idx(11);
  std::vector<float> val(11);
  auto ws = K().NewWorkspace();
  auto run = [&](const float* gp, float* rp, float* mp, float m, size_t n, size_t k, uint32_t* ip,
                 float* vp, KernelWorkspace* w) {
    return K().FusedResidualTopK(gp, rp, mp, m, n, k, ip, vp, w, nullptr);
  };
  const StatusCode kArg = StatusCode::kInvalidArgument;
  EXPECT_TRUE(HasError(run(g.data(), r.data(), nullptr, 0, 10, 0, idx.data(), val.data(), ws.get()),
                       kArg, {"FusedResidualTopK", "k is 0", "n = 10"}));
  EXPECT_TRUE(
      HasError(run(g.data(), r.data(), nullptr, 0, 10, 11, idx.data(), val.data(), ws.get()), kArg,
               {"FusedResidualTopK", "k is 11", "n is 10"}));
  EXPECT_TRUE(HasError(run(g.data(), r.data(), nullptr, 0, 0, 1, idx.data(), val.data(), ws.get()),
                       kArg, {"k is 1", "n is 0"}));
  EXPECT_TRUE(HasError(run(nullptr, r.data(), nullptr, 0, 10, 1, idx.data(), val.data(), ws.get()),
                       kArg, {"grad is null", "n = 10"}));
  EXPECT_TRUE(HasError(run(g.data(), nullptr, nullptr, 0, 10, 1, idx.data(), val.data(), ws.get()),
                       kArg, {"residual is null"}));
  EXPECT_TRUE(HasError(run(g.data(), r.data(), nullptr, 0, 10, 1, nullptr, val.data(), ws.get()),
                       kArg, {"out_idx is null", "k = 1"}));
  EXPECT_TRUE(HasError(run(g.data(), r.data(), nullptr, 0, 10, 1, idx.data(), nullptr, ws.get()),
                       kArg, {"out_val is null"}));
  EXPECT_TRUE(
      HasError(run(g.data(), r.data(), nullptr, 0.9f, 10, 1, idx.data(), val.data(), ws.get()),
               kArg, {"momentum is 0.9", "momentum_buf is null"}));
  EXPECT_TRUE(HasError(
      run(g.data(), r.data(), mom.data(), std::nanf(""), 10, 1, idx.data(), val.data(), ws.get()),
      kArg, {"momentum is nan"}));
  EXPECT_TRUE(HasError(run(g.data(), g.data(), nullptr, 0, 10, 1, idx.data(), val.data(), ws.get()),
                       kArg, {"distinct"}));
  EXPECT_TRUE(HasError(run(g.data(), r.data(), nullptr, 0, 10, 1, idx.data(), val.data(), nullptr),
                       kArg, {"workspace is null"}));
  struct OtherWorkspace : KernelWorkspace {};
  OtherWorkspace other;
  EXPECT_TRUE(HasError(run(g.data(), r.data(), nullptr, 0, 10, 1, idx.data(), val.data(), &other),
                       kArg, {"another Kernels implementation"}));
  // Nothing was modified by the failed calls.
  EXPECT_EQ(r, std::vector<float>(10, 0.0f));
}

}  // namespace
}  // namespace poseidon
