// Unit tests of the example trainer's pieces: the synthetic data set, the MLP's gradients and
// sufficient factors, SGD with momentum and the flag parser. Single process, no MPI launch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "examples/mlp/data.h"
#include "examples/mlp/model.h"
#include "examples/mlp/options.h"

namespace poseidon::mlp {
namespace {

bool Contains(const Status& s, const std::string& part) {
  return s.message().find(part) != std::string::npos;
}

// --- data ---------------------------------------------------------------------------------

TEST(SyntheticTask, SamplesAreDeterministicInSeedAndIndex) {
  auto a = SyntheticTask::Create(TaskConfig{}, 7);
  auto b = SyntheticTask::Create(TaskConfig{}, 7);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<float> xa(64), xb(64);
  int32_t ya = -1, yb = -1;
  for (uint64_t i : {0ull, 1ull, 12345ull}) {
    a->Sample(Split::kTrain, i, xa.data(), &ya);
    b->Sample(Split::kTrain, i, xb.data(), &yb);
    EXPECT_EQ(0, std::memcmp(xa.data(), xb.data(), 64 * sizeof(float))) << "sample " << i;
    EXPECT_EQ(ya, yb);
  }
  // Another seed or the other split gives other data.
  auto c = SyntheticTask::Create(TaskConfig{}, 8);
  ASSERT_TRUE(c.ok());
  a->Sample(Split::kTrain, 3, xa.data(), &ya);
  c->Sample(Split::kTrain, 3, xb.data(), &yb);
  EXPECT_NE(0, std::memcmp(xa.data(), xb.data(), 64 * sizeof(float)));
  a->Sample(Split::kTest, 3, xb.data(), &yb);
  EXPECT_NE(0, std::memcmp(xa.data(), xb.data(), 64 * sizeof(float)));
}

TEST(SyntheticTask, ShardsPartitionTheSplit) {
  auto t = SyntheticTask::Create(TaskConfig{}, 3);
  ASSERT_TRUE(t.ok());
  const uint64_t total = 103;  // not a multiple of any stride below
  auto all = t->Generate(Split::kTrain, total, 0, 1);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), total);
  for (uint64_t p : {1u, 2u, 3u, 5u, 8u}) {
    size_t seen = 0;
    for (uint64_t r = 0; r < p; ++r) {
      auto shard = t->Generate(Split::kTrain, total, r, p);
      ASSERT_TRUE(shard.ok());
      EXPECT_EQ(shard->size(), (total - r + p - 1) / p);
      for (size_t k = 0; k < shard->size(); ++k) {
        const size_t i = r + k * p;
        EXPECT_EQ(shard->y[k], all->y[i]);
        EXPECT_EQ(0, std::memcmp(&shard->x[k * 64], &all->x[i * 64], 64 * sizeof(float)));
      }
      seen += shard->size();
    }
    EXPECT_EQ(seen, total) << "stride " << p;
  }
}

TEST(SyntheticTask, LabelNoiseFlipsAboutTheConfiguredFraction) {
  // The same seed with and without noise: features are identical (the stream's use does not
  // depend on the noise), and the labels differ exactly where noise struck.
  TaskConfig clean;
  clean.label_noise = 0.0;
  auto a = SyntheticTask::Create(clean, 11);
  auto b = SyntheticTask::Create(TaskConfig{}, 11);
  ASSERT_TRUE(a.ok() && b.ok());
  auto da = a->Generate(Split::kTrain, 20000, 0, 1);
  auto db = b->Generate(Split::kTrain, 20000, 0, 1);
  ASSERT_TRUE(da.ok() && db.ok());
  EXPECT_EQ(da->x, db->x);
  int flipped = 0;
  std::vector<int> per_class(10, 0);
  for (size_t i = 0; i < da->size(); ++i) {
    ASSERT_GE(db->y[i], 0);
    ASSERT_LT(db->y[i], 10);
    flipped += da->y[i] != db->y[i] ? 1 : 0;
    per_class[da->y[i]]++;
  }
  // 2% of 20000 = 400; a binomial standard deviation is about 20.
  EXPECT_GT(flipped, 300);
  EXPECT_LT(flipped, 500);
  for (int c = 0; c < 10; ++c) EXPECT_GT(per_class[c], 1700) << "class " << c;
}

