// Multi-rank tests of the engine. Gradients hold exact values: rank r contributes
// (r + 1) * f(i) with small integers f(i), so every sum is exact in float32 and the average is
// sum * (1/P) computed once, the same float operation as the dense strategy: results compare
// with == (bitwise) whether the engine fused, chunked or ran a layer alone. The failures, the
// stall and shutdown paths and the response cache are in engine_faults_test.cc (the same test
// executable).
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

TEST(Engine, HandleWaitTestStatusAndCallback) {
  const int P = World()->size(), me = World()->rank();
  auto hc = MakeCollective({10, 3});
  auto engine = MakeEngine(hc.get(), Options(1 << 20, 1 << 20));
  ASSERT_NE(engine, nullptr);

  // Layer 0's callback holds the engine thread until we let it go, so layer 1 stays pending.
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::atomic<int> calls{0};
  std::thread::id cb_thread;
  Status cb_status = InternalError("callback not run");
  auto g0 = Grad(10, me, 0), g1 = Grad(3, me, 0);
  HandlePtr h0 = engine->Submit(0, g0.data(), g0.size(), 0, [&](const Status& s) {
    cb_status = s;
    cb_thread = std::this_thread::get_id();
    calls++;
    gate.wait();
  });
  HandlePtr h1 = engine->Submit(1, g1.data(), g1.size(), 0);
  ASSERT_NE(h0, nullptr);
  EXPECT_EQ(h0->layer(), 0);
  EXPECT_EQ(h1->step(), 0);

  EXPECT_EQ(h1->Wait(0.05).code(), StatusCode::kTimeout);
  EXPECT_NE(h1->Wait(0.0).message().find("layer 1 (l1) step 0 is not complete"), std::string::npos);
  EXPECT_FALSE(h1->Test());
  EXPECT_EQ(h1->status().code(), StatusCode::kUnavailable);
  EXPECT_NE(h1->status().message().find("still pending"), std::string::npos);

  release.set_value();
  ASSERT_TRUE(h0->Wait(10).ok()) << h0->status().ToString();
  ASSERT_TRUE(h1->Wait(10).ok()) << h1->status().ToString();
  EXPECT_TRUE(h0->Test());
  EXPECT_TRUE(h1->status().ok());
  EXPECT_EQ(CallbacksRun(calls, 1), 1);
  EXPECT_TRUE(cb_status.ok());
  EXPECT_NE(cb_thread, std::this_thread::get_id());
  for (size_t i = 0; i < g0.size(); ++i) EXPECT_EQ(g0[i], Expected(i, P, 0)) << i;
  for (size_t i = 0; i < g1.size(); ++i) EXPECT_EQ(g1[i], Expected(i, P, 0)) << i;
  EXPECT_TRUE(engine->Shutdown().ok());
  EXPECT_EQ(calls.load(), 1);
}

// Runs `steps` iterations (layers submitted in backward order, waited in forward order) and
// checks every result bitwise. Returns the engine's counters.
EngineStats RunAndCheck(std::vector<size_t> sizes, const EngineOptions& o, int steps) {
  const int P = World()->size(), me = World()->rank();
  // A one-float gate layer (the last id) is submitted first each step; its callback holds the
  // engine thread until every other layer of the step is queued, so that the step's layers
  // reach the engine together on every rank and fusion has something to fuse.
  sizes.push_back(1);
  const size_t gate = sizes.size() - 1;
  auto hc = MakeCollective(sizes);
  auto engine = MakeEngine(hc.get(), o);
  EXPECT_NE(engine, nullptr);
  if (!engine) return {};
  std::vector<std::vector<float>> g(sizes.size());
  std::vector<HandlePtr> h(sizes.size());
  for (int step = 0; step < steps; ++step) {
    std::promise<void> release;
    std::shared_future<void> opened = release.get_future().share();
    g[gate] = Grad(1, me, step);
    h[gate] = engine->Submit(static_cast<int>(gate), g[gate].data(), 1, step,
                             [opened](const Status&) { opened.wait(); });
    for (size_t l = gate; l-- > 0;) {
      g[l] = Grad(sizes[l], me, step);
      h[l] = engine->Submit(static_cast<int>(l), g[l].data(), g[l].size(), step);
    }
    release.set_value();
    for (size_t l = 0; l < sizes.size(); ++l) {
      Status s = h[l]->Wait(30);
      EXPECT_TRUE(s.ok()) << s.ToString();
      size_t wrong = 0;
      for (size_t i = 0; i < sizes[l]; ++i) wrong += g[l][i] != Expected(i, P, step);
      EXPECT_EQ(wrong, 0u) << "layer " << l << " step " << step;
    }
  }
  EngineStats st = engine->stats();
  EXPECT_TRUE(engine->Shutdown().ok());
  EXPECT_EQ(st.completed, static_cast<int64_t>(sizes.size()) * steps);
  return st;
}

