// Multi-rank tests of the engine when ranks disagree or fail: mismatched submissions fail every
// rank, bad arguments, the stall warning and abort, shutdown with pending work, and the response
// cache (steady state, the waiting thread running cached ops, deviations). Gradients and
// averages as in engine_test.cc (the same test executable).
#include "engine/engine.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <future>
#include <sstream>
#include <limits>
#include <stdexcept>
#include <thread>
#include <vector>

#include "collectives/hybrid.h"
#include "runtime/settings.h"
#include "test/engine/engine_test_util.h"
#include "test/mpi_test_main.h"

namespace poseidon {
namespace {

using testing::CallbacksRun;
using testing::Expected;
using testing::Grad;
using testing::MakeCollective;
using testing::MakeEngine;
using testing::Options;
using testing::World;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Every handle of `handles` fails with `code` and a message holding every piece of `parts`,
// within `limit_s` of `start`.
void ExpectAllFail(const std::vector<HandlePtr>& handles, StatusCode code,
                   const std::vector<std::string>& parts, Clock::time_point start, double limit_s) {
  for (const auto& h : handles) {
    Status s = h->Wait(limit_s + 5);
    EXPECT_EQ(s.code(), code) << s.ToString();
    for (const auto& p : parts) {
      EXPECT_NE(s.message().find(p), std::string::npos)
          << "missing '" << p << "' in " << s.ToString();
    }
  }
  EXPECT_LT(Seconds(start), limit_s);
}

TEST(Engine, DifferentSizeFailsEveryRank) {
  const int P = World()->size(), me = World()->rank();
  if (P < 2) GTEST_SKIP() << "needs two ranks";
  auto hc = MakeCollective({16, 32, 8});
  auto engine = MakeEngine(hc.get(), Options(1 << 20, 0));
  std::vector<float> a(16, 1), b(32, 1), c(8, 1);
  auto start = Clock::now();
  std::vector<HandlePtr> h;
  h.push_back(engine->Submit(2, c.data(), c.size(), 0));
  h.push_back(engine->Submit(1, b.data(), me == P - 1 ? 31 : 32, 0));
  h.push_back(engine->Submit(0, a.data(), a.size(), 0));
  ExpectAllFail({h[1], h[2]}, StatusCode::kMismatch,
                {"layer 1 (l1)", "element count", "count 32", "count 31",
                 StrCat("rank ", P - 1, " submitted")},
                start, 5);
  // Layer 2 agreed: it ran, or it was still waiting when the mismatch failed everything.
  Status s0 = h[0]->Wait(5);
  EXPECT_TRUE(s0.ok() || s0.code() == StatusCode::kMismatch) << s0.ToString();
  EXPECT_EQ(engine->status().code(), StatusCode::kMismatch);
  // Sticky: later submissions fail at once with the same error.
  HandlePtr later = engine->Submit(0, a.data(), a.size(), 1);
  EXPECT_TRUE(later->Test());
  EXPECT_EQ(later->status().code(), StatusCode::kMismatch);
  EXPECT_EQ(engine->Shutdown().code(), StatusCode::kMismatch);
}

TEST(Engine, AnyOrderWithinAStep) {
  // Layers are matched by id: every rank submits the step's layers in its own order (rotated
  // by rank, reversed on odd steps), over enough steps for the response cache to take over.
  const int P = World()->size(), me = World()->rank();
  const std::vector<size_t> sizes = {16, 32, 7, 100, 1};
  auto hc = MakeCollective(sizes);
  auto engine = MakeEngine(hc.get(), Options(1 << 20, 0));
  ASSERT_NE(engine, nullptr);
  const int L = static_cast<int>(sizes.size());
  std::vector<std::vector<float>> g(sizes.size());
  for (int step = 0; step < 8; ++step) {
    std::vector<HandlePtr> h(sizes.size());
    for (int k = 0; k < L; ++k) {
      int l = (k + me) % L;
      if (step % 2 == 1) l = L - 1 - l;
      g[static_cast<size_t>(l)] = Grad(sizes[static_cast<size_t>(l)], me, step);
      h[static_cast<size_t>(l)] =
          engine->Submit(l, g[static_cast<size_t>(l)].data(), sizes[static_cast<size_t>(l)], step);
    }
    for (int l = 0; l < L; ++l) {
      Status s = h[static_cast<size_t>(l)]->Wait(30);
      ASSERT_TRUE(s.ok()) << s.ToString();
      size_t wrong = 0;
      for (size_t i = 0; i < sizes[static_cast<size_t>(l)]; ++i) {
        wrong += g[static_cast<size_t>(l)][i] != Expected(i, P, step);
      }
      EXPECT_EQ(wrong, 0u) << "layer " << l << " step " << step;
    }
  }
  EXPECT_TRUE(engine->Shutdown().ok());
}

TEST(Engine, DifferentStepFailsEveryRank) {
  const int P = World()->size(), me = World()->rank();
  if (P < 2) GTEST_SKIP() << "needs two ranks";
  auto hc = MakeCollective({16, 32});
  auto engine = MakeEngine(hc.get(), Options(1 << 20, 0));
  std::vector<float> a(16, 1), b(32, 1);
  auto start = Clock::now();
  std::vector<HandlePtr> h;
  h.push_back(engine->Submit(1, b.data(), b.size(), 0));
  h.push_back(engine->Submit(0, a.data(), a.size(), me == P - 1 ? 1 : 0));
  ExpectAllFail({h[1]}, StatusCode::kMismatch,
                {"layer 0 (l0)", "step", StrCat("rank", P == 2 ? " " : "s ")}, start, 5);
  EXPECT_EQ(engine->Shutdown().code(), StatusCode::kMismatch);
}

TEST(Engine, DifferentDtypeFailsEveryRank) {
  const int P = World()->size(), me = World()->rank();
  if (P < 2) GTEST_SKIP() << "needs two ranks";
  auto hc = MakeCollective({16});
  auto engine = MakeEngine(hc.get(), Options(1 << 20, 0));
  std::vector<double> a(16, 1);
  Gradient g;
  g.data = a.data();
  g.count = 16;
  g.dtype = me == 0 ? DType::kFloat64 : DType::kFloat32;
  auto start = Clock::now();
  HandlePtr h = engine->Submit(0, g, 0);
  ExpectAllFail({h}, StatusCode::kMismatch, {"layer 0 (l0)", "dtype", "float64", "float32"}, start,
                5);
  EXPECT_EQ(engine->Shutdown().code(), StatusCode::kMismatch);
}

TEST(Engine, AgreedBadCountFailsOnlyThatHandle) {
  const int me = World()->rank();
  auto hc = MakeCollective({16, 8});
  auto engine = MakeEngine(hc.get(), Options(1 << 20, 0));
  std::vector<float> a(16, 1);
  HandlePtr bad = engine->Submit(0, a.data(), 15, 0);
  Status s = bad->Wait(10);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("count 15 on every rank, but the layer has 16 elements"),
            std::string::npos)
      << s.ToString();
  // The engine stays healthy: nothing was exchanged, every rank took the same verdict.
  auto g = Grad(16, me, 0);
  EXPECT_TRUE(engine->Submit(0, g.data(), g.size(), 0)->Wait(10).ok());
  EXPECT_TRUE(engine->Shutdown().ok());
}

TEST(Engine, InvalidSubmissionOnOneRankFailsEveryRank) {
  const int P = World()->size(), me = World()->rank();
  auto hc = MakeCollective({16});
  auto engine = MakeEngine(hc.get(), Options(1 << 20, 0));
  std::vector<float> a(16, 1);
  auto start = Clock::now();
  HandlePtr h = engine->Submit(0, me == P - 1 ? nullptr : a.data(), 16, 0);
  Status s = h->Wait(10);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  if (me == P - 1) {
    EXPECT_NE(s.message().find("grad is null"), std::string::npos) << s.ToString();
  } else {
    EXPECT_NE(s.message().find(StrCat("failed on rank ", P - 1)), std::string::npos)
        << s.ToString();
  }
  EXPECT_LT(Seconds(start), 5);
  // The engine stops on every rank with the gathered error.
  EXPECT_EQ(engine->Shutdown().code(), StatusCode::kInvalidArgument);
  Status st = engine->status();
  EXPECT_NE(st.message().find("grad is null"), std::string::npos) << st.ToString();
}

TEST(Engine, BadLayerIdAndOptions) {
  auto hc = MakeCollective({4});
  EngineOptions o = Options(-1, 0);
  auto bad = Engine::Create(World(), hc.get(), o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("POSEIDON_FUSION_BYTES=-1"), std::string::npos);
  auto noplan = HybridCollective::Create(World());
  ASSERT_TRUE(noplan.ok());
  auto e2 = Engine::Create(World(), noplan->get(), Options(0, 0));
  ASSERT_FALSE(e2.ok());
  EXPECT_NE(e2.status().message().find("no plan"), std::string::npos);
  EXPECT_FALSE(Engine::Create(World(), nullptr, Options(0, 0)).ok());

  auto engine = MakeEngine(hc.get(), Options(0, 0));
  std::vector<float> a(4, 1);
  HandlePtr h = engine->Submit(7, a.data(), 4, 0);
  EXPECT_TRUE(h->Test());
  EXPECT_EQ(h->status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(h->status().message().find("layer id 7 is out of range; expected 0..0"),
            std::string::npos);
  // Every rank made the same mistake: every rank's engine stops with it.
  EXPECT_EQ(engine->Shutdown().code(), StatusCode::kInvalidArgument);
}

TEST(Engine, StallWarnsThenAborts) {
  const int P = World()->size(), me = World()->rank();
  if (P < 2) GTEST_SKIP() << "needs two ranks";
  auto hc = MakeCollective({16, 8});
  EngineOptions o = Options(1 << 20, 0);
  o.stall_warn_s = 0.3;
  o.stall_abort_s = 1.0;
  // Rank 0 captures its stderr to check the warning names the missing rank.
  char log_path[] = "/tmp/psd_engine_stall_XXXXXX";
  int saved = -1;
  if (me == 0) {
    int fd = mkstemp(log_path);
    ASSERT_GE(fd, 0);
    std::fflush(stderr);
    saved = dup(2);
    dup2(fd, 2);
    close(fd);
  }
  auto engine = MakeEngine(hc.get(), o);
  std::vector<float> a(16, 1), b(8, 1);
  auto start = Clock::now();
  HandlePtr h1 = engine->Submit(1, b.data(), b.size(), 0);
  HandlePtr h0;
  if (me != P - 1) h0 = engine->Submit(0, a.data(), a.size(), 0);  // the last rank never does
  EXPECT_TRUE(h1->Wait(10).ok());
  if (h0) {
    Status s = h0->Wait(10);
    EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.ToString();
    EXPECT_NE(s.message().find("stall abort"), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("POSEIDON_STALL_ABORT_S=1"), std::string::npos);
    const std::string present = P == 2 ? "rank 0" : StrCat("ranks 0-", P - 2);
    EXPECT_NE(s.message().find(StrCat("layer 0 (l0) submitted on ", present)), std::string::npos)
        << s.ToString();
    EXPECT_NE(s.message().find(StrCat("missing on rank ", P - 1)), std::string::npos)
        << s.ToString();
    EXPECT_GE(Seconds(start), 0.9);
  }
  // Every rank (the last one too, which has nothing pending) stops with the stall error.
  while (engine->running() && Seconds(start) < 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(engine->Shutdown().code(), StatusCode::kTimeout);
  EXPECT_LT(Seconds(start), 5);
  EXPECT_GE(engine->stats().stall_warnings, 1);
  if (me == 0) {
    std::fflush(stderr);
    dup2(saved, 2);
    close(saved);
    std::ifstream in(log_path);
    std::stringstream text;
    text << in.rdbuf();
    std::remove(log_path);
    EXPECT_NE(text.str().find("Engine: stall: waiting more than POSEIDON_STALL_WARN_S=0.3"),
              std::string::npos)
        << text.str();
    EXPECT_NE(text.str().find(StrCat("missing on rank ", P - 1)), std::string::npos) << text.str();
  }
}

TEST(Engine, ShutdownFailsPendingWork) {
  const int me = World()->rank();
  auto hc = MakeCollective({10, 3});
  auto engine = MakeEngine(hc.get(), Options(1 << 20, 0));
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  auto g0 = Grad(10, me, 0), g1 = Grad(3, me, 0);
  std::atomic<bool> entered{false};
  HandlePtr h0 = engine->Submit(0, g0.data(), g0.size(), 0, [&](const Status&) {
    entered = true;
    gate.wait();
  });
  // Layer 1 is submitted while the engine thread sits in layer 0's callback, so it cannot
  // have been taken in layer 0's cycle.
  while (!entered) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::atomic<bool> cb1{false};
  HandlePtr h1 = engine->Submit(1, g1.data(), g1.size(), 0,
                                [&](const Status& s) { cb1 = s.code() == StatusCode::kAborted; });
  Status shut;
  std::thread closer([&] { shut = engine->Shutdown(); });
  // Once Shutdown has been asked for, status() says so; then let the engine thread go on.
  while (engine->status().ok()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  release.set_value();
  closer.join();
  EXPECT_TRUE(shut.ok()) << shut.ToString();
  EXPECT_TRUE(h0->Wait(1).ok());
  Status s = h1->Wait(1);
  EXPECT_EQ(s.code(), StatusCode::kAborted);
  EXPECT_NE(s.message().find("layer 1 (l1) step 0: the engine was shut down"), std::string::npos)
      << s.ToString();
  EXPECT_TRUE(cb1.load());
  HandlePtr after = engine->Submit(0, g0.data(), g0.size(), 1);
  EXPECT_EQ(after->status().code(), StatusCode::kAborted);
  EXPECT_FALSE(engine->running());
}


// Steady state: a repeating schedule is run from the response cache (no negotiation round),
// with results bitwise those of the negotiated runs; then one rank deviates in a cached step.
// wait_s < 0: Wait without a timeout (the waiting thread may run the cached op itself).
void RunCachedSteps(Engine* engine, const std::vector<size_t>& sizes, int from, int to,
                    std::vector<std::vector<float>>* g, double wait_s = 30) {
  const int P = World()->size(), me = World()->rank();
  for (int step = from; step < to; ++step) {
    std::vector<HandlePtr> h(sizes.size());
    for (size_t l = sizes.size(); l-- > 0;) {
      (*g)[l] = Grad(sizes[l], me, step);
      h[l] = engine->Submit(static_cast<int>(l), (*g)[l].data(), sizes[l], step);
    }
    for (size_t l = 0; l < sizes.size(); ++l) {
      Status s = h[l]->Wait(wait_s);
      ASSERT_TRUE(s.ok()) << s.ToString();
      size_t wrong = 0;
      for (size_t i = 0; i < sizes[l]; ++i) wrong += (*g)[l][i] != Expected(i, P, step);
      EXPECT_EQ(wrong, 0u) << "layer " << l << " step " << step;
    }
  }
}

TEST(Engine, ResponseCacheSkipsNegotiationInSteadyState) {
  const std::vector<size_t> sizes = {16, 32, 7, 100};
  auto hc = MakeCollective(sizes);
  EngineOptions o = Options(1 << 20, 0);
  // Every step's layers in one fused group, also under load (the user thread's Wait closes the
  // window at once, so the width costs nothing; 2 ms missed the cache in 12 steps once under
  // ASan with 4 busy processes on 2 cores).
  o.fusion_wait_us = 20000;
  auto engine = MakeEngine(hc.get(), o);
  ASSERT_NE(engine, nullptr);
  std::vector<std::vector<float>> g(sizes.size());
  RunCachedSteps(engine.get(), sizes, 0, 30, &g);
  EngineStats st = engine->stats();
  EXPECT_GT(st.cached_ops, 0) << "cycles " << st.cycles;
  // Negotiated rounds are spent learning the schedule (and idling), cached ops on the rest.
  EXPECT_EQ(st.completed, 30 * static_cast<int64_t>(sizes.size()));
  EXPECT_TRUE(engine->Shutdown().ok());
}

// An engine that has run 12 steps of `sizes` and entered the response cache; *next is the step
// to submit next. A loaded machine (ASan, 4 busy processes on 2 cores) can deschedule the test
// thread between two submissions for longer than the fusion window, which splits a step's
// group and delays the cache: up to 48 more steps are run then, 4 at a time (the switch is
// decided alike on every rank, so every rank runs as many).
std::unique_ptr<Engine> CachedEngine(HybridCollective* hc, const std::vector<size_t>& sizes,
                                     double stall_abort_s, std::vector<std::vector<float>>* g,
                                     int* next) {
  EngineOptions o = Options(1 << 20, 0);
  o.fusion_wait_us = 20000;  // as in ResponseCacheSkipsNegotiationInSteadyState
  o.stall_abort_s = stall_abort_s;
  auto engine = MakeEngine(hc, o);
  if (engine == nullptr) return nullptr;
  g->assign(sizes.size(), {});
  RunCachedSteps(engine.get(), sizes, 0, 12, g);
  *next = 12;
  while (engine->stats().cached_ops == 0 && *next < 60) {
    RunCachedSteps(engine.get(), sizes, *next, *next + 4, g);
    *next += 4;
  }
  EXPECT_GT(engine->stats().cached_ops, 0) << "not in the response cache after " << *next
                                           << " steps";
  return engine;
}

// A user thread waiting without a timeout runs the cached op itself (no hand-over to the engine
// thread and back); the results are the engine thread's, bit for bit, and the cache holds.
TEST(Engine, WaitingThreadRunsCachedOps) {
  const std::vector<size_t> sizes = {16, 32, 7, 100};
  auto hc = MakeCollective(sizes);
  std::vector<std::vector<float>> g;
  int next = 0;
  auto engine = CachedEngine(hc.get(), sizes, 20, &g, &next);
  ASSERT_NE(engine, nullptr);
  const EngineStats before = engine->stats();
  RunCachedSteps(engine.get(), sizes, next, next + 28, &g, -1);
  const EngineStats after = engine->stats();
  EXPECT_EQ(after.completed - before.completed, 28 * static_cast<int64_t>(sizes.size()));
  EXPECT_GT(after.waiter_ops, before.waiter_ops)
      << "no cached op ran on a waiting thread; cached ops " << before.cached_ops << " -> "
      << after.cached_ops << ", cache exits " << before.cache_exits << " -> " << after.cache_exits
      << ", cycles " << before.cycles << " -> " << after.cycles;
  EXPECT_LE(after.waiter_ops, after.cached_ops);
  EXPECT_EQ(after.cache_exits, before.cache_exits);
  EXPECT_TRUE(engine->Shutdown().ok());
}

// Nobody waits (callbacks and Test polling only): the step's last op still runs, from the
// engine thread (after one tick, then at once), with exact results.
TEST(Engine, CachedOpsCompleteWithoutWaiters) {
  const int P = World()->size(), me = World()->rank();
  const std::vector<size_t> sizes = {16, 32, 7};
  auto hc = MakeCollective(sizes);
  std::vector<std::vector<float>> g;
  int next = 0;
  auto engine = CachedEngine(hc.get(), sizes, 20, &g, &next);
  ASSERT_NE(engine, nullptr);
  std::atomic<int> done{0};
  for (int step = next; step < next + 20; ++step) {
    std::vector<HandlePtr> h(sizes.size());
    for (size_t l = sizes.size(); l-- > 0;) {
      g[l] = Grad(sizes[l], me, step);
      h[l] = engine->Submit(static_cast<int>(l), g[l].data(), sizes[l], step,
                            [&done](const Status& s) { done += s.ok(); });
    }
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    for (const HandlePtr& x : h) {
      while (!x->Test() && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      ASSERT_TRUE(x->Test()) << "step " << step << ": not complete after 20 s of polling";
      ASSERT_TRUE(x->status().ok()) << x->status().ToString();
    }
    for (size_t l = 0; l < sizes.size(); ++l) {
      size_t wrong = 0;
      for (size_t i = 0; i < sizes[l]; ++i) wrong += g[l][i] != Expected(i, P, step);
      EXPECT_EQ(wrong, 0u) << "layer " << l << " step " << step;
    }
  }
  EXPECT_EQ(CallbacksRun(done, 20 * static_cast<int>(sizes.size())),
            20 * static_cast<int>(sizes.size()));
  EXPECT_TRUE(engine->Shutdown().ok());
}

TEST(Engine, ResponseCacheCatchesADeviationWithinTheStep) {
  const int P = World()->size(), me = World()->rank();
  if (P < 2) GTEST_SKIP() << "needs two ranks";
  const std::vector<size_t> sizes = {16, 32, 7};
  auto hc = MakeCollective(sizes);
  std::vector<std::vector<float>> g;
  int next = 0;
  auto engine = CachedEngine(hc.get(), sizes, 20, &g, &next);
  ASSERT_NE(engine, nullptr);
  // The last rank hands over a different size for layer 1: every rank fails with kMismatch
  // naming it, within the step.
  auto start = Clock::now();
  std::vector<HandlePtr> h;
  for (size_t l = sizes.size(); l-- > 0;) {
    g[l] = Grad(sizes[l], me, next);
    const size_t n = (l == 1 && me == P - 1) ? sizes[l] - 1 : sizes[l];
    h.push_back(engine->Submit(static_cast<int>(l), g[l].data(), n, next));
  }
  ExpectAllFail({h[1]}, StatusCode::kMismatch, {"layer 1 (l1)", "element count"}, start, 5);
  EXPECT_GE(engine->stats().cache_exits, 1);
  EXPECT_EQ(engine->Shutdown().code(), StatusCode::kMismatch);
}

TEST(Engine, ResponseCacheSkippedLayerStallsInsteadOfHanging) {
  const int P = World()->size(), me = World()->rank();
  if (P < 2) GTEST_SKIP() << "needs two ranks";
  const std::vector<size_t> sizes = {16, 32};
  auto hc = MakeCollective(sizes);
  std::vector<std::vector<float>> g;
  int next = 0;
  auto engine = CachedEngine(hc.get(), sizes, 1.0, &g, &next);
  ASSERT_NE(engine, nullptr);
  // The last rank never submits layer 0 in the next step (a parameter unused there).
  auto start = Clock::now();
  g[1] = Grad(sizes[1], me, next);
  HandlePtr h1 = engine->Submit(1, g[1].data(), sizes[1], next);
  HandlePtr h0;
  if (me != P - 1) {
    g[0] = Grad(sizes[0], me, next);
    h0 = engine->Submit(0, g[0].data(), sizes[0], next);
  }
  Status s1 = h1->Wait(15);
  EXPECT_TRUE(s1.ok() || s1.code() == StatusCode::kTimeout) << s1.ToString();
  if (h0) {
    Status s0 = h0->Wait(15);
    EXPECT_EQ(s0.code(), StatusCode::kTimeout) << s0.ToString();
    EXPECT_NE(s0.message().find(StrCat("missing on rank ", P - 1)), std::string::npos)
        << s0.ToString();
  }
  while (engine->running() && Seconds(start) < 15) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_LT(Seconds(start), 10);
  EXPECT_EQ(engine->Shutdown().code(), StatusCode::kTimeout);
}

}  // namespace
}  // namespace poseidon
