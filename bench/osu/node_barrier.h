// A barrier of the ranks of one node through a shared-memory window of the harness's own, for
// the timed loop's `--barrier node` (bench/osu/args.h). It drives neither Open MPI's progress
// engine nor Poseidon's window.
//
// Why: OSU's loop meets in MPI_Barrier around each timed call. A rank that leaves that barrier
// first and sends eagerly (Open MPI's broadcast root writes into the receiver's fast box) can
// have its message taken in by the receiver's progress engine while the receiver is still in
// the barrier, before its timer starts; the receiver's MPI_Bcast then finds the message already
// received. A shared-memory collective cannot do that (nothing of it runs between calls), nor
// can a receiver whose previous MPI call was long ago, as in a training step. With this barrier
// both columns move their data inside the timed call.
//
// Each rank owns one 64-byte line of the window holding the count of barriers it has entered.
// Wait() bumps its own count and returns once every rank's count has reached it: spinning for
// up to 2 us where every rank of the node can have a core (of those the process may run on), then yielding the core between
// looks (at once where ranks outnumber cores: a spinning rank would hold the core a peer needs;
// at 4 ranks on 2 cores a 2 us spin made a 4-256 B broadcast take 0.32-0.43 us against 0.11).
// A rank that does not arrive within the deadline is named in the error (never a hang).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/status.h"

namespace poseidon::osu {

class NodeBarrier {
 public:
  // Collective over comm. Fails with a clear error where comm's ranks are not all on one node
  // or the window is not in the unified memory model.
  static Result<std::unique_ptr<NodeBarrier>> Create(MPI_Comm comm, double timeout_s);
  ~NodeBarrier();
  NodeBarrier(const NodeBarrier&) = delete;
  NodeBarrier& operator=(const NodeBarrier&) = delete;

  // Returns once every rank has entered as many barriers as this one has; TimeoutError naming
  // the ranks missing after timeout_s.
  Status Wait();

 private:
  NodeBarrier() = default;

  MPI_Comm node_ = MPI_COMM_NULL;
  MPI_Win win_ = MPI_WIN_NULL;
  bool locked_ = false;
  int rank_ = 0, size_ = 0;
  std::vector<uint64_t*> counts_;  // each rank's count, in its line of the window
  uint64_t entered_ = 0;
  double timeout_s_ = 0;
  bool spin_ = false;  // spin before yielding (every rank of the node has a core)
};

}  // namespace poseidon::osu
