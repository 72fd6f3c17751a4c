// Sparse gradient inputs with exactly known sums (see sparse_inputs.h).
#include "bench/osu/sparse_inputs.h"

#include <cmath>
#include <cstdint>

#include "bench/osu/verify.h"

namespace poseidon::osu {

void PlaceLargeEntries(int world, int rank, size_t n, size_t k, float* sum, unsigned char* large,
                       float* in) {
  const size_t s = n / k, h = (k + 1) / 2;
  for (int r = 0; r < world; ++r) {
    for (size_t j = 0; j < k; ++j) {
      size_t m = static_cast<size_t>(r) * h + j;
      size_t pos = (m * s) % n;
      float v = static_cast<float>((r + 1) * FormulaF(m)) * (m % 2 == 0 ? 1.0f : -1.0f);
      sum[pos] += v;
      large[pos] = 1;
      if (r == rank) in[pos] = v;
    }
  }
}

float GradientNoise(int rank, size_t i) {
  uint64_t x =
      (static_cast<uint64_t>(i) + 0x9E3779B97F4A7C15ull * (rank + 1)) * 0xD1B54A32D192ED03ull;
  x ^= x >> 29;
  float mag = std::ldexp(static_cast<float>((x >> 8) % 1024 + 1), -30);
  return (x & 1) ? -mag : mag;
}

}  // namespace poseidon::osu
