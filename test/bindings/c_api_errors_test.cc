// Error paths of the C API, through the exported symbols of libposeidon.so only: every bad
// argument returns its documented code and leaves a message naming the call and the value;
// dead handles are refused, never dereferenced; messages are per communicator and per thread.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "poseidon.h"  // includes mpi.h (C API only)
#include "test/gtest_ranks.h"

namespace {

std::string Last(psdComm_t comm = nullptr) { return psdGetLastError(comm); }

class CApi : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(psdCommInitWorld(&comm_), psdSuccess) << Last(); }
  void TearDown() override {
    if (comm_ != nullptr) EXPECT_EQ(psdCommDestroy(comm_), psdSuccess) << Last();
  }
  psdComm_t comm_ = nullptr;
};

TEST(CApiStatic, ErrorStringsCoverEveryCode) {
  for (int r = 0; r < psdNumResults; ++r) {
    std::string s = psdGetErrorString(static_cast<psdResult_t>(r));
    EXPECT_FALSE(s.empty());
    EXPECT_NE(s, "unknown result code") << r;
  }
  EXPECT_STREQ(psdGetErrorString(static_cast<psdResult_t>(-3)), "unknown result code");
  EXPECT_EQ(psdInvalidArgument, 1);
  EXPECT_EQ(psdInternalError, 7);
  EXPECT_STREQ(psdGetErrorString(psdNumResults), "unknown result code");
}

TEST(CApiStatic, PeerLostHasItsCodeAndString) {
  // Numbered like poseidon::StatusCode::kPeerLost; never renumbered.
  EXPECT_EQ(psdPeerLost, 9);
  EXPECT_EQ(psdNumResults, 10);
  std::string s = psdGetErrorString(psdPeerLost);
  EXPECT_NE(s.find("peer stopped answering"), std::string::npos) << s;
  EXPECT_NE(s, psdGetErrorString(psdTimeout));
  EXPECT_NE(s, psdGetErrorString(psdAborted));
}

TEST(CApiStatic, VersionMatchesHeader) {
  int v = 0;
  ASSERT_EQ(psdGetVersion(&v), psdSuccess);
  EXPECT_EQ(v, PSD_VERSION_CODE);
  EXPECT_EQ(psdGetVersion(nullptr), psdInvalidArgument);
  EXPECT_NE(Last().find("psdGetVersion: version is NULL"), std::string::npos) << Last();
}

TEST(CApiStatic, NullCommIsRefusedByEveryEntryPoint) {
  float x = 0;
  int i = 0;
  size_t n = 0;
  psdStrategy_t st;
  psdLayerConfig_t cfg;
  ASSERT_EQ(psdLayerConfigInit(&cfg), psdSuccess);
  psdHandle_t h = nullptr;
  struct Case {
    const char* name;
    psdResult_t result;
  } cases[] = {
      {"psdAllReduce", psdAllReduce(nullptr, &x, &x, 1, psdFloat32, psdMemHost, nullptr)},
      {"psdReduceScatter", psdReduceScatter(nullptr, &x, &x, 1, psdFloat32, psdMemHost, nullptr)},
      {"psdAllGather", psdAllGather(nullptr, &x, &x, 1, psdFloat32, psdMemHost, nullptr)},
      {"psdBroadcast", psdBroadcast(nullptr, &x, 1, psdFloat32, 0, psdMemHost, nullptr)},
      {"psdBarrier", psdBarrier(nullptr)},
      {"psdCommRank", psdCommRank(nullptr, &i)},
      {"psdCommSize", psdCommSize(nullptr, &i)},
      {"psdCommLocalRank", psdCommLocalRank(nullptr, &i)},
      {"psdCommLocalSize", psdCommLocalSize(nullptr, &i)},
      {"psdRegisterLayer", psdRegisterLayer(nullptr, &cfg, &i)},
      {"psdNumLayers", psdNumLayers(nullptr, &i)},
      {"psdBuildPlan", psdBuildPlan(nullptr, 1)},
      {"psdGetLayerStrategy", psdGetLayerStrategy(nullptr, 0, &st)},
      {"psdGetPlan", psdGetPlan(nullptr, nullptr, &n)},
      {"psdPrintPlan", psdPrintPlan(nullptr, nullptr)},
      {"psdSubmit", psdSubmit(nullptr, 0, &x, nullptr, nullptr, nullptr, 0, &h)},
      {"psdCommDestroy", psdCommDestroy(nullptr)},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.result, psdInvalidArgument) << c.name;
  }
  // Each call replaced the thread's message; the last one names its call.
  EXPECT_NE(Last().find("psdCommDestroy: comm is NULL"), std::string::npos) << Last();
  EXPECT_EQ(h, nullptr);
}

