// ControlChannel: the engine's control traffic (negotiation rounds, and the gathers that turn a
// failed round into an error naming every rank) on a private duplicate of the communicator, so
// it never matches a data collective. The engine's controller talks only through it; MPI stays
// below runtime/.
//
// Every call is non-blocking or bounded: PostOr / TestOr split a reduction so the caller can
// poll it against its own deadlines, and AllGather polls the Interrupt it is given.
//
// Threading: one thread (the engine's) uses an object at a time.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/backend.h"
#include "runtime/status.h"

namespace poseidon {

class ControlChannel {
 public:
  // Collective over comm (duplicates it).
  static Result<std::unique_ptr<ControlChannel>> Create(MPI_Comm comm);
  // Frees the duplicate unless a request was abandoned (MPI still owns it then).
  ~ControlChannel();
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // Posts recv = bitwise OR over ranks of send (n words). Both buffers must stay valid and
  // untouched until TestOr returns true. One reduction in flight at a time.
  Status PostOr(const uint64_t* send, uint64_t* recv, size_t n);
  // True once the posted reduction completed; never blocks.
  Result<bool> TestOr();
  bool or_pending() const { return or_req_ != MPI_REQUEST_NULL; }
  // Gives up on the posted reduction: MPI keeps the request and its buffers (the caller must
  // never free them) and the channel refuses every later call.
  void AbandonOr();

  // Every rank's bytes, in rank order. Collective; polls `interrupt` (may be null) while it
  // waits, and returns its status at once when it turns non-OK (the channel is then unusable).
  Result<std::vector<std::string>> AllGather(const std::string& mine, const Interrupt* interrupt);

 private:
  ControlChannel() = default;
  Status Usable(const char* call) const;
  // Waits for req, polling interrupt with growing sleeps; abandons it on interrupt.
  Status Wait(MPI_Request* req, const Interrupt* interrupt, const char* call);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  MPI_Request or_req_ = MPI_REQUEST_NULL;
  bool abandoned_ = false;
};

}  // namespace poseidon
