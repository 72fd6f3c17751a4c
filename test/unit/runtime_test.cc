// Unit tests of the process-local runtime pieces: Status / Result, dtypes and half casts,
// the settings registry and shard arithmetic.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <ios>
#include <numeric>
#include <random>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/half.h"
#include "runtime/half_cast.h"
#include "runtime/settings.h"
#include "runtime/shard.h"
#include "runtime/status.h"

namespace poseidon {
namespace {

Status FailsWithArg(int v) {
  PSD_REQUIRE_ARG(v >= 0, "Fn: v is ", v, "; expected >= 0");
  return Status::Ok();
}
Status Chained(int v) {
  PSD_CHECK(FailsWithArg(v));
  return Status::Ok();
}
Result<int> Doubled(int v) {
  PSD_CHECK(FailsWithArg(v));
  return 2 * v;
}
Result<int> UsesAssign(int v) {
  PSD_ASSIGN_OR_RETURN(int d, Doubled(v));
  return d + 1;
}

TEST(Status, OkAndErrors) {
  EXPECT_TRUE(Status::Ok().ok());
  EXPECT_EQ(Status::Ok().ToString(), "OK");
  Status s = FailsWithArg(-3);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "Fn: v is -3; expected >= 0");
  EXPECT_EQ(s.ToString(), "InvalidArgument: Fn: v is -3; expected >= 0");
}

TEST(Status, CheckAddsLocationOnce) {
  Status s = Chained(-1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("[at runtime_test.cc:"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("[at ", s.message().find("[at ") + 1), std::string::npos);
  EXPECT_EQ(s.WithPrefix("layer fc1: ").message().rfind("layer fc1: Fn: v is -1", 0), 0u);
}

TEST(Result, ValueAndError) {
  Result<int> ok = UsesAssign(4);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 9);
  Result<int> bad = UsesAssign(-4);
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  Result<int> from_ok_status = Status::Ok();  // misuse becomes an internal error, never "ok"
  EXPECT_FALSE(from_ok_status.ok());
  EXPECT_EQ(from_ok_status.status().code(), StatusCode::kInternal);
}

TEST(DType, SizesNamesParse) {
  EXPECT_EQ(DTypeSize(DType::kFloat32), 4u);
  EXPECT_EQ(DTypeSize(DType::kFloat64), 8u);
  EXPECT_EQ(DTypeSize(DType::kFloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2u);
  EXPECT_EQ(DTypeSize(static_cast<DType>(42)), 0u);
  for (int i = 0; i < kNumDTypes; ++i) {
    DType d = static_cast<DType>(i);
    auto parsed = ParseDType(DTypeName(d));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_EQ(*ParseDType("BF16"), DType::kBFloat16);
  auto bad = ParseDType("complex64");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'complex64'"), std::string::npos);
  Status st = CheckDType("AllReduce", static_cast<DType>(42));
  EXPECT_NE(st.message().find("AllReduce: unknown dtype 42"), std::string::npos) << st.message();
}

TEST(Half, Float16RoundTripsEveryValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    uint16_t x = static_cast<uint16_t>(h);
    float f = HalfToFloat(x);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f))));
      continue;
    }
    ASSERT_EQ(FloatToHalf(f), x) << "half bits " << h << " value " << f;
  }
}

TEST(Half, Float16RoundsToNearestEven) {
  EXPECT_EQ(HalfToFloat(FloatToHalf(1.0f)), 1.0f);
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0).
  EXPECT_EQ(HalfToFloat(FloatToHalf(1.0f + std::ldexp(1.0f, -11))), 1.0f);
  // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 and 1 + 2^-9: ties to even (1 + 2^-9).
  EXPECT_EQ(HalfToFloat(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11))),
            1.0f + std::ldexp(1.0f, -9));
  EXPECT_EQ(HalfToFloat(FloatToHalf(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(HalfToFloat(FloatToHalf(70000.0f))));
  EXPECT_EQ(HalfToFloat(FloatToHalf(std::ldexp(1.0f, -24))), std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfToFloat(FloatToHalf(std::ldexp(1.0f, -26))), 0.0f);
  EXPECT_EQ(HalfToFloat(FloatToHalf(-2.5f)), -2.5f);
}

TEST(Half, BFloat16RoundTripAndRounding) {
  for (uint32_t h = 0; h < 65536; ++h) {
    uint16_t x = static_cast<uint16_t>(h);
    float f = BFloat16ToFloat(x);
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToBFloat16(f), x);
  }
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8))), 1.0f);  // tie to even
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.0f + 3 * std::ldexp(1.0f, -8))),
            1.0f + std::ldexp(1.0f, -6));
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(252.0f)), 252.0f);
}

// The bulk casts (runtime/half_cast.h) against the scalar reference, every half value.
TEST(HalfCast, WidenMatchesScalarForEveryValue) {
  std::vector<uint16_t> all(65536);
  std::iota(all.begin(), all.end(), uint16_t{0});
  std::vector<float> out(all.size());
  WidenToFloat32(DType::kFloat16, all.data(), out.data(), all.size());
  for (uint32_t h = 0; h < 65536; ++h) {
    ASSERT_EQ(FloatBits(out[h]), FloatBits(HalfToFloat(static_cast<uint16_t>(h)))) << h;
  }
  WidenToFloat32(DType::kBFloat16, all.data(), out.data(), all.size());
  for (uint32_t h = 0; h < 65536; ++h) {
    ASSERT_EQ(FloatBits(out[h]), FloatBits(BFloat16ToFloat(static_cast<uint16_t>(h)))) << h;
  }
}

