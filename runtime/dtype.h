// Element types Poseidon moves and reduces, and where their memory lives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/status.h"

namespace poseidon {

// Numbered to match the C ABI's psdDataType_t; never renumber.
enum class DType : int {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,   // IEEE binary16; reductions accumulate in float32
  kBFloat16 = 3,  // bfloat16; reductions accumulate in float32
  kInt32 = 4,
  kInt64 = 5,
};
inline constexpr int kNumDTypes = 6;

inline bool IsValidDType(DType d) {
  return static_cast<int>(d) >= 0 && static_cast<int>(d) < kNumDTypes;
}
inline bool IsHalfDType(DType d) { return d == DType::kFloat16 || d == DType::kBFloat16; }
inline bool IsFloatDType(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat64 || IsHalfDType(d);
}
// Size of one element in bytes; 0 for an invalid dtype.
// A table, not a switch: every call asks, several times.
inline size_t DTypeSize(DType d) {
  static constexpr unsigned char kSizes[kNumDTypes] = {4, 8, 2, 2, 4, 8};  // in DType's order
  return IsValidDType(d) ? kSizes[static_cast<int>(d)] : 0;
}
// "float32", "float64", "float16", "bfloat16", "int32", "int64"; "invalid(<n>)" otherwise.
std::string DTypeName(DType d);
// Accepts the names above and the aliases f32, fp32, f64, fp16, half, bf16.
Result<DType> ParseDType(const std::string& name);
// Error for an out-of-range dtype, naming the call and the valid values (inline: every
// collective call runs it).
Status DTypeError(const char* call, DType d);
inline Status CheckDType(const char* call, DType d) {
  return IsValidDType(d) ? Status::Ok() : DTypeError(call, d);
}

enum class MemoryKind : int { kHost = 0, kDevice = 1 };
const char* MemoryKindName(MemoryKind m);

}  // namespace poseidon
