// FNV-1a over bytes: the one hash Poseidon uses to compare small things across ranks (argument
// layouts, plan tables, engine descriptors, host sets, parameter bytes). Not cryptographic.
#pragma once

#include <cstddef>
#include <cstdint>

namespace poseidon {

inline constexpr uint64_t kFnv1aOffset = 14695981039346656037ull;
inline constexpr uint64_t kFnv1aPrime = 1099511628211ull;

// Continues hash h over bytes [data, data + bytes); start with kFnv1aOffset.
inline uint64_t Fnv1a(const void* data, size_t bytes, uint64_t h = kFnv1aOffset) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= kFnv1aPrime;
  }
  return h;
}

}  // namespace poseidon
