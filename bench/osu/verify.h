// Exact expected values for the OSU-style benchmarks, and their check: every program fills its
// inputs from one formula whose sums are exact in every element type, so a result is compared
// bitwise and any wrong or missing element counts in #wrong.
#pragma once

#include <cstddef>

#include "runtime/dtype.h"

namespace poseidon::osu {

// The exact formula every program uses: rank r contributes (r + 1) * F(i), F(i) = i % 7 + 1,
// so every sum over up to 23 ranks is an integer below 2048, exact in every dtype.
double FormulaF(size_t i);
// out (n elements of dtype) = scale * F(first + i).
void FillFormula(DType dtype, double scale, size_t first, size_t n, void* out);
// Elements of `got` that differ (bitwise) from `want`, both n elements of dtype.
size_t CountMismatches(DType dtype, const void* got, const void* want, size_t n);
// Whether MPI has a native sum for dtype (not the half types), so the peer can run.
bool MpiSumSupported(DType dtype);

}  // namespace poseidon::osu