const std::vector<size_t> kSizes = {0, 1, 7, 1001, 5000, 70000, 3};

TEST(Engine, UnfusedGivesExactAverages) {
  EngineStats st = RunAndCheck(kSizes, Options(0, 0), 2);
  EXPECT_EQ(st.fused_groups, 0);
  EXPECT_EQ(st.chunks, 0);
  EXPECT_EQ(st.direct_layers, 16);  // 7 layers + the gate, two steps
}

TEST(Engine, FusedMatchesUnfusedBitwise) {
  // 64 KiB fusion buffer: the small layers share buffers, 70000 floats (280 KB) runs alone.
  EngineStats st = RunAndCheck(kSizes, Options(64 << 10, 0), 2);
  EXPECT_GT(st.fused_groups, 0);
  EXPECT_GE(st.fused_layers, 2 * st.fused_groups);
  EXPECT_GE(st.direct_layers, 2);  // the 70000-float layer, at least
}

TEST(Engine, ChunkedMatchesUnfusedBitwise) {
  // 16 KiB chunks: 70000 floats -> 18 chunks, 5000 floats -> 2 chunks.
  EngineStats st = RunAndCheck(kSizes, Options(0, 16 << 10), 2);
  EXPECT_EQ(st.chunked_layers, 4);
  EXPECT_EQ(st.chunks, 2 * (18 + 2));
}

TEST(Engine, FusedAndChunkedTogether) {
  EngineStats st = RunAndCheck(kSizes, Options(8 << 10, 12 << 10), 3);
  EXPECT_GT(st.fused_groups + st.direct_layers, 0);
  EXPECT_EQ(st.chunked_layers, 6);  // 5000 and 70000 floats, three steps
}

TEST(Engine, SlicedMatchesUnfusedBitwise) {
  // 16 KiB slices, no fusion: after the gate, one cycle per slice in index order. 5000 floats
  // run as 12348 + 7652 bytes; 70000 floats as 8732 bytes, 16 x 16384, then 9124 bytes (with
  // the 3-float layer): 2 + 18 slices per step; the others run whole.
  EngineOptions o = Options(0, 0);
  o.slice_bytes = 16 << 10;
  EngineStats st = RunAndCheck(kSizes, o, 2);
  EXPECT_EQ(st.slices, 2 * (2 + 18));
  EXPECT_EQ(st.direct_layers, 2 * 6);
}

TEST(Engine, SlicedFusedAndChunkedTogether) {
  EngineOptions o = Options(8 << 10, 12 << 10);
  o.slice_bytes = 40 << 10;
  EngineStats st = RunAndCheck(kSizes, o, 2);
  EXPECT_GT(st.slices, 0);
  EXPECT_GT(st.chunks, 0);
}

TEST(Engine, PipelinedNegotiationEverySliceCycle) {
  // 16 KiB slices as above: 19 cycles per step run slices (the second slice of 5000 floats
  // shares one with the first of 70000), and each of them posts the next cycle's negotiation
  // before its exchange; the results stay exact.
  EngineOptions o = Options(0, 0);
  o.slice_bytes = 16 << 10;
  o.pipeline_negotiation = true;
  EngineStats st = RunAndCheck(kSizes, o, 2);
  EXPECT_EQ(st.slices, 2 * (2 + 18));
  EXPECT_GE(st.pipelined, 2 * 19);
  EXPECT_LE(st.pipelined, st.cycles);
}