TEST(SyntheticTask, RejectsBadConfigAndShards) {
  TaskConfig c;
  c.classes = 1;
  auto r = SyntheticTask::Create(c, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(r.status(), "classes = 1")) << r.status().ToString();
  c = TaskConfig{};
  c.label_noise = 1.0;
  EXPECT_FALSE(SyntheticTask::Create(c, 1).ok());
  c = TaskConfig{};
  c.cluster_sigma = 0;
  EXPECT_FALSE(SyntheticTask::Create(c, 1).ok());

  auto t = SyntheticTask::Create(TaskConfig{}, 1);
  ASSERT_TRUE(t.ok());
  auto g = t->Generate(Split::kTrain, 10, 4, 4);
  ASSERT_FALSE(g.ok());
  EXPECT_TRUE(Contains(g.status(), "offset = 4")) << g.status().ToString();
  EXPECT_FALSE(t->Generate(Split::kTrain, 10, 0, 0).ok());
  // Fewer samples than the offset: an empty shard, not an error.
  auto empty = t->Generate(Split::kTrain, 2, 3, 4);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->size(), 0u);
}

// --- model --------------------------------------------------------------------------------

struct Batch {
  std::vector<float> x;
  std::vector<int32_t> y;
};

Batch MakeBatch(int k, int in, int classes, uint64_t seed) {
  Rng rng(seed);
  Batch b;
  b.x.resize(static_cast<size_t>(k) * in);
  for (float& v : b.x) v = static_cast<float>(rng.Normal());
  for (int i = 0; i < k; ++i) b.y.push_back(static_cast<int32_t>(rng.Below(classes)));
  return b;
}

TEST(Mlp, LayoutAndDeterministicInit) {
  auto m = Mlp::Create({5, 4, 3}, 9);
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m->num_layers(), 2);
  EXPECT_EQ(m->num_params(), 5u * 4 + 4 + 4u * 3 + 3);
  EXPECT_EQ(m->layer(0).w_offset, 0u);
  EXPECT_EQ(m->layer(0).b_offset, 20u);
  EXPECT_EQ(m->layer(1).w_offset, 24u);
  EXPECT_EQ(m->layer(1).b_offset, 36u);
  EXPECT_EQ(m->Describe(), "5-4-3 (39 parameters, 2 layers)");
  for (int j = 0; j < 4; ++j) EXPECT_EQ(m->params()[20 + j], 0.0f);

  auto same = Mlp::Create({5, 4, 3}, 9);
  auto other = Mlp::Create({5, 4, 3}, 10);
  ASSERT_TRUE(same.ok() && other.ok());
  const size_t bytes = m->num_params() * sizeof(float);
  EXPECT_EQ(HashBytes(m->params(), bytes), HashBytes(same->params(), bytes));
  EXPECT_NE(HashBytes(m->params(), bytes), HashBytes(other->params(), bytes));
}

// The analytic gradient against central differences of the mean loss, for every parameter.
TEST(Mlp, GradientMatchesFiniteDifferences) {
  auto m = Mlp::Create({6, 5, 4, 3}, 21);
  ASSERT_TRUE(m.ok());
  // Non-zero biases, so their gradient paths are exercised with realistic values.
  for (int l = 0; l < m->num_layers(); ++l) {
    for (int j = 0; j < m->layer(l).out; ++j) m->params()[m->layer(l).b_offset + j] = 0.1f * j;
  }
  const int k = 7;
  Batch b = MakeBatch(k, 6, 3, 5);
  EvalResult stats;
  ASSERT_TRUE(m->ForwardBackward(b.x.data(), b.y.data(), k, &stats).ok());
  EXPECT_EQ(stats.count, k);
  const std::vector<float> grad(m->grads(), m->grads() + m->num_params());
  auto mean_loss = [&]() {
    auto r = m->Evaluate(b.x.data(), b.y.data(), k);
    EXPECT_TRUE(r.ok());
    return r->loss_sum / k;
  };
  EXPECT_NEAR(mean_loss(), stats.loss_sum / k, 1e-6);
  // Small enough that no ReLU input crosses zero within +-eps, large enough for float noise.
  const float eps = 1e-3f;
  for (size_t i = 0; i < m->num_params(); ++i) {
    const float saved = m->params()[i];
    m->params()[i] = saved + eps;
    const double up = mean_loss();
    m->params()[i] = saved - eps;
    const double down = mean_loss();
    m->params()[i] = saved;
    const double numeric = (up - down) / (2.0 * eps);
    EXPECT_NEAR(grad[i], numeric, 2e-3 + 0.02 * std::fabs(numeric)) << "parameter " << i;
  }
}

