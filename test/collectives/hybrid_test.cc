// Multi-rank tests of the four strategies through HybridCollective. Each rank's inputs come
// from a formula of (rank, step, index), so every rank computes the dense reference for all
// ranks locally. Inputs are multiples of 1/8 (and factors multiples of 1/4), so sums are exact
// in float32 and the dense average compares with ==; the GEMM and optimizer steps compare to
// a double-precision reference within float32 rounding. Every rank must end bitwise identical:
// a hash of the result is allgathered and compared. The top-k tests are in hybrid_topk_test.cc
// (the same test executable).
#include "collectives/hybrid.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "runtime/settings.h"
#include "runtime/shard.h"
#include "test/collectives/hybrid_test_util.h"
#include "test/mpi/rank_checks.h"
#include "test/mpi_test_main.h"

namespace poseidon {
namespace {

using testing::DenseAverage;
using testing::Grad;
using testing::Layer;
using testing::MakeHybrid;
using testing::Plan;
using testing::Rank;
using testing::SameOnAllRanks;
using testing::Size;
using testing::Sparse;
using testing::World;

float Factor(int rank, int which, size_t row, size_t col) {
  return static_cast<float>(static_cast<int>((row * 5 + col * 3 + rank * 7 + which) % 9) - 4) /
         4.0f;
}

// ---- reference optimizers (PyTorch semantics), in double ----
struct RefSgd {
  SgdParams p;
  std::vector<double> vel;
  void Step(std::vector<double>& w, const std::vector<double>& g) {
    vel.resize(w.size(), 0.0);
    for (size_t i = 0; i < w.size(); ++i) {
      double d = g[i] + p.weight_decay * w[i];
      vel[i] = p.momentum * vel[i] + d;
      w[i] -= p.lr * (p.nesterov ? d + p.momentum * vel[i] : vel[i]);
    }
  }
};
struct RefAdam {
  AdamParams p;
  std::vector<double> m, v;
  int t = 0;
  void Step(std::vector<double>& w, const std::vector<double>& g) {
    m.resize(w.size(), 0.0);
    v.resize(w.size(), 0.0);
    ++t;
    double bc1 = 1 - std::pow(static_cast<double>(p.beta1), t);
    double bc2 = 1 - std::pow(static_cast<double>(p.beta2), t);
    for (size_t i = 0; i < w.size(); ++i) {
      double d = g[i] + p.weight_decay * w[i];
      m[i] = p.beta1 * m[i] + (1 - p.beta1) * d;
      v[i] = p.beta2 * v[i] + (1 - p.beta2) * d * d;
      w[i] -= p.lr * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + p.eps);
    }
  }
};

// The average over ranks of U_r^T V_r with K_r rows, in double.
std::vector<double> FactorAverage(size_t m, size_t n, const std::vector<size_t>& batches) {
  std::vector<double> g(m * n, 0.0);
  for (int r = 0; r < Size(); ++r) {
    for (size_t k = 0; k < batches[static_cast<size_t>(r)]; ++k) {
      for (size_t i = 0; i < m; ++i) {
        for (size_t j = 0; j < n; ++j) {
          g[i * n + j] += static_cast<double>(Factor(r, 0, k, i)) * Factor(r, 1, k, j);
        }
      }
    }
  }
  for (double& x : g) x /= Size();
  return g;
}

void ExpectNear(const std::vector<float>& got, const std::vector<double>& want,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    double tol = 2e-6 * std::max(1.0, std::fabs(want[i]));
    ASSERT_NEAR(got[i], want[i], tol) << what << " i=" << i;
  }
}

// ---------------------------------------------------------------- allreduce

