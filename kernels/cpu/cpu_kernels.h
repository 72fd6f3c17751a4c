// Host-memory implementation of the Kernels contract (kernels/kernels.h): CpuKernels(). Every
// call goes through it, so the contract's argument checks (kernels/contract.cc) run once, before
// the CPU kernels; the kernels themselves (kernels/cpu/cpu_impl.h) are internal and unchecked.
// This header adds what is particular to the CPU kernels: the top-k workspace's statistics and
// the choice of vector width, for the tests and benchmarks.
//
// All calls are synchronous (the stream argument is ignored), thread-compatible (no shared
// mutable state; a workspace must not be used by two calls at once) and deterministic: the same
// inputs give bit-identical outputs on every run and every instruction set the dispatcher may
// pick.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/kernels.h"

namespace poseidon {
namespace cpu {

// Scratch for FusedResidualTopK: candidate buffers and radix histograms, grown on demand and
// kept across calls (any n may follow any other n).
class TopKWorkspace final : public KernelWorkspace {
 public:
  std::vector<uint32_t> cand_idx;
  std::vector<float> cand_val;
  std::vector<uint32_t> keys;  // sample keys, then candidate keys
  std::vector<uint32_t> hist;  // radix histogram (65536 buckets)
  // Statistics of the last call, for tests and benchmarks: whether the sampled threshold
  // produced the selection (true) or the exact radix select over the residual did (false).
  bool last_used_sample = false;
  size_t last_candidates = 0;
};

// The sort key of a value: its magnitude's float bits, which order like the magnitudes. Every
// NaN maps to one key above +infinity, so NaNs are selected first (smaller index first).
inline constexpr uint32_t kNaNKey = 0x7f800001u;

// Which vector width FusedResidualTopK's fused pass runs with: "avx512", "avx2" or "scalar".
const char* TopKIsa();
// Tests and benchmarks: pin the fused pass to "scalar", "avx2" or "avx512" ("auto" undoes it).
// Unavailable when the CPU lacks the instructions. Process-wide; not for production use.
Status ForceIsaForTesting(const std::string& isa);

}  // namespace cpu
}  // namespace poseidon
