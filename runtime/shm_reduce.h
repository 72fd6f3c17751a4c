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

// memcpy into the caller's output, with non-temporal stores when `stream` (x86-64).
void CopyOut(void* dst, const void* src, size_t n, bool stream);
// Orders streaming stores before the call returns (the caller may hand the buffer on).
void StreamFence();

}  // namespace poseidon
