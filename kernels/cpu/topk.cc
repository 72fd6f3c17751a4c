// FusedResidualTopK on host memory: residual accumulation (with optional DGC momentum
// correction) fused with exact top-k selection by magnitude. No full sort. Called by
// CpuKernels() once the contract's checks (kernels/contract.cc) and the workspace's have passed.
//
// Keys: a value's sort key is the float bits of its magnitude (|x| orders like those bits),
// with every NaN mapped to one key just above +infinity (kNaNKey).
//
//  1. Threshold estimate (large n, small k/n only): evaluate r = residual + update at ~16K
//     positions (1024 cache lines spread over the buffer, read only) and take the key that a
//     safety-padded k/n fraction of the sample reaches. That key is a guess; step 3 checks it.
//     When that key is 0 (sparse gradients: most entries are exact zeros, which all tie) or
//     k/n is large, but few sampled entries are nonzero, the guess is the smallest nonzero key
//     (1): the fused pass then collects exactly the nonzero entries.
//  2. One fused, vectorized pass: u = momentum * u + g (stored, if momentum is on),
//     r = residual + u (stored); entries whose key reaches the guess are appended as (index,
//     value) to the candidate buffer, which therefore stays in ascending index order.
//  3. Exact k-th key T: if at least k candidates were collected (and the buffer did not
//     overflow), every entry of the top k is a candidate, and nth_element on the candidate keys
//     gives T. Otherwise (unlucky sample, many equal magnitudes, large k/n) an exact two-level
//     radix select (histograms of the key's top and bottom 16 bits) over the updated residual
//     finds T. Small n simply runs nth_element on all keys. With the guess 1 and fewer than k
//     candidates, the candidates are every nonzero entry and T is 0: the selection is all of
//     them plus the lowest-index zeros (+0 or -0) up to k, merged in index order without
//     another pass over the residual (it stops at index k + #candidates at the latest).
//  4. Emission in ascending index order: keys above T always, keys equal to T for the first
//     (k - #above) of them (the smaller index wins a tie). Each emitted entry is zeroed in the
//     residual and in the momentum buffer (DGC's momentum factor masking).
//
// Because the selection is exact, the output never depends on the sample or on the vector
// width the dispatcher picks; only the time does.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

#include "kernels/cpu/cpu_impl.h"
#include "runtime/half.h"

