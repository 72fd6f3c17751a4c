// Waiting for MPI under an Interrupt: the one poll loop every host-backend wait uses when its
// caller passed CallOptions::interrupt, and what happens to a request it gives up on.
//
// MPI cannot cancel a posted collective (MPI_Cancel and MPI_Request_free are erroneous on one),
// so a wait that gives up *abandons* the request: MPI keeps it, may still read and write its
// buffers whenever a peer finally joins, and later collectives on the same communicator could
// pair with it. Hence two rules, kept here so that every caller follows them alike:
//  - scratch an abandoned request may touch is never freed while the request is pending
//    (AbandonMpi keeps it; ReapAbandonedMpi frees it once MPI reports the request complete);
//  - the communicator's owner records the first abandoned call in a StickyError and fails
//    every later call at once (NCCL's sticky per-communicator error).
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>

#include "runtime/backend.h"
#include "runtime/status.h"

namespace poseidon {

// "MPI_Allreduce failed: <MPI's error string>".
Status MpiError(const char* what, int code);

// Waits until *request completes. interrupt == nullptr: MPI_Wait (MPI's own blocking wait).
// Otherwise polls MPI_Test, calling interrupt->Check() after every poll that finds the request
// pending: the first polls only yield the core, later ones sleep, the sleeps doubling up to
// 200 us (ranks may outnumber cores: a spinning waiter steals the core its peer needs), so the
// interrupt is seen within ~0.2 ms plus one Check().
// Returns OK when the request completed (*request is then MPI_REQUEST_NULL); a kBackendError
// naming `call` when MPI fails; or the interrupt's status with "<call>: " in front, leaving
// *request pending: the caller must then abandon it (WaitOrAbandon does).
Status WaitMpi(MPI_Request* request, const Interrupt* interrupt, const char* call);

// Hands a pending request to the process-wide list of abandoned requests, with `keep`: every
// scratch buffer the request may still read or write. Both stay there until ReapAbandonedMpi
// sees the request complete (never, if no peer ever joins: the memory is leaked on purpose,
// since freeing it would let MPI write into memory the allocator has handed out again).
// Does nothing for MPI_REQUEST_NULL.
void AbandonMpi(MPI_Request request, std::shared_ptr<void> keep);

// Tests every abandoned request (MPI_Test, so it also drives MPI's progress) and frees the
// scratch of those that completed. Returns how many are still pending. Thread-safe.
size_t ReapAbandonedMpi();

// The first failure that left a communicator unusable; shared by a backend and the requests it
// hands out, which may outlive it. Thread-safe; Check() costs one atomic load while healthy.
class StickyError {
 public:
  // OK while nothing is recorded; else kAborted: "<call>: <why later calls fail> (<first>)".
  Status Check(const char* call) const { return failed() ? Failed(call) : Status::Ok(); }
  // Records `failure` unless an earlier one is recorded.
  void Record(const Status& failure);
  bool failed() const { return failed_.load(std::memory_order_acquire); }

 private:
  Status Failed(const char* call) const;
  std::atomic<bool> failed_{false};
  mutable std::mutex mu_;  // guards first_
  Status first_;
};

// How a routine that runs MPI collectives for a call waits for them.
struct MpiWait {
  // Null: the blocking MPI forms. Non-null: the non-blocking forms, waited for by WaitMpi.
  // Every rank of the communicator must choose alike: MPI never matches a blocking collective
  // with a non-blocking one.
  const Interrupt* interrupt = nullptr;
  // Names the call in an interrupted wait's status ("MpiBackend::AllReduce").
  const char* call = "";
  // Records an abandoned request; may be null.
  StickyError* sticky = nullptr;
};

// WaitMpi(request, how.interrupt, how.call); when the wait gives up with the request still
// pending, abandons it (AbandonMpi(*request, keep); *request becomes MPI_REQUEST_NULL) and
// records the failure in how.sticky.
Status WaitOrAbandon(MPI_Request* request, std::shared_ptr<void> keep, const MpiWait& how);

// Runs one MPI collective for a call: op(nullptr) must run its blocking form and op(&request)
// post its non-blocking form; both return MPI's error code. Without how.interrupt the blocking
// form runs (MPI's own wait, the fastest for direct callers); with it, the posted form is
// waited for by WaitOrAbandon, and `keep` must own every scratch buffer the call reads or
// writes. `what` names the MPI function in errors ("MPI_Allreduce").
template <typename Op>
Status RunMpi(const MpiWait& how, const char* what, std::shared_ptr<void> keep, Op&& op) {
  if (how.interrupt == nullptr) {
    int rc = op(nullptr);
    return rc == MPI_SUCCESS ? Status::Ok() : MpiError(what, rc);
  }
  MPI_Request request = MPI_REQUEST_NULL;
  int rc = op(&request);
  if (rc != MPI_SUCCESS) return MpiError(StrCat(how.call, ": ", what, " (posted)").c_str(), rc);
  return WaitOrAbandon(&request, std::move(keep), how);
}

}  // namespace poseidon
