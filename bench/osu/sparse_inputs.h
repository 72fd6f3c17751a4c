// Gradient inputs with exactly known sums for the sparse exchanges (osu_topk, osu_hybrid): a
// known set of large entries per rank, and small noise elsewhere whose sums stay exact.
#pragma once

#include <cstddef>

namespace poseidon::osu {

// Rank r's k large entries of an n-element gradient: (r + 1) F(m) with alternating signs at
// positions (m s) mod n for m in [r h, r h + k) (s = n / k, h = ceil(k / 2): neighbouring
// ranks share half their positions). Adds every rank's entries to sum in rank order (as the
// scatter-add), marks their positions in large and writes this rank's into in.
void PlaceLargeEntries(int world, int rank, size_t n, size_t k, float* sum, unsigned char* large,
                       float* in);
// Small noise for the other entries: +-(1..1024) x 2^-30 from a multiplicative hash of (rank,
// index): varied magnitudes, as real gradients have, never zero; sums of a few thousand are
// exact in float32.
float GradientNoise(int rank, size_t i);

}  // namespace poseidon::osu
