// Creates one communicator over MPI_COMM_WORLD and exits: 0 when creation works, 1 (after
// printing "rank R: <error>" to stderr) when it fails. The agreement ctest launches it with a
// setting exported to some ranks only (mpirun's MPMD form) and expects every rank to fail.
#include <cstdio>

#include "runtime/communicator.h"

int main(int argc, char** argv) {
  auto level = poseidon::InitMpi(&argc, &argv);
  if (!level.ok()) {
    std::fprintf(stderr, "%s\n", level.status().ToString().c_str());
    return 1;
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int rc = 0;
  {
    auto comm = poseidon::Communicator::Create(MPI_COMM_WORLD);
    if (comm.ok()) {
      std::printf("rank %d: communicator created\n", rank);
    } else {
      std::fprintf(stderr, "rank %d: %s\n", rank, comm.status().ToString().c_str());
      rc = 1;
    }
  }  // the communicator is freed before MPI_Finalize
  MPI_Finalize();
  return rc;
}
