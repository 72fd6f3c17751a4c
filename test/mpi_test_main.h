// Helpers for GoogleTest binaries run under mpirun.
#pragma once

#include <mpi.h>

#include <memory>

#include "runtime/communicator.h"

namespace poseidon::testing {

// The communicator over MPI_COMM_WORLD made by the test main (valid inside tests).
std::shared_ptr<Communicator> World();

}  // namespace poseidon::testing