TEST(Engine, UnpipelinedNegotiationGivesTheSameResults) {
  EngineOptions o = Options(8 << 10, 12 << 10);
  o.slice_bytes = 16 << 10;
  o.pipeline_negotiation = false;
  EngineStats st = RunAndCheck(kSizes, o, 2);
  EXPECT_EQ(st.pipelined, 0);
  EXPECT_GT(st.slices, 0);
}

TEST(Engine, MatchesHybridCollectiveExchange) {
  // The strategy path (HybridCollective::Exchange) and the engine's own paths agree bitwise.
  const int me = World()->rank();
  auto hc = MakeCollective({4097});
  auto ref = Grad(4097, me, 1);
  ASSERT_TRUE(hc->Exchange(0, ExchangeBuffers{ref.data()}, 0).ok());
  auto engine = MakeEngine(hc.get(), Options(1 << 20, 4 << 10));
  auto g = Grad(4097, me, 1);
  ASSERT_TRUE(engine->Submit(0, g.data(), g.size(), 1)->Wait(30).ok());
  EXPECT_EQ(g, ref);
}

// Dense allreduce layers with an optimizer are fused / chunked too: the engine sums them and the
// collective finishes them (FinishDenseSum). Parameters must match, bitwise, a run of
// HybridCollective::Exchange alone, and the traffic counters must count every layer.
struct OptLayer {
  size_t n;
  OptimizerSpec::Kind kind;
};

std::unique_ptr<HybridCollective> MakeOptCollective(const std::vector<OptLayer>& layers) {
  auto hc = HybridCollective::Create(World());
  EXPECT_TRUE(hc.ok()) << hc.status().ToString();
  for (size_t i = 0; i < layers.size(); ++i) {
    LayerSpec s;
    s.name = "o" + std::to_string(i);
    s.shape = {layers[i].n};
    s.force = StrategyKind::kAllReduce;
    if (layers[i].kind == OptimizerSpec::Kind::kSgd) {
      s.optimizer = OptimizerSpec::Sgd(SgdParams{0.05f, 0.9f, 0.01f, false});
    } else if (layers[i].kind == OptimizerSpec::Kind::kAdam) {
      s.optimizer = OptimizerSpec::Adam(AdamParams{});
    }
    EXPECT_TRUE((*hc)->RegisterLayer(s).ok());
  }
  Status st = (*hc)->BuildPlan(32, CostModel::Network(25e-6, 1.25e9), PlannerOptions{});
  EXPECT_TRUE(st.ok()) << st.ToString();
  return std::move(*hc);
}

std::vector<float> Params(size_t n, size_t layer) {
  std::vector<float> w(n);
  for (size_t i = 0; i < n; ++i) w[i] = 0.01f * static_cast<float>((i * 3 + layer) % 11) - 0.05f;
  return w;
}

const std::vector<OptLayer> kOptLayers = {
    {1001, OptimizerSpec::Kind::kSgd},  {7, OptimizerSpec::Kind::kAdam},
    {5000, OptimizerSpec::Kind::kAdam}, {3, OptimizerSpec::Kind::kNone},
    {2000, OptimizerSpec::Kind::kSgd},  {1, OptimizerSpec::Kind::kNone}};  // the last: the gate

