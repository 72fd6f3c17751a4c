// Exact expected values and their bitwise check (see verify.h).
#include "bench/osu/verify.h"

#include <cstdint>
#include <cstring>

#include "runtime/half.h"

namespace poseidon::osu {
namespace {

template <typename T>
void FillTyped(double scale, size_t first, size_t n, void* out) {
  T* p = static_cast<T*>(out);
  // F repeats every 7 indices: fill one period, then copy it (this runs at 64 MiB per size).
  T period[7];
  for (size_t k = 0; k < 7; ++k) period[k] = static_cast<T>(scale * FormulaF(first + k));
  for (size_t i = 0; i < n; ++i) p[i] = period[i % 7];
}

void FillHalf(bool bf16, double scale, size_t first, size_t n, void* out) {
  uint16_t period[7];
  for (size_t k = 0; k < 7; ++k) {
    float v = static_cast<float>(scale * FormulaF(first + k));
    period[k] = bf16 ? FloatToBFloat16(v) : FloatToHalf(v);
  }
  uint16_t* p = static_cast<uint16_t*>(out);
  for (size_t i = 0; i < n; ++i) p[i] = period[i % 7];
}

}  // namespace

double FormulaF(size_t i) { return static_cast<double>(i % 7 + 1); }

void FillFormula(DType dtype, double scale, size_t first, size_t n, void* out) {
  switch (dtype) {
    case DType::kFloat32:
      FillTyped<float>(scale, first, n, out);
      break;
    case DType::kFloat64:
      FillTyped<double>(scale, first, n, out);
      break;
    case DType::kInt32:
      FillTyped<int32_t>(scale, first, n, out);
      break;
    case DType::kInt64:
      FillTyped<int64_t>(scale, first, n, out);
      break;
    case DType::kFloat16:
      FillHalf(false, scale, first, n, out);
      break;
    case DType::kBFloat16:
      FillHalf(true, scale, first, n, out);
      break;
  }
}

size_t CountMismatches(DType dtype, const void* got, const void* want, size_t n) {
  size_t es = DTypeSize(dtype);
  if (n == 0 || std::memcmp(got, want, n * es) == 0) return 0;
  const unsigned char* g = static_cast<const unsigned char*>(got);
  const unsigned char* w = static_cast<const unsigned char*>(want);
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += std::memcmp(g + i * es, w + i * es, es) != 0 ? 1 : 0;
  return bad;
}

bool MpiSumSupported(DType dtype) { return !IsHalfDType(dtype); }

}  // namespace poseidon::osu
