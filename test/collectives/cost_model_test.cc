// Multi-rank tests of the cost-model probe and its cache: every rank gets identical figures,
// the cache file is written, read back exactly, ignored when it names another host key or is
// corrupt, and bypassed with POSEIDON_REPROBE. The probe runs with few repetitions to stay fast.
#include "collectives/cost_model.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "collectives/hybrid.h"
#include "runtime/settings.h"
#include "test/mpi_test_main.h"

namespace poseidon {
namespace {

using testing::World;

ProbeOptions Quick() {
  ProbeOptions o;
  o.repetitions = 3;
  o.small_bytes = 1024;
  o.large_bytes = 256 * 1024;
  return o;
}

bool SameTextOnAllRanks(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  int64_t mine = static_cast<int64_t>(h >> 1);
  std::vector<int64_t> all(static_cast<size_t>(World()->size()));
  EXPECT_TRUE(World()->host_backend().AllGather(&mine, all.data(), 1, DType::kInt64).ok());
  for (int64_t v : all) {
    if (v != all[0]) return false;
  }
  return true;
}

// A cache path every rank agrees on (rank 0's pid), removed at the end.
class CostCache : public ::testing::Test {
 protected:
  void SetUp() override {
    int64_t pid = World()->rank() == 0 ? static_cast<int64_t>(getpid()) : 0;
    ASSERT_TRUE(World()->host_backend().Broadcast(&pid, 1, DType::kInt64, 0).ok());
    path_ = StrCat("/tmp/poseidon-cost-test-", pid, "/cost.txt");
    ASSERT_TRUE(Settings::Global().Set("POSEIDON_COST_CACHE", path_).ok());
  }
  void TearDown() override {
    ASSERT_TRUE(World()->host_backend().Barrier().ok());
    if (World()->rank() == 0) {
      std::remove(path_.c_str());
      std::remove(path_.substr(0, path_.rfind('/')).c_str());
    }
    Settings::Global().Reset();
  }
  std::string Read() {
    std::ifstream in(path_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  void Write(const std::string& text) {
    // Nobody may still be reading the previous contents.
    ASSERT_TRUE(World()->host_backend().Barrier().ok());
    if (World()->rank() == 0) {
      mkdir(path_.substr(0, path_.rfind('/')).c_str(), 0755);
      std::ofstream out(path_, std::ios::trunc);
      out << text;
      ASSERT_TRUE(out.good()) << path_;
    }
    ASSERT_TRUE(World()->host_backend().Barrier().ok());
  }
  std::string path_;
};

TEST(Probe, EveryRankGetsRankZerosFigures) {
  auto m = MeasureCostModel(World()->host_backend(), CpuKernels(), Quick());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_TRUE(m->Validate().ok()) << m->Validate().ToString();
  EXPECT_EQ(m->source, "measured");
  EXPECT_TRUE(SameTextOnAllRanks(m->ToText("k")));
  if (World()->size() > 1) {
    // Something must cost something when bytes move between processes.
    EXPECT_GT(m->CollectiveTime(CollectiveKind::kAllReduce, World()->size(), 1 << 20), 0.0);
  }
  EXPECT_GT(m->gemm_flops, 0.0);
  ProbeOptions bad = Quick();
  bad.repetitions = 0;
  auto r = MeasureCostModel(World()->host_backend(), CpuKernels(), bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("repetitions 0"), std::string::npos);
}

TEST_F(CostCache, WrittenThenReadBackExactly) {
  EXPECT_EQ(CostCachePath(World()->host_key()), path_);
  auto first = LoadOrMeasureCostModel(*World(), CpuKernels(), Quick());
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->source, "measured");
  ASSERT_TRUE(World()->host_backend().Barrier().ok());
  std::string text = Read();
  EXPECT_EQ(text, first->ToText(World()->host_key()));
  EXPECT_NE(text.find("host_key " + World()->host_key()), std::string::npos);

  auto second = LoadOrMeasureCostModel(*World(), CpuKernels(), Quick());
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->source, "cache:" + path_);
  EXPECT_EQ(second->ToText("k"), first->ToText("k"));  // every figure, bit for bit
  EXPECT_TRUE(SameTextOnAllRanks(second->ToText("k")));

  // HybridCollective::BuildPlan(batch) goes through the cache too.
  auto h = HybridCollective::Create(World());
  ASSERT_TRUE(h.ok());
  LayerSpec fc;
  fc.name = "fc";
  fc.shape = {64, 32};
  fc.kind = LayerKind::kFullyConnected;
  ASSERT_TRUE((*h)->RegisterLayer(fc).ok());
  ASSERT_TRUE((*h)->BuildPlan(8).ok());
  EXPECT_EQ((*h)->cost_model().source, "cache:" + path_);
  EXPECT_NE((*h)->PrintPlan().find("model=cache:" + path_), std::string::npos);
}

TEST_F(CostCache, AnotherHostKeyOrACorruptFileIsMeasuredAgain) {
  CostModel fake = CostModel::Network(1.0, 1.0);
  Write(fake.ToText("P99-hosts7-00000000"));
  auto m = LoadOrMeasureCostModel(*World(), CpuKernels(), Quick());
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->source, "measured");
  ASSERT_TRUE(World()->host_backend().Barrier().ok());
  std::string now = Read();
  EXPECT_NE(now.find(World()->host_key()), std::string::npos) << now;  // rewritten for this key

  Write("poseidon-cost-model 1\nhost_key " + World()->host_key() + "\ngemm_flops x\n");
  auto c = LoadOrMeasureCostModel(*World(), CpuKernels(), Quick());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->source, "measured");
}

TEST_F(CostCache, ReprobeIgnoresAGoodCache) {
  CostModel fake = CostModel::Network(1.0, 1.0);
  Write(fake.ToText(World()->host_key()));
  auto cached = LoadOrMeasureCostModel(*World(), CpuKernels(), Quick());
  ASSERT_TRUE(cached.ok());
  EXPECT_EQ(cached->link[0].alpha_s, 1.0);  // the planted figures
  ASSERT_TRUE(Settings::Global().Set("POSEIDON_REPROBE", "1").ok());
  auto fresh = LoadOrMeasureCostModel(*World(), CpuKernels(), Quick());
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(fresh->source, "measured");
  EXPECT_LT(fresh->link[0].alpha_s, 1.0);
}

}  // namespace
}  // namespace poseidon