TEST(CApiStatic, HandleCallsRefuseNullAndUnknownHandles) {
  int done = 7;
  EXPECT_EQ(psdWait(nullptr, 0), psdInvalidArgument);
  EXPECT_NE(Last().find("psdWait: handle is NULL"), std::string::npos) << Last();
  EXPECT_EQ(psdTest(reinterpret_cast<psdHandle_t>(uintptr_t{0xdead}), &done), psdInvalidArgument);
  EXPECT_EQ(done, 0);
  EXPECT_NE(Last().find("is not a live handle"), std::string::npos) << Last();
  EXPECT_EQ(psdHandleFree(reinterpret_cast<psdHandle_t>(uintptr_t{0xdead})), psdInvalidArgument);
  EXPECT_EQ(psdHandleFree(nullptr), psdSuccess);
}

TEST(CApiStatic, SettingsValidateNameTypeAndBuffer) {
  EXPECT_EQ(psdSetSetting(nullptr, "1"), psdInvalidArgument);
  EXPECT_EQ(psdSetSetting("FUSION_BYTES", nullptr), psdInvalidArgument);
  EXPECT_EQ(psdSetSetting("FUSION_BYTES", "many"), psdInvalidArgument);
  EXPECT_NE(Last().find("POSEIDON_FUSION_BYTES"), std::string::npos) << Last();
  EXPECT_NE(Last().find("many"), std::string::npos) << Last();
  ASSERT_EQ(psdSetSetting("POSEIDON_FUSION_BYTES", "12345"), psdSuccess) << Last();
  char buf[6];
  size_t size = sizeof(buf);
  ASSERT_EQ(psdGetSetting("FUSION_BYTES", buf, &size), psdSuccess) << Last();
  EXPECT_STREQ(buf, "12345");
  EXPECT_EQ(size, 6u);
  size = 3;
  EXPECT_EQ(psdGetSetting("FUSION_BYTES", buf, &size), psdInvalidArgument);
  EXPECT_EQ(size, 6u);
  EXPECT_NE(Last().find("buffer of 3 bytes is too small"), std::string::npos) << Last();
  EXPECT_EQ(psdGetSetting("FUSION_BYTES", buf, nullptr), psdInvalidArgument);
  EXPECT_EQ(psdGetSetting("NOPE", nullptr, &size), psdInvalidArgument);
  ASSERT_EQ(psdSetSetting("FUSION_BYTES", "4194304"), psdSuccess);
}

TEST(CApiStatic, CommInitChecksItsArguments) {
  EXPECT_EQ(psdCommInitFromMpi(MPI_COMM_WORLD, nullptr), psdInvalidArgument);
  psdComm_t c = reinterpret_cast<psdComm_t>(uintptr_t{1});
  EXPECT_EQ(psdCommInitFromMpi(MPI_COMM_NULL, &c), psdInvalidArgument);
  EXPECT_EQ(c, nullptr);
  EXPECT_NE(Last().find("MPI_COMM_NULL"), std::string::npos) << Last();
  EXPECT_EQ(psdCommInitWorld(nullptr), psdInvalidArgument);
}

TEST_F(CApi, DestroyedCommIsDetectedNotDereferenced) {
  psdComm_t dead = comm_;
  ASSERT_EQ(psdCommDestroy(comm_), psdSuccess);
  comm_ = nullptr;
  int rank = -1;
  EXPECT_EQ(psdCommRank(dead, &rank), psdInvalidArgument);
  EXPECT_EQ(rank, -1);
  EXPECT_NE(Last(dead).find("psdCommRank: comm"), std::string::npos) << Last(dead);
  EXPECT_NE(Last(dead).find("is not a live communicator"), std::string::npos);
  psdResult_t async;
  EXPECT_EQ(psdCommGetAsyncError(dead, &async), psdInvalidArgument);
  EXPECT_EQ(psdCommDestroy(dead), psdInvalidArgument);
  // A new communicator never gets the dead one's number back.
  psdComm_t fresh = nullptr;
  ASSERT_EQ(psdCommInitWorld(&fresh), psdSuccess);
  EXPECT_NE(fresh, dead);
  EXPECT_EQ(psdCommRank(dead, &rank), psdInvalidArgument);
  EXPECT_EQ(psdCommDestroy(fresh), psdSuccess);
}

