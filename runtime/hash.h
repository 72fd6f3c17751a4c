// The hashes Poseidon uses to compare small things across ranks: FNV-1a over bytes (argument
// layouts, plan tables, host sets, parameter bytes) and a word-wise one for the engine's
// per-step descriptors. Not cryptographic.
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

// Continues hash h over 64-bit words, one multiply per word (Fnv1a takes one per byte): for
// the engine's per-step descriptors. Finish with Mix64 where the high bits matter.
inline uint64_t HashWords(const uint64_t* w, size_t n, uint64_t h = kFnv1aOffset) {
  for (size_t i = 0; i < n; ++i) {
    h = (h ^ w[i]) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
  }
  return h;
}

// The splitmix64 finalizer: every input bit reaches every output bit.
inline uint64_t Mix64(uint64_t h) {
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

}  // namespace poseidon