void CheckOptimizerFusion(const EngineOptions& o, int steps, EngineStats* stats) {
  const int me = World()->rank();
  const size_t L = kOptLayers.size(), gate = L - 1;
  // Reference: the collective alone.
  auto ref_hc = MakeOptCollective(kOptLayers);
  std::vector<std::vector<float>> ref_w(L), ref_g(L);
  for (size_t l = 0; l < L; ++l) ref_w[l] = Params(kOptLayers[l].n, l);
  for (int step = 0; step < steps; ++step) {
    for (size_t l = L; l-- > 0;) {
      ref_g[l] = Grad(kOptLayers[l].n, me, step);
      ExchangeBuffers b;
      b.grad = ref_g[l].data();
      b.params = ref_w[l].data();
      ASSERT_TRUE(ref_hc->Exchange(static_cast<int>(l), b, step).ok());
    }
  }
  // The engine, with the step's layers reaching it together (the gate's callback holds it).
  auto hc = MakeOptCollective(kOptLayers);
  auto engine = MakeEngine(hc.get(), o);
  ASSERT_NE(engine, nullptr);
  std::vector<std::vector<float>> w(L), g(L);
  for (size_t l = 0; l < L; ++l) w[l] = Params(kOptLayers[l].n, l);
  std::vector<HandlePtr> h(L);
  for (int step = 0; step < steps; ++step) {
    std::promise<void> release;
    std::shared_future<void> opened = release.get_future().share();
    for (size_t l = L; l-- > 0;) {
      g[l] = Grad(kOptLayers[l].n, me, step);
      Gradient gr;
      gr.data = g[l].data();
      gr.count = g[l].size();
      gr.params = kOptLayers[l].kind == OptimizerSpec::Kind::kNone ? nullptr : w[l].data();
      DoneCallback cb;
      if (l == gate) cb = [opened](const Status&) { opened.wait(); };
      h[l] = engine->Submit(static_cast<int>(l), gr, step, cb);
    }
    release.set_value();
    for (size_t l = 0; l < L; ++l) ASSERT_TRUE(h[l]->Wait(30).ok()) << h[l]->status().ToString();
  }
  *stats = engine->stats();
  ASSERT_TRUE(engine->Shutdown().ok());
  for (size_t l = 0; l < L; ++l) {
    const bool opt = kOptLayers[l].kind != OptimizerSpec::Kind::kNone;
    const auto& got = opt ? w[l] : g[l];
    const auto& want = opt ? ref_w[l] : ref_g[l];
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
        << "layer " << l << " differs from HybridCollective::Exchange";
    // Every exchange counted, at the dense allreduce's bytes.
    const Traffic& t = hc->LayerTraffic(static_cast<int>(l));
    const double wire = CostModel::WireBytes(CollectiveKind::kAllReduce, World()->size(),
                                             4.0 * static_cast<double>(kOptLayers[l].n));
    EXPECT_EQ(t.exchanges, steps) << "layer " << l;
    EXPECT_DOUBLE_EQ(t.bytes_sent, steps * wire) << "layer " << l;
    EXPECT_DOUBLE_EQ(t.dense_bytes, steps * wire) << "layer " << l;
    EXPECT_DOUBLE_EQ(t.bytes_sent, ref_hc->LayerTraffic(static_cast<int>(l)).bytes_sent);
  }
  EXPECT_EQ(hc->TotalTraffic().exchanges, static_cast<int64_t>(L) * steps);
}

TEST(Engine, FusedWithOptimizerMatchesExchangeBitwise) {
  EngineStats st;
  CheckOptimizerFusion(Options(64 << 10, 0), 3, &st);
  EXPECT_GT(st.fused_groups, 0);
  EXPECT_GE(st.fused_layers, 2 * st.fused_groups);
  EXPECT_EQ(st.strategy_layers, 0);  // every layer summed by the engine
}

TEST(Engine, ChunkedWithOptimizerMatchesExchangeBitwise) {
  EngineStats st;
  // 4 KiB chunks: 5000 floats (Adam) -> 5 chunks, 2000 floats (SGD) -> 2 chunks; the optimizer
  // runs once, after the last chunk.
  CheckOptimizerFusion(Options(0, 4 << 10), 2, &st);
  EXPECT_EQ(st.chunked_layers, 2 * 2);
  EXPECT_EQ(st.chunks, 2 * (5 + 2));
}

TEST(Engine, SlicedWithOptimizerMatchesExchangeBitwise) {
  EngineStats st;
  // 4 KiB slices: the Adam and SGD layers are cut; each takes its step once, after its last
  // slice, and counts its traffic once.
  EngineOptions o = Options(64 << 10, 0);
  o.slice_bytes = 4 << 10;
  CheckOptimizerFusion(o, 2, &st);
  EXPECT_GT(st.slices, 0);
}