// dW_l must equal U_l^T V_l built from the exposed factors; db_l the column sums of U_l.
TEST(Mlp, WeightGradientIsProductOfSufficientFactors) {
  auto m = Mlp::Create({8, 6, 4}, 2);
  ASSERT_TRUE(m.ok());
  const int k = 5;
  Batch b = MakeBatch(k, 8, 4, 17);
  ASSERT_TRUE(m->ForwardBackward(b.x.data(), b.y.data(), k, nullptr).ok());
  ASSERT_EQ(m->batch_rows(), k);
  // Layer 0's V is the batch itself.
  EXPECT_EQ(0, std::memcmp(m->factor_v(0), b.x.data(), b.x.size() * sizeof(float)));
  for (int l = 0; l < m->num_layers(); ++l) {
    const LayerInfo& L = m->layer(l);
    const float* u = m->factor_u(l);
    const float* v = m->factor_v(l);
    for (int r = 0; r < L.out; ++r) {
      double db = 0;
      for (int i = 0; i < k; ++i) db += u[i * L.out + r];
      EXPECT_NEAR(m->grads()[L.b_offset + r], db, 1e-6) << "layer " << l << " bias " << r;
      for (int c = 0; c < L.in; ++c) {
        double dw = 0;
        for (int i = 0; i < k; ++i) dw += static_cast<double>(u[i * L.out + r]) * v[i * L.in + c];
        EXPECT_NEAR(m->grads()[L.w_offset + static_cast<size_t>(r) * L.in + c], dw, 1e-6)
            << "layer " << l << " (" << r << ", " << c << ")";
      }
    }
  }
  // The last layer's U rows are (softmax - onehot) / K: each row sums to zero.
  const float* u = m->factor_u(1);
  for (int i = 0; i < k; ++i) {
    double s = 0;
    for (int j = 0; j < 4; ++j) s += u[i * 4 + j];
    EXPECT_NEAR(s, 0.0, 1e-6);
    EXPECT_LT(u[i * 4 + b.y[i]], 0.0f);
  }
}

TEST(Mlp, LearnsASmallBatchByHeart) {
  auto m = Mlp::Create({8, 16, 4}, 3);
  ASSERT_TRUE(m.ok());
  auto sgd = SgdMomentum::Create(m->num_params(), 0.1, 0.9);
  ASSERT_TRUE(sgd.ok());
  Batch b = MakeBatch(16, 8, 4, 23);
  EvalResult first, last;
  for (int step = 0; step < 300; ++step) {
    EvalResult s;
    ASSERT_TRUE(m->ForwardBackward(b.x.data(), b.y.data(), 16, &s).ok());
    ASSERT_TRUE(sgd->Step(m->params(), m->grads(), m->num_params()).ok());
    if (step == 0) first = s;
    last = s;
  }
  EXPECT_LT(last.loss_sum, 0.1 * first.loss_sum);
  EXPECT_EQ(last.correct, 16);
}

