#include "runtime/dtype.h"

#include <algorithm>
#include <cctype>

namespace poseidon {

std::string DTypeName(DType d) {
  switch (d) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
  }
  return StrCat("invalid(", static_cast<int>(d), ")");
}

Result<DType> ParseDType(const std::string& name) {
  std::string s = name;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "float32" || s == "f32" || s == "fp32" || s == "float") return DType::kFloat32;
  if (s == "float64" || s == "f64" || s == "fp64" || s == "double") return DType::kFloat64;
  if (s == "float16" || s == "fp16" || s == "f16" || s == "half") return DType::kFloat16;
  if (s == "bfloat16" || s == "bf16") return DType::kBFloat16;
  if (s == "int32" || s == "i32") return DType::kInt32;
  if (s == "int64" || s == "i64") return DType::kInt64;
  return InvalidArgument("ParseDType: unknown dtype '", name,
                         "'; expected one of float32, float64, float16, bfloat16, int32, int64");
}

Status DTypeError(const char* call, DType d) {
  return InvalidArgument(call, ": unknown dtype ", static_cast<int>(d), "; expected 0..",
                         kNumDTypes - 1, " (float32, float64, float16, bfloat16, int32, int64)");
}

const char* MemoryKindName(MemoryKind m) {
  return m == MemoryKind::kHost ? "host" : m == MemoryKind::kDevice ? "device" : "invalid";
}

}  // namespace poseidon
