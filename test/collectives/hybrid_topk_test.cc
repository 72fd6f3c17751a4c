// Multi-rank tests of the top-k strategy through HybridCollective: exact k, the conservation
// invariant, momentum correction, full density, warm-up, the small-layer fallback and bad
// arguments. Inputs and references as in hybrid_test.cc (the same test executable).
#include "collectives/hybrid.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "runtime/settings.h"
#include "runtime/shard.h"
#include "test/collectives/hybrid_test_util.h"
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

// Exact k, ascending indices, the conservation invariant (exact), and a result equal to the
// rank-ordered sum of what every rank sent, bitwise identical on every rank.
void CheckTopkSteps(double momentum) {
  const size_t n = 1000;
  auto h = MakeHybrid();
  ASSERT_TRUE(h->RegisterLayer(Sparse("emb", n, 0.01, 0, momentum)).ok());
  ASSERT_TRUE(Plan(*h, 1).ok());
  const float inv = 1.0f / static_cast<float>(Size());
  std::vector<float> before(n, 0.0f), prev_mom(n, 0.0f);
  for (int64_t step = 0; step < 3; ++step) {
    std::vector<float> g(n), input(n);
    for (size_t i = 0; i < n; ++i) input[i] = g[i] = Grad(Rank(), step, i) * (1 + i % 3);
    ExchangeBuffers b;
    b.grad = g.data();
    ASSERT_TRUE(h->Exchange(0, b, step).ok());
    auto* st = dynamic_cast<const TopkLayerState*>(h->state(0));
    ASSERT_NE(st, nullptr);
    ASSERT_EQ(st->k(), 10u);
    ASSERT_EQ(st->last_indices().size(), 10u);
    for (size_t j = 1; j < 10; ++j) ASSERT_LT(st->last_indices()[j - 1], st->last_indices()[j]);
    std::vector<float> sent(n, 0.0f);
    for (size_t j = 0; j < 10; ++j) sent[st->last_indices()[j]] = st->last_values()[j];
    for (size_t i = 0; i < n; ++i) {
      // With momentum correction the update is u = m u + g; the kernel also clears u where an
      // entry was sent (DGC's momentum factor masking).
      float update = input[i];
      if (momentum > 0) {
        update = static_cast<float>(momentum) * prev_mom[i] + input[i];
        ASSERT_EQ(st->momentum()[i], sent[i] != 0.0f ? 0.0f : update) << "i=" << i;
      }
      ASSERT_EQ(before[i] + update, sent[i] + st->residual()[i]) << "step " << step << " i=" << i;
    }
    if (momentum > 0) prev_mom = st->momentum();
    // Each selected entry is at least as large as every entry left behind.
    float smallest_sent = INFINITY, largest_left = 0;
    for (size_t j = 0; j < 10; ++j) {
      smallest_sent = std::min(smallest_sent, std::fabs(st->last_values()[j]));
    }
    for (size_t i = 0; i < n; ++i)
      largest_left = std::max(largest_left, std::fabs(st->residual()[i]));
    ASSERT_GE(smallest_sent, largest_left);
    // Expected result: every rank's pairs, added in rank order, times 1/P.
    std::vector<uint32_t> all_idx(10 * static_cast<size_t>(Size()));
    std::vector<float> all_val(10 * static_cast<size_t>(Size()));
    ASSERT_TRUE(World()
                    ->host_backend()
                    .AllGather(st->last_indices().data(), all_idx.data(), 10, DType::kInt32)
                    .ok());
    ASSERT_TRUE(World()
                    ->host_backend()
                    .AllGather(st->last_values().data(), all_val.data(), 10, DType::kFloat32)
                    .ok());
    std::vector<float> want(n, 0.0f);
    for (size_t j = 0; j < all_idx.size(); ++j) want[all_idx[j]] += all_val[j];
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(g[i], want[i] * inv) << "i=" << i;
    ASSERT_TRUE(SameOnAllRanks(g.data(), n * 4));
    EXPECT_DOUBLE_EQ(h->LayerTraffic(0).last_bytes_sent, 8.0 * 10 * (Size() - 1));
    before = st->residual();
  }
  EXPECT_EQ(h->LayerTraffic(0).dense_fallbacks, 0);
}

TEST(Topk, ExactKConservationAndIdenticalResults) { CheckTopkSteps(0.0); }
TEST(Topk, MomentumCorrectionKeepsTheInvariant) { CheckTopkSteps(0.9); }

