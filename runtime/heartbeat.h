// HeartbeatChannel: the transport under peer-liveness detection (runtime/liveness.h), and the only
// place where its MPI traffic lives.
//
// A beat is one 64-bit word, (sequence << 1) | leaving, sent point to point on a private
// duplicate of the communicator, so it never matches anyone else's messages. Every call here is
// non-blocking, because the peer on the other side may be frozen (SIGSTOP, a hung node) and must
// never stall the caller:
//  - Send keeps at most one beat in flight per peer: while the previous one has not completed
//    (a frozen peer's shared-memory FIFO or socket is full), the new beat to that peer is
//    skipped, so requests never pile up.
//  - Poll keeps one receive posted per peer, drains every beat that has arrived and re-posts.
//  - The destructor is local (no collective, no wait, no cancel): see ~HeartbeatChannel.
//
// Threading: Create is collective over comm and called by one thread per rank; afterwards one
// thread at a time may use the object (the liveness thread). Other threads may call MPI at the
// same time only under MPI_THREAD_MULTIPLE (liveness checks it).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/status.h"

namespace poseidon {

struct Beat {
  int from = -1;         // rank in the channel's communicator
  uint64_t seq = 0;      // the sender's sequence number (up to 2^63)
  bool leaving = false;  // the sender shuts down cleanly and stops beating
};

class HeartbeatChannel {
 public:
  // Collective over comm: duplicates it (MPI_ERRORS_RETURN on the duplicate) and gathers every
  // rank's MPI_Get_processor_name.
  static Result<std::unique_ptr<HeartbeatChannel>> Create(MPI_Comm comm);
  // Local and non-blocking; never frees what a frozen peer could still touch (see .cc).
  ~HeartbeatChannel();

  HeartbeatChannel(const HeartbeatChannel&) = delete;
  HeartbeatChannel& operator=(const HeartbeatChannel&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The host name rank r reported at creation ("?" for a rank out of range).
  const std::string& host(int r) const;

  // Collectives (every rank alike, from the thread that made the channel before any other
  // thread uses it), with which Liveness agrees on its options: words[0..n) = their bitwise OR
  // over the ranks, in place (the one agreement protocol, runtime/or_agreement.h); and every
  // rank's `mine`, in rank order (the rarer second round that names a mismatch).
  Status OrOverRanks(uint64_t* words, size_t n);
  Result<std::vector<double>> GatherValues(double mine);

  // Posts one beat to peer (not this rank) without blocking. Returns false when the previous
  // beat to peer is still in flight, in which case this one is skipped.
  Result<bool> Send(int peer, uint64_t seq, bool leaving);
  // True when no beat sent by this rank is still in flight; never blocks.
  Result<bool> SendsDone();
  // Appends every beat that has arrived since the last call to *arrived; never blocks.
  Status Poll(std::vector<Beat>* arrived);

 private:
  HeartbeatChannel() = default;
  Status PostReceive(int peer);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::vector<std::string> hosts_;
  // One slot per rank (this rank's slots stay unused): the word being sent / received and its
  // request. A buffer stays untouched while its request is active.
  std::vector<uint64_t> send_word_;
  std::vector<uint64_t> recv_word_;
  std::vector<MPI_Request> send_req_;
  std::vector<MPI_Request> recv_req_;
  bool receiving_ = false;    // the per-peer receives are posted (at the first Poll)
  bool started_p2p_ = false;  // any Send or receive posted: the duplicate can no longer be freed
};

}  // namespace poseidon