TEST(AllReduce, AveragesExactlyForEveryShape) {
  auto h = MakeHybrid();
  const std::vector<std::vector<size_t>> shapes = {{0}, {1}, {7}, {1001}, {3, 5}, {64, 3, 3, 3}};
  for (size_t s = 0; s < shapes.size(); ++s) {
    ASSERT_TRUE(h->RegisterLayer(
                     Layer(StrCat("l", s), shapes[s], LayerKind::kDense, StrategyKind::kAllReduce))
                    .ok());
  }
  ASSERT_TRUE(Plan(*h, 1).ok());
  const float inv = 1.0f / static_cast<float>(Size());
  for (int64_t step = 0; step < 2; ++step) {
    for (int id = 0; id < h->num_layers(); ++id) {
      size_t n = h->layer(id).NumElements();
      std::vector<float> g(n);
      for (size_t i = 0; i < n; ++i) g[i] = Grad(Rank(), step, i);
      ExchangeBuffers b;
      b.grad = g.data();
      ASSERT_TRUE(h->Exchange(id, b, step).ok());
      std::vector<double> avg = DenseAverage(n, step);
      for (size_t i = 0; i < n; ++i) {
        // The sum is exact; the average is that sum times float(1/P), rounded once.
        float want = static_cast<float>(avg[i] * Size()) * inv;
        ASSERT_EQ(g[i], want) << "layer " << id << " i=" << i;
      }
      ASSERT_TRUE(SameOnAllRanks(g.data(), n * 4));
      double p = Size();
      EXPECT_DOUBLE_EQ(h->LayerTraffic(id).last_bytes_sent, 2 * (p - 1) / p * 4 * n);
    }
  }
  EXPECT_EQ(h->TotalTraffic().exchanges, 2 * h->num_layers());
  EXPECT_DOUBLE_EQ(h->TotalTraffic().bytes_sent, h->TotalTraffic().dense_bytes);
}

// ---------------------------------------------------------------- sfb

// Rectangular layers, K = 1, and a different K on every rank (padded to max_batch).
TEST(Sfb, EqualsTheDenseSumOfFactorProducts) {
  struct Case {
    size_t m, n;
    bool vary;
    size_t k;
  };
  const Case cases[] = {
      {5, 3, false, 1}, {1, 1, false, 1}, {17, 33, false, 4}, {8, 2, true, 3}, {33, 65, true, 5}};
  for (const Case& c : cases) {
    auto h = MakeHybrid();
    ASSERT_TRUE(
        h->RegisterLayer(Layer("fc", {c.m, c.n}, LayerKind::kFullyConnected, StrategyKind::kSfb))
            .ok());
    ASSERT_TRUE(Plan(*h, c.k).ok());
    std::vector<size_t> batches(static_cast<size_t>(Size()), c.k);
    // Varying: rank r has (r % (k + 1)) rows, so some ranks have none at all.
    if (c.vary) {
      for (int r = 0; r < Size(); ++r) batches[static_cast<size_t>(r)] = r % (c.k + 1);
    }
    size_t kr = batches[static_cast<size_t>(Rank())];
    std::vector<float> u(kr * c.m), v(kr * c.n), g(c.m * c.n, 123.0f);
    for (size_t k = 0; k < kr; ++k) {
      for (size_t i = 0; i < c.m; ++i) u[k * c.m + i] = Factor(Rank(), 0, k, i);
      for (size_t j = 0; j < c.n; ++j) v[k * c.n + j] = Factor(Rank(), 1, k, j);
    }
    ExchangeBuffers b;
    b.grad = g.data();
    b.u = u.data();
    b.v = v.data();
    b.batch = kr;
    ASSERT_TRUE(h->Exchange(0, b, 0).ok());
    ExpectNear(g, FactorAverage(c.m, c.n, batches), StrCat("sfb ", c.m, "x", c.n));
    ASSERT_TRUE(SameOnAllRanks(g.data(), g.size() * 4));
    double p = Size();
    EXPECT_DOUBLE_EQ(h->LayerTraffic(0).last_bytes_sent, 4.0 * c.k * (c.m + c.n) * (p - 1));
  }
}

// The same factors through allreduce (the gradient is formed locally) give the same average.
TEST(Sfb, AllReduceOfFactorGradientsAgrees) {
  auto h = MakeHybrid();
  ASSERT_TRUE(
      h->RegisterLayer(Layer("fc", {6, 10}, LayerKind::kFullyConnected, StrategyKind::kAllReduce))
          .ok());
  ASSERT_TRUE(Plan(*h, 3).ok());
  std::vector<float> u(18), v(30), g(60);
  for (size_t k = 0; k < 3; ++k) {
    for (size_t i = 0; i < 6; ++i) u[k * 6 + i] = Factor(Rank(), 0, k, i);
    for (size_t j = 0; j < 10; ++j) v[k * 10 + j] = Factor(Rank(), 1, k, j);
  }
  ExchangeBuffers b;
  b.grad = g.data();
  b.u = u.data();
  b.v = v.data();
  b.batch = 3;
  ASSERT_TRUE(h->Exchange(0, b, 0).ok());
  ExpectNear(g, FactorAverage(6, 10, std::vector<size_t>(static_cast<size_t>(Size()), 3)), "ar");
}

