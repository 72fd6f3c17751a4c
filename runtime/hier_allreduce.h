// HierAllReduce: the two-level allreduce for a communicator whose ranks sit on several nodes,
// several ranks per node.
//
//   1. reduce-scatter within each node through the shared-memory window (ShmCollectives): the
//      node's L ranks each end with the node's sum of one 1/L shard;
//   2. allreduce of that shard among the ranks with the same node-local index, one per node
//      (the "cross" communicator: N ranks, S/L bytes each);
//   3. allgather of the shards within the node, through the window or read straight from the
//      node peers' memory (the window's single copy, POSEIDON_SHM_SINGLE_COPY_BYTES).
//
// A flat ring over all P = N x L ranks sends 2(P-1)/P x S per rank, and with consecutive ranks
// on one node one rank per node carries the node's whole share over the node's link: 2(P-1)/P x
// S per node link. Here each node link carries L x 2(N-1)/N x S/L = 2(N-1)/N x S, and only
// S/L-byte messages cross it (N-1 steps each way instead of P-1). With ranks placed round-robin
// over nodes, the flat ring crosses a link at every step and carries L times as much.
//
// Determinism: step 1 sums each element on one rank in node-rank order, step 2 is one MPI
// allreduce whose result is the same on every rank of the cross communicator, step 3 copies:
// every rank ends with the same bits. Half types are not taken (their P-rank sum is rounded
// once by the flat path; two levels would round twice): see Takes().
//
// Deadlines: with an interrupt, the window's steps poll it and the cross allreduce is posted
// non-blocking and polled (RunMpi): a call that gives up leaves the window or the request in an
// unknown state, and broken() turns true (so does any failure of step 2, which leaves the node
// peers waiting in step 3); the owner must then treat its communicator as dead.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/mpi_wait.h"
#include "runtime/status.h"

namespace poseidon {

class ShmCollectives;

class HierAllReduce {
 public:
  // Collective over comm (every rank calls it; the MPI calls it makes block). Returns
  // kUnavailable on every rank when there is nothing to gain or no way to build it: comm on one
  // node, one rank per node, or nodes holding different numbers of ranks. chunk_bytes and
  // timeout_s are the window's (ShmCollectives::Create). node >= 0: the node this rank counts
  // as on, instead of the ranks it shares memory with (tests emulate several nodes on one
  // machine; ranks given one node must share memory); every rank passes >= 0 or none.
  // single_copy_bytes: the node window's (ShmCollectives::Create). chunk_bytes and
  // single_copy_bytes must be the same on every rank of comm (kMismatch on every rank
  // otherwise), and a window that fails on one node fails Create on every rank with one code.
  static Result<std::unique_ptr<HierAllReduce>> Create(MPI_Comm comm, size_t chunk_bytes,
                                                       double timeout_s, int node = -1,
                                                       size_t single_copy_bytes = 0);
  // Frees the window and both communicators; collective like ShmCollectives' destructor.
  ~HierAllReduce();
  HierAllReduce(const HierAllReduce&) = delete;
  HierAllReduce& operator=(const HierAllReduce&) = delete;

  // Whether AllReduce takes this dtype (not float16 / bfloat16, see the top of this file).
  static bool Takes(DType dtype) { return !IsHalfDType(dtype); }
  // recv[i] = sum over every rank of comm of send[i]; send may equal recv. The arguments must
  // already agree across ranks (the caller checked them); Takes(dtype) must hold.
  Status AllReduce(const void* send, void* recv, size_t count, DType dtype, const MpiWait& how);

  int nodes() const { return nodes_; }
  int local_size() const { return local_size_; }
  // The window within this rank's node (its settings and what its single-copy probe chose).
  const ShmCollectives& node_window() const { return *shm_; }
  // True once a call gave up mid-collective (see the top of this file).
  bool broken() const;

 private:
  HierAllReduce() = default;

  MPI_Comm node_ = MPI_COMM_NULL;   // the ranks of this node
  MPI_Comm cross_ = MPI_COMM_NULL;  // one rank per node: those with this rank's local index
  std::unique_ptr<ShmCollectives> shm_;
  int local_rank_ = 0;
  int local_size_ = 1;
  int nodes_ = 1;
  // Step 1's output, step 2's send buffer. Shared so that an abandoned step 2 keeps it alive
  // (RunMpi hands it to AbandonMpi).
  std::shared_ptr<std::vector<unsigned char>> shard_ =
      std::make_shared<std::vector<unsigned char>>();
  bool cross_failed_ = false;  // step 2 failed: the node peers are left in step 3
};

}  // namespace poseidon