// The hooks run in the documented order: before_forward 0..L-1, then after_backward L-1..0, and
// the gradients and factors are final when after_backward(l) runs.
TEST(Mlp, StepHooksRunInLayerOrderWithFinalGradients) {
  auto m = Mlp::Create({6, 5, 4, 3}, 4);
  auto ref = Mlp::Create({6, 5, 4, 3}, 4);
  ASSERT_TRUE(m.ok() && ref.ok());
  Batch b = MakeBatch(7, 6, 3, 5);
  ASSERT_TRUE(ref->ForwardBackward(b.x.data(), b.y.data(), 7, nullptr).ok());
  std::vector<std::string> calls;
  StepHooks hooks;
  hooks.before_forward = [&](int l) {
    calls.push_back("f" + std::to_string(l));
    return Status::Ok();
  };
  hooks.after_backward = [&](int l) {
    calls.push_back("b" + std::to_string(l));
    const LayerInfo& info = m->layer(l);
    // This layer's span is already the full gradient (equal to an unhooked run's).
    EXPECT_EQ(0, std::memcmp(m->grads() + info.w_offset, ref->grads() + info.w_offset,
                             info.count() * sizeof(float)))
        << "layer " << l;
    EXPECT_EQ(0, std::memcmp(m->factor_u(l), ref->factor_u(l),
                             sizeof(float) * 7 * static_cast<size_t>(info.out)));
    return Status::Ok();
  };
  ASSERT_TRUE(m->ForwardBackward(b.x.data(), b.y.data(), 7, nullptr, &hooks).ok());
  EXPECT_EQ(calls, (std::vector<std::string>{"f0", "f1", "f2", "b2", "b1", "b0"}));
  EXPECT_EQ(0, std::memcmp(m->grads(), ref->grads(), m->num_params() * sizeof(float)));

  // A failing hook stops the step and its status comes back.
  hooks.before_forward = [](int l) {
    return l == 1 ? InvalidArgument("hook says no at ", l) : Status::Ok();
  };
  Status s = m->ForwardBackward(b.x.data(), b.y.data(), 7, nullptr, &hooks);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s, "hook says no at 1")) << s.ToString();
}

// The factors handed out at step t survive step t+1 (two scratch slots), so an exchange still in
// flight from step t reads what it was given.
TEST(Mlp, FactorsOfAStepSurviveTheNextStep) {
  auto m = Mlp::Create({6, 5, 3}, 8);
  ASSERT_TRUE(m.ok());
  Batch b1 = MakeBatch(4, 6, 3, 1), b2 = MakeBatch(4, 6, 3, 2);
  ASSERT_TRUE(m->ForwardBackward(b1.x.data(), b1.y.data(), 4, nullptr).ok());
  const float* u1 = m->factor_u(1);
  const float* v0 = m->factor_v(0);
  std::vector<float> u1_copy(u1, u1 + 4 * 3), v0_copy(v0, v0 + 4 * 6);
  ASSERT_TRUE(m->ForwardBackward(b2.x.data(), b2.y.data(), 4, nullptr).ok());
  EXPECT_NE(m->factor_u(1), u1);
  EXPECT_EQ(0, std::memcmp(u1, u1_copy.data(), u1_copy.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(v0, v0_copy.data(), v0_copy.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(m->factor_v(0), b2.x.data(), b2.x.size() * sizeof(float)));
}

// With the weight gradient switched off (sfb rebuilds it), the W span is left alone, the bias
// and every other layer are still formed exactly as before.
TEST(Mlp, SkippedWeightGradientLeavesItsSpanUntouched) {
  auto m = Mlp::Create({6, 5, 3}, 12);
  auto ref = Mlp::Create({6, 5, 3}, 12);
  ASSERT_TRUE(m.ok() && ref.ok());
  m->set_form_weight_grad(0, false);
  m->set_form_weight_grad(7, false);  // out of range: ignored
  EXPECT_FALSE(m->form_weight_grad(0));
  EXPECT_TRUE(m->form_weight_grad(1));
  const LayerInfo& l0 = m->layer(0);
  std::fill(m->grads(), m->grads() + m->num_params(), 42.0f);
  Batch b = MakeBatch(5, 6, 3, 3);
  ASSERT_TRUE(m->ForwardBackward(b.x.data(), b.y.data(), 5, nullptr).ok());
  ASSERT_TRUE(ref->ForwardBackward(b.x.data(), b.y.data(), 5, nullptr).ok());
  for (size_t i = 0; i < static_cast<size_t>(l0.in) * l0.out; ++i) {
    ASSERT_EQ(m->grads()[l0.w_offset + i], 42.0f) << i;
  }
  const size_t rest = m->num_params() - l0.b_offset;
  EXPECT_EQ(
      0, std::memcmp(m->grads() + l0.b_offset, ref->grads() + l0.b_offset, rest * sizeof(float)));
}

TEST(Mlp, RejectsBadShapesAndLabels) {
  auto r = Mlp::Create({5}, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  r = Mlp::Create({5, 0, 3}, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status(), "width 1 is 0")) << r.status().ToString();
  EXPECT_FALSE(Mlp::Create({5, 1}, 1).ok());  // one class cannot be classified

  auto m = Mlp::Create({4, 3}, 1);
  ASSERT_TRUE(m.ok());
  std::vector<float> x(8, 1.0f);
  std::vector<int32_t> y = {0, 3};
  Status s = m->ForwardBackward(x.data(), y.data(), 2, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s, "label of row 1 is 3")) << s.ToString();
  EXPECT_FALSE(m->ForwardBackward(x.data(), y.data(), 0, nullptr).ok());
  EXPECT_FALSE(m->ForwardBackward(nullptr, y.data(), 1, nullptr).ok());
  y[1] = -1;
  EXPECT_FALSE(m->Evaluate(x.data(), y.data(), 2).ok());
  auto ok = m->Evaluate(x.data(), y.data(), 0);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->count, 0);
}