// A rank whose batch exceeds the planned K fails, and so does every other rank (no hang).
TEST(Sfb, OneRankWithABadBatchFailsEveryRank) {
  auto h = MakeHybrid();
  ASSERT_TRUE(
      h->RegisterLayer(Layer("fc", {4, 4}, LayerKind::kFullyConnected, StrategyKind::kSfb)).ok());
  ASSERT_TRUE(Plan(*h, 2).ok());
  std::vector<float> u(5 * 4, 1.0f), v(5 * 4, 1.0f), g(16);
  ExchangeBuffers b;
  b.grad = g.data();
  b.u = u.data();
  b.v = v.data();
  b.batch = Rank() == Size() - 1 ? 5 : 2;
  Status st = h->Exchange(0, b, 0);
  ASSERT_FALSE(st.ok());
  if (Rank() == Size() - 1) {
    EXPECT_NE(st.message().find("batch 5 exceeds max_batch 2"), std::string::npos) << st.message();
  }
  // The collective is still usable afterwards.
  b.batch = 2;
  EXPECT_TRUE(h->Exchange(0, b, 1).ok());
}

// A local kernel failure on one rank before the collective (forming U^T V from a batch beyond
// the BLAS index range) fails every rank instead of leaving the others in the allreduce.
TEST(AllReduce, OneRankWithAFailingLocalStepFailsEveryRank) {
  auto h = MakeHybrid();
  ASSERT_TRUE(h->RegisterLayer(
                   Layer("fc", {4, 4}, LayerKind::kFullyConnected, StrategyKind::kAllReduce))
                  .ok());
  ASSERT_TRUE(Plan(*h, 2).ok());
  std::vector<float> u(2 * 4, 1.0f), v(2 * 4, 1.0f), g(16);
  ExchangeBuffers b;
  b.grad = g.data();
  b.u = u.data();
  b.v = v.data();
  const bool bad = Rank() == Size() - 1;
  b.batch = bad ? (size_t{1} << 32) : 2;  // refused by the GEMM before it reads u or v
  Status st = h->Exchange(0, b, 0);
  ASSERT_FALSE(st.ok());
  if (bad) {
    EXPECT_NE(st.message().find("exceeds the BLAS index range"), std::string::npos)
        << st.message();
  } else {
    EXPECT_NE(st.message().find(StrCat("rank ", Size() - 1)), std::string::npos) << st.message();
  }
  // The collective is still usable afterwards: every rank's U^T V is 2 at every entry.
  b.batch = 2;
  ASSERT_TRUE(h->Exchange(0, b, 1).ok());
  for (float x : g) EXPECT_EQ(x, 2.0f);
}

// ---------------------------------------------------------------- optimizers

struct OptCase {
  StrategyKind strategy;
  bool adam;
};

class WithOptimizer : public ::testing::TestWithParam<OptCase> {};