// Every combination of the top 16 bits (sign, exponent, 7 mantissa bits) with low-bit patterns
// that sit on and around every rounding boundary of both formats, plus random low bits (the
// float16 subnormal range rounds away up to 24 bits).
TEST(HalfCast, NarrowMatchesScalarOnEveryRoundingBoundary) {
  std::vector<uint32_t> lows = {0x0,    0x1,    0xfff,  0x1000, 0x1001, 0x1fff, 0x2000,
                                0x2001, 0x3000, 0x7fff, 0x8000, 0x8001, 0xc000, 0xffff};
  std::mt19937 rng(11);
  while (lows.size() < 64) lows.push_back(rng() & 0xffffu);
  std::vector<float> src;
  src.reserve(65536 * lows.size());
  for (uint32_t hi = 0; hi < 65536; ++hi) {
    for (uint32_t lo : lows) src.push_back(BitsToFloat((hi << 16) | lo));
  }
  for (uint32_t e = 0x33000000u; e < 0x38800000u; e += 0x101u) src.push_back(BitsToFloat(e));
  std::vector<uint16_t> out(src.size());
  NarrowFromFloat32(DType::kFloat16, src.data(), out.data(), src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(out[i], FloatToHalf(src[i])) << std::hex << FloatBits(src[i]);
  }
  NarrowFromFloat32(DType::kBFloat16, src.data(), out.data(), src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(out[i], FloatToBFloat16(src[i])) << std::hex << FloatBits(src[i]);
  }
  NarrowFromFloat32(DType::kFloat16, nullptr, nullptr, 0);  // empty: touches nothing
}

TEST(Settings, DefaultsEnvAndApi) {
  Settings& s = Settings::Global();
  s.Reset();
  unsetenv("POSEIDON_FUSION_BYTES");
  EXPECT_EQ(settings::FusionBytes(), 4194304);
  setenv("POSEIDON_FUSION_BYTES", "2M", 1);
  EXPECT_EQ(settings::FusionBytes(), 2 << 20);
  ASSERT_TRUE(s.Set("POSEIDON_FUSION_BYTES", "1024").ok());
  EXPECT_EQ(settings::FusionBytes(), 1024);
  bool found = false;
  for (const auto& v : s.Snapshot()) {
    if (v.info.name == "POSEIDON_FUSION_BYTES") {
      found = true;
      EXPECT_EQ(v.source, "api");
      EXPECT_EQ(v.value, "1024");
      EXPECT_EQ(v.info.default_value, "4194304");
      EXPECT_FALSE(v.info.help.empty());
    }
  }
  EXPECT_TRUE(found);
  s.Reset();
  unsetenv("POSEIDON_FUSION_BYTES");
}

TEST(Settings, BadValuesAreClearErrors) {
  Settings& s = Settings::Global();
  s.Reset();
  Status st = s.Set("POSEIDON_NO_SUCH", "1");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("unknown setting 'POSEIDON_NO_SUCH'"), std::string::npos);
  st = s.Set("POSEIDON_CHECK_ARGS", "maybe");
  EXPECT_NE(st.message().find("POSEIDON_CHECK_ARGS='maybe' is not a bool"), std::string::npos)
      << st.message();
  setenv("POSEIDON_TOPK_DENSITY", "lots", 1);
  st = s.Validate();
  EXPECT_NE(st.message().find("POSEIDON_TOPK_DENSITY='lots' is not a number"), std::string::npos)
      << st.message();
  EXPECT_DOUBLE_EQ(settings::TopkDensity(), 0.001);  // falls back to the default
  unsetenv("POSEIDON_TOPK_DENSITY");
  EXPECT_TRUE(s.Validate().ok());
  EXPECT_FALSE(s.GetInt("POSEIDON_TOPK_DENSITY").ok());  // wrong type
}

TEST(Settings, EveryOneDeclaredOnceWithHelp) {
  const auto& all = Settings::Global().All();
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(all[i].name.rfind("POSEIDON_", 0), 0u) << all[i].name;
    EXPECT_FALSE(all[i].help.empty()) << all[i].name;
    for (size_t j = i + 1; j < all.size(); ++j) EXPECT_NE(all[i].name, all[j].name);
  }
}

TEST(Shard, CountsCoverEveryElementOnce) {
  for (size_t n : {0ul, 1ul, 2ul, 7ul, 8ul, 9ul, 1000ul, 1001ul}) {
    for (int p : {1, 2, 3, 4, 5, 8, 13}) {
      auto counts = ShardCounts(n, p);
      auto off = PrefixOffsets(counts);
      ASSERT_EQ(off.back(), n);
      size_t lo = n / p, hi = lo + (n % p ? 1 : 0);
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(ShardOffset(n, p, r), off[r]);
        EXPECT_GE(counts[r], lo);
        EXPECT_LE(counts[r], hi);
        if (r > 0) {
          EXPECT_LE(counts[r], counts[r - 1]);  // the larger shards come first
        }
      }
    }
  }
  EXPECT_EQ(ShardCounts(7, 3), (std::vector<size_t>{3, 2, 2}));
  EXPECT_EQ(ShardCounts(2, 4), (std::vector<size_t>{1, 1, 0, 0}));
}

}  // namespace
}  // namespace poseidon
