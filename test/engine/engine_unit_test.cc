// Process-local tests of the engine's pure pieces: the negotiation vector (reduced here by hand
// with bitwise OR, as MPI_BOR does), the descriptor hash, the error messages, the fusion plan,
// chunk ranges and the timeline file.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "engine/fusion.h"
#include "engine/negotiation.h"
#include "engine/response_cache.h"
#include "engine/stream_sync.h"
#include "engine/timeline.h"
#include "runtime/build_config.h"

namespace poseidon::engine {
namespace {

// OR-reduces the ranks' vectors into the first, as MPI_Allreduce(MPI_BOR) would.
NegotiationVector Reduce(const std::vector<NegotiationVector>& ranks) {
  NegotiationVector out = ranks[0];
  for (size_t r = 1; r < ranks.size(); ++r) {
    for (int i = 0; i < out.size(); ++i) out.data()[i] |= ranks[r].data()[i];
  }
  return out;
}

Descriptor D(int layer, int step, int64_t count = 10) {
  Descriptor d;
  d.layer = layer;
  d.step = step;
  d.count = count;
  return d;
}

TEST(Negotiation, AndOrAndHashAgreement) {
  for (int layers : {1, 3, 64, 65, 130}) {
    std::vector<NegotiationVector> v(3, NegotiationVector(layers));
    const int last = layers - 1;
    // Layer 0 ready on every rank with equal descriptors; the last layer ready on ranks 0 and 2
    // only (when distinct from 0).
    for (int r = 0; r < 3; ++r) v[r].SetReady(0, D(0, 0).Hash());
    if (last != 0) {
      v[0].SetReady(last, D(last, 1).Hash());
      v[2].SetReady(last, D(last, 1).Hash());
    }
    v[1].SetFlag(kFlagStallWarn);
    NegotiationVector red = Reduce(v);
    EXPECT_TRUE(red.ReadyEverywhere(0)) << layers;
    EXPECT_TRUE(red.ReadySomewhere(0));
    EXPECT_TRUE(red.HashAgrees(0));
    if (last != 0) {
      EXPECT_FALSE(red.ReadyEverywhere(last)) << layers;
      EXPECT_TRUE(red.ReadySomewhere(last));
    }
    for (int l = 1; l < last; ++l) {
      EXPECT_FALSE(red.ReadySomewhere(l));
      EXPECT_FALSE(red.ReadyEverywhere(l));
    }
    EXPECT_TRUE(red.flag(kFlagStallWarn));
    EXPECT_FALSE(red.flag(kFlagError));
    EXPECT_FALSE(red.flag(kFlagShutdown));
  }
}

TEST(Negotiation, HashDisagreementIsSeen) {
  std::vector<NegotiationVector> v(4, NegotiationVector(5));
  for (int r = 0; r < 4; ++r) v[r].SetReady(2, D(2, 7, r == 3 ? 99 : 100).Hash());
  NegotiationVector red = Reduce(v);
  EXPECT_TRUE(red.ReadyEverywhere(2));
  EXPECT_FALSE(red.HashAgrees(2));
  // A single rank agrees with itself.
  NegotiationVector one = Reduce({v[3]});
  EXPECT_TRUE(one.HashAgrees(2));
}

TEST(Negotiation, ClearResetsEverything) {
  NegotiationVector v(70);
  v.SetReady(69, 12345);
  v.SetFlag(kFlagError);
  v.Clear();
  NegotiationVector red = Reduce({v});
  for (int l = 0; l < 70; ++l) EXPECT_FALSE(red.ReadySomewhere(l));
  EXPECT_FALSE(red.flag(kFlagError));
  EXPECT_EQ(v.MaskWords().size(), 2u);
}

TEST(Descriptor, HashCoversEveryField) {
  Descriptor base = D(3, 4);
  base.step = 5;
  base.dtype = 0;
  base.strategy = 0;
  const uint64_t h = base.Hash();
  EXPECT_NE(h, 0u);
  for (int f = 0; f < Descriptor::kWords; ++f) {
    int64_t w[Descriptor::kWords];
    base.ToWords(w);
    w[f] += 1;
    Descriptor d = Descriptor::FromWords(w);
    EXPECT_FALSE(d == base);
    EXPECT_NE(d.Hash(), h) << "field " << f;
  }
  int64_t w[Descriptor::kWords];
  base.ToWords(w);
  EXPECT_TRUE(Descriptor::FromWords(w) == base);
  EXPECT_EQ(base.ToString(), "step 5 count 10 float32 allreduce");
}

std::string Name(int l) { return "fc" + std::to_string(l); }

TEST(Messages, MismatchNamesLayerFieldAndRanks) {
  // Rank 1 submitted a different size for layer 1.
  std::vector<std::vector<Descriptor>> per_rank = {{D(1, 1, 32)}, {D(1, 1, 31)}, {D(1, 1, 32)}};
  std::string m = DescribeMismatch(per_rank, {1}, Name);
  EXPECT_EQ(m,
            "layer 1 (fc1): ranks disagree on the element count: ranks 0, 2 submitted step 1 "
            "count 32 float32 allreduce; rank 1 submitted step 1 count 31 float32 allreduce");
}

TEST(Messages, MismatchNamesTheStepAndListsLayersWaitingOnSomeRanks) {
  // Rank 1 is a step ahead on layer 0; layer 1 waits on rank 0 only.
  std::vector<std::vector<Descriptor>> per_rank = {{D(0, 2), D(1, 2)}, {D(0, 3)}};
  std::string m = DescribeMismatch(per_rank, {0}, Name);
  EXPECT_NE(m.find("layer 0 (fc0): ranks disagree on the step: rank 0 submitted step 2"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("rank 1 submitted step 3"), std::string::npos) << m;
  EXPECT_NE(m.find("layer 1 (fc1) is waiting on rank 0 but was not submitted by rank 1"),
            std::string::npos)
      << m;
}

TEST(ResponseCache, TrailerCommitsOnlyWhenEveryRankIsReadyAndAgrees) {
  for (int world : {1, 2, 3, 7, 9, 256}) {
    auto sum = [&](const std::vector<std::vector<float>>& t) {
      std::vector<float> s(engine::kTrailerFloats, 0.0f);
      for (const auto& v : t) {
        for (size_t i = 0; i < s.size(); ++i) s[i] += v[i];
      }
      return s;
    };
    auto Encode = [](bool ready, bool error, bool shutdown, uint64_t hash) {
      std::vector<float> t;
      engine::EncodeTrailer(ready, error, shutdown, hash, &t);
      return t;
    };
    const uint64_t h = 0x9e3779b97f4a7c15ull;
    std::vector<std::vector<float>> all(static_cast<size_t>(world),
                                        Encode(true, false, false, h));
    EXPECT_TRUE(engine::DecodeTrailer(sum(all).data(), world).commit()) << world;
    // One rank differs in one bit of any of the 48 carried bits: never committed.
    for (int bit = 0; bit < 48; bit += 5) {
      auto t = all;
      t.back() = Encode(true, false, false, h ^ (1ull << bit));
      auto v = engine::DecodeTrailer(sum(t).data(), world);
      if (world > 1) {
        EXPECT_FALSE(v.agree) << world << " bit " << bit;
        EXPECT_FALSE(v.commit());
      }
    }
    // Two ranks whose pieces average to a third's: variance still catches it.
    if (world >= 3) {
      auto t = all;
      t[0] = Encode(true, false, false, h + 1);
      t[1] = Encode(true, false, false, h - 1);
      EXPECT_FALSE(engine::DecodeTrailer(sum(t).data(), world).agree) << world;
    }
    auto t = all;
    t[0] = Encode(false, false, false, 0);
    EXPECT_FALSE(engine::DecodeTrailer(sum(t).data(), world).all_ready);
    t = all;
    t[0] = Encode(true, true, false, h);
    EXPECT_TRUE(engine::DecodeTrailer(sum(t).data(), world).error);
    t[0] = Encode(true, false, true, h);
    EXPECT_TRUE(engine::DecodeTrailer(sum(t).data(), world).shutdown);
  }
}

TEST(ResponseCache, RecorderNeedsTwoEqualCacheableSteps) {
  engine::ScheduleRecorder r;
  std::vector<engine::CachedOp> sched;
  size_t next = 9;
  auto step = [&](int s, bool cacheable) {
    r.Record(cacheable, {D(2, s), D(3, s)}, 20);
    r.Record(true, {D(0, s), D(1, s)}, 20);
  };
  step(0, true);
  EXPECT_FALSE(r.Ready(&sched, &next));
  step(1, true);
  EXPECT_FALSE(r.Ready(&sched, &next));  // step 1 is not known complete yet
  r.Record(true, {D(2, 2), D(3, 2)}, 20);
  ASSERT_TRUE(r.Ready(&sched, &next));
  EXPECT_EQ(sched.size(), 2u);
  EXPECT_EQ(next, 1u);
  EXPECT_EQ(sched[1].layers, (std::vector<int>{0, 1}));
  // A step with an op that cannot be cached (a strategy, a slice) keeps the cache off.
  r.Reset();
  step(0, true);
  step(1, false);
  r.Record(true, {D(2, 2), D(3, 2)}, 20);
  EXPECT_FALSE(r.Ready(&sched, &next));
  // Different groupings in two steps: no cache.
  r.Reset();
  step(0, true);
  r.Record(true, {D(2, 1), D(3, 1), D(0, 1), D(1, 1)}, 40);
  r.Record(true, {D(2, 2), D(3, 2)}, 20);
  EXPECT_FALSE(r.Ready(&sched, &next));
}

TEST(Messages, StallListsPresentAndMissingRanks) {
  // 4 ranks; layer 65 (second mask word) ready on ranks 0 and 3.
  std::vector<std::vector<uint64_t>> masks(4, std::vector<uint64_t>(2, 0));
  masks[0][1] = masks[3][1] = 1ull << 1;
  masks[2][0] = 1;
  EXPECT_EQ(DescribeStall(masks, {65, 0}, Name),
            "layer 65 (fc65) submitted on ranks 0, 3, missing on ranks 1-2; "
            "layer 0 (fc0) submitted on rank 2, missing on ranks 0-1, 3");
}

std::vector<WorkItem> Items(std::vector<std::pair<size_t, bool>> spec) {
  std::vector<WorkItem> out;
  for (size_t i = 0; i < spec.size(); ++i) {
    out.push_back(WorkItem{static_cast<int>(i), spec[i].first, spec[i].second});
  }
  return out;
}

TEST(Fusion, GroupsSmallLayersAndKeepsOrder) {
  // fusion 100 bytes, chunk 1000 bytes.
  auto ops = PlanOps(Items({{40, true},
                            {40, true},
                            {40, true},    // would exceed 100: new group
                            {30, false},   // not fusible: closes the group, runs alone
                            {10, true},    // alone in its group -> direct
                            {5000, true},  // > chunk: chunked
                            {500, true},   // > fusion, < chunk: direct
                            {0, true},
                            {0, true}}),
                     100, 1000);
  ASSERT_EQ(ops.size(), 7u);
  EXPECT_EQ(ops[0].kind, OpKind::kFused);
  EXPECT_EQ(ops[0].items, (std::vector<size_t>{0, 1}));
  EXPECT_EQ(ops[1].kind, OpKind::kDirect);
  EXPECT_EQ(ops[1].items, (std::vector<size_t>{2}));
  EXPECT_EQ(ops[2].kind, OpKind::kStrategy);
  EXPECT_EQ(ops[3].kind, OpKind::kDirect);
  EXPECT_EQ(ops[4].kind, OpKind::kChunked);
  EXPECT_EQ(ops[5].kind, OpKind::kDirect);
  EXPECT_EQ(ops[6].kind, OpKind::kFused);
  EXPECT_EQ(ops[6].items, (std::vector<size_t>{7, 8}));
}

TEST(Fusion, DisabledFusionAndChunking) {
  auto ops = PlanOps(Items({{4, true}, {4, true}, {1 << 30, true}}), 0, 0);
  ASSERT_EQ(ops.size(), 3u);
  for (const auto& op : ops) EXPECT_EQ(op.kind, OpKind::kDirect);
  EXPECT_TRUE(PlanOps({}, 100, 100).empty());
}

std::vector<SliceItem> Slices(std::initializer_list<std::pair<size_t, bool>> spec) {
  std::vector<SliceItem> out;
  for (const auto& [bytes, sliceable] : spec) {
    SliceItem it;
    it.remaining_bytes = bytes;
    it.elem_bytes = 4;
    it.sliceable = sliceable;
    out.push_back(it);
  }
  return out;
}

TEST(Slices, BudgetCutsInIndexOrder) {
  // Budget 100 bytes: 40 whole, then 62 -> 60 (whole floats), the rest waits.
  EXPECT_EQ(PlanSlices(Slices({{40, true}, {62, true}, {8, true}, {0, true}}), 100),
            (std::vector<size_t>{40, 60, 0, 0}));
  // A strategy layer runs whole or waits; a later small layer may still fit.
  EXPECT_EQ(PlanSlices(Slices({{40, true}, {80, false}, {20, true}}), 100),
            (std::vector<size_t>{40, 0, 20}));
  // The first layer always makes progress: a whole strategy layer, or at least one element.
  EXPECT_EQ(PlanSlices(Slices({{500, false}, {4, true}}), 100), (std::vector<size_t>{500, 0}));
  EXPECT_EQ(PlanSlices(Slices({{12, true}}), 2), (std::vector<size_t>{4}));
  // 0 disables slicing: everything whole.
  EXPECT_EQ(PlanSlices(Slices({{1 << 20, true}, {7, false}}), 0),
            (std::vector<size_t>{1 << 20, 7}));
  EXPECT_TRUE(PlanSlices({}, 100).empty());
}

TEST(Fusion, ChunkRangesCoverExactly) {
  EXPECT_EQ(ChunkRanges(10, 4), (std::vector<std::pair<size_t, size_t>>{{0, 4}, {4, 8}, {8, 10}}));
  EXPECT_EQ(ChunkRanges(8, 4), (std::vector<std::pair<size_t, size_t>>{{0, 4}, {4, 8}}));
  EXPECT_EQ(ChunkRanges(0, 4), (std::vector<std::pair<size_t, size_t>>{{0, 0}}));
  EXPECT_EQ(ChunkRanges(3, 100), (std::vector<std::pair<size_t, size_t>>{{0, 3}}));
}

TEST(Timeline, FileNamesCarryTheRank) {
  EXPECT_EQ(Timeline::FileFor("/tmp/t.json", 0, 1), "/tmp/t.json");
  EXPECT_EQ(Timeline::FileFor("/tmp/t.json", 3, 4), "/tmp/t.rank3.json");
  EXPECT_EQ(Timeline::FileFor("/tmp/trace", 1, 2), "/tmp/trace.rank1");
  EXPECT_EQ(Timeline::FileFor("/tmp/a.b/trace", 1, 2), "/tmp/a.b/trace.rank1");
  EXPECT_EQ(Timeline::FileFor(".hidden", 1, 2), ".hidden.rank1");
}

TEST(Timeline, WritesEventsAndCloses) {
  const std::string path = "/tmp/psd_engine_unit_timeline_" + std::to_string(::getpid()) + ".json";
  auto t = Timeline::Open(path, 0, 1);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  (*t)->SetLayerName(2, "fc2");
  (*t)->Span(2, "allreduce", 7, 10.0, 25.5);
  (*t)->Instant(2, "done", 7, 26.0);
  (*t)->Publish();
  ASSERT_TRUE((*t)->Close().ok());
  ASSERT_TRUE((*t)->Close().ok());  // idempotent
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::remove(path.c_str());
  const std::string s = ss.str();
  EXPECT_NE(s.find("{\"name\":\"allreduce\",\"cat\":\"engine\",\"ph\":\"X\",\"pid\":0,\"tid\":2,"
                   "\"ts\":10.000,\"dur\":15.500,\"args\":{\"step\":7}}"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("\"name\":\"done\""), std::string::npos);
  EXPECT_NE(s.find("layer 2 fc2"), std::string::npos);
  EXPECT_EQ(s.substr(s.size() - 2), "]\n");

  auto bad = Timeline::Open("/nonexistent-dir/x.json", 0, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("/nonexistent-dir/x.json"), std::string::npos);
}

// The stream seam works only with CUDA and a GPU; elsewhere every call says why (the device
// paths are tested in test/gpu).
TEST(StreamSync, ReportsWhyWithoutCudaOrAGpu) {
  auto ev = Event::Create();
  auto st = Stream::Create();
  auto dev = CurrentDevice();
  if (!POSEIDON_CUDA_ENABLED) {
    ASSERT_FALSE(ev.ok());
    EXPECT_EQ(ev.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(ev.status().message().find("this build has no CUDA"), std::string::npos)
        << ev.status().ToString();
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.status().code(), StatusCode::kUnavailable);
    ASSERT_FALSE(dev.ok());
    EXPECT_EQ(dev.status().code(), StatusCode::kUnavailable);
    EXPECT_EQ(UseDevice(0).code(), StatusCode::kUnavailable);
    return;
  }
  if (!dev.ok()) {  // CUDA built, no usable device: the CUDA error, never a crash
    EXPECT_FALSE(ev.ok());
    EXPECT_FALSE(st.ok());
    EXPECT_NE(ev.status().message().find("Engine: cudaEventCreateWithFlags"), std::string::npos)
        << ev.status().ToString();
    return;
  }
  // A GPU: record on a stream, order another after it, and see it complete.
  ASSERT_TRUE(ev.ok()) << ev.status().ToString();
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ASSERT_TRUE((*ev)->Record((*st)->get()).ok());
  ASSERT_TRUE((*ev)->OrderStream(nullptr).ok());
  ASSERT_TRUE((*ev)->Synchronize().ok());
  EXPECT_TRUE((*st)->Synchronize().ok());
}

}  // namespace
}  // namespace poseidon::engine