// Several steps of SGD with momentum (weight decay, nesterov) or Adam: parameters follow the
// reference optimizer driven by the dense average, and stay bitwise identical across ranks.
TEST_P(WithOptimizer, FollowsTheReferenceStep) {
  const OptCase c = GetParam();
  const bool fc = c.strategy == StrategyKind::kSfb;
  const size_t m = 7, nn = 13, kb = 2;  // fc layer 7 x 13 (sfb), dense 1001 (uneven shards)
  const size_t n = fc ? m * nn : 1001;
  LayerSpec spec = Layer("w", fc ? std::vector<size_t>{m, nn} : std::vector<size_t>{n},
                         fc ? LayerKind::kFullyConnected : LayerKind::kDense, c.strategy);
  SgdParams sp{0.05f, 0.9f, 0.01f, c.strategy == StrategyKind::kAllReduce};
  AdamParams ap{0.01f, 0.9f, 0.999f, 1e-8f, 0.001f, 1};
  spec.optimizer = c.adam ? OptimizerSpec::Adam(ap) : OptimizerSpec::Sgd(sp);
  auto h = MakeHybrid();
  ASSERT_TRUE(h->RegisterLayer(spec).ok());
  ASSERT_TRUE(Plan(*h, kb).ok());
  ASSERT_EQ(h->strategy(0), c.strategy);

  std::vector<float> w(n);
  std::vector<double> ref(n);
  for (size_t i = 0; i < n; ++i) ref[i] = w[i] = static_cast<float>(i % 11) / 16.0f - 0.25f;
  RefSgd rs{sp, {}};
  RefAdam ra{ap, {}, {}, 0};
  for (int64_t step = 0; step < 4; ++step) {
    std::vector<float> g(n);
    std::vector<float> u(kb * m), v(kb * nn);
    std::vector<double> avg;
    ExchangeBuffers b;
    b.grad = g.data();
    b.params = w.data();
    if (fc) {
      // Factors change with the step through the rank offset.
      int r = Rank() + static_cast<int>(step);
      for (size_t k = 0; k < kb; ++k) {
        for (size_t i = 0; i < m; ++i) u[k * m + i] = Factor(r, 0, k, i);
        for (size_t j = 0; j < nn; ++j) v[k * nn + j] = Factor(r, 1, k, j);
      }
      b.u = u.data();
      b.v = v.data();
      b.batch = kb;
      avg.assign(n, 0.0);
      for (int q = 0; q < Size(); ++q) {
        for (size_t k = 0; k < kb; ++k) {
          for (size_t i = 0; i < m; ++i) {
            for (size_t j = 0; j < nn; ++j) {
              // Products of quarters: exact in double, and so is their sum.
              avg[i * nn + j] += static_cast<double>(Factor(q + static_cast<int>(step), 0, k, i)) *
                                 Factor(q + static_cast<int>(step), 1, k, j);
            }
          }
        }
      }
      for (double& x : avg) x /= Size();
    } else {
      for (size_t i = 0; i < n; ++i) g[i] = Grad(Rank(), step, i);
      avg = DenseAverage(n, step);
    }
    ASSERT_TRUE(h->Exchange(0, b, step).ok());
    if (c.adam) {
      ra.Step(ref, avg);
    } else {
      rs.Step(ref, avg);
    }
    ExpectNear(w, ref, StrCat(StrategyName(c.strategy), " step ", step));
    ASSERT_TRUE(SameOnAllRanks(w.data(), n * 4)) << "step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Strategies, WithOptimizer,
    ::testing::Values(OptCase{StrategyKind::kPs, false}, OptCase{StrategyKind::kPs, true},
                      OptCase{StrategyKind::kAllReduce, false},
                      OptCase{StrategyKind::kAllReduce, true}, OptCase{StrategyKind::kSfb, false},
                      OptCase{StrategyKind::kSfb, true}),
    [](const ::testing::TestParamInfo<OptCase>& i) {
      return StrCat(StrategyName(i.param.strategy), i.param.adam ? "_adam" : "_sgd");
    });

// ps keeps optimizer state for its shard only: 1/P of the memory.
TEST(Ps, OptimizerStateLivesOnTheShardOwner) {
  auto h = MakeHybrid();
  LayerSpec spec = Layer("w", {1001}, LayerKind::kDense, StrategyKind::kPs);
  spec.optimizer = OptimizerSpec::Adam(AdamParams{});
  ASSERT_TRUE(h->RegisterLayer(spec).ok());
  ASSERT_TRUE(Plan(*h, 1).ok());
  std::vector<float> g(1001, 0.5f), w(1001, 1.0f);
  ExchangeBuffers b;
  b.grad = g.data();
  b.params = w.data();
  ASSERT_TRUE(h->Exchange(0, b, 0).ok());
  double p = Size();
  EXPECT_DOUBLE_EQ(h->LayerTraffic(0).last_bytes_sent, 2 * (p - 1) / p * 4 * 1001);
  // No optimizer: ps is refused at registration with a reason.
  auto h2 = MakeHybrid();
  auto id = h2->RegisterLayer(Layer("w", {10}, LayerKind::kDense, StrategyKind::kPs));
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.status().message().find("ps needs an optimizer"), std::string::npos);
  (void)ShardCount(1001, Size(), Rank());
}

