// Bulk conversions between float32 and the half types on host memory, vectorized and
// bit-identical to runtime/half.h's scalar functions. The host backends sum float16 / bfloat16
// in float32 through them (backend.h's accumulation contract); the device twins are
// LaunchWidenToFloat32 / LaunchNarrowFromFloat32 in runtime/cuda_util.h.
#pragma once

#include <cstddef>

#include "runtime/dtype.h"

namespace poseidon {

// dtype is kFloat16 or kBFloat16 (the caller checked); src and dst hold n elements each and do
// not overlap; n == 0 does nothing.
void WidenToFloat32(DType dtype, const void* src, float* dst, size_t n);
void NarrowFromFloat32(DType dtype, const float* src, void* dst, size_t n);

}  // namespace poseidon
