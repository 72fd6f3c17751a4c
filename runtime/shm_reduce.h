// The data movement of the shared-memory collectives (shm_collectives.h): summing every
// rank's slot in rank order, and copying a result out of the window.
#pragma once

#include <cstddef>

#include "runtime/dtype.h"

namespace poseidon {

// dst[i] = srcs[0][i] + srcs[1][i] + ... + srcs[n-1][i], summed in that order; float16 /
// bfloat16 accumulate in float32 and round once. dst may equal one of srcs (same index only).
// The vectorizable loop the shared-memory collectives reduce with; exposed for tests.
void ShmReduceSum(DType dtype, const void* const* srcs, int n, void* dst, size_t count);

// Outputs at least this large are written with streaming stores (no read-for-ownership).
// Below it, plain stores: the output is read soon (the caller's next step) and still fits the
// last-level cache. Measured on the 2-core VM (osu_*, --no-peer, np 2 / 4): with a 4 MiB
// threshold, 4-8 MiB allreduce, allgather and broadcast ran 1.2-1.9x slower than with plain
// stores (np 4 broadcast of 4 MiB: 1.3-1.6 ms against 0.82 ms), 16 MiB was even to 1.3x
// slower, and at 32 MiB streaming was 1.1-1.2x faster at np 4.
inline constexpr size_t kStreamOutputBytes = size_t{32} << 20;

// memcpy into the caller's output, with non-temporal stores when `stream` (x86-64).
void CopyOut(void* dst, const void* src, size_t n, bool stream);
// Orders streaming stores before the call returns (the caller may hand the buffer on).
void StreamFence();

}  // namespace poseidon
