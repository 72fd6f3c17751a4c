// Multi-rank tests of the agreement of settings across ranks (runtime/agreement.h): every
// Agreed setting of settings.def, set differently on one rank (the last, the first or a middle
// one), must fail Communicator::Create on every rank with kMismatch and the same message, which
// names the variable, both values and their ranks; equal values, equal values spelled
// differently, and PerRank settings that differ must all pass. AgreeOnValues itself must also
// fail everywhere when the lists differ in length or order.
#include "runtime/agreement.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "runtime/communicator.h"
#include "runtime/hash.h"
#include "runtime/settings.h"
#include "test/mpi_test_main.h"

namespace poseidon {
namespace {

using testing::OneOddGroups;
using testing::Ranks;
using testing::World;

int Rank() { return World()->rank(); }
int Size() { return World()->size(); }

// Clears every API override before and after each test, so that one test's per-rank values
// never leak into the next (the test main's own communicator was made before any of them).
class Agreement : public ::testing::Test {
 protected:
  void SetUp() override {
    Settings::Global().Reset();
    if (Size() < 2) GTEST_SKIP() << "needs at least 2 ranks";
  }
  void TearDown() override { Settings::Global().Reset(); }
};

Status CreateStatus() {
  auto c = Communicator::Create(MPI_COMM_WORLD);
  return c.status();
}

// Fails unless every rank passes the same text (the message must not depend on the rank).
void ExpectSameOnEveryRank(const std::string& text) {
  uint64_t h = Fnv1a(text.data(), text.size());
  uint64_t lo = 0, hi = 0;
  MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(lo, hi) << "rank " << Rank() << " has another text: " << text;
}

// The rank that differs for the i-th case: the last, the first, then one in the middle.
int OddRank(size_t i) {
  switch (i % 3) {
    case 0:
      return Size() - 1;
    case 1:
      return 0;
    default:
      return Size() / 2;
  }
}

std::string CurrentAgreedValue(const std::string& name) {
  for (const auto& v : AgreedSettings()) {
    if (v.name == name) return v.value;
  }
  ADD_FAILURE() << name << " is not among AgreedSettings()";
  return "";
}

// A valid value other than `current`, already in the canonical spelling of AgreedSettings.
std::string OtherValue(const SettingInfo& info, const std::string& current) {
  if (info.name == "POSEIDON_STRATEGY") return current == "ps" ? "sfb" : "ps";
  if (info.name == "POSEIDON_CANDIDATES") return "allreduce,ps";
  if (info.name == "POSEIDON_DEVICE_BACKEND") return current == "staged" ? "auto" : "staged";
  if (info.name == "POSEIDON_LOG_LEVEL") return current == "error" ? "warn" : "error";
  switch (info.type) {
    case SettingType::kBool:
      return current == "1" ? "0" : "1";
    case SettingType::kInt:
      return std::to_string(std::atoll(current.c_str()) + 4096);
    case SettingType::kDouble:
      return current == "0.5" ? "0.25" : "0.5";
    case SettingType::kString:
      return current + "-other";
  }
  return current + "-other";
}

std::string Expected(const std::string& name, const std::string& groups) {
  return "Communicator::Create: " + name + " differs across ranks (" + groups +
         "); expected the same value on every rank (set it alike for all ranks, e.g. mpirun -x " +
         name + ")";
}

TEST_F(Agreement, AgreedSettingsAreTheDeclaredOnes) {
  const std::set<std::string> want = {"POSEIDON_CHECK_ARGS",           "POSEIDON_STRATEGY",
                                      "POSEIDON_CANDIDATES",           "POSEIDON_TOPK_DENSITY",
                                      "POSEIDON_TOPK_WARMUP_STEPS",    "POSEIDON_TOPK_MIN_ELEMENTS",
                                      "POSEIDON_TOPK_MOMENTUM",        "POSEIDON_REPROBE",
                                      "POSEIDON_FUSION_BYTES",         "POSEIDON_CHUNK_BYTES",
                                      "POSEIDON_SHM_THRESHOLD_BYTES",  "POSEIDON_SHM_CHUNK_BYTES",
                                      "POSEIDON_DEVICE_BACKEND",       "POSEIDON_SLICE_BYTES",
                                      "POSEIDON_PIPELINE_NEGOTIATION", "POSEIDON_PEER_TIMEOUT_S",
                                      "POSEIDON_RESPONSE_CACHE",
                                      "POSEIDON_HIER_ALLREDUCE_BYTES",
                                      "POSEIDON_SHM_SINGLE_COPY_BYTES"};
  std::set<std::string> got;
  for (const auto& v : AgreedSettings()) got.insert(v.name);
  EXPECT_EQ(got, want);
  for (const auto& info : Settings::Global().All()) {
    EXPECT_EQ(info.agreed, want.count(info.name) == 1) << info.name;
  }
  // The hash follows the values.
  uint64_t before = AgreedSettingsHash();
  EXPECT_EQ(before, HashAgreedValues(AgreedSettings()));
  EXPECT_TRUE(Settings::Global().Set("POSEIDON_FUSION_BYTES", "12345").ok());
  EXPECT_NE(AgreedSettingsHash(), before);
  EXPECT_TRUE(Settings::Global().Set("POSEIDON_LOG_LEVEL", "debug").ok());  // not agreed
  uint64_t with_fusion = AgreedSettingsHash();
  Settings::Global().Reset();
  EXPECT_TRUE(Settings::Global().Set("POSEIDON_FUSION_BYTES", "12345").ok());
  EXPECT_EQ(AgreedSettingsHash(), with_fusion);
  Settings::Global().Reset();
  EXPECT_EQ(AgreedSettingsHash(), before);
}

TEST_F(Agreement, EachAgreedSettingDifferingOnOneRankFailsEveryRank) {
  const auto& all = Settings::Global().All();
  size_t i = 0;
  for (const auto& info : all) {
    if (!info.agreed) continue;
    const int odd = OddRank(i++);
    const std::string value = CurrentAgreedValue(info.name);
    const std::string other = OtherValue(info, value);
    if (Rank() == odd) {
      EXPECT_TRUE(Settings::Global().Set(info.name, other).ok()) << info.name;
    }
    Status st = CreateStatus();
    Settings::Global().Reset();
    EXPECT_EQ(st.code(), StatusCode::kMismatch) << info.name << ": " << st.ToString();
    const std::string want = Expected(info.name, OneOddGroups(odd, value, other));
    EXPECT_EQ(st.message().rfind(want, 0), 0u)
        << "rank " << Rank() << "\n got: " << st.message() << "\nwant: " << want;
    ExpectSameOnEveryRank(st.message());
  }
  EXPECT_GE(i, 18u);
  // Afterwards, with the values alike again, creation works.
  EXPECT_TRUE(CreateStatus().ok());
}

TEST_F(Agreement, LiteralMessages) {
  // The brief's example at every rank count, and the grouping of a middle rank at np 5.
  if (Rank() == 0) {
    EXPECT_TRUE(Settings::Global().Set("POSEIDON_FUSION_BYTES", "0").ok());
  }
  Status st = CreateStatus();
  Settings::Global().Reset();
  const std::string rest = Size() == 2 ? "rank 1" : "ranks 1-" + std::to_string(Size() - 1);
  EXPECT_EQ(st.message().rfind("Communicator::Create: POSEIDON_FUSION_BYTES differs across ranks "
                               "(rank 0: 0; " +
                                   rest +
                                   ": 4194304); expected the same value on "
                                   "every rank (set it alike for all ranks, e.g. mpirun -x "
                                   "POSEIDON_FUSION_BYTES)",
                               0),
            0u)
      << st.message();
  if (Size() == 5) {
    if (Rank() == 2) {
      EXPECT_TRUE(Settings::Global().Set("POSEIDON_REPROBE", "yes").ok());
    }
    st = CreateStatus();
    Settings::Global().Reset();
    EXPECT_NE(st.message().find("POSEIDON_REPROBE differs across ranks (ranks 0-1, 3-4: 0; "
                                "rank 2: 1)"),
              std::string::npos)
        << st.message();
  }
}

TEST_F(Agreement, ThroughTheEnvironment) {
  // The case that smashed the stack: the shared-memory threshold off on one rank.
  const int odd = Size() / 2;
  if (Rank() == odd) setenv("POSEIDON_SHM_THRESHOLD_BYTES", "0", 1);
  Status st = CreateStatus();
  unsetenv("POSEIDON_SHM_THRESHOLD_BYTES");
  EXPECT_EQ(st.code(), StatusCode::kMismatch) << st.ToString();
  EXPECT_EQ(st.message().rfind(
                Expected("POSEIDON_SHM_THRESHOLD_BYTES", OneOddGroups(odd, "1", "0")), 0),
            0u)
      << st.message();
  ExpectSameOnEveryRank(st.message());
}

TEST_F(Agreement, SeveralDifferencesAreAllNamed) {
  const int last = Size() - 1;
  if (Rank() == 0) {
    EXPECT_TRUE(Settings::Global().Set("POSEIDON_FUSION_BYTES", "0").ok());
  }
  if (Rank() == last) {
    EXPECT_TRUE(Settings::Global().Set("POSEIDON_STRATEGY", "topk").ok());
  }
  Status st = CreateStatus();
  EXPECT_EQ(st.code(), StatusCode::kMismatch);
  const std::string& m = st.message();
  EXPECT_NE(m.find("POSEIDON_FUSION_BYTES differs across ranks (" +
                   OneOddGroups(0, "4194304", "0") + ")"),
            std::string::npos)
      << m;
  EXPECT_NE(
      m.find("POSEIDON_STRATEGY differs across ranks (" + OneOddGroups(last, "auto", "topk") + ")"),
      std::string::npos)
      << m;
  // In declaration order (settings.def), whichever rank differs.
  EXPECT_LT(m.find("POSEIDON_STRATEGY differs"), m.find("POSEIDON_FUSION_BYTES differs")) << m;
  EXPECT_NE(m.find("(set them alike for all ranks, e.g. mpirun -x POSEIDON_STRATEGY -x "
                   "POSEIDON_FUSION_BYTES)"),
            std::string::npos)
      << m;
  ExpectSameOnEveryRank(m);
}

TEST_F(Agreement, ThreeValuesAreThreeGroups) {
  if (Size() < 3) GTEST_SKIP() << "needs 3 ranks";
  if (Rank() == 0) {
    EXPECT_TRUE(Settings::Global().Set("POSEIDON_CHUNK_BYTES", "1M").ok());
  }
  if (Rank() == 1) {
    EXPECT_TRUE(Settings::Global().Set("POSEIDON_CHUNK_BYTES", "2048").ok());
  }
  Status st = CreateStatus();
  std::vector<int> rest;
  for (int r = 2; r < Size(); ++r) rest.push_back(r);
  EXPECT_NE(st.message().find("POSEIDON_CHUNK_BYTES differs across ranks (rank 0: 1048576; "
                              "rank 1: 2048; " +
                              Ranks(rest) + ": 16777216)"),
            std::string::npos)
      << st.message();
}

TEST_F(Agreement, EqualValuesPass) {
  // Non-default values, alike on every rank.
  for (const auto& info : Settings::Global().All()) {
    if (!info.agreed) continue;
    EXPECT_TRUE(
        Settings::Global().Set(info.name, OtherValue(info, CurrentAgreedValue(info.name))).ok());
  }
  auto c = Communicator::Create(MPI_COMM_WORLD);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  float x = 1.0f;
  ASSERT_TRUE((*c)->host_backend().AllReduce(&x, &x, 1, DType::kFloat32).ok());
  EXPECT_EQ(x, static_cast<float>(Size()));
}

TEST_F(Agreement, OneValueSpelledDifferentlyPasses) {
  const bool even = Rank() % 2 == 0;
  Settings& s = Settings::Global();
  EXPECT_TRUE(s.Set("POSEIDON_FUSION_BYTES", even ? "4M" : "4194304").ok());
  EXPECT_TRUE(s.Set("POSEIDON_CHECK_ARGS", even ? "on" : "TRUE").ok());
  EXPECT_TRUE(s.Set("POSEIDON_TOPK_DENSITY", even ? "1e-3" : "0.0010").ok());
  EXPECT_TRUE(s.Set("POSEIDON_PEER_TIMEOUT_S", even ? "60" : "6e1").ok());
  Status st = CreateStatus();
  EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST_F(Agreement, PerRankSettingsMayDiffer) {
  size_t i = 0;
  for (const auto& info : Settings::Global().All()) {
    if (info.agreed) continue;
    auto current = Settings::Global().GetString(info.name);  // the text, whatever the type
    ASSERT_TRUE(current.ok());
    if (Rank() == OddRank(i++)) {
      EXPECT_TRUE(Settings::Global().Set(info.name, OtherValue(info, *current)).ok()) << info.name;
    }
  }
  EXPECT_GE(i, 8u);
  Status st = CreateStatus();
  EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST_F(Agreement, ValueThatDoesNotParseOnOneRank) {
  // That rank reports its own error first; the others fail too (instead of waiting for it in a
  // collective), naming the rank and its error.
  const int odd = Size() - 1;
  if (Rank() == odd) setenv("POSEIDON_STALL_WARN_S", "soon", 1);
  Status st = CreateStatus();
  unsetenv("POSEIDON_STALL_WARN_S");
  const std::string parse_error = "setting POSEIDON_STALL_WARN_S='soon' is not a number";
  if (Rank() == odd) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_EQ(st.message().rfind(parse_error, 0), 0u) << st.message();
  } else {
    EXPECT_EQ(st.code(), StatusCode::kMismatch) << st.ToString();
    EXPECT_NE(st.message().find("Settings::Validate differs across ranks (" +
                                OneOddGroups(odd, "ok", parse_error) + ")"),
              std::string::npos)
        << st.message();
  }
  // An Agreed one that does not parse: its text is shown as written.
  if (Rank() == 0) setenv("POSEIDON_FUSION_BYTES", "lots", 1);
  st = CreateStatus();
  unsetenv("POSEIDON_FUSION_BYTES");
  if (Rank() == 0) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_NE(st.message().find("POSEIDON_FUSION_BYTES='lots' is not an integer"),
              std::string::npos)
        << st.message();
  } else {
    EXPECT_EQ(st.code(), StatusCode::kMismatch) << st.ToString();
    EXPECT_NE(st.message().find("POSEIDON_FUSION_BYTES differs across ranks (" +
                                OneOddGroups(0, "4194304", "lots") + ")"),
              std::string::npos)
        << st.message();
  }
  EXPECT_TRUE(CreateStatus().ok());
}

TEST_F(Agreement, AgreeOnValuesListsOfOtherLengthsFail) {
  MPI_Comm comm = World()->mpi_comm();
  std::vector<AgreedValue> base = {{"A", "1"}, {"B", ""}};
  EXPECT_TRUE(AgreeOnValues(comm, base, "Test").ok());
  EXPECT_TRUE(AgreeOnValues(comm, {}, "Test").ok());

  // One more value on one rank.
  for (int odd : {Size() - 1, 0}) {
    std::vector<AgreedValue> mine = base;
    if (Rank() == odd) mine.push_back({"EXTRA", "7"});
    Status st = AgreeOnValues(comm, mine, "Test");
    EXPECT_EQ(st.code(), StatusCode::kMismatch) << st.ToString();
    EXPECT_EQ(st.message(), "Test: the number of agreed values differs across ranks (" +
                                OneOddGroups(odd, "2", "3") + "); EXTRA differs across ranks (" +
                                OneOddGroups(odd, "(absent)", "7") +
                                "); expected the same value on every rank (run the same build "
                                "of Poseidon on every rank)");
    ExpectSameOnEveryRank(st.message());
  }

  // An empty list on one rank; the empty value reads ''.
  {
    const int odd = Size() / 2;
    Status st = AgreeOnValues(comm, Rank() == odd ? std::vector<AgreedValue>{} : base, "Test");
    EXPECT_EQ(st.code(), StatusCode::kMismatch);
    EXPECT_NE(
        st.message().find("B differs across ranks (" + OneOddGroups(odd, "''", "(absent)") + ")"),
        std::string::npos)
        << st.message();
    ExpectSameOnEveryRank(st.message());
  }

  // The same values in another order.
  {
    std::vector<AgreedValue> mine = base;
    if (Rank() == 0) std::reverse(mine.begin(), mine.end());
    Status st = AgreeOnValues(comm, mine, "Test");
    EXPECT_EQ(st.code(), StatusCode::kMismatch);
    EXPECT_NE(st.message().find("the agreed values come in a different order across ranks (" +
                                OneOddGroups(0, "A,B", "B,A") + ")"),
              std::string::npos)
        << st.message();
  }
  // A value that only looks alike.
  {
    Status st = AgreeOnValues(comm, {{"A", Rank() == 0 ? "1 " : "1"}}, "Test");
    EXPECT_EQ(st.code(), StatusCode::kMismatch);
    EXPECT_NE(st.message().find("A differs across ranks (" + OneOddGroups(0, "1", "1 ") + ")"),
              std::string::npos)
        << st.message();
  }
}

}  // namespace
}  // namespace poseidon