namespace poseidon {
namespace cpu {
namespace {

constexpr uint32_t kAbsMask = 0x7fffffffu;
// A threshold above every key: the fused pass collects nothing.
constexpr uint32_t kCollectNothing = kNaNKey + 1;
// Below this many entries, nth_element over all keys beats the other paths.
constexpr size_t kSmallN = 8192;
// Sampling pays only for large buffers.
constexpr size_t kMinSampledN = size_t{1} << 16;
constexpr size_t kSampleLines = 1024;
constexpr size_t kLine = 16;  // floats per 64-byte cache line
constexpr size_t kSlack = 16;  // extra candidate slots for one vector's compress-store

inline uint32_t KeyOf(float x) {
  uint32_t b = FloatBits(x) & kAbsMask;
  return b < kNaNKey ? b : kNaNKey;
}

struct PassArgs {
  const float* grad;
  float* residual;
  float* mom;  // null: no momentum
  float momentum;
  size_t n;
  uint32_t threshold;  // collect entries with key >= threshold (always < 2^31)
  uint32_t* cand_idx;  // cap + kSlack slots
  float* cand_val;
  size_t cap;
};
// Returns how many entries reached the threshold; when that exceeds cap, the buffer holds only
// some of them and the caller must not use it.
using PassFn = size_t (*)(const PassArgs&);

template <bool kMom>
inline size_t ScalarRange(const PassArgs& a, size_t begin, size_t end, size_t c) {
  const float* __restrict grad = a.grad;
  float* __restrict res = a.residual;
  float* __restrict mom = a.mom;
  for (size_t i = begin; i < end; ++i) {
    float u = grad[i];
    if (kMom) {
      u = a.momentum * mom[i] + u;
      mom[i] = u;
    }
    float r = res[i] + u;
    res[i] = r;
    if (KeyOf(r) >= a.threshold) {
      if (c < a.cap + kSlack) {
        a.cand_idx[c] = static_cast<uint32_t>(i);
        a.cand_val[c] = r;
      }
      ++c;
    }
  }
  return c;
}

// Portable version, written so the compiler can vectorize the 16-wide inner loop; the rare
// block holding a candidate is rescanned from the (cached) residual.
template <bool kMom>
size_t PassGeneric(const PassArgs& a) {
  const float* __restrict grad = a.grad;
  float* __restrict res = a.residual;
  float* __restrict mom = a.mom;
  const uint32_t thr = a.threshold;
  size_t c = 0;
  size_t i = 0;
  for (; i + kLine <= a.n; i += kLine) {
    uint32_t hit = 0;
    for (size_t j = 0; j < kLine; ++j) {
      float u = grad[i + j];
      if (kMom) {
        u = a.momentum * mom[i + j] + u;
        mom[i + j] = u;
      }
      float r = res[i + j] + u;
      res[i + j] = r;
      hit |= static_cast<uint32_t>(KeyOf(r) >= thr);
    }
    if (hit) {
      for (size_t j = 0; j < kLine; ++j) {
        float r = res[i + j];
        if (KeyOf(r) >= thr) {
          if (c < a.cap + kSlack) {
            a.cand_idx[c] = static_cast<uint32_t>(i + j);
            a.cand_val[c] = r;
          }
          ++c;
        }
      }
    }
  }
  return ScalarRange<kMom>(a, i, a.n, c);
}

template <bool kMom>
__attribute__((target("avx2"))) size_t PassAvx2(const PassArgs& a) {
  const __m256i abs_mask = _mm256_set1_epi32(static_cast<int>(kAbsMask));
  const __m256i nan_key = _mm256_set1_epi32(static_cast<int>(kNaNKey));
  // Keys and threshold are below 2^31, so the signed compare orders them correctly.
  const __m256i thr = _mm256_set1_epi32(static_cast<int>(a.threshold));
  const __m256 vm = _mm256_set1_ps(a.momentum);
  size_t c = 0;
  size_t i = 0;
  for (; i + 8 <= a.n; i += 8) {
    __m256 u = _mm256_loadu_ps(a.grad + i);
    if (kMom) {
      u = _mm256_add_ps(_mm256_mul_ps(vm, _mm256_loadu_ps(a.mom + i)), u);
      _mm256_storeu_ps(a.mom + i, u);
    }
    __m256 r = _mm256_add_ps(_mm256_loadu_ps(a.residual + i), u);
    _mm256_storeu_ps(a.residual + i, r);
    __m256i key = _mm256_min_epu32(_mm256_and_si256(_mm256_castps_si256(r), abs_mask), nan_key);
    __m256i below = _mm256_cmpgt_epi32(thr, key);
    unsigned hit = ~static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(below))) & 0xffu;
    if (hit) {
      alignas(32) float rv[8];
      _mm256_store_ps(rv, r);
      while (hit) {
        int j = __builtin_ctz(hit);
        hit &= hit - 1;
        if (c < a.cap + kSlack) {
          a.cand_idx[c] = static_cast<uint32_t>(i + j);
          a.cand_val[c] = rv[j];
        }
        ++c;
      }
    }
  }
  return ScalarRange<kMom>(a, i, a.n, c);
}

template <bool kMom>
__attribute__((target("avx512f"))) size_t PassAvx512(const PassArgs& a) {
  const __m512i abs_mask = _mm512_set1_epi32(static_cast<int>(kAbsMask));
  const __m512i nan_key = _mm512_set1_epi32(static_cast<int>(kNaNKey));
  const __m512i thr = _mm512_set1_epi32(static_cast<int>(a.threshold));
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 vm = _mm512_set1_ps(a.momentum);
  size_t c = 0;
  size_t i = 0;
  for (; i + 16 <= a.n; i += 16) {
    __m512 u = _mm512_loadu_ps(a.grad + i);
    if (kMom) {
      u = _mm512_add_ps(_mm512_mul_ps(vm, _mm512_loadu_ps(a.mom + i)), u);
      _mm512_storeu_ps(a.mom + i, u);
    }
    __m512 r = _mm512_add_ps(_mm512_loadu_ps(a.residual + i), u);
    _mm512_storeu_ps(a.residual + i, r);
    // The masked form of the unsigned min: GCC 12 warns about the unmasked one's undefined
    // pass-through operand.
    __m512i abs_bits = _mm512_and_si512(_mm512_castps_si512(r), abs_mask);
    __m512i key = _mm512_mask_min_epu32(abs_bits, 0xffff, abs_bits, nan_key);
    __mmask16 hit = _mm512_cmpge_epu32_mask(key, thr);
    if (hit) {
      // c <= cap leaves room for 16 more in the kSlack slots.
      if (c <= a.cap) {
        __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(i)), lane);
        _mm512_mask_compressstoreu_epi32(a.cand_idx + c, hit, idx);
        _mm512_mask_compressstoreu_ps(a.cand_val + c, hit, r);
      }
      c += static_cast<size_t>(__builtin_popcount(hit));
    }
  }
  return ScalarRange<kMom>(a, i, a.n, c);
}

