// What the C API entry point files (poseidon.cc, layers.cc) share: enum values read as the
// C caller stored them, and the header's size-query copy into a caller buffer. Internal.
#pragma once

#include <cstring>
#include <string>

#include "runtime/arg_check.h"
#include "runtime/status.h"

namespace poseidon::capi {

// The int a C caller stored in an enum field or argument. C lets any int through, and the checks
// below must see it as it is: reading it as the enum type would be undefined in C++ for a value
// outside the enumerators' range (UBSan: "load of value 9, which is not a valid value for type
// 'psdStrategy_t'"), so its bytes are copied instead.
template <typename E>
int EnumInt(const E& value) {
  static_assert(sizeof(E) == sizeof(int), "the C API's enums are int-sized");
  int v = 0;
  std::memcpy(&v, &value, sizeof(v));
  return v;
}

// Copies `text` into a caller buffer with the size-query convention of the header.
inline Status CopyOut(const std::string& text, char* buf, size_t* size) {
  PSD_REQUIRE_ARG(size != nullptr, "size is NULL; expected a pointer to the buffer size");
  size_t need = text.size() + 1;
  if (buf == nullptr) {
    *size = need;
    return Status::Ok();
  }
  if (*size < need) {
    size_t given = *size;
    *size = need;
    return InvalidArgument("buffer of ", given, " bytes is too small; expected at least ", need,
                           " (the size is now in *size)");
  }
  std::memcpy(buf, text.c_str(), need);
  *size = need;
  return Status::Ok();
}

}  // namespace poseidon::capi