// --- optimizer and hash -------------------------------------------------------------------

TEST(SgdMomentum, ExactSteps) {
  auto sgd = SgdMomentum::Create(2, 0.5, 0.5);
  ASSERT_TRUE(sgd.ok());
  float w[2] = {1.0f, -2.0f};
  const float g[2] = {0.5f, 1.0f};
  ASSERT_TRUE(sgd->Step(w, g, 2).ok());  // v = g; w -= 0.5 v
  EXPECT_EQ(w[0], 0.75f);
  EXPECT_EQ(w[1], -2.5f);
  ASSERT_TRUE(sgd->Step(w, g, 2).ok());  // v = 0.5 v + g
  EXPECT_EQ(w[0], 0.375f);
  EXPECT_EQ(w[1], -3.25f);
}

TEST(SgdMomentum, RejectsBadArguments) {
  auto r = SgdMomentum::Create(3, 0.0, 0.9);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status(), "lr = 0")) << r.status().ToString();
  EXPECT_FALSE(SgdMomentum::Create(3, 0.1, 1.0).ok());
  EXPECT_FALSE(SgdMomentum::Create(3, 0.1, -0.1).ok());
  auto sgd = SgdMomentum::Create(3, 0.1, 0.9);
  ASSERT_TRUE(sgd.ok());
  float w[4] = {}, g[4] = {};
  Status s = sgd->Step(w, g, 4);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s, "4 parameters")) << s.ToString();
}

TEST(HashBytes, Fnv1aKnownValues) {
  EXPECT_EQ(HashBytes("", 0), 0xcbf29ce484222325ull);
  EXPECT_EQ(HashBytes("a", 1), 0xaf63dc4c8601ec8cull);
}

// --- options ------------------------------------------------------------------------------