// Density 1 sends everything: the result is the exact dense average and the residual is zero.
TEST(Topk, FullDensityEqualsDenseAverage) {
  const size_t n = 257;
  auto h = MakeHybrid();
  ASSERT_TRUE(h->RegisterLayer(Sparse("s", n, 1.0)).ok());
  ASSERT_TRUE(Plan(*h, 1).ok());
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = Grad(Rank(), 0, i);
  ExchangeBuffers b;
  b.grad = g.data();
  ASSERT_TRUE(h->Exchange(0, b, 0).ok());
  std::vector<double> avg = DenseAverage(n, 0);
  const float inv = 1.0f / static_cast<float>(Size());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(g[i], static_cast<float>(avg[i] * Size()) * inv);
  auto* st = dynamic_cast<const TopkLayerState*>(h->state(0));
  for (float r : st->residual()) ASSERT_EQ(r, 0.0f);
}

// The first W steps are dense (exact average, residual untouched); compression starts at W.
TEST(Topk, WarmupStepsAreDense) {
  const size_t n = 500;
  auto h = MakeHybrid();
  ASSERT_TRUE(h->RegisterLayer(Sparse("s", n, 0.01, 2)).ok());
  ASSERT_TRUE(Plan(*h, 1).ok());
  const float inv = 1.0f / static_cast<float>(Size());
  for (int64_t step = 0; step < 3; ++step) {
    std::vector<float> g(n);
    for (size_t i = 0; i < n; ++i) g[i] = Grad(Rank(), step, i);
    ExchangeBuffers b;
    b.grad = g.data();
    ASSERT_TRUE(h->Exchange(0, b, step).ok());
    if (step < 2) {
      std::vector<double> avg = DenseAverage(n, step);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(g[i], static_cast<float>(avg[i] * Size()) * inv);
      EXPECT_EQ(h->LayerTraffic(0).dense_fallbacks, step + 1);
    } else {
      auto* st = dynamic_cast<const TopkLayerState*>(h->state(0));
      EXPECT_EQ(st->k(), 5u);
      size_t nonzero = 0;
      for (float x : g) nonzero += x != 0.0f;
      EXPECT_LE(nonzero, 5u * Size());
      EXPECT_GT(nonzero, 0u);
    }
  }
  EXPECT_EQ(h->LayerTraffic(0).dense_fallbacks, 2);
}

// A layer under POSEIDON_TOPK_MIN_ELEMENTS (the setting, here 16384 by default) is dense.
TEST(Topk, SmallLayersFallBackToDense) {
  auto h = MakeHybrid();
  LayerSpec l = Layer("small", {100}, LayerKind::kSparse, StrategyKind::kTopk);
  l.topk.density = 0.01;
  ASSERT_TRUE(h->RegisterLayer(l).ok());
  ASSERT_EQ(*h->layer(0).topk.min_elements, settings::TopkMinElements());
  ASSERT_TRUE(Plan(*h, 1).ok());
  std::vector<float> g(100);
  for (size_t i = 0; i < 100; ++i) g[i] = Grad(Rank(), 0, i);
  ExchangeBuffers b;
  b.grad = g.data();
  ASSERT_TRUE(h->Exchange(0, b, 5).ok());
  std::vector<double> avg = DenseAverage(100, 0);
  const float inv = 1.0f / static_cast<float>(Size());
  for (size_t i = 0; i < 100; ++i) ASSERT_EQ(g[i], static_cast<float>(avg[i] * Size()) * inv);
  EXPECT_EQ(h->LayerTraffic(0).dense_fallbacks, 1);
  // And the planner predicts the fall-back: topk's cost equals allreduce's.
  const PlanEntry& e = h->plan().entries[0];
  EXPECT_EQ(e.cost(StrategyKind::kTopk).bytes_sent, e.cost(StrategyKind::kAllReduce).bytes_sent);
}

TEST(Topk, BadDensityAndKAreRejected) {
  auto h = MakeHybrid();
  for (double d : {0.0, -1.0, 1.0001}) {
    auto id = h->RegisterLayer(Sparse("s", 100, d));
    ASSERT_FALSE(id.ok());
    EXPECT_NE(id.status().message().find("outside (0, 1]"), std::string::npos);
  }
  LayerSpec big = Sparse("s", 100, 0.5);
  big.topk.k = 101;
  auto id = h->RegisterLayer(big);
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.status().message().find("k 101 is invalid for 100 elements"), std::string::npos);
}

}  // namespace
}  // namespace poseidon
