// The host-checkable half of the GPU top-k step and of the block scatter-add:
//  - the plan functions the CUDA kernels call (kernels/topk_plan.h): digit pick, next-step
//    threshold guess, candidate capacity, the candidate-or-full decision and output slots;
//  - a step-by-step host model of the device algorithm (kernels/cuda/topk.cu: streaming pass
//    with the guess, first digit from the histogram, refine and emit on the candidates or on
//    the full residual) run for many steps and compared bit for bit with the CPU kernel, with
//    the path it took (first call, steady state, distribution jumps, ties, zeros, NaN);
//  - the fault report protocol of ScatterAddBlocks (kernels/scatter_report.h) and the CPU
//    ScatterAddBlocks against ScatterAdd applied block by block.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/scatter_report.h"
#include "kernels/topk_plan.h"

namespace poseidon {
namespace {

namespace plan = topk_plan;

uint32_t Bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}
uint32_t KeyOf(float x) { return plan::KeyOfBits(Bits(x)); }

TEST(TopKPlan, KeysOrderMagnitudesAndPutNaNAboveInfinity) {
  EXPECT_EQ(KeyOf(-2.0f), KeyOf(2.0f));
  EXPECT_LT(KeyOf(1.0f), KeyOf(-1.5f));
  EXPECT_EQ(KeyOf(-0.0f), 0u);
  EXPECT_EQ(KeyOf(std::numeric_limits<float>::infinity()), 0x7f800000u);
  EXPECT_EQ(KeyOf(-std::numeric_limits<float>::quiet_NaN()), plan::kNaNKey);
  EXPECT_EQ(KeyOf(std::nanf("7")), plan::kNaNKey);
  // Bit 31 is never set: the first digit (bits 30..20) uses all 2048 bins.
  EXPECT_EQ(plan::kNaNKey >> plan::kShift1, 0x7f8u);
  EXPECT_LT(plan::kNaNKey >> plan::kShift1, static_cast<uint32_t>(plan::kBins1));
  EXPECT_GT(plan::kGuessNone, plan::kNaNKey);
}

TEST(TopKPlan, PickDigitWalksFromTheTop) {
  std::vector<uint32_t> h(8, 0);
  h[7] = 2;
  h[5] = 3;
  h[1] = 10;
  plan::DigitPick p = plan::PickDigit(h.data(), 8, 1);
  EXPECT_TRUE(p.found);
  EXPECT_EQ(p.digit, 7u);
  EXPECT_EQ(p.above, 0u);
  p = plan::PickDigit(h.data(), 8, 3);
  EXPECT_EQ(p.digit, 5u);
  EXPECT_EQ(p.above, 2u);
  p = plan::PickDigit(h.data(), 8, 15);
  EXPECT_EQ(p.digit, 1u);
  EXPECT_EQ(p.above, 5u);
  p = plan::PickDigit(h.data(), 8, 16);
  EXPECT_FALSE(p.found);
  EXPECT_EQ(p.above, 15u);
}

TEST(TopKPlan, NextGuessIsTheEdgeOfTheBinReachingTheTarget) {
  const uint64_t k = 100;
  std::vector<uint32_t> h(plan::kBins1, 0);
  h[1000] = 50;
  h[990] = static_cast<uint32_t>(plan::GuessTarget(k));  // reached inside bin 990
  h[3] = 1000000;
  const uint64_t target = plan::GuessTarget(k);
  EXPECT_EQ(plan::NextGuess(h.data(), target), 990u << plan::kShift1);
  // All together below the target: every nonzero entry is a candidate (guess 1).
  std::vector<uint32_t> few(plan::kBins1, 0);
  few[1500] = 10;
  EXPECT_EQ(plan::NextGuess(few.data(), target), 1u);
  // The target reached in bin 0 (zeros and the tiniest denormals): still 1, never 0.
  std::vector<uint32_t> zeros(plan::kBins1, 0);
  zeros[0] = 1u << 20;
  EXPECT_EQ(plan::NextGuess(zeros.data(), target), 1u);
  // What the chosen guess had above it in this histogram: the prediction for the next step.
  const plan::DigitPick p = plan::PickDigit(h.data(), plan::kBins1, target);
  EXPECT_EQ(plan::PredictedCount(p, h.data()), 50u + target);
}

TEST(TopKPlan, TheAimCorrectsForDrift) {
  const uint64_t k = 1000, target = plan::GuessTarget(k);
  EXPECT_EQ(plan::GuessAim(k, 0, 500), target);  // no history
  EXPECT_EQ(plan::GuessAim(k, 3000, 3000), target);
  EXPECT_EQ(plan::GuessAim(k, 3000, 9000), target / 3);  // counts grew 3x: aim 3x lower
  EXPECT_EQ(plan::GuessAim(k, 3000, 1500), 2 * target);
  EXPECT_EQ(plan::GuessAim(k, 1, 1000000), k / 2 + 1);  // clamped
  EXPECT_EQ(plan::GuessAim(k, 1000000, 1), 4 * target);
}

TEST(TopKPlan, CapacityAndTheCandidateDecision) {
  EXPECT_EQ(plan::GuessTarget(1000), 3024u);
  EXPECT_EQ(plan::CandidateCapacity(1u << 30, 1000), 4u * 3024u);
  EXPECT_EQ(plan::CandidateCapacity(5000, 1000), 5000u);  // never above n
  EXPECT_TRUE(plan::CandidatesSuffice(1000, 1000, 5000));
  EXPECT_FALSE(plan::CandidatesSuffice(999, 1000, 5000));   // T may lie below the guess
  EXPECT_FALSE(plan::CandidatesSuffice(5001, 1000, 5000));  // some did not fit
}

TEST(TopKPlan, OutputSlotsInterleaveAboveAndFirstTies) {
  // Keys in index order: A T A T T A with k_rem = 1: selected A, T(first), A, A.
  EXPECT_EQ(plan::OutputSlot(0, 0, 1), 0u);  // A
  EXPECT_EQ(plan::OutputSlot(1, 0, 1), 1u);  // first T (t_before 0 < k_rem)
  EXPECT_EQ(plan::OutputSlot(1, 1, 1), 2u);  // A after one tie
  EXPECT_EQ(plan::OutputSlot(2, 3, 1), 3u);  // A after three ties, only one taken
}

// ---- A host model of the device step (topk.cu), step by step ----

struct DeviceModel {
  uint32_t guess = plan::kGuessNone;
  uint64_t predicted = 0;  // this step's count above the guess, per the last histogram
  bool used_candidates = false;
  uint64_t candidates = 0;

