// Process-local tests of the hybrid collective's pure parts: names and specs, each strategy's
// byte formula, the planner's choices for fixed cost figures (computed by hand here), Poseidon's
// bytes-only rule, and plan and cost-model text round trips.
#include <gtest/gtest.h>

#include <cmath>

#include "collectives/cost_model.h"
#include "collectives/layer.h"
#include "collectives/planner.h"
#include "collectives/strategy.h"
#include "runtime/settings.h"

namespace poseidon {
namespace {

LayerSpec Fc(const std::string& name, size_t m, size_t n) {
  LayerSpec l;
  l.name = name;
  l.shape = {m, n};
  l.kind = LayerKind::kFullyConnected;
  return l;
}
LayerSpec Dense(const std::string& name, std::vector<size_t> shape,
                LayerKind kind = LayerKind::kDense) {
  LayerSpec l;
  l.name = name;
  l.shape = std::move(shape);
  l.kind = kind;
  return l;
}
LayerSpec Resolved(const LayerSpec& l) {
  auto r = ResolveLayerSpec(l);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : l;
}

TEST(Names, StrategiesRoundTripAndErrors) {
  for (StrategyKind s : kAllStrategies) {
    auto p = ParseStrategy(StrategyName(s));
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(*p, s);
  }
  EXPECT_EQ(ParseStrategy("ring").status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(ParseStrategy("ring").status().message().find("'ring'"), std::string::npos);
  auto list = ParseStrategyList(" allreduce, sfb ");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(StrategyListName(*list), "allreduce,sfb");
  EXPECT_FALSE(ParseStrategyList("sfb,sfb").ok());
  EXPECT_FALSE(ParseStrategyList(" , ").ok());
  EXPECT_FALSE(ParseStrategyList("allreduce,bogus").ok());
  auto shape = ParseShape("64x3x7x7");
  ASSERT_TRUE(shape.ok());
  EXPECT_EQ(*shape, (std::vector<size_t>{64, 3, 7, 7}));
  EXPECT_EQ(ShapeString(*shape), "64x3x7x7");
  EXPECT_FALSE(ParseShape("64xx3").ok());
  EXPECT_FALSE(ParseShape("a").ok());
  EXPECT_EQ(*ParseLayerKind("fc"), LayerKind::kFullyConnected);
  EXPECT_FALSE(ParseLayerKind("conv").ok());
}

TEST(LayerSpecs, BadSpecsAreRejectedWithTheValue) {
  auto expect_error = [](const LayerSpec& l, const std::string& needle) {
    auto r = ResolveLayerSpec(l);
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  };
  expect_error(Dense("", {4}), "name is empty");
  expect_error(Dense("a b", {4}), "whitespace");
  LayerSpec half = Dense("h", {4});
  half.dtype = DType::kFloat16;
  expect_error(half, "float16");
  expect_error(Dense("fc", {4, 5, 6}, LayerKind::kFullyConnected), "4x5x6");
  expect_error(Fc("fc0", 0, 5), "0x5");
  for (double d : {0.0, -0.1, 1.5, std::nan("")}) {
    LayerSpec s = Dense("s", {100}, LayerKind::kSparse);
    s.topk.density = d;
    expect_error(s, "density");
  }
  LayerSpec big_k = Dense("s", {100}, LayerKind::kSparse);
  big_k.topk.k = 101;
  expect_error(big_k, "k 101");
  LayerSpec zero_k = Dense("s", {100}, LayerKind::kSparse);
  zero_k.topk.k = 0;
  expect_error(zero_k, "k 0");
  LayerSpec ps_no_opt = Dense("p", {10});
  ps_no_opt.force = StrategyKind::kPs;
  expect_error(ps_no_opt, "ps needs an optimizer");
  LayerSpec sfb_conv = Dense("c", {10});
  sfb_conv.force = StrategyKind::kSfb;
  expect_error(sfb_conv, "sfb needs a fully connected layer");
  LayerSpec bad_lr = Dense("o", {10});
  bad_lr.optimizer = OptimizerSpec::Sgd({-1.0f, 0.9f, 0.0f, false});
  expect_error(bad_lr, "lr -1");
  LayerSpec ok = Dense("s", {100}, LayerKind::kSparse);
  ok.topk.density = 1.0;
  EXPECT_TRUE(ResolveLayerSpec(ok).ok());
}

TEST(LayerSpecs, TopkCountIsCeilOfDensityTimesN) {
  LayerSpec s = Dense("s", {1000}, LayerKind::kSparse);
  s.topk.density = 0.001;
  EXPECT_EQ(strategy_internal::TopkCount(Resolved(s)), 1u);
  s.shape = {1001};
  s.topk.density = 0.01;
  EXPECT_EQ(strategy_internal::TopkCount(Resolved(s)), 11u);
  s.topk.density = 1e-9;
  EXPECT_EQ(strategy_internal::TopkCount(Resolved(s)), 1u);
  s.topk.density = 1.0;
  EXPECT_EQ(strategy_internal::TopkCount(Resolved(s)), 1001u);
  s.topk.k = 7;
  EXPECT_EQ(strategy_internal::TopkCount(Resolved(s)), 7u);
}

// The byte formulas of DESIGN.md, exactly.
TEST(CostFormulas, BytesPerRank) {
  CostModel m = CostModel::Network(1e-5, 1e9);
  const int p = 8;
  const size_t k = 32, rows = 1000, cols = 4096;
  LayerSpec fc = Fc("fc", rows, cols);
  fc.optimizer = OptimizerSpec::Sgd(SgdParams{});
  fc = Resolved(fc);
  const double n = 1000.0 * 4096.0;
  EXPECT_DOUBLE_EQ(GetStrategy(StrategyKind::kAllReduce).Cost(fc, k, p, m).bytes_sent,
                   2.0 * (p - 1) / p * 4 * n);
  EXPECT_DOUBLE_EQ(GetStrategy(StrategyKind::kPs).Cost(fc, k, p, m).bytes_sent,
                   2.0 * (p - 1) / p * 4 * n);
  EXPECT_DOUBLE_EQ(GetStrategy(StrategyKind::kSfb).Cost(fc, k, p, m).bytes_sent,
                   4.0 * k * (rows + cols) * (p - 1));
  LayerSpec sp = Dense("sp", {1u << 20}, LayerKind::kSparse);
  sp.topk.density = 0.001;
  sp.topk.min_elements = 0;
  sp = Resolved(sp);
  const double kk = std::ceil(0.001 * (1u << 20));  // 1049
  EXPECT_DOUBLE_EQ(GetStrategy(StrategyKind::kTopk).Cost(sp, k, p, m).bytes_sent,
                   2.0 * kk * (p - 1) * 4);
  // One rank: nothing on the wire, no latency.
  EXPECT_EQ(GetStrategy(StrategyKind::kAllReduce).Cost(fc, k, 1, m).bytes_sent, 0.0);
  EXPECT_EQ(m.CollectiveTime(CollectiveKind::kAllReduce, 1, 1e9), 0.0);
}

// Poseidon's rule: with zero latency and free compute, sfb wins exactly when
// P K <= 2 M N / (M + N) (integers here, so the comparison is exact).
TEST(Planner, BytesOnlyRuleFallsOutExactly) {
  CostModel m = CostModel::BytesOnly(1e9);
  PlannerOptions o;
  o.candidates = {StrategyKind::kAllReduce, StrategyKind::kSfb};
  int checked = 0, sfb = 0;
  for (size_t rows : {1, 3, 64, 1000, 4096, 25088}) {
    for (size_t cols : {1, 7, 512, 4096, 21841}) {
      for (size_t k : {1, 2, 8, 32, 100, 256}) {
        for (int p : {2, 3, 4, 5, 8, 16, 64}) {
          auto e = PlanLayer(Resolved(Fc("fc", rows, cols)), k, p, m, o);
          ASSERT_TRUE(e.ok());
          bool rule = static_cast<double>(p) * k * (rows + cols) <= 2.0 * rows * cols;
          ASSERT_EQ(e->choice == StrategyKind::kSfb, rule)
              << "M=" << rows << " N=" << cols << " K=" << k << " P=" << p;
          ++checked;
          sfb += rule;
        }
      }
    }
  }
  EXPECT_GT(sfb, 100);
  EXPECT_LT(sfb, checked - 100);
  // The boundary itself: M = N = 64, 2MN/(M+N) = 64: P K = 64 is sfb, 65+ is not.
  EXPECT_EQ(PlanLayer(Resolved(Fc("b", 64, 64)), 16, 4, m, o)->choice, StrategyKind::kSfb);
  EXPECT_EQ(PlanLayer(Resolved(Fc("b", 64, 64)), 13, 5, m, o)->choice, StrategyKind::kAllReduce);
}

// Fixed figures; every expected time below is written out from the formulas in cost_model.h.
CostModel FixedModel() {
  CostModel m = CostModel::Network(10e-6, 1e9);  // 10 us per step, 1 GB/s
  m.gemm_flops = 1e11;
  m.topk_bytes_per_s = 1e9;
  m.scatter_bytes_per_s = 1e9;
  m.optimizer_bytes_per_s = 1e9;
  m.source = "fixed";
  return m;
}

TEST(Planner, HandComputedChoices) {
  CostModel m = FixedModel();
  PlannerOptions o;  // every candidate
  const int p = 4;

  // Dense 1 Mi floats, no optimizer: only allreduce applies.
  // AR: 2*3*10us + 2*3/4*4 MiB / 1 GB/s = 60e-6 + 6291456e-9 = 6.351456 ms.
  auto dense = PlanLayer(Resolved(Dense("conv", {1u << 20})), 32, p, m, o);
  ASSERT_TRUE(dense.ok());
  EXPECT_EQ(dense->choice, StrategyKind::kAllReduce);
  EXPECT_NEAR(dense->cost(StrategyKind::kAllReduce).time_s, 60e-6 + 6291456e-9, 1e-15);
  EXPECT_FALSE(dense->cost(StrategyKind::kPs).applies);
  EXPECT_FALSE(dense->cost(StrategyKind::kTopk).applies);

  // Sparse 1 Mi floats, density 0.001 (k = 1049): topk = select 4 MiB (4.194304 ms)
  // + AG 3*10us + 3/4*8*1049*4 B (25.176 us) + scatter 8*1049*4 B (33.568 us) = 4.283048 ms,
  // below allreduce's 6.351456 ms.
  LayerSpec sp = Dense("emb", {1u << 20}, LayerKind::kSparse);
  sp.topk.density = 0.001;
  sp.topk.min_elements = 0;
  auto topk = PlanLayer(Resolved(sp), 32, p, m, o);
  ASSERT_TRUE(topk.ok());
  EXPECT_NEAR(topk->cost(StrategyKind::kTopk).time_s, 4194304e-9 + 30e-6 + 25176e-9 + 33568e-9,
              1e-15);
  EXPECT_EQ(topk->choice, StrategyKind::kTopk);
  // Half as fast a selection kernel (8.39 ms) makes topk lose: measured compute matters.
  CostModel slow = m;
  slow.topk_bytes_per_s = 0.5e9;
  EXPECT_EQ(PlanLayer(Resolved(sp), 32, p, slow, o)->choice, StrategyKind::kAllReduce);

  // Dense 1 Mi floats with SGD and a slow optimizer (0.1 GB/s): allreduce pays the step on
  // 4 MiB (41.94304 ms), ps on a quarter (10.48576 ms) plus RS + AG (same as AR) -> ps.
  LayerSpec opt = Dense("conv2", {1u << 20});
  opt.optimizer = OptimizerSpec::Sgd(SgdParams{});
  CostModel slow_opt = m;
  slow_opt.optimizer_bytes_per_s = 1e8;
  auto ps = PlanLayer(Resolved(opt), 32, p, slow_opt, o);
  ASSERT_TRUE(ps.ok());
  EXPECT_NEAR(ps->cost(StrategyKind::kAllReduce).time_s, 60e-6 + 6291456e-9 + 41943040e-9, 1e-15);
  EXPECT_NEAR(ps->cost(StrategyKind::kPs).time_s, 60e-6 + 6291456e-9 + 10485760e-9, 1e-15);
  EXPECT_EQ(ps->choice, StrategyKind::kPs);

  // FC 4096 x 4096, K = 32, P = 4, no optimizer:
  //  allreduce = local GEMM 2*32*4096^2 flop (10.737 ms) + 60 us + 3/2*64 MiB (100.663 ms)
  //  sfb = AG 30 us + 3/4*4*32*4*8192 B (3.146 ms) + GEMM 2*128*4096^2 flop (42.950 ms)
  LayerSpec fc = Fc("fc7", 4096, 4096);
  auto f = PlanLayer(Resolved(fc), 32, p, m, o);
  ASSERT_TRUE(f.ok());
  const double mn = 4096.0 * 4096.0;
  EXPECT_NEAR(f->cost(StrategyKind::kAllReduce).time_s,
              2 * 32 * mn / 1e11 + 60e-6 + 1.5 * 4 * mn * 1e-9, 1e-12);
  EXPECT_NEAR(f->cost(StrategyKind::kSfb).time_s,
              30e-6 + 0.75 * 4 * 32 * 4 * 8192 * 1e-9 + 2 * 128 * mn / 1e11, 1e-12);
  EXPECT_EQ(f->choice, StrategyKind::kSfb);
  // A 100x slower GEMM (1 GF/s) turns it around even though sfb still sends fewer bytes.
  CostModel slow_gemm = m;
  slow_gemm.gemm_flops = 1e9;
  auto g = PlanLayer(Resolved(fc), 32, p, slow_gemm, o);
  EXPECT_EQ(g->choice, StrategyKind::kAllReduce);
  EXPECT_LT(g->cost(StrategyKind::kSfb).bytes_sent, g->cost(StrategyKind::kAllReduce).bytes_sent);

  // A small FC layer (16 x 16, K 32): latency dominates; AR = 60 us + 1.5 KiB, sfb = 30 us +
  // 3/4*4*32*4*32 B -> sfb sends more bytes (12288 vs 1536) yet wins on latency at this alpha.
  auto small = PlanLayer(Resolved(Fc("tiny", 16, 16)), 32, p, m, o);
  EXPECT_NEAR(small->cost(StrategyKind::kSfb).time_s, 30e-6 + 12288e-9 + 2 * 128 * 256 / 1e11,
              1e-15);
  EXPECT_EQ(small->choice, StrategyKind::kSfb);
}

// With one rank nothing is exchanged: sfb and allreduce cost the same GEMM, and the tie goes
// to allreduce (the identity, which the engine fuses) unless sfb is forced.
TEST(Planner, OneRankTieGoesToAllReduce) {
  PlannerOptions o;
  o.candidates = {StrategyKind::kAllReduce, StrategyKind::kSfb};
  for (const CostModel& m : {CostModel::BytesOnly(1e9), FixedModel()}) {
    for (const LayerSpec& fc : {Fc("fc", 64, 64), Fc("fc7", 4096, 4096), Fc("thin", 3, 1000)}) {
      auto e = PlanLayer(Resolved(fc), 32, 1, m, o);
      ASSERT_TRUE(e.ok()) << e.status().message();
      EXPECT_EQ(e->cost(StrategyKind::kSfb).time_s, e->cost(StrategyKind::kAllReduce).time_s)
          << fc.name;
      EXPECT_EQ(e->choice, StrategyKind::kAllReduce) << fc.name << " with " << m.source;
      // Two ranks: the same layer still follows the cost model (64 x 64 at K 32 is sfb).
      if (fc.name == "fc") {
        EXPECT_EQ(PlanLayer(Resolved(fc), 32, 2, m, o)->choice, StrategyKind::kSfb) << m.source;
      }
    }
    PlannerOptions forced = o;
    forced.global_force = StrategyKind::kSfb;
    EXPECT_EQ(PlanLayer(Resolved(Fc("fc", 64, 64)), 32, 1, m, forced)->choice,
              StrategyKind::kSfb);
  }
}

TEST(Planner, ForcesAndCandidates) {
  CostModel m = FixedModel();
  PlannerOptions o;
  o.global_force = StrategyKind::kSfb;
  LayerSpec fc = Resolved(Fc("fc", 64, 64));
  LayerSpec conv = Resolved(Dense("conv", {1000}));
  auto a = PlanLayer(fc, 4096, 4, m, o);  // sfb is very expensive here, but forced
  EXPECT_EQ(a->choice, StrategyKind::kSfb);
  EXPECT_EQ(a->reason, "global");
  auto b = PlanLayer(conv, 32, 4, m, o);  // sfb does not apply to a conv layer
  EXPECT_EQ(b->choice, StrategyKind::kAllReduce);
  EXPECT_EQ(b->reason, "global-na");
  LayerSpec forced = Fc("f2", 64, 64);
  forced.force = StrategyKind::kAllReduce;
  auto c = PlanLayer(Resolved(forced), 1, 4, m, o);  // layer force beats the global one
  EXPECT_EQ(c->choice, StrategyKind::kAllReduce);
  EXPECT_EQ(c->reason, "layer");
  // Candidate lists: the layer's beats the global one.
  PlannerOptions only_ar;
  only_ar.candidates = {StrategyKind::kAllReduce};
  EXPECT_EQ(PlanLayer(fc, 1, 4, m, only_ar)->choice, StrategyKind::kAllReduce);
  LayerSpec own = Fc("f3", 64, 64);
  own.candidates = {StrategyKind::kSfb};
  EXPECT_EQ(PlanLayer(Resolved(own), 1, 4, m, only_ar)->choice, StrategyKind::kSfb);
  // No candidate applies: allreduce, said so.
  PlannerOptions only_sfb;
  only_sfb.candidates = {StrategyKind::kSfb};
  auto d = PlanLayer(conv, 1, 4, m, only_sfb);
  EXPECT_EQ(d->choice, StrategyKind::kAllReduce);
  EXPECT_EQ(d->reason, "fallback");
}

TEST(Planner, OptionsFromSettings) {
  Settings& s = Settings::Global();
  ASSERT_TRUE(s.Set("POSEIDON_STRATEGY", "topk").ok());
  ASSERT_TRUE(s.Set("POSEIDON_CANDIDATES", "allreduce, sfb").ok());
  auto o = PlannerOptions::FromSettings();
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->global_force, StrategyKind::kTopk);
  EXPECT_EQ(StrategyListName(o->candidates), "allreduce,sfb");
  ASSERT_TRUE(s.Set("POSEIDON_STRATEGY", "fastest").ok());
  auto bad = PlannerOptions::FromSettings();
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("POSEIDON_STRATEGY='fastest'"), std::string::npos);
  ASSERT_TRUE(s.Set("POSEIDON_STRATEGY", "auto").ok());
  ASSERT_TRUE(s.Set("POSEIDON_CANDIDATES", "sfb,nope").ok());
  EXPECT_FALSE(PlannerOptions::FromSettings().ok());
  s.Reset();
  auto def = PlannerOptions::FromSettings();
  ASSERT_TRUE(def.ok());
  EXPECT_FALSE(def->global_force.has_value());
  EXPECT_EQ(def->candidates.size(), 4u);
}

TEST(Plan, PrintParseRoundTrip) {
  CostModel m = FixedModel();
  m.source = "cache:/tmp/some dir/cost.txt";  // spaces survive in the header
  std::vector<LayerSpec> layers;
  layers.push_back(Resolved(Fc("fc6", 4096, 25088)));
  LayerSpec conv = Dense("conv1.w", {64, 3, 7, 7});
  conv.optimizer = OptimizerSpec::Adam(AdamParams{});
  layers.push_back(Resolved(conv));
  LayerSpec sp = Dense("emb", {1u << 20}, LayerKind::kSparse);
  sp.topk.min_elements = 0;
  layers.push_back(Resolved(sp));
  layers.push_back(Resolved(Dense("bias", {})));
  PlannerOptions o;
  o.candidates = {StrategyKind::kSfb, StrategyKind::kPs, StrategyKind::kTopk};
  auto plan = MakePlan(layers, 32, 8, m, o);
  ASSERT_TRUE(plan.ok());
  std::string text = plan->ToString();
  auto back = ParsePlan(text);
  ASSERT_TRUE(back.ok()) << back.status().ToString() << "\n" << text;
  EXPECT_EQ(back->ToString(), text);
  EXPECT_EQ(back->world, 8);
  EXPECT_EQ(back->batch, 32u);
  EXPECT_EQ(back->model_source, m.source);
  ASSERT_EQ(back->entries.size(), plan->entries.size());
  for (size_t i = 0; i < plan->entries.size(); ++i) {
    const PlanEntry& a = plan->entries[i];
    const PlanEntry& b = back->entries[i];
    EXPECT_EQ(a.layer, b.layer);
    EXPECT_EQ(a.shape, b.shape);
    EXPECT_EQ(a.kind, b.kind);
    EXPECT_EQ(a.choice, b.choice);
    EXPECT_EQ(a.reason, b.reason);
    for (StrategyKind s : kAllStrategies) {
      EXPECT_EQ(a.cost(s).applies, b.cost(s).applies);
      EXPECT_EQ(a.cost(s).candidate, b.cost(s).candidate);
      if (a.cost(s).applies) {
        EXPECT_NEAR(a.cost(s).time_s, b.cost(s).time_s, 1e-8 * a.cost(s).time_s);
        EXPECT_NEAR(a.cost(s).bytes_sent, b.cost(s).bytes_sent, 1e-8 * a.cost(s).bytes_sent);
      }
    }
  }
  // The conv layer's allreduce is costed for reference but not a candidate: printed in ().
  EXPECT_NE(text.find("conv1.w 64x3x7x7 dense ps auto ("), std::string::npos) << text;
  EXPECT_NE(text.find("bias scalar dense allreduce fallback"), std::string::npos) << text;
  // Broken tables name the line.
  EXPECT_FALSE(ParsePlan("fc 1x2 fc sfb auto - - - -\n").ok());  // no header
  auto bad = ParsePlan("# poseidon-plan P=2 K=1 model=x\nfc 1x2 fc sfb auto - - 1/x -\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("line 2"), std::string::npos);
  EXPECT_FALSE(ParsePlan("# poseidon-plan P=2 K=1 model=x\nfc 1x2 fc sfb auto - - - -\n").ok());
}

TEST(CostModelText, RoundTripIsExactAndErrorsNameTheLine) {
  CostModel m = FixedModel();
  m.link[1].alpha_s = 1.0 / 3.0;
  m.gemm_flops = 12345.678901234567;
  std::string key;
  auto back = CostModel::Parse(m.ToText("P4-hosts1-abc"), &key);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(key, "P4-hosts1-abc");
  EXPECT_EQ(back->link[1].alpha_s, m.link[1].alpha_s);
  EXPECT_EQ(back->gemm_flops, m.gemm_flops);
  EXPECT_EQ(back->ToText("k"), m.ToText("k"));
  EXPECT_FALSE(CostModel::Parse("garbage\n", nullptr).ok());
  std::string text = m.ToText("k");
  std::string missing = text.substr(0, text.rfind("optimizer_bytes_per_s"));
  auto r = CostModel::Parse(missing, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("optimizer_bytes_per_s"), std::string::npos);
  std::string bad = text + "gemm_flops fast\n";
  EXPECT_NE(CostModel::Parse(bad, nullptr).status().message().find("not a number"),
            std::string::npos);
  CostModel neg = m;
  neg.link[0].beta_s_per_b = -1;
  EXPECT_FALSE(neg.Validate().ok());
}

// The two-level allreduce's figures: optional in the text, the cheaper allreduce predicted, and
// the crossover where flat(S) = hier(S), by hand.
TEST(CostModelHier, CrossoverAndTextForm) {
  CostModel m = FixedModel();
  EXPECT_FALSE(m.has_hier());
  EXPECT_EQ(m.HierAllReduceFromBytes(8), 0);
  const int p = 8;
  const LinkCost flat = m.link[0];
  // Twice the latency, half the time per byte: flat = 14 a + 1.75 S b; hier = 28 a + 0.875 S b.
  m.hier_allreduce = {2 * flat.alpha_s, flat.beta_s_per_b / 2};
  ASSERT_TRUE(m.has_hier());
  const double from = 14 * flat.alpha_s / (0.875 * flat.beta_s_per_b);
  EXPECT_EQ(m.HierAllReduceFromBytes(p), static_cast<long long>(std::ceil(from)));
  const double s_small = from / 4, s_large = from * 4;
  EXPECT_DOUBLE_EQ(m.CollectiveTime(CollectiveKind::kAllReduce, p, s_small),
                   14 * flat.alpha_s + 1.75 * s_small * flat.beta_s_per_b);
  EXPECT_DOUBLE_EQ(m.CollectiveTime(CollectiveKind::kAllReduce, p, s_large),
                   28 * flat.alpha_s + 0.875 * s_large * flat.beta_s_per_b);
  // Other collectives never take the two-level figures.
  EXPECT_DOUBLE_EQ(m.CollectiveTime(CollectiveKind::kAllGather, p, s_large),
                   7 * m.link[2].alpha_s + 0.875 * s_large * m.link[2].beta_s_per_b);
  // Never slower: from 1 byte; slower per byte: never.
  CostModel always = m;
  always.hier_allreduce = {flat.alpha_s, flat.beta_s_per_b / 2};
  EXPECT_EQ(always.HierAllReduceFromBytes(p), 1);
  CostModel never = m;
  never.hier_allreduce = {flat.alpha_s / 2, flat.beta_s_per_b * 2};
  EXPECT_EQ(never.HierAllReduceFromBytes(p), 0);
  EXPECT_EQ(m.HierAllReduceFromBytes(1), 0);

  auto back = CostModel::Parse(m.ToText("k"), nullptr);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->hier_allreduce.alpha_s, m.hier_allreduce.alpha_s);
  EXPECT_EQ(back->hier_allreduce.beta_s_per_b, m.hier_allreduce.beta_s_per_b);
  // A file without them (written before they existed) parses, with no two-level figures.
  std::string text = m.ToText("k");
  std::string without = text.substr(0, text.find("hier_allreduce.alpha_s"));
  auto old = CostModel::Parse(without, nullptr);
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  EXPECT_FALSE(old->has_hier());
  // One of the two alone is refused, naming both.
  std::string half = text.substr(0, text.find("hier_allreduce.beta_s_per_b"));
  auto r = CostModel::Parse(half, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("hier_allreduce.beta_s_per_b"), std::string::npos);
  CostModel nan = m;
  nan.hier_allreduce.beta_s_per_b = std::nan("");
  EXPECT_FALSE(nan.Validate().ok());
}

}  // namespace
}  // namespace poseidon