TEST_F(CApi, CollectiveArgumentsAreChecked) {
  float x[4] = {1, 2, 3, 4};
  EXPECT_EQ(psdAllReduce(comm_, x, x, 4, static_cast<psdDataType_t>(6), psdMemHost, nullptr),
            psdInvalidArgument);
  EXPECT_NE(Last(comm_).find("psdAllReduce: dtype 6 is unknown"), std::string::npos) << Last(comm_);
  EXPECT_EQ(psdAllReduce(comm_, x, nullptr, 4, psdFloat32, psdMemHost, nullptr),
            psdInvalidArgument);
  EXPECT_NE(Last(comm_).find("recv is NULL for 4 elements"), std::string::npos);
  EXPECT_EQ(psdAllReduce(comm_, nullptr, nullptr, 0, psdFloat32, psdMemHost, nullptr),
            psdSuccess);  // zero elements need no buffers
  EXPECT_EQ(psdAllReduce(comm_, x, x, 4, psdFloat32, psdMemHost, x), psdInvalidArgument);
  EXPECT_NE(Last(comm_).find("stream"), std::string::npos);
  EXPECT_EQ(psdAllReduce(comm_, x, x, 4, psdFloat32, psdMemDevice, nullptr), psdUnavailable);
  EXPECT_EQ(psdReduceScatter(comm_, x, x, SIZE_MAX, psdFloat32, psdMemHost, nullptr),
            psdInvalidArgument);
  EXPECT_EQ(psdAllGather(comm_, x, nullptr, 1, psdInt64, psdMemHost, nullptr), psdInvalidArgument);
  int size = 0;
  ASSERT_EQ(psdCommSize(comm_, &size), psdSuccess);
  EXPECT_EQ(psdBroadcast(comm_, x, 4, psdFloat32, size, psdMemHost, nullptr), psdInvalidArgument);
  EXPECT_NE(Last(comm_).find("root"), std::string::npos) << Last(comm_);
  // Still usable after all that.
  ASSERT_EQ(psdAllReduce(comm_, x, x, 4, psdFloat32, psdMemHost, nullptr), psdSuccess);
  EXPECT_EQ(x[3], 4.0f * size);
}

// An argument the C layer itself refuses (NULL buffer, unknown dtype, a stream for host memory)
// on the last rank alone: every rank fails instead of the others waiting for it.
TEST_F(CApi, ArgumentErrorOnOneRankFailsEveryRank) {
  int rank = 0, size = 0;
  ASSERT_EQ(psdCommRank(comm_, &rank), psdSuccess);
  ASSERT_EQ(psdCommSize(comm_, &size), psdSuccess);
  const int bad = size - 1;
  const bool me = rank == bad;
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  float y[8] = {0};
  auto expect_every_rank_fails = [&](psdResult_t r, const std::string& cause) {
    EXPECT_EQ(r, psdInvalidArgument) << Last(comm_);
    EXPECT_NE(Last(comm_).find(cause), std::string::npos) << Last(comm_);
    if (!me) {
      EXPECT_NE(Last(comm_).find("rank " + std::to_string(bad) + " passed an invalid argument"),
                std::string::npos)
          << Last(comm_);
    }
  };
  expect_every_rank_fails(
      psdAllReduce(comm_, x, me ? nullptr : y, 4, psdFloat32, psdMemHost, nullptr),
      "recv is NULL for 4 elements");
  expect_every_rank_fails(
      psdReduceScatter(comm_, x, y, 1, me ? static_cast<psdDataType_t>(9) : psdFloat32, psdMemHost,
                       nullptr),
      "dtype 9 is unknown");
  expect_every_rank_fails(
      psdAllGather(comm_, me ? nullptr : x, y, 1, psdFloat32, psdMemHost, nullptr),
      "send is NULL for 1 elements");
  // A small broadcast on one node returns on its root and on the ranks that agree with it
  // before the last rank's refusal reaches them: the next call fails on every rank with it.
  const psdResult_t refused =
      psdBroadcast(comm_, x, 4, psdFloat32, 0, psdMemHost, me ? static_cast<void*>(y) : nullptr);
  if (refused != psdSuccess) expect_every_rank_fails(refused, "was given for host memory");
  const psdResult_t next = psdBarrier(comm_);
  if (refused == psdSuccess) {
    expect_every_rank_fails(next, "was given for host memory");
    EXPECT_NE(Last(comm_).find("returned here before its peers found"), std::string::npos)
        << Last(comm_);
  }
  // The communicator still works afterwards, on every rank.
  ASSERT_EQ(psdAllReduce(comm_, x, y, 4, psdFloat32, psdMemHost, nullptr), psdSuccess)
      << Last(comm_);
  EXPECT_EQ(y[3], 4.0f * size);
}