// Fewer elements than ranks: some shards are empty, and the result is still the reference.
TEST(Ps, EmptyShardsWhenFewerElementsThanRanks) {
  const size_t n = 3;
  auto h = MakeHybrid();
  LayerSpec spec = Layer("tiny", {n}, LayerKind::kDense, StrategyKind::kPs);
  SgdParams sp{0.1f, 0.5f, 0.0f, false};
  spec.optimizer = OptimizerSpec::Sgd(sp);
  ASSERT_TRUE(h->RegisterLayer(spec).ok());
  ASSERT_TRUE(Plan(*h, 1).ok());
  std::vector<float> w(n, 1.0f);
  std::vector<double> ref(n, 1.0);
  RefSgd rs{sp, {}};
  for (int64_t step = 0; step < 3; ++step) {
    std::vector<float> g(n);
    for (size_t i = 0; i < n; ++i) g[i] = Grad(Rank(), step, i);
    ExchangeBuffers b;
    b.grad = g.data();
    b.params = w.data();
    ASSERT_TRUE(h->Exchange(0, b, step).ok());
    rs.Step(ref, DenseAverage(n, step));
    ExpectNear(w, ref, StrCat("ps n=3 step ", step));
    ASSERT_TRUE(SameOnAllRanks(w.data(), n * 4));
  }
}

// POSEIDON_STRATEGY and POSEIDON_CANDIDATES reach BuildPlan when no options are given.
TEST(Hybrid, SettingsDriveThePlan) {
  Settings& s = Settings::Global();
  ASSERT_TRUE(s.Set("POSEIDON_STRATEGY", "sfb").ok());
  auto h = MakeHybrid();
  LayerSpec fc = Layer("fc", {8, 8}, LayerKind::kFullyConnected, StrategyKind::kSfb);
  fc.force.reset();
  LayerSpec conv = Layer("conv", {8, 8}, LayerKind::kDense, StrategyKind::kSfb);
  conv.force.reset();
  ASSERT_TRUE(h->RegisterLayer(fc).ok());
  ASSERT_TRUE(h->RegisterLayer(conv).ok());
  ASSERT_TRUE(h->BuildPlan(1024, CostModel::BytesOnly()).ok());  // sfb costs more here
  EXPECT_EQ(h->strategy(0), StrategyKind::kSfb);
  EXPECT_EQ(h->plan().entries[0].reason, "global");
  EXPECT_EQ(h->strategy(1), StrategyKind::kAllReduce);
  EXPECT_EQ(h->plan().entries[1].reason, "global-na");
  ASSERT_TRUE(s.Set("POSEIDON_STRATEGY", "auto").ok());
  ASSERT_TRUE(s.Set("POSEIDON_CANDIDATES", "allreduce").ok());
  ASSERT_TRUE(h->BuildPlan(1, CostModel::BytesOnly()).ok());  // sfb would win, not allowed
  EXPECT_EQ(h->strategy(0), StrategyKind::kAllReduce);
  ASSERT_TRUE(s.Set("POSEIDON_CANDIDATES", "allreduce,bogus").ok());
  Status bad = h->BuildPlan(1, CostModel::BytesOnly());
  EXPECT_NE(bad.message().find("POSEIDON_CANDIDATES"), std::string::npos) << bad.message();
  s.Reset();
}

// ---------------------------------------------------------------- planning and errors