TEST(Engine, UnfusedWithOptimizerMatchesExchangeBitwise) {
  EngineStats st;
  CheckOptimizerFusion(Options(0, 0), 2, &st);
  EXPECT_EQ(st.direct_layers, static_cast<int64_t>(kOptLayers.size()) * 2);
}

// A host engine has no streams or events: a stream is refused (on every rank, which made the
// same mistake), handles carry no event, and a device engine cannot run on a host collective.
TEST(Engine, HostMemoryHasNoStreams) {
  auto hc = MakeCollective({4});
  EngineOptions dev = Options(0, 0);
  dev.memory = MemoryKind::kDevice;
  auto bad = Engine::Create(World(), hc.get(), dev);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("options.memory is device but the collective works on "
                                        "host memory"),
            std::string::npos)
      << bad.status().ToString();

  auto engine = MakeEngine(hc.get(), Options(0, 0));
  ASSERT_NE(engine, nullptr);
  std::vector<float> a = Grad(4, World()->rank(), 0);
  HandlePtr ok = engine->Submit(0, a.data(), 4, 0);
  ASSERT_TRUE(ok->WaitOnStream(nullptr, 30).ok());  // host: the same as Wait
  EXPECT_EQ(ok->cuda_event(), nullptr);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(a[i], Expected(i, World()->size(), 0));
  Gradient g;
  g.data = a.data();
  g.count = 4;
  int fake_stream = 0;
  g.stream = &fake_stream;
  HandlePtr h = engine->Submit(0, g, 1);
  Status s = h->Wait(30);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("a stream was given but the engine works on host memory"),
            std::string::npos)
      << s.ToString();
  EXPECT_EQ(h->cuda_event(), nullptr);
  EXPECT_EQ(engine->Shutdown().code(), StatusCode::kInvalidArgument);
}