enum class Isa : int { kAuto = 0, kScalar = 1, kAvx2 = 2, kAvx512 = 3 };
std::atomic<int> g_forced_isa{0};

Isa DetectIsa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return Isa::kAvx512;
  if (__builtin_cpu_supports("avx2")) return Isa::kAvx2;
  return Isa::kScalar;
}

Isa ActiveIsa() {
  static const Isa detected = DetectIsa();
  Isa forced = static_cast<Isa>(g_forced_isa.load(std::memory_order_relaxed));
  return forced == Isa::kAuto ? detected : forced;
}

PassFn SelectPass(bool with_momentum) {
  switch (ActiveIsa()) {
    case Isa::kAvx512: return with_momentum ? PassAvx512<true> : PassAvx512<false>;
    case Isa::kAvx2: return with_momentum ? PassAvx2<true> : PassAvx2<false>;
    default: return with_momentum ? PassGeneric<true> : PassGeneric<false>;
  }
}

template <typename T>
void GrowTo(std::vector<T>* v, size_t size) {
  if (v->size() < size) v->resize(size);
}

// A fixed, well-mixed sequence: the sampled lines are the same on every call and every rank,
// so timings are repeatable; correctness never depends on them.
inline uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Step 1. Returns false when sampling does not pay (small n, large k/n or a zero threshold
// with many nonzero entries); otherwise sets the threshold and the buffer capacity.
bool SampleThreshold(const PassArgs& a, size_t k, TopKWorkspace* w, uint32_t* threshold,
                     size_t* cap) {
  const size_t n = a.n;
  if (n < kMinSampledN) return false;
  const size_t s = kSampleLines * kLine;
  const double expected = static_cast<double>(s) * static_cast<double>(k) / n;
  // Padding: 25% plus four standard deviations of the sampled count plus a constant, so that a
  // guess that collects fewer than k entries is very unlikely for unstructured data.
  const double rank_f = 1.25 * expected + 4.0 * std::sqrt(expected) + 16.0;
  if (rank_f > static_cast<double>(s) / 8) return false;
  GrowTo(&w->keys, s);
  uint32_t* keys = w->keys.data();
  const size_t seg = n / kSampleLines;  // >= 64
  size_t o = 0;
  for (size_t line = 0; line < kSampleLines; ++line) {
    size_t off = (line * seg + Mix(line) % (seg - kLine + 1)) & ~(kLine - 1);
    for (size_t t = 0; t < kLine; ++t) {
      size_t i = off + t;
      float u = a.grad[i];
      if (a.mom != nullptr) u = a.momentum * a.mom[i] + u;
      keys[o++] = KeyOf(a.residual[i] + u);
    }
  }
  size_t nonzero = 0;
  for (size_t j = 0; j < s; ++j) nonzero += keys[j] != 0;
  if (rank_f <= static_cast<double>(s) / 8) {
    const size_t rank = static_cast<size_t>(rank_f);
    std::nth_element(keys, keys + (rank - 1), keys + s, std::greater<uint32_t>());
    if (keys[rank - 1] != 0) {
      *threshold = keys[rank - 1];
      *cap = std::min(n, static_cast<size_t>(4.0 * rank_f / s * n) + 4096);
      return true;
    }
  }
  // The guess is zero, or k/n is large: every zero ties at the bottom, and a threshold of 0
  // would collect everything. When nonzero entries are rare, collecting exactly those (key >=
  // 1) is still a small buffer, and it decides the selection whether there are more or fewer
  // than k of them. The capacity is padded as above, from the sampled nonzero count.
  const double nonzero_f = 1.25 * nonzero + 4.0 * std::sqrt(static_cast<double>(nonzero)) + 16.0;
  if (nonzero_f > static_cast<double>(s) / 8) return false;
  *threshold = 1;
  *cap = std::min(n, static_cast<size_t>(4.0 * nonzero_f / s * n) + 4096);
  return true;
}

struct Cut {
  uint32_t key;    // the k-th largest key T
  size_t need_eq;  // how many entries with key == T are selected (smallest indices first)
};

// Exact k-th key over all n residual entries by two histogram passes (top 16 bits of the key,
// then the bottom 16 bits within the chosen top bucket).
Cut RadixCut(const float* res, size_t n, size_t k, std::vector<uint32_t>* hist_v) {
  hist_v->assign(size_t{1} << 16, 0);
  uint32_t* hist = hist_v->data();
  for (size_t i = 0; i < n; ++i) ++hist[KeyOf(res[i]) >> 16];
  size_t above = 0;
  uint32_t hi = kNaNKey >> 16;
  for (;; --hi) {  // terminates: the histogram holds n >= k entries
    if (above + hist[hi] >= k) break;
    above += hist[hi];
  }
  std::fill(hist, hist + (size_t{1} << 16), 0u);
  for (size_t i = 0; i < n; ++i) {
    uint32_t key = KeyOf(res[i]);
    if ((key >> 16) == hi) ++hist[key & 0xffffu];
  }
  uint32_t lo = 0xffffu;
  for (;; --lo) {
    if (above + hist[lo] >= k) break;
    above += hist[lo];
  }
  return Cut{(hi << 16) | lo, k - above};
}

// Exact k-th key among `count` keys (copied into scratch).
Cut NthCut(const uint32_t* keys_in, size_t count, size_t k, std::vector<uint32_t>* scratch) {
  GrowTo(scratch, count);
  uint32_t* keys = scratch->data();
  std::copy(keys_in, keys_in + count, keys);
  std::nth_element(keys, keys + (k - 1), keys + count, std::greater<uint32_t>());
  const uint32_t t = keys[k - 1];
  size_t above = 0;
  for (size_t j = 0; j < count; ++j) above += keys_in[j] > t;
  return Cut{t, k - above};
}

inline bool Take(uint32_t key, Cut* cut) {
  if (key > cut->key) return true;
  if (key == cut->key && cut->need_eq > 0) {
    --cut->need_eq;
    return true;
  }
  return false;
}

}  // namespace