TEST(Hybrid, MixedPlanRunsEveryStrategyInOneStep) {
  auto h = MakeHybrid();
  LayerSpec fc = Layer("fc", {64, 128}, LayerKind::kFullyConnected, StrategyKind::kSfb);
  // The planner decides; with one rank it prefers allreduce to sfb on a tie (nothing is
  // exchanged: collectives_unit_test), so there sfb is forced to keep every strategy here.
  if (Size() > 1) fc.force.reset();
  fc.optimizer = OptimizerSpec::Sgd(SgdParams{});
  LayerSpec conv = Layer("conv", {32, 3, 3, 3}, LayerKind::kDense, StrategyKind::kPs);
  conv.optimizer = OptimizerSpec::Sgd(SgdParams{});
  LayerSpec emb = Sparse("emb", 20000, 0.001);
  LayerSpec bias = Layer("bias", {32}, LayerKind::kDense, StrategyKind::kAllReduce);
  for (const LayerSpec& l : {fc, conv, emb, bias}) ASSERT_TRUE(h->RegisterLayer(l).ok());
  // Bytes only, K = 1: sfb (P*1*(64+128) <= 2*64*128/192 = 85.3 for P <= 8 ... 192 P <= 16384).
  PlannerOptions o;
  o.candidates = {StrategyKind::kAllReduce, StrategyKind::kSfb};
  ASSERT_TRUE(h->BuildPlan(1, CostModel::BytesOnly(), o).ok());
  EXPECT_EQ(h->strategy(0), StrategyKind::kSfb);
  EXPECT_EQ(h->strategy(1), StrategyKind::kPs);
  EXPECT_EQ(h->strategy(2), StrategyKind::kTopk);
  EXPECT_EQ(h->strategy(3), StrategyKind::kAllReduce);
  auto parsed = ParsePlan(h->PrintPlan());
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->entries.size(), 4u);

  std::vector<float> u(64, 0.25f), v(128, 0.5f), g0(64 * 128), w0(64 * 128, 1.0f);
  std::vector<float> g1(32 * 27, 0.125f), w1(32 * 27, 1.0f), g2(20000, 0.0f), g3(32, 1.0f);
  g2[Rank()] = 1.0f;
  for (int64_t step = 0; step < 2; ++step) {
    h->ResetIteration();
    ExchangeBuffers b0;
    b0.grad = g0.data();
    b0.params = w0.data();
    b0.u = u.data();
    b0.v = v.data();
    b0.batch = 1;
    ASSERT_TRUE(h->Exchange(0, b0, step).ok());
    ExchangeBuffers b1;
    b1.grad = g1.data();
    b1.params = w1.data();
    ASSERT_TRUE(h->Exchange(1, b1, step).ok());
    ExchangeBuffers b2;
    b2.grad = g2.data();
    ASSERT_TRUE(h->Exchange(2, b2, step).ok());
    ExchangeBuffers b3;
    b3.grad = g3.data();
    ASSERT_TRUE(h->Exchange(3, b3, step).ok());
    double sum = 0;
    for (int id = 0; id < 4; ++id) sum += h->LayerTraffic(id).last_bytes_sent;
    EXPECT_DOUBLE_EQ(h->TotalTraffic().last_bytes_sent, sum);
  }
  // sfb with momentum-free SGD from a constant gradient 0.125: w = 1 - 0.01 * (0.125 + 0.9 *
  // 0.125 + 0.125) after two steps (SgdParams' defaults: lr 0.01, momentum 0.9).
  EXPECT_NEAR(w0[0], 1.0 - 0.01 * 0.125 - 0.01 * (0.9 * 0.125 + 0.125), 1e-6);
  EXPECT_TRUE(SameOnAllRanks(w0.data(), w0.size() * 4));
  EXPECT_TRUE(SameOnAllRanks(w1.data(), w1.size() * 4));
  if (Size() > 1) {
    EXPECT_LT(h->TotalTraffic().bytes_sent, h->TotalTraffic().dense_bytes);
  }
}

