// Controller: the engine's negotiation rounds and the gathers behind its agreed failures, over
// the ControlChannel (runtime/control_channel.h): the engine never calls MPI itself.
//
// A round: every rank posts its NegotiationVector (negotiation.h) and the ranks reduce it with
// one bitwise-OR allreduce; the engine polls it, so its thread never blocks. The gathers run
// only when a round's flags say every rank must take part (an error, a mismatch, a stall): they
// turn the failure into a message naming each rank.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/negotiation.h"
#include "runtime/control_channel.h"

namespace poseidon::engine {

class Controller {
 public:
  // Collective over comm.
  static Result<std::unique_ptr<Controller>> Create(MPI_Comm comm, int num_layers);

  NegotiationVector& send() { return *send_; }
  // The last completed round's reduction (a copy: see TakeDelivered).
  const NegotiationVector& result() const { return *result_; }
  bool pending() const { return channel_->or_pending(); }
  double posted_us() const { return posted_us_; }

  // Posts the reduction of send() into result().
  Status Post();
  // Waits for the posted round, polling with growing sleeps so oversubscribed ranks leave the
  // cores to those doing work; stops at once when `interrupt` reports a lost peer, and after
  // `limit_s` (0: none) with kTimeout naming this rank.
  Status Wait(const Interrupt* interrupt, double limit_s);

  // Every rank's error text (code, message; empty: none); the failure naming each rank that
  // had one, or OK when none had.
  Status GatherErrors(StatusCode my_code, const std::string& my_error, const Interrupt* interrupt);
  // Every rank's waiting descriptors; kMismatch naming the layers, fields and ranks.
  Status GatherMismatch(const std::vector<Descriptor>& mine, const std::vector<int>& layers,
                        const LayerNamer& name, const Interrupt* interrupt);
  // Every rank's ready mask; which ranks miss which stalled layers.
  Result<std::string> GatherStall(const std::vector<int>& layers, const LayerNamer& name,
                                  const Interrupt* interrupt);

 private:
  Controller() = default;
  // Copies the completed round's receive buffer into result_. The one place the engine reads a
  // buffer Open MPI wrote: whichever thread drove MPI's progress (a user thread waiting, the
  // liveness thread) may have unpacked it, ordered with the completion by Open MPI's own
  // atomics, which ThreadSanitizer cannot see (test/engine/tsan.supp names this function).
  void TakeDelivered();

  std::unique_ptr<ControlChannel> channel_;
  // Heap buffers, released only once their round completed: an abandoned round (a lost peer)
  // leaves them to MPI.
  std::unique_ptr<NegotiationVector> send_, recv_;
  std::unique_ptr<NegotiationVector> result_;
  double posted_us_ = 0;
};

}  // namespace poseidon::engine
