// The shared-memory collectives' data movement (shm_reduce.h): the rank-order sums, compiled
// for AVX2 and the x86-64 baseline (runtime/multiversion.h), and the streaming copy-out.
#include "runtime/shm_reduce.h"

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "runtime/half.h"
#include "runtime/multiversion.h"

namespace poseidon {

void CopyOut(void* dst, const void* src, size_t n, bool stream) {
#if defined(__x86_64__)
  if (stream && n >= 256) {
    unsigned char* d = static_cast<unsigned char*>(dst);
    const unsigned char* s = static_cast<const unsigned char*>(src);
    size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
    std::memcpy(d, s, head);
    size_t i = head;
    for (; i + 64 <= n; i += 64) {
      __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
      __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
      __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
    }
    std::memcpy(d + i, s + i, n - i);
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

void StreamFence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

namespace {

constexpr size_t kBlock = 1024;  // elements summed per block: the accumulator stays in L1

// Exact float16 -> float32 through a 64 Ki-entry table (256 KiB, built once): the scalar
// conversion branches on subnormals and is several times slower than the memory traffic.
const float* HalfTable() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t h = 0; h < 65536; ++h) t[h] = HalfToFloat(static_cast<uint16_t>(h));
    return t;
  }();
  return table.data();
}

// Sums in rank order, several sources per pass over the L1-resident accumulator (up to 4 in
// the first pass, then 3), which nearly halves the loads and stores of one source per pass.
// The parenthesization keeps the order ((s0 + s1) + s2) + ... exactly. Inlined into
// ShmReduceSum, so its loops are compiled for each of that function's targets.
template <typename T>
inline __attribute__((always_inline)) void SumTyped(const void* const* srcs, int n, void* dst,
                                                    size_t count) {
  T* out = static_cast<T*>(dst);
  auto src = [&](int p, size_t base) { return static_cast<const T*>(srcs[p]) + base; };
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t b = std::min(kBlock, count - base);
    T acc[kBlock];
    int g = std::min(n, 4);
    {
      const T* __restrict a = src(0, base);
      const T* __restrict c = src(g > 1 ? 1 : 0, base);
      const T* __restrict d = src(g > 2 ? 2 : 0, base);
      const T* __restrict e = src(g > 3 ? 3 : 0, base);
      switch (g) {
        case 1: for (size_t j = 0; j < b; ++j) acc[j] = a[j]; break;
        case 2: for (size_t j = 0; j < b; ++j) acc[j] = a[j] + c[j]; break;
        case 3: for (size_t j = 0; j < b; ++j) acc[j] = (a[j] + c[j]) + d[j]; break;
        default: for (size_t j = 0; j < b; ++j) acc[j] = ((a[j] + c[j]) + d[j]) + e[j]; break;
      }
    }
    for (int p = g; p < n; p += g) {
      g = std::min(n - p, 3);
      const T* __restrict a = src(p, base);
      const T* __restrict c = src(g > 1 ? p + 1 : p, base);
      const T* __restrict d = src(g > 2 ? p + 2 : p, base);
      switch (g) {
        case 1: for (size_t j = 0; j < b; ++j) acc[j] += a[j]; break;
        case 2: for (size_t j = 0; j < b; ++j) acc[j] = (acc[j] + a[j]) + c[j]; break;
        default: for (size_t j = 0; j < b; ++j) acc[j] = ((acc[j] + a[j]) + c[j]) + d[j]; break;
      }
    }
    // Written last so dst may alias a source at the same index.
    for (size_t j = 0; j < b; ++j) out[base + j] = acc[j];
  }
}

template <bool kBFloat16>
inline __attribute__((always_inline)) void SumHalf(const void* const* srcs, int n, void* dst,
                                                   size_t count) {
  const float* table = kBFloat16 ? nullptr : HalfTable();
  uint16_t* out = static_cast<uint16_t*>(dst);
  for (size_t base = 0; base < count; base += kBlock) {
    size_t b = std::min(kBlock, count - base);
    float acc[kBlock];
    for (int p = 0; p < n; ++p) {
      const uint16_t* __restrict sp = static_cast<const uint16_t*>(srcs[p]) + base;
      for (size_t j = 0; j < b; ++j) {
        float v = kBFloat16 ? BitsToFloat(static_cast<uint32_t>(sp[j]) << 16) : table[sp[j]];
        acc[j] = (p == 0) ? v : acc[j] + v;
      }
    }
    for (size_t j = 0; j < b; ++j) {
      out[base + j] = kBFloat16 ? FloatToBFloat16(acc[j]) : FloatToHalf(acc[j]);
    }
  }
}

}  // namespace

PSD_MULTIVERSION
void ShmReduceSum(DType dtype, const void* const* srcs, int n, void* dst, size_t count) {
  if (count == 0 || n <= 0) return;
  switch (dtype) {
    case DType::kFloat32: SumTyped<float>(srcs, n, dst, count); break;
    case DType::kFloat64: SumTyped<double>(srcs, n, dst, count); break;
    case DType::kInt32: SumTyped<int32_t>(srcs, n, dst, count); break;
    case DType::kInt64: SumTyped<int64_t>(srcs, n, dst, count); break;
    case DType::kFloat16: SumHalf<false>(srcs, n, dst, count); break;
    case DType::kBFloat16: SumHalf<true>(srcs, n, dst, count); break;
  }
}

}  // namespace poseidon
