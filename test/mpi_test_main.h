// Helpers for GoogleTest binaries run under mpirun.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "runtime/communicator.h"

namespace poseidon::testing {

// The communicator over MPI_COMM_WORLD made by the test main (valid inside tests).
std::shared_ptr<Communicator> World();

// How the library's cross-rank errors name ranks, written here independently of it: "rank 3",
// "ranks 0-2", "ranks 0-1, 3-4" (ranks ascending).
std::string Ranks(const std::vector<int>& ranks);
// The groups of a value over World()'s ranks where rank `odd` holds `odd_value` and the others
// `value`, in order of lowest rank, e.g. "ranks 0-1, 3-4: 4194304; rank 2: 0".
std::string OneOddGroups(int odd, const std::string& value, const std::string& odd_value);

}  // namespace poseidon::testing