TEST_F(CApi, LayerConfigErrorsNameTheField) {
  psdLayerConfig_t cfg;
  ASSERT_EQ(psdLayerConfigInit(&cfg), psdSuccess);
  EXPECT_EQ(cfg.kind, psdLayerDense);
  EXPECT_EQ(cfg.strategy, psdStrategyAuto);
  EXPECT_EQ(cfg.optimizer.kind, psdOptimizerNone);
  EXPECT_FLOAT_EQ(cfg.optimizer.beta2, 0.999f);
  int id = -1;
  size_t shape[3] = {4, 3, 2};
  cfg.name = "conv1";
  cfg.ndim = 3;
  cfg.shape = shape;
  EXPECT_EQ(psdRegisterLayer(comm_, nullptr, &id), psdInvalidArgument);
  EXPECT_EQ(psdRegisterLayer(comm_, &cfg, nullptr), psdInvalidArgument);
  struct Bad {
    void (*edit)(psdLayerConfig_t*);
    const char* expect;
  } bad[] = {
      {[](psdLayerConfig_t* c) { c->ndim = 9; }, "ndim 9 is out of range"},
      {[](psdLayerConfig_t* c) { c->shape = nullptr; }, "shape is NULL"},
      {[](psdLayerConfig_t* c) { c->kind = static_cast<psdLayerKind_t>(5); }, "kind 5"},
      {[](psdLayerConfig_t* c) { c->kind = psdLayerFullyConnected; }, "fully connected"},
      {[](psdLayerConfig_t* c) { c->density = -0.5; }, "density -0.5"},
      {[](psdLayerConfig_t* c) { c->candidates = "allreduce,magic"; }, "magic"},
      {[](psdLayerConfig_t* c) { c->name = "has space"; }, "whitespace"},
      {[](psdLayerConfig_t* c) { c->optimizer.kind = static_cast<psdOptimizerKind_t>(3); },
       "optimizer.kind 3"},
      {[](psdLayerConfig_t* c) {
         c->optimizer.kind = psdOptimizerSgd;
         c->optimizer.momentum = 1.5f;
       },
       "momentum"},
      {[](psdLayerConfig_t* c) {
         c->optimizer.kind = psdOptimizerSgd;
         c->optimizer.nesterov = 2;
       },
       "nesterov 2"},
      {[](psdLayerConfig_t* c) {
         c->optimizer.kind = psdOptimizerAdam;
         c->optimizer.eps = 0;
       },
       "eps"},
  };
  for (const Bad& b : bad) {
    psdLayerConfig_t c = cfg;
    b.edit(&c);
    EXPECT_EQ(psdRegisterLayer(comm_, &c, &id), psdInvalidArgument) << b.expect;
    EXPECT_NE(Last(comm_).find(b.expect), std::string::npos) << Last(comm_);
  }
  int num = -1;
  ASSERT_EQ(psdNumLayers(comm_, &num), psdSuccess);
  EXPECT_EQ(num, 0);  // nothing half-registered
  ASSERT_EQ(psdRegisterLayer(comm_, &cfg, &id), psdSuccess) << Last(comm_);
  EXPECT_EQ(id, 0);
  psdStrategy_t st;
  EXPECT_EQ(psdGetLayerStrategy(comm_, 0, &st), psdInvalidArgument);
  EXPECT_NE(Last(comm_).find("no plan yet"), std::string::npos);
  EXPECT_EQ(psdGetLayerStrategy(comm_, 3, &st), psdInvalidArgument);
  EXPECT_NE(Last(comm_).find("layer_id 3 is not registered"), std::string::npos);
  float g[24] = {0};
  psdHandle_t h = nullptr;
  EXPECT_EQ(psdSubmit(comm_, 0, g, nullptr, nullptr, nullptr, 0, &h), psdInvalidArgument);
  EXPECT_NE(Last(comm_).find("psdBuildPlan first"), std::string::npos) << Last(comm_);
}