TEST(Hybrid, ErrorsNameTheCallAndValue) {
  // Device memory works where a GPU and CUDA are (test/gpu checks it); elsewhere Create says
  // why there is no device backend, on every rank.
  auto dev = HybridCollective::Create(World(), MemoryKind::kDevice);
  if (!dev.ok()) {
    EXPECT_EQ(dev.status().code(), StatusCode::kUnavailable) << dev.status().ToString();
  }
  EXPECT_FALSE(HybridCollective::Create(nullptr).ok());
  auto h = MakeHybrid();
  std::vector<float> g(10);
  ExchangeBuffers b;
  b.grad = g.data();
  Status st = h->Exchange(0, b, 0);
  EXPECT_NE(st.message().find("layer id 0 is not registered"), std::string::npos);
  ASSERT_TRUE(h->RegisterLayer(Layer("a", {10}, LayerKind::kDense, StrategyKind::kAllReduce)).ok());
  auto dup = h->RegisterLayer(Layer("a", {3}, LayerKind::kDense, StrategyKind::kAllReduce));
  EXPECT_NE(dup.status().message().find("already registered"), std::string::npos);
  st = h->Exchange(0, b, 0);
  EXPECT_NE(st.message().find("no plan; call BuildPlan"), std::string::npos) << st.message();
  Status zero_batch = h->BuildPlan(0, CostModel::BytesOnly(), PlannerOptions{});
  EXPECT_NE(zero_batch.message().find("batch 0 is invalid"), std::string::npos);
  ASSERT_TRUE(Plan(*h, 1).ok());
  EXPECT_NE(h->Exchange(0, b, -1).message().find("step -1"), std::string::npos);
  ExchangeBuffers null_grad;
  st = h->Exchange(0, null_grad, 0);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("grad is null"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("layer a"), std::string::npos) << st.message();
  LayerSpec opt = Layer("o", {10}, LayerKind::kDense, StrategyKind::kAllReduce);
  opt.optimizer = OptimizerSpec::Sgd(SgdParams{});
  ASSERT_TRUE(h->RegisterLayer(opt).ok());
  ASSERT_TRUE(Plan(*h, 1).ok());
  st = h->Exchange(1, b, 0);
  EXPECT_NE(st.message().find("params is null"), std::string::npos) << st.message();
}

// Ranks that registered different layers fail BuildPlan together instead of hanging later.
TEST(Hybrid, DisagreeingPlansFailEveryRank) {
  if (Size() == 1) GTEST_SKIP() << "needs two ranks";
  auto h = MakeHybrid();
  ASSERT_TRUE(h->RegisterLayer(Layer("a", {10}, LayerKind::kDense, StrategyKind::kAllReduce)).ok());
  if (Rank() == 0) {
    ASSERT_TRUE(
        h->RegisterLayer(Layer("b", {5}, LayerKind::kDense, StrategyKind::kAllReduce)).ok());
  }
  Status st = Plan(*h, 1);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kMismatch);
  EXPECT_NE(st.message().find("the plan on rank 1 differs from rank 0's (first at line 4 of "
                              "the table: rank 0 'b 5 dense allreduce"),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("rank 1 '# predicted"), std::string::npos) << st.message();
}

// A layer whose forced strategy differs on the last rank only: every rank's error names the
// layer's line on rank 0 and on that rank.
TEST(Hybrid, PlanThatDiffersOnTheLastRankNamesTheLayer) {
  if (Size() == 1) GTEST_SKIP() << "needs two ranks";
  auto h = MakeHybrid();
  const bool odd = Rank() == Size() - 1;
  ASSERT_TRUE(h->RegisterLayer(Layer("a", {10}, LayerKind::kDense, StrategyKind::kAllReduce)).ok());
  ASSERT_TRUE(h->RegisterLayer(Layer("w", {64}, LayerKind::kSparse,
                                     odd ? StrategyKind::kTopk : StrategyKind::kAllReduce))
                  .ok());
  Status st = Plan(*h, 1);
  EXPECT_TRUE(testing::OnEveryRank(st.code() == StatusCode::kMismatch)) << st.ToString();
  EXPECT_NE(st.message().find(StrCat("the plan on rank ", Size() - 1,
                                     " differs from rank 0's (first at line 4 of the table: "
                                     "rank 0 'w 64 sparse allreduce")),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find(StrCat("rank ", Size() - 1, " 'w 64 sparse topk")),
            std::string::npos)
      << st.message();
  // Agreeing layers plan afterwards.
  auto again = MakeHybrid();
  ASSERT_TRUE(
      again->RegisterLayer(Layer("a", {10}, LayerKind::kDense, StrategyKind::kAllReduce)).ok());
  EXPECT_TRUE(testing::OkOnEveryRank(Plan(*again, 1)));
}

}  // namespace
}  // namespace poseidon
