// Typed test storage shared by the multi-rank collective tests: n elements of one dtype, set
// from and read back as doubles, so one test body covers every dtype with exact values.
//
// The storage holds 8 guard bytes past the n elements and starts filled with kFill, so a test
// can check that a collective wrote every element it owes (no kFill left) and nothing past the
// end (the guard bytes keep kFill). data() is never null, even for n == 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/half.h"

namespace poseidon::testing {

class TypedBuffer {
 public:
  static constexpr unsigned char kFill = 0xA5;
  static constexpr size_t kGuardBytes = 8;

  TypedBuffer(DType d, size_t n) : dtype(d), bytes(n * DTypeSize(d) + kGuardBytes, kFill) {}

  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
  // Bytes of n elements.
  size_t used(size_t n) const { return n * DTypeSize(dtype); }

  void Set(size_t i, double v) {
    unsigned char* p = bytes.data() + i * DTypeSize(dtype);
    switch (dtype) {
      case DType::kFloat32: Put(p, static_cast<float>(v)); break;
      case DType::kFloat64: Put(p, v); break;
      case DType::kFloat16: Put(p, FloatToHalf(static_cast<float>(v))); break;
      case DType::kBFloat16: Put(p, FloatToBFloat16(static_cast<float>(v))); break;
      case DType::kInt32: Put(p, static_cast<int32_t>(v)); break;
      case DType::kInt64: Put(p, static_cast<int64_t>(v)); break;
    }
  }

  double Get(size_t i) const {
    const unsigned char* p = bytes.data() + i * DTypeSize(dtype);
    switch (dtype) {
      case DType::kFloat32: return Take<float>(p);
      case DType::kFloat64: return Take<double>(p);
      case DType::kFloat16: return HalfToFloat(Take<uint16_t>(p));
      case DType::kBFloat16: return BFloat16ToFloat(Take<uint16_t>(p));
      case DType::kInt32: return Take<int32_t>(p);
      case DType::kInt64: return static_cast<double>(Take<int64_t>(p));
    }
    return 0;
  }

  // The exact value v as an element of dtype d holds it: rounded once to d, through float32
  // for the half types. That is how the reductions round an exact sum: float16 / bfloat16 are
  // summed in float32 (exact for the tests' small integers) and rounded once, so a sum the
  // dtype cannot hold (bfloat16 keeps 8 significant bits: 315 -> 316, 343 -> 344) is expected
  // as Rounded(d, exact sum). Equal to Set(i, v) then Get(i).
  static double Rounded(DType d, double v) {
    switch (d) {
      case DType::kFloat32: return static_cast<float>(v);
      case DType::kFloat64: return v;
      case DType::kFloat16: return HalfToFloat(FloatToHalf(static_cast<float>(v)));
      case DType::kBFloat16: return BFloat16ToFloat(FloatToBFloat16(static_cast<float>(v)));
      case DType::kInt32: return static_cast<int32_t>(v);
      case DType::kInt64: return static_cast<double>(static_cast<int64_t>(v));
    }
    return v;
  }

  DType dtype;
  std::vector<unsigned char> bytes;

 private:
  // memcpy, not a typed pointer: the storage is bytes, and elements need not be aligned.
  template <typename T>
  static void Put(unsigned char* p, T x) {
    std::memcpy(p, &x, sizeof(T));
  }
  template <typename T>
  static T Take(const unsigned char* p) {
    T x;
    std::memcpy(&x, p, sizeof(T));
    return x;
  }
};

}  // namespace poseidon::testing