TEST_F(CApi, PlanSizeQueryAndSubmitChecks) {
  psdLayerConfig_t cfg;
  ASSERT_EQ(psdLayerConfigInit(&cfg), psdSuccess);
  size_t shape[2] = {4, 6};
  cfg.name = "fc";
  cfg.ndim = 2;
  cfg.shape = shape;
  cfg.kind = psdLayerFullyConnected;
  cfg.strategy = psdStrategyAllReduce;
  int id = -1;
  ASSERT_EQ(psdRegisterLayer(comm_, &cfg, &id), psdSuccess) << Last(comm_);
  EXPECT_EQ(psdBuildPlan(comm_, 2), psdSuccess) << Last(comm_);
  size_t need = 0;
  ASSERT_EQ(psdGetPlan(comm_, nullptr, &need), psdSuccess);
  ASSERT_GT(need, 1u);
  std::vector<char> buf(need);
  size_t small = need - 1;
  EXPECT_EQ(psdGetPlan(comm_, buf.data(), &small), psdInvalidArgument);
  EXPECT_EQ(small, need);
  ASSERT_EQ(psdGetPlan(comm_, buf.data(), &need), psdSuccess);
  EXPECT_EQ(std::string(buf.data()).size() + 1, need);
  EXPECT_NE(std::string(buf.data()).find("fc"), std::string::npos);

  // Local checks of psdSubmit (each one also fails the engine, so they come last).
  float g[24] = {0}, u[8] = {0};
  psdHandle_t h = nullptr;
  EXPECT_EQ(psdSubmit(comm_, id, g, nullptr, u, nullptr, 2, &h), psdInvalidArgument);
  EXPECT_NE(Last(comm_).find("only one of u"), std::string::npos) << Last(comm_);
  EXPECT_EQ(psdSubmit(comm_, id, nullptr, nullptr, nullptr, nullptr, 0, &h), psdInvalidArgument);
  EXPECT_NE(Last(comm_).find("grad is null; expected 24 floats"), std::string::npos);
  EXPECT_EQ(psdSubmit(comm_, id, g, nullptr, nullptr, nullptr, 0, nullptr), psdInvalidArgument);
  EXPECT_EQ(h, nullptr);
  // A refused submission also fails the engine on every rank (the others would wait for it):
  // the sticky asynchronous error says so within a few engine cycles.
  psdResult_t async = psdSuccess;
  for (int i = 0; i < 500 && async == psdSuccess; ++i) {
    ASSERT_EQ(psdCommGetAsyncError(comm_, &async), psdSuccess);
    if (async == psdSuccess) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(async, psdInvalidArgument);
  EXPECT_NE(Last(comm_).find("asynchronous error"), std::string::npos) << Last(comm_);
  // Later submissions fail with the same sticky error instead of hanging.
  ASSERT_EQ(psdSubmit(comm_, id, g, nullptr, nullptr, nullptr, 0, &h), psdSuccess);
  EXPECT_EQ(psdWait(h, 10000), psdInvalidArgument);
  EXPECT_EQ(psdHandleFree(h), psdSuccess);
}

TEST_F(CApi, MessagesArePerThreadAndPerComm) {
  // Another thread's failure does not replace this thread's message.
  EXPECT_EQ(psdGetVersion(nullptr), psdInvalidArgument);
  std::string other;
  std::thread t([&] {
    EXPECT_EQ(psdBarrier(nullptr), psdInvalidArgument);
    other = psdGetLastError(nullptr);
  });
  t.join();
  EXPECT_NE(other.find("psdBarrier"), std::string::npos) << other;
  EXPECT_NE(Last().find("psdGetVersion"), std::string::npos) << Last();
  // The communicator keeps its own last failure.
  int* null_out = nullptr;
  EXPECT_EQ(psdCommSize(comm_, null_out), psdInvalidArgument);
  EXPECT_EQ(psdGetVersion(nullptr), psdInvalidArgument);
  EXPECT_NE(Last(comm_).find("psdCommSize"), std::string::npos) << Last(comm_);
  psdResult_t async = psdInternalError;
  ASSERT_EQ(psdCommGetAsyncError(comm_, &async), psdSuccess);
  EXPECT_EQ(async, psdSuccess);  // argument errors are not asynchronous errors
  EXPECT_EQ(psdCommGetAsyncError(comm_, nullptr), psdInvalidArgument);
}

TEST_F(CApi, ConcurrentCallsOnOneCommAreSerialized) {
  // At np = 1 the collectives complete locally, so threads can race on one communicator.
  int size = 0;
  ASSERT_EQ(psdCommSize(comm_, &size), psdSuccess);
  if (size != 1) GTEST_SKIP() << "threads racing on one communicator need np = 1";
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<float> x(1000, static_cast<float>(t));
      for (int i = 0; i < 50; ++i) {
        if (psdAllReduce(comm_, x.data(), x.data(), x.size(), psdFloat32, psdMemHost, nullptr) !=
                psdSuccess ||
            x[999] != static_cast<float>(t)) {
          ++failures;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace

int main(int argc, char** argv) {
  if (psdInit() != psdSuccess) {
    std::fprintf(stderr, "psdInit: %s\n", psdGetLastError(nullptr));
    return 1;
  }
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  poseidon::testing::SetUpRankOutput(rank);
  int result = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&result, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (psdFinalize() != psdSuccess) return 1;
  return any;
}