  // One call, the device's order of decisions; output into idx / val.
  void Step(const std::vector<float>& grad, std::vector<float>* res, std::vector<float>* mom,
            float momentum, size_t k, std::vector<uint32_t>* idx, std::vector<float>* val) {
    const size_t n = grad.size();
    const uint64_t cap = plan::CandidateCapacity(n, k);
    std::vector<uint32_t> hist1(plan::kBins1, 0);
    std::vector<uint32_t> cand_idx;
    std::vector<float> cand_val;
    uint64_t count = 0;
    for (size_t i = 0; i < n; ++i) {  // 1. the streaming pass
      float u = grad[i];
      if (mom != nullptr) {
        u = momentum * (*mom)[i] + u;
        (*mom)[i] = u;
      }
      const float r = (*res)[i] + u;
      (*res)[i] = r;
      const uint32_t key = KeyOf(r);
      ++hist1[key >> plan::kShift1];
      if (key >= guess) {
        if (count < cap) {
          cand_idx.push_back(static_cast<uint32_t>(i));
          cand_val.push_back(r);
        }
        ++count;
      }
    }
    const plan::DigitPick first = plan::PickDigit(hist1.data(), plan::kBins1, k);
    ASSERT_TRUE(first.found);
    candidates = count;
    used_candidates = plan::CandidatesSuffice(count, k, cap);
    const plan::DigitPick next =
        plan::PickDigit(hist1.data(), plan::kBins1, plan::GuessAim(k, predicted, count));
    guess = plan::NextGuessFromPick(next);
    predicted = plan::PredictedCount(next, hist1.data());
    if (!used_candidates) {  // the full path reads the residual itself
      cand_idx.resize(n);
      cand_val.assign(res->begin(), res->end());
      for (size_t i = 0; i < n; ++i) cand_idx[i] = static_cast<uint32_t>(i);
    }
    uint32_t prefix = first.digit << plan::kShift1;
    uint64_t k_rem = k - first.above;
    for (int shift : {10, 0}) {  // 2., 3. refine
      const int high = shift + plan::kBits2;
      std::vector<uint32_t> h(plan::kBins2, 0);
      for (float v : cand_val) {
        const uint32_t key = KeyOf(v);
        if ((key >> high) == (prefix >> high)) ++h[(key >> shift) & (plan::kBins2 - 1)];
      }
      const plan::DigitPick p = plan::PickDigit(h.data(), plan::kBins2, k_rem);
      ASSERT_TRUE(p.found) << "shift " << shift;
      prefix |= p.digit << shift;
      k_rem -= p.above;
    }
    idx->assign(k, 0xffffffffu);
    val->assign(k, 0.0f);
    uint64_t a = 0, t = 0, written = 0;
    for (size_t j = 0; j < cand_val.size(); ++j) {  // 4. emit
      const uint32_t key = KeyOf(cand_val[j]);
      uint64_t slot;
      if (key > prefix) {
        slot = plan::OutputSlot(a++, t, k_rem);
      } else if (key == prefix && t < k_rem) {
        slot = plan::OutputSlot(a, t++, k_rem);
      } else {
        if (key == prefix) ++t;
        continue;
      }
      ASSERT_LT(slot, k);
      (*idx)[slot] = cand_idx[j];
      (*val)[slot] = cand_val[j];
      (*res)[cand_idx[j]] = 0.0f;
      if (mom != nullptr) (*mom)[cand_idx[j]] = 0.0f;
      ++written;
    }
    ASSERT_EQ(written, k);
  }
};

enum class Shape { kGaussian, kJump, kTies, kSparse, kNaN };

std::vector<float> Gradient(Shape shape, int step, size_t n, std::mt19937* rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = normal(*rng);
  switch (shape) {
    case Shape::kGaussian:
      break;
    case Shape::kJump:  // the scale jumps 1000x at step 6 and back at step 12
      if (step >= 6 && step < 12) {
        for (float& x : g) x *= 1000.0f;
      }
      break;
    case Shape::kTies:  // every magnitude equal: the smaller index wins every tie
      for (size_t i = 0; i < n; ++i) g[i] = (i % 3 == 0) ? -0.5f : 0.5f;
      break;
    case Shape::kSparse:  // fewer than k nonzero entries: zeros fill the selection
      for (size_t i = 0; i < n; ++i) g[i] = (i % 997 == 5) ? g[i] : 0.0f;
      break;
    case Shape::kNaN:
      g[n / 2] = std::nanf("");
      g[n / 3] = -std::numeric_limits<float>::infinity();
      g[7] = std::numeric_limits<float>::denorm_min();
      break;
  }
  return g;
}

struct Case {
  Shape shape;
  size_t n, k;
  bool momentum;
};

class DeviceModelTest : public ::testing::TestWithParam<Case> {};

TEST_P(DeviceModelTest, MatchesTheCpuKernelEveryStepAndTakesTheCandidatePathInSteadyState) {
  const Case c = GetParam();
  std::mt19937 rng(1234);
  std::vector<float> res_m(c.n, 0.0f), res_c(c.n, 0.0f), mom_m(c.n, 0.0f), mom_c(c.n, 0.0f);
  std::vector<uint32_t> idx_m, idx_c(c.k);
  std::vector<float> val_m, val_c(c.k);
  cpu::TopKWorkspace ws;
  DeviceModel model;
  const int steps = 18;
  int candidate_steps = 0;
  for (int step = 0; step < steps; ++step) {
    const std::vector<float> g = Gradient(c.shape, step, c.n, &rng);
    model.Step(g, &res_m, c.momentum ? &mom_m : nullptr, 0.9f, c.k, &idx_m, &val_m);
    ASSERT_FALSE(HasFatalFailure());
    ASSERT_TRUE(CpuKernels()
                    .FusedResidualTopK(g.data(), res_c.data(), c.momentum ? mom_c.data() : nullptr,
                                       c.momentum ? 0.9f : 0.0f, c.n, c.k, idx_c.data(),
                                       val_c.data(), &ws, nullptr)
                    .ok());
    ASSERT_EQ(idx_m, idx_c) << "step " << step;
    for (size_t j = 0; j < c.k; ++j) {
      ASSERT_EQ(Bits(val_m[j]), Bits(val_c[j])) << "step " << step << " j " << j;
    }
    for (size_t i = 0; i < c.n; ++i) {
      ASSERT_EQ(Bits(res_m[i]), Bits(res_c[i])) << "step " << step << " i " << i;
    }
    if (step == 0) {
      EXPECT_FALSE(model.used_candidates) << "the first call has no guess";
    }
    if (step >= 2 && (c.shape == Shape::kGaussian || c.shape == Shape::kNaN)) {
      EXPECT_TRUE(model.used_candidates) << "step " << step << ": " << model.candidates;
    }
    candidate_steps += model.used_candidates;
    if (getenv("PSD_MODEL_TRACE")) {
      printf("step %d: %s, %llu candidates (k %zu, cap %llu)\n", step,
             model.used_candidates ? "candidates" : "full",
             static_cast<unsigned long long>(model.candidates), c.k,
             static_cast<unsigned long long>(plan::CandidateCapacity(c.n, c.k)));
    }
  }
  switch (c.shape) {
    case Shape::kGaussian:
    case Shape::kNaN:
      // Every step after the first two: the first has no guess, the second no drift estimate
      // yet (its residual is the sum of two gradients, about 10x more entries pass the guess).
      EXPECT_GE(candidate_steps, steps - 2);
      break;
    case Shape::kJump:
      // The jump costs one more full step (the jump back is absorbed by the aim's clamp).
      EXPECT_GE(candidate_steps, steps - 3);
      break;
    case Shape::kTies:
    case Shape::kSparse:
      // All magnitudes in one bin, or fewer nonzero entries than k: the full path, correct.
      break;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, DeviceModelTest,
                         ::testing::Values(Case{Shape::kGaussian, 100000, 100, false},
                                           Case{Shape::kGaussian, 100000, 1000, true},
                                           Case{Shape::kGaussian, 4099, 4099, false},  // k == n
                                           Case{Shape::kGaussian, 5000, 1, true},
                                           Case{Shape::kJump, 50000, 50, false},
                                           Case{Shape::kTies, 20000, 333, false},
                                           Case{Shape::kSparse, 60000, 200, true},
                                           Case{Shape::kNaN, 30000, 30, false}));

// ---- ScatterAddBlocks' fault protocol and the CPU kernel ----

TEST(ScatterReport, TheFirstFaultByKindThenBlockThenPositionIsTheSmallestWord) {
  using namespace scatter_report;
  EXPECT_LT(Encode(kIndexOutOfRange, 5, 900), Encode(kNotAscending, 0, 1));
  EXPECT_LT(Encode(kNotAscending, 1, 900), Encode(kNotAscending, 2, 1));
  EXPECT_LT(Encode(kNotAscending, 2, 1), Encode(kNotAscending, 2, 2));
  EXPECT_LT(Encode(kIndexOutOfRange, (1u << 28) - 1, 0xffffffffu), kClean);
  const uint64_t w = Encode(kNotAscending, 3, 4000000000u);
  EXPECT_EQ(FaultOf(w), static_cast<uint32_t>(kNotAscending));
  EXPECT_EQ(BlockOf(w), 3u);
  EXPECT_EQ(PositionOf(w), 4000000000u);
}

TEST(ScatterReport, MessagesNameBlockPositionAndValues) {
  using namespace scatter_report;
  Report r;
  EXPECT_TRUE(ReportStatus(r, 10).ok());
  r.word = Encode(kIndexOutOfRange, 2, 5);
  r.index = 99;
  Status s = ReportStatus(r, 50);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("block 2 idx[5] is 99 but n is 50"), std::string::npos)
      << s.ToString();
  r.word = Encode(kNotAscending, 1, 7);
  r.index = 3;
  r.previous = 8;
  s = ReportStatus(r, 50);
  EXPECT_NE(s.message().find("block 1 idx[7] is 3 after idx[6] = 8"), std::string::npos)
      << s.ToString();
}

// Blocks of [k indices | k values] as 32-bit words.
std::vector<uint32_t> Blocks(const std::vector<std::vector<uint32_t>>& idx,
                             const std::vector<std::vector<float>>& val) {
  std::vector<uint32_t> out;
  for (size_t b = 0; b < idx.size(); ++b) {
    out.insert(out.end(), idx[b].begin(), idx[b].end());
    for (float v : val[b]) out.push_back(Bits(v));
  }
  return out;
}

TEST(ScatterAddBlocks, EqualsScatterAddBlockByBlockBitwise) {
  std::mt19937 rng(7);
  const size_t n = 5000, k = 300;
  const int world = 7;
  std::vector<std::vector<uint32_t>> idx(world);
  std::vector<std::vector<float>> val(world);
  std::normal_distribution<float> normal(0.0f, 1e3f);
  for (int b = 0; b < world; ++b) {
    std::vector<uint32_t> all(n);
    for (size_t i = 0; i < n; ++i) all[i] = static_cast<uint32_t>(i);
    std::shuffle(all.begin(), all.end(), rng);
    idx[b].assign(all.begin(), all.begin() + k);
    std::sort(idx[b].begin(), idx[b].end());
    for (size_t j = 0; j < k; ++j) val[b].push_back(normal(rng));
  }
  const std::vector<uint32_t> words = Blocks(idx, val);
  std::vector<float> want(n, 0.0f), got(n, 0.0f);
  for (int b = 0; b < world; ++b) {
    ASSERT_TRUE(
        CpuKernels().ScatterAdd(idx[b].data(), val[b].data(), k, want.data(), n, nullptr).ok());
  }
  auto ws = CpuKernels().NewScatterWorkspace();
  ASSERT_TRUE(
      CpuKernels().ScatterAddBlocks(words.data(), world, k, got.data(), n, ws.get(), nullptr).ok());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(Bits(got[i]), Bits(want[i])) << i;
  EXPECT_TRUE(ws->Fault().ok());
  // Nothing to add.
  EXPECT_TRUE(CpuKernels().ScatterAddBlocks(nullptr, 0, k, got.data(), n, ws.get(), nullptr).ok());
  EXPECT_TRUE(CpuKernels().ScatterAddBlocks(nullptr, 3, 0, nullptr, 0, ws.get(), nullptr).ok());
}

TEST(ScatterAddBlocks, AFaultLeavesDenseUnchangedNamesTheFirstOneAndSticks) {
  const size_t n = 100;
  std::vector<std::vector<uint32_t>> idx = {{1, 5, 9}, {2, 2, 7}, {3, 4, 100}};
  std::vector<std::vector<float>> val = {{1, 1, 1}, {1, 1, 1}, {1, 1, 1}};
  const std::vector<uint32_t> words = Blocks(idx, val);
  std::vector<float> dense(n, 0.5f);
  auto ws = CpuKernels().NewScatterWorkspace();
  Status s = CpuKernels().ScatterAddBlocks(words.data(), 3, 3, dense.data(), n, ws.get(), nullptr);
  // Block 2's index out of range outranks block 1's repeated index.
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("block 2 idx[2] is 100 but n is 100"), std::string::npos)
      << s.ToString();
  for (float x : dense) ASSERT_EQ(x, 0.5f);
  EXPECT_EQ(ws->Fault().message(), s.message());
  // Sticky: a clean call on the same workspace still fails and adds nothing.
  const std::vector<uint32_t> clean = Blocks({{1, 2, 3}}, {{1, 1, 1}});
  s = CpuKernels().ScatterAddBlocks(clean.data(), 1, 3, dense.data(), n, ws.get(), nullptr);
  EXPECT_FALSE(s.ok());
  for (float x : dense) ASSERT_EQ(x, 0.5f);
  // Without the out-of-range block: the repeated index of block 1 is named.
  auto ws2 = CpuKernels().NewScatterWorkspace();
  s = CpuKernels().ScatterAddBlocks(words.data(), 2, 3, dense.data(), n, ws2.get(), nullptr);
  EXPECT_NE(s.message().find("block 1 idx[1] is 2 after idx[0] = 2"), std::string::npos)
      << s.ToString();
}

TEST(ScatterAddBlocks, BadArgumentsAreNamed) {
  auto ws = CpuKernels().NewScatterWorkspace();
  std::vector<float> dense(4);
  std::vector<uint32_t> words(4);
  auto expect = [](const Status& s, const char* what) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find(what), std::string::npos) << s.ToString();
  };
  expect(CpuKernels().ScatterAddBlocks(words.data(), 1, 2, dense.data(), 4, nullptr, nullptr),
         "workspace is null");
  expect(CpuKernels().ScatterAddBlocks(words.data(), -1, 2, dense.data(), 4, ws.get(), nullptr),
         "num_blocks is -1");
  expect(CpuKernels().ScatterAddBlocks(words.data(), 1, 5, dense.data(), 4, ws.get(), nullptr),
         "k is 5 but n is 4");
  expect(CpuKernels().ScatterAddBlocks(nullptr, 1, 2, dense.data(), 4, ws.get(), nullptr),
         "blocks is null");
  expect(CpuKernels().ScatterAddBlocks(words.data(), 1, 2, nullptr, 4, ws.get(), nullptr),
         "dense is null");
}

}  // namespace
}  // namespace poseidon