TEST(TrainerOptions, DefaultsAndValues) {
  auto d = ParseTrainerOptions({});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->batch, 32);
  EXPECT_EQ(d->hidden, (std::vector<int>{128, 64}));
  EXPECT_FALSE(d->check_loss_falls);

  auto o =
      ParseTrainerOptions({"--iters", "10", "--batch=16", "--lr", "0.25", "--momentum", "0",
                           "--hidden", "32", "--seed=5", "--log-every", "0", "--samples", "100",
                           "--test-samples=50", "--check-loss-falls", "--min-accuracy", "0.5"});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->iters, 10);
  EXPECT_EQ(o->batch, 16);
  EXPECT_EQ(o->lr, 0.25);
  EXPECT_EQ(o->momentum, 0.0);
  EXPECT_EQ(o->hidden, (std::vector<int>{32}));
  EXPECT_EQ(o->seed, 5u);
  EXPECT_EQ(o->log_every, 0);
  EXPECT_EQ(o->samples, 100);
  EXPECT_EQ(o->test_samples, 50);
  EXPECT_TRUE(o->check_loss_falls);
  EXPECT_EQ(o->min_accuracy, 0.5);

  auto none = ParseTrainerOptions({"--hidden", ""});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->hidden.empty());
  auto help = ParseTrainerOptions({"--help"});
  ASSERT_TRUE(help.ok());
  EXPECT_TRUE(help->help);
  EXPECT_NE(TrainerHelp().find("--check-loss-falls"), std::string::npos);

  // The exchange: engine and auto plan by default; the switches and topk's knobs.
  EXPECT_EQ(d->strategy, "auto");
  EXPECT_TRUE(d->print_plan);
  EXPECT_FALSE(d->no_engine || d->dense_baseline || d->compare_to_dense);
  EXPECT_FALSE(d->density.has_value() || d->warmup_steps.has_value());
  EXPECT_EQ(d->compare_tolerance, 0.005);
  auto x = ParseTrainerOptions({"--strategy", "topk", "--density=0.01", "--warmup-steps", "50",
                                "--no-print-plan", "--no-engine", "--compare-to-dense",
                                "--compare-tolerance", "0.01"});
  ASSERT_TRUE(x.ok()) << x.status().ToString();
  EXPECT_EQ(x->strategy, "topk");
  EXPECT_EQ(x->density, 0.01);
  EXPECT_EQ(x->warmup_steps, 50);
  EXPECT_FALSE(x->print_plan);
  EXPECT_TRUE(x->no_engine && x->compare_to_dense);
  EXPECT_EQ(x->compare_tolerance, 0.01);
  for (const char* s : {"auto", "allreduce", "ps", "sfb", "topk"}) {
    auto r = ParseTrainerOptions({"--strategy", s});
    ASSERT_TRUE(r.ok()) << s;
    EXPECT_EQ(r->strategy, s);
  }
  auto base = ParseTrainerOptions({"--dense-baseline"});
  ASSERT_TRUE(base.ok());
  EXPECT_TRUE(base->dense_baseline);
}

TEST(TrainerOptions, ErrorsNameTheFlagAndValue) {
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  };
  const Case cases[] = {
      {{"--batch=0"}, "--batch: got '0'"},
      {{"--iters", "ten"}, "--iters: got 'ten'"},
      {{"--iters", "5x"}, "--iters: got '5x'"},
      {{"--lr", "-1"}, "--lr: got '-1'"},
      {{"--lr", "nan"}, "--lr: got 'nan'"},
      {{"--momentum", "1"}, "--momentum: got '1'"},
      {{"--min-accuracy", "1.5"}, "--min-accuracy: got '1.5'"},
      {{"--hidden", "12,x"}, "width 'x'"},
      {{"--hidden", "12,,4"}, "width ''"},
      {{"--samples"}, "--samples: missing value"},
      {{"--bogus"}, "unknown argument '--bogus'"},
      {{"--check-loss-falls=1"}, "takes no value"},
      {{"--no-engine=yes"}, "--no-engine: takes no value"},
      {{"--strategy", "fastest"}, "--strategy: got 'fastest'; expected auto, allreduce"},
      {{"--strategy", "topk", "--density", "0"}, "--density: got '0'"},
      {{"--strategy", "topk", "--density", "1.5"}, "--density: got '1.5'"},
      {{"--strategy", "topk", "--warmup-steps", "-1"}, "--warmup-steps: got '-1'"},
      {{"--density", "0.01"}, "--density: given with --strategy auto"},
      {{"--strategy", "sfb", "--warmup-steps", "5"}, "--warmup-steps: given with --strategy sfb"},
      {{"--dense-baseline", "--no-engine"}, "--dense-baseline: runs the single fused"},
      {{"--dense-baseline", "--strategy", "ps"}, "--dense-baseline: runs the single fused"},
      {{"--compare-tolerance", "2"}, "--compare-tolerance: got '2'"},
  };
  for (const Case& c : cases) {
    auto r = ParseTrainerOptions(c.args);
    ASSERT_FALSE(r.ok()) << c.args[0];
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(r.status(), c.expect)) << r.status().ToString();
  }
}

}  // namespace
}  // namespace poseidon::mlp
