// Bulk float16 / bfloat16 <-> float32 conversions on host memory (runtime/half_cast.h), the
// host twin of cuda_util's LaunchWidenToFloat32 / LaunchNarrowFromFloat32.
//
// The conversions give bit-identical results to runtime/half.h's scalar functions (round to
// nearest even; NaN -> the canonical quiet NaN 0x7e00 for float16, the quieted truncation for
// bfloat16) but are written without branches, as selects, so the compiler vectorizes them:
//  - float32 -> float16, normal range: add the rounding bias (0xfff plus the kept LSB) to the
//    bits and shift; overflow and NaN are selected afterwards.
//  - float32 -> float16, below 2^-14: |x| + 0.5f rounds |x| to a multiple of 2^-24 (half's
//    subnormal unit) in the FPU's round-to-nearest-even mode; the float's low bits are then
//    the half's mantissa (2^-14 itself comes out as 0x400, the smallest normal half).
//  - float16 -> float32: rebias the exponent (normal, inf, NaN); subnormals are mant * 2^-24,
//    exact in float32.
#include "runtime/half_cast.h"

#include <cstdint>

#include "runtime/half.h"
#include "runtime/multiversion.h"

namespace poseidon {
namespace {

// Branch-free select (all-ones mask when cond): keeps the loops free of control flow, which the
// vectorizer needs (a ternary lets GCC sink the float add into a branch it then cannot undo).
inline uint32_t Select(bool cond, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(cond);
  return (a & mask) | (b & ~mask);
}

// Wider clones of the cast loops (AVX-512 too, unlike PSD_MULTIVERSION: the selects gain from
// it), picked at load time from the CPU's features; none under ThreadSanitizer (see
// runtime/multiversion.h).
#if defined(PSD_THREAD_SANITIZER)
#define kCastClones
#else
#define kCastClones __attribute__((target_clones("avx512f", "avx2", "default")))
#endif

inline uint16_t FloatToHalfSelect(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t absu = u & 0x7fffffffu;
  const uint32_t normal = (absu + 0xfffu + ((absu >> 13) & 1u) - 0x38000000u) >> 13;
  const uint32_t sub = FloatBits(BitsToFloat(absu) + 0.5f) - 0x3f000000u;
  uint32_t h = Select(absu < 0x38800000u, sub, normal);
  h = Select(absu >= 0x477ff000u, 0x7c00u, h);
  h = Select(absu > 0x7f800000u, 0x7e00u, h);
  return static_cast<uint16_t>(sign | h);
}

inline float HalfToFloatSelect(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;
  const uint32_t normal = (em << 13) + (112u << 23);   // exponent 1..30: rebias by 127 - 15
  const uint32_t special = (em << 13) + (224u << 23);  // exponent 31: inf / NaN keep mantissa
  const uint32_t sub = FloatBits(static_cast<float>(em) * 0x1p-24f);
  uint32_t bits = Select(em < 0x400u, sub, normal);
  bits = Select(em >= 0x7c00u, special, bits);
  return BitsToFloat(sign | bits);
}

inline uint16_t FloatToBFloat16Select(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;
  return static_cast<uint16_t>(Select((u & 0x7fffffffu) > 0x7f800000u, nan, rounded));
}

kCastClones void F32ToF16(const float* __restrict src, uint16_t* __restrict dst, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = FloatToHalfSelect(src[i]);
}
kCastClones void F16ToF32(const uint16_t* __restrict src, float* __restrict dst, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = HalfToFloatSelect(src[i]);
}
kCastClones void F32ToBf16(const float* __restrict src, uint16_t* __restrict dst, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = FloatToBFloat16Select(src[i]);
}
kCastClones void Bf16ToF32(const uint16_t* __restrict src, float* __restrict dst, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = BitsToFloat(static_cast<uint32_t>(src[i]) << 16);
}

}  // namespace

void WidenToFloat32(DType dtype, const void* src, float* dst, size_t n) {
  const auto* s = static_cast<const uint16_t*>(src);
  if (dtype == DType::kFloat16) {
    F16ToF32(s, dst, n);
  } else {
    Bf16ToF32(s, dst, n);
  }
}

void NarrowFromFloat32(DType dtype, const float* src, void* dst, size_t n) {
  auto* d = static_cast<uint16_t*>(dst);
  if (dtype == DType::kFloat16) {
    F32ToF16(src, d, n);
  } else {
    F32ToBf16(src, d, n);
  }
}

}  // namespace poseidon
