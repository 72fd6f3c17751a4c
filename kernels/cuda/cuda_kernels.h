// The CUDA twin of the CPU kernels (kernels/kernels.h, MemoryKind::kDevice; the stream argument
// is a cudaStream_t, null meaning the legacy default stream). Every call is enqueued on the
// stream and returns without waiting, except where a doc comment below says otherwise; results
// are valid for later work on the same stream.
//
// Determinism: every kernel except ScatterAdd computes bit-identical results to CpuKernels()
// (the target is compiled with --fmad=false, and each kernel evaluates the CPU twin's
// expressions in the same order). ScatterAdd uses float atomicAdd: with repeated indices the
// order of the additions, and so the last bits of the sums, can change from run to run.
// NaN is the one exception to bit identity: CUDA float arithmetic returns the canonical NaN
// (0x7fffffff) where x86 keeps an operand's sign and payload, so a NaN result is a NaN on both
// sides but its bits may differ. The selection does not depend on it (every NaN has one key).
#pragma once

#include "kernels/kernels.h"

namespace poseidon {

// The process-wide CUDA kernels (stateless; thread-safe). Usable without a GPU: every call
// with work to do then fails with a Status carrying the CUDA error; bad arguments are refused
// first, by the contract's checks (kInvalidArgument, the CPU kernels' messages), and the empty
// calls return Ok without a CUDA call (Allocate(0) too).
const Kernels& CudaKernels();

// What the last FusedResidualTopK call on a CudaKernels() workspace did, as far as its report
// has reached host memory (synchronize the stream first to see the latest call): which path
// ran (the candidate buffer, or the full residual on the first call and whenever the guess
// missed), how many entries reached the guess, and a consistency fault (0: none).
struct CudaTopKCall {
  uint64_t calls = 0;
  bool used_candidates = false;
  uint64_t candidates = 0;
  uint32_t fault = 0;
};
Result<CudaTopKCall> LastCudaTopKCall(const KernelWorkspace& ws);

}  // namespace poseidon
