// The Collective defaults (see collective.h): which sizes run, where the peer can run, the
// thread level; and the peer's call as a Status.
#include "bench/osu/collective.h"

#include <mpi.h>

#include "bench/osu/verify.h"
#include "runtime/mpi_wait.h"

namespace poseidon::osu {

size_t Collective::CountFor(size_t bytes, DType dtype, int world) const {
  return bytes / DTypeSize(dtype);
}

int Collective::RequiredThreadLevel() const { return MPI_THREAD_SINGLE; }

bool Collective::PeerSupported(const Context& ctx) const {
  // Debian's Open MPI is not CUDA-aware, and MPI has no float16 / bfloat16 sum.
  return ctx.memory == MemoryKind::kHost && MpiSumSupported(ctx.dtype);
}

Status PeerCall(const char* call, int rc) {
  return rc == MPI_SUCCESS ? Status::Ok() : MpiError(call, rc);
}

}  // namespace poseidon::osu
