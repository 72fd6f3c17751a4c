// The decisions of the CUDA top-k step (kernels/cuda/topk.cu) that do not depend on the
// device: the key of a value, the radix digits, the threshold guess for the next step, the
// candidate capacity and the choice between the candidate path and the full path. They are
// plain functions so the CPU tests check them; the device code calls the same functions.
//
// The step (topk.cu has the kernels):
//  1. One streaming pass over n: momentum and residual update, a 2048-bin histogram of key
//     bits 30..20 of every entry, and an index-ordered compaction of the entries whose key is
//     at least the guess (the candidates) into a buffer of `cap` slots.
//  2. The first digit of the exact k-th key T comes from that histogram (it counts all n).
//     The candidates decide the rest when CandidatesSuffice: then every entry with key >= T is
//     a candidate (T >= guess), ties included, in index order. Otherwise (first call, too few
//     candidates, overflow) the same finish runs over the whole residual instead.
//  3. Two refine passes (bits 19..10, 9..0) and one emitting pass finish on the chosen input.
//  4. NextGuess picks the next step's guess from this step's histogram: the lower edge of the
//     highest bin at which the count from the top reaches GuessAim (the target corrected by
//     the drift the last guess saw). Gradients change slowly from one step to the next, so the
//     next step collects about GuessTarget(k) candidates; when they do not suffice, that step
//     falls back and its own histogram and count correct the guess.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define PSD_HOST_DEVICE __host__ __device__
#else
#define PSD_HOST_DEVICE
#endif

namespace poseidon {
namespace topk_plan {

// Every NaN sorts as one key just above +infinity (the CPU kernel's cpu::kNaNKey).
inline constexpr uint32_t kNaNKey = 0x7f800001u;
// A guess above every key: the streaming pass collects nothing (the first call).
inline constexpr uint32_t kGuessNone = 0x80000000u;

// Radix digits: bits 30..20 (bit 31 of a key is always 0), then 19..10 and 9..0.
inline constexpr int kBits1 = 11;
inline constexpr int kBins1 = 1 << kBits1;
inline constexpr int kShift1 = 20;
inline constexpr int kBits2 = 10;
inline constexpr int kBins2 = 1 << kBits2;

PSD_HOST_DEVICE inline uint32_t KeyOfBits(uint32_t float_bits) {
  uint32_t u = float_bits & 0x7fffffffu;
  return u > 0x7f800000u ? kNaNKey : u;
}

// How many candidates the guess aims at, and the buffer that holds them: four times the aim,
// so a step whose distribution moved by up to that factor still takes the candidate path.
PSD_HOST_DEVICE inline uint64_t GuessTarget(uint64_t k) { return 2 * k + 1024; }
PSD_HOST_DEVICE inline uint64_t CandidateCapacity(uint64_t n, uint64_t k) {
  uint64_t cap = 4 * GuessTarget(k);
  return cap < n ? cap : n;
}

// The candidates decide the selection when they hold at least k entries (then T >= guess, so
// every entry with key >= T was collected) and all of them fit in the buffer.
PSD_HOST_DEVICE inline bool CandidatesSuffice(uint64_t count, uint64_t k, uint64_t cap) {
  return count >= k && count <= cap;
}

struct DigitPick {
  uint32_t digit;  // the bin holding the rank-th largest key
  uint64_t above;  // keys in the bins above it
  bool found;      // false when the bins hold fewer than `rank` keys
};

// Walking the bins from the top: the bin where the running count reaches `rank` (>= 1).
// The device runs the same walk split over a block (a scan of per-thread bin groups).
PSD_HOST_DEVICE inline DigitPick PickDigit(const uint32_t* hist, int bins, uint64_t rank) {
  uint64_t above = 0;
  for (int d = bins - 1; d >= 0; --d) {
    uint64_t c = hist[d];
    if (above + c >= rank) return DigitPick{static_cast<uint32_t>(d), above, true};
    above += c;
  }
  return DigitPick{0, above, false};
}

// How many entries of this step's histogram the next guess should leave above it. The
// residual drifts (entries not sent keep growing, momentum compounds), so the count a guess
// collects one step later differs from the count it had in the histogram it came from by a
// factor that changes slowly: observed / predicted from the step that just ran. The aim is
// the target divided by that factor, kept within [k / 2, 4 x target] so one odd step cannot
// push it far; with no history (predicted == 0) it is the target.
PSD_HOST_DEVICE inline uint64_t GuessAim(uint64_t k, uint64_t predicted, uint64_t observed) {
  const uint64_t target = GuessTarget(k);
  if (predicted == 0 || observed == 0) return target;
  const double aim =
      static_cast<double>(target) * static_cast<double>(predicted) / static_cast<double>(observed);
  const double lo = static_cast<double>(k / 2 + 1), hi = 4.0 * static_cast<double>(target);
  return static_cast<uint64_t>(aim < lo ? lo : (aim > hi ? hi : aim));
}

// The next step's guess from this step's first-digit histogram (kBins1 bins of key >> 20):
// the lower edge of the bin where the count from the top reaches `aim`, never below 1 (exact
// zeros, often most of a sparse gradient, are never candidates). When all n entries together
// stay below the aim, the guess is 1: every nonzero entry is a candidate.
PSD_HOST_DEVICE inline uint32_t NextGuessFromPick(const DigitPick& p) {
  if (!p.found) return 1;
  uint32_t edge = p.digit << kShift1;
  return edge == 0 ? 1u : edge;
}
// This step's count at or above the guess NextGuessFromPick(p) chose (the `predicted` of the
// next step's GuessAim): the bins above plus the chosen bin (every key of bin 0 but the zeros
// reaches the guess 1; counting them all only makes the drift estimate cautious).
PSD_HOST_DEVICE inline uint64_t PredictedCount(const DigitPick& p, const uint32_t* hist1) {
  return p.found ? p.above + hist1[p.digit] : p.above;
}
PSD_HOST_DEVICE inline uint32_t NextGuess(const uint32_t* hist1, uint64_t aim) {
  return NextGuessFromPick(PickDigit(hist1, kBins1, aim));
}

// Where entry i of an index-ordered selection lands: entries above T all come first in index
// order, interleaved with the first k_rem ties (the smaller index wins a tie). With a_before
// entries above T and t_before ties before it, an entry above T goes to a_before +
// min(t_before, k_rem); a tie goes to a_before + t_before when t_before < k_rem, else nowhere.
PSD_HOST_DEVICE inline uint64_t OutputSlot(uint64_t a_before, uint64_t t_before, uint64_t k_rem) {
  return a_before + (t_before < k_rem ? t_before : k_rem);
}

}  // namespace topk_plan
}  // namespace poseidon
