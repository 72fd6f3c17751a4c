// Internals shared by mpi_backend.cc (the blocking collectives) and mpi_requests.cc (the
// non-blocking ones): the scratch a call keeps alive and the count / displacement arrays MPI
// takes. Only those two files include this.
#ifndef POSEIDON_RUNTIME_MPI_INTERNAL_H_
#define POSEIDON_RUNTIME_MPI_INTERNAL_H_

#include <mpi.h>

#include <cstddef>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/half_cast.h"
#include "runtime/status.h"

namespace poseidon::mpi_internal {

// Scratch a call's MPI collective reads or writes besides the caller's buffers. Held through a
// shared_ptr so that an abandoned call can hand it to AbandonMpi: MPI may still use it.
struct Scratch {
  std::vector<float> wide;  // float16 / bfloat16 widened to float32 (and reduce-scatter output)
  // The send side of a non-blocking allreduce asked in place: Open MPI 4.1's non-blocking
  // allreduce (libnbc) takes reduce + broadcast for MPI_IN_PLACE at any size and P, 1.5-1.8x
  // slower than out of place at 1-4 MiB on shared memory, 2.5x on the emulated 1 Gbit/s
  // cluster at P = 8 (bench/RESULTS.md, "Engine v2"); a copy costs far less.
  std::vector<unsigned char> send;
  std::vector<int> counts;  // MPI may read count / displacement arrays until the call completes
  std::vector<int> displs;
};

// A valid pointer for an empty send or receive: MPI writes nothing there, but Open MPI wants a
// pointer, and a posted call may outlive any stack frame.
extern char g_empty[16];

// The send buffer of a non-blocking allreduce of `buf` in place: a copy in scratch->send (see
// Scratch::send for why).
const void* OutOfPlaceSend(Scratch* scratch, const void* buf, size_t bytes);

std::vector<int> ToInts(const std::vector<size_t>& v);
std::vector<int> Displacements(const std::vector<size_t>& counts);

}  // namespace poseidon::mpi_internal

#endif  // POSEIDON_RUNTIME_MPI_INTERNAL_H_