TEST(Engine, TimelineWritesChromeTrace) {
  const int P = World()->size(), me = World()->rank();
  // Every rank uses rank 0's pid in the name, so the names differ only by the rank tag.
  int tag = static_cast<int>(getpid());
  MPI_Bcast(&tag, 1, MPI_INT, 0, MPI_COMM_WORLD);
  const std::string base = StrCat("/tmp/psd_engine_timeline_", tag, ".json");
  auto hc = MakeCollective({1000, 20, 30000});
  EngineOptions o = Options(1 << 10, 64 << 10);
  o.timeline = base;
  auto engine = MakeEngine(hc.get(), o);
  const std::string file = engine->timeline_file();
  EXPECT_EQ(file, P == 1 ? base : StrCat("/tmp/psd_engine_timeline_", tag, ".rank", me, ".json"));
  std::vector<std::vector<float>> g = {Grad(1000, me, 0), Grad(20, me, 0), Grad(30000, me, 0)};
  for (int step = 0; step < 2; ++step) {
    std::vector<HandlePtr> h;
    for (int l = 2; l >= 0; --l) h.push_back(engine->Submit(l, g[l].data(), g[l].size(), step));
    for (auto& x : h) ASSERT_TRUE(x->Wait(30).ok());
  }
  ASSERT_TRUE(engine->Shutdown().ok());
  std::ifstream in(file);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string t = ss.str();
  std::remove(file.c_str());
  ASSERT_FALSE(t.empty());
  EXPECT_EQ(t.front(), '[');
  EXPECT_EQ(t.substr(t.size() - 2), "]\n");
  auto count = [&](const std::string& what) {
    size_t n = 0;
    for (size_t p = t.find(what); p != std::string::npos; p = t.find(what, p + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("\"name\":\"done\""), 6u);
  EXPECT_EQ(count("\"name\":\"submit\""), 6u);
  EXPECT_EQ(count("\"name\":\"queue\""), 6u);
  EXPECT_GE(count("\"name\":\"allreduce(chunks)\""), 2u);  // the chunked layer, both steps
  // Three layers and the negotiation track; every cycle that ran work records its round.
  EXPECT_EQ(count("\"name\":\"thread_name\""), 4u);
  EXPECT_NE(t.find("negotiation"), std::string::npos);
  EXPECT_GE(count("\"name\":\"negotiate"), 2u);
  EXPECT_NE(t.find("layer 2 l2"), std::string::npos);
  EXPECT_NE(t.find(StrCat("\"pid\":", me)), std::string::npos);
}

TEST(Engine, ManyStepsManyLayersNoLeftovers) {
  // A longer run with callbacks: every handle completes once, in any rank count.
  const int P = World()->size(), me = World()->rank();
  std::vector<size_t> sizes;
  for (int l = 0; l < 70; ++l) sizes.push_back(static_cast<size_t>(1 + 37 * l));  // 2 mask words
  auto hc = MakeCollective(sizes);
  auto engine = MakeEngine(hc.get(), Options(4 << 10, 8 << 10));
  std::atomic<int> done{0};
  std::vector<std::vector<float>> g(sizes.size());
  for (int step = 0; step < 3; ++step) {
    std::vector<HandlePtr> h(sizes.size());
    for (size_t l = sizes.size(); l-- > 0;) {
      g[l] = Grad(sizes[l], me, step);
      h[l] = engine->Submit(static_cast<int>(l), g[l].data(), g[l].size(), step,
                            [&](const Status& s) { done += s.ok(); });
    }
    for (size_t l = 0; l < sizes.size(); ++l) {
      ASSERT_TRUE(h[l]->Wait(30).ok()) << h[l]->status().ToString();
      EXPECT_EQ(g[l].back(), Expected(sizes[l] - 1, P, step));
    }
  }
  EXPECT_TRUE(engine->Shutdown().ok());
  EXPECT_EQ(done.load(), 3 * 70);
}


TEST(Engine, OptionsThatShapeCollectivesMustAgree) {
  const int P = World()->size(), me = World()->rank();
  if (P < 2) GTEST_SKIP() << "needs two ranks";
  auto hc = MakeCollective({16});
  for (int variant = 0; variant < 3; ++variant) {
    EngineOptions o = Options(1 << 20, 0);
    const int odd = variant % P;  // the rank that differs: 0, 1, 2 (mod P)
    const char* name = "";
    if (variant == 0) {
      name = "POSEIDON_FUSION_BYTES";
      if (me == odd) o.fusion_bytes = 0;
    } else if (variant == 1) {
      name = "POSEIDON_SLICE_BYTES";
      if (me == odd) o.slice_bytes = 4096;
    } else {
      name = "POSEIDON_RESPONSE_CACHE";
      if (me == odd) o.response_cache = false;
    }
    auto e = Engine::Create(World(), hc.get(), o);
    ASSERT_FALSE(e.ok()) << name;
    EXPECT_EQ(e.status().code(), StatusCode::kMismatch) << e.status().ToString();
    EXPECT_NE(e.status().message().find(name), std::string::npos) << e.status().ToString();
    EXPECT_NE(e.status().message().find(StrCat("rank ", odd)), std::string::npos)
        << e.status().ToString();
  }
}

TEST(Engine, HugeWaitTimeoutsMeanForeverAndCallbacksMayThrow) {
  const int P = World()->size(), me = World()->rank();
  auto hc = MakeCollective({10, 3});
  auto engine = MakeEngine(hc.get(), Options(1 << 20, 0));
  ASSERT_NE(engine, nullptr);
  auto g0 = Grad(10, me, 0), g1 = Grad(3, me, 0);
  HandlePtr h0 = engine->Submit(0, g0.data(), g0.size(), 0,
                                [](const Status&) { throw std::runtime_error("user bug"); });
  HandlePtr h1 = engine->Submit(1, g1.data(), g1.size(), 0);
  EXPECT_TRUE(h0->Wait(1e10).ok());
  EXPECT_TRUE(h1->Wait(std::numeric_limits<double>::infinity()).ok());
  EXPECT_TRUE(h1->Wait(std::numeric_limits<double>::quiet_NaN()).ok());
  EXPECT_EQ(g0[3], Expected(3, P, 0));
  EXPECT_TRUE(engine->Shutdown().ok());
}

}  // namespace
}  // namespace poseidon