const char* TopKIsa() {
  switch (ActiveIsa()) {
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    default: return "scalar";
  }
}

Status ForceIsaForTesting(const std::string& isa) {
  Isa want;
  if (isa == "auto" || isa.empty()) {
    want = Isa::kAuto;
  } else if (isa == "scalar") {
    want = Isa::kScalar;
  } else if (isa == "avx2") {
    want = Isa::kAvx2;
  } else if (isa == "avx512") {
    want = Isa::kAvx512;
  } else {
    return InvalidArgument("ForceIsaForTesting: unknown isa '", isa,
                           "'; expected auto, scalar, avx2 or avx512");
  }
  if (want > DetectIsa()) {
    return UnavailableError("ForceIsaForTesting: this CPU does not support ", isa);
  }
  g_forced_isa.store(static_cast<int>(want), std::memory_order_relaxed);
  return Status::Ok();
}

Status FusedResidualTopK(const float* grad, float* residual, float* momentum_buf, float momentum,
                         size_t n, size_t k, uint32_t* out_idx, float* out_val,
                         TopKWorkspace* w) {
  constexpr const char* kCall = "FusedResidualTopK";
  PassArgs a{grad, residual, momentum_buf, momentum, n, kCollectNothing, nullptr, nullptr, 0};
  bool sampled = k < n && SampleThreshold(a, k, w, &a.threshold, &a.cap);
  if (sampled) {
    GrowTo(&w->cand_idx, a.cap + kSlack);
    GrowTo(&w->cand_val, a.cap + kSlack);
    a.cand_idx = w->cand_idx.data();
    a.cand_val = w->cand_val.data();
  }
  const size_t candidates = SelectPass(momentum_buf != nullptr)(a);  // step 2
  w->last_used_sample = false;
  w->last_candidates = sampled ? candidates : 0;

  auto emit = [&](size_t o, size_t i, float value) {
    out_idx[o] = static_cast<uint32_t>(i);
    out_val[o] = value;
    residual[i] = 0.0f;
    if (momentum_buf != nullptr) momentum_buf[i] = 0.0f;
  };

  if (k == n) {
    for (size_t i = 0; i < n; ++i) emit(i, i, residual[i]);
    return Status::Ok();
  }

  if (sampled && a.threshold == 1 && candidates < k && candidates <= a.cap) {
    // Fewer than k nonzero entries, and the buffer holds all of them, in index order. Merge it
    // with the zeros of smallest index: k - candidates of them lie below index k + candidates.
    size_t zeros = k - candidates;
    size_t o = 0, j = 0;
    for (size_t i = 0; zeros > 0; ++i) {
      if (j < candidates && a.cand_idx[j] == i) {
        emit(o++, i, a.cand_val[j++]);
      } else {
        emit(o++, i, residual[i]);  // a zero of either sign, as the update left it
        --zeros;
      }
    }
    for (; j < candidates; ++j) emit(o++, a.cand_idx[j], a.cand_val[j]);
    w->last_used_sample = true;
    if (o != k) return InternalError(kCall, ": emitted ", o, " of k = ", k, " entries");
    return Status::Ok();
  }

  if (sampled && candidates >= k && candidates <= a.cap) {  // steps 3 and 4 on candidates
    GrowTo(&w->keys, candidates);
    uint32_t* keys = w->keys.data();
    for (size_t j = 0; j < candidates; ++j) keys[j] = KeyOf(a.cand_val[j]);
    std::vector<uint32_t>& scratch = w->hist;
    Cut cut = NthCut(keys, candidates, k, &scratch);
    size_t o = 0;
    for (size_t j = 0; j < candidates && o < k; ++j) {
      if (Take(keys[j], &cut)) emit(o++, a.cand_idx[j], a.cand_val[j]);
    }
    w->last_used_sample = true;
    if (o != k) return InternalError(kCall, ": emitted ", o, " of k = ", k, " candidates");
    return Status::Ok();
  }

  Cut cut;  // steps 3 and 4 over the whole residual
  if (n <= kSmallN) {
    GrowTo(&w->keys, n);
    uint32_t* keys = w->keys.data();
    for (size_t i = 0; i < n; ++i) keys[i] = KeyOf(residual[i]);
    cut = NthCut(keys, n, k, &w->hist);
  } else {
    cut = RadixCut(residual, n, k, &w->hist);
  }
  size_t o = 0;
  for (size_t i = 0; i < n && o < k; ++i) {
    float r = residual[i];
    if (Take(KeyOf(r), &cut)) emit(o++, i, r);
  }
  if (o != k) return InternalError(kCall, ": emitted ", o, " of k = ", k, " entries");
  return Status::Ok();
}

}  // namespace cpu
}  // namespace poseidon
