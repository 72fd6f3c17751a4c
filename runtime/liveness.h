// Liveness: tells a frozen or unreachable peer from a slow one, and ends the job when one is lost.
//
// Every rank runs a thread of its own (independent of the engine thread and of user threads)
// that sends a heartbeat to every peer each interval = clamp(peer_timeout_s / 10, 50 ms, 1 s)
// and drains the beats that arrived (runtime/heartbeat.h). A peer not heard from for
// peer_timeout_s (counted from Create) is lost. A slow peer, its training thread busy or asleep
// for minutes, is never lost: its liveness thread keeps beating. A peer that calls Leave() is
// no longer watched (a clean shutdown is never a loss). Time this rank's own liveness thread was
// not running (this process stopped, a starved scheduler) does not count against peers: beats
// may be sitting unread in our queue.
//
// On loss, once, on the liveness thread:
//   1. Check() starts returning kPeerLost, its message naming every lost rank, its host and the
//      timeout; the same line goes to stderr once, prefixed "poseidon: ".
//   2. When abort_on_loss: a timer armed now calls MPI_Abort(MPI_COMM_WORLD, kPeerLostExitCode)
//      grace_s later. It waits for nothing else (not the engine thread, which may be stuck in a
//      vendor call with the lost peer, nor any MPI operation), so the bound holds whatever
//      on_lost or the rest of the process does.
//   3. on_lost(status), then every observer (AddObserver), run on the liveness thread (an
//      engine fails its handles there). They should return promptly: the liveness thread keeps
//      beating only after they return.
//
// Inert objects (Check() always OK, no thread, no traffic): peer_timeout_s == 0, a single rank,
// or MPI below MPI_THREAD_MULTIPLE (the liveness thread cannot call MPI beside the engine
// thread; rank 0 logs a warning once naming POSEIDON_PEER_TIMEOUT_S).
//
// Threading: Create is collective over comm. Check() is lock-free until a loss (an atomic flag)
// and safe from any thread. Leave() and the destructor are local and return within ~100 ms.
// MPI_Finalize calls Leave() on every Liveness still running (an attribute on MPI_COMM_SELF).
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/backend.h"
#include "runtime/status.h"

namespace poseidon {

class HeartbeatChannel;

struct LivenessOptions {
  // Seconds without any beat from a peer after which it is lost; 0 disables liveness. Must be
  // the same on every rank (Create checks it). POSEIDON_PEER_TIMEOUT_S.
  double peer_timeout_s = 60;
  // Whether a loss ends the job (MPI_Abort after grace_s). POSEIDON_PEER_LOST_ABORT.
  bool abort_on_loss = true;
  // Seconds between the loss and MPI_Abort, for on_lost and the error to reach the user.
  double grace_s = 2;
};

// The exit code MPI_Abort passes to mpirun when a peer is lost (StatusCode::kPeerLost's value).
constexpr int kPeerLostExitCode = static_cast<int>(StatusCode::kPeerLost);

class Liveness : public Interrupt {
 public:
  // Collective over comm (every rank, same peer_timeout_s): one MPI_Comm_dup, one host-name
  // allgather and one allreduce that checks the options agree. An invalid or differing
  // peer_timeout_s or grace_s fails Create on every rank (kInvalidArgument). on_lost may be
  // empty.
  static Result<std::unique_ptr<Liveness>> Create(MPI_Comm comm, const LivenessOptions& options,
                                                  std::function<void(const Status&)> on_lost);
  // Leave() if not done.
  ~Liveness() override;

  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

  // OK, or the kPeerLost status once a peer has been declared lost (it stays so, Leave included).
  Status Check() const override;

  // Sends "leaving" to every watched peer, which stops watching this rank, and stops the
  // thread. Not collective; returns within ~100 ms (plus an on_lost call under way). Idempotent.
  // Called from on_lost it only asks the thread to stop (it cannot join itself); on_lost must
  // not destroy the object.
  void Leave();

  // More code to run on loss, after on_lost, on the liveness thread (an engine fails its
  // handles there); called at once, on this thread, when the loss is already declared. Returns
  // an id for RemoveObserver, which returns only after a call under way has finished.
  int AddObserver(std::function<void(const Status&)> on_lost);
  void RemoveObserver(int id);

  // Changes what a loss does from now on (POSEIDON_PEER_LOST_ABORT / _GRACE_S for this rank;
  // an engine sets its own options on the communicator's watch). Returns the previous values.
  std::pair<bool, double> SetAbort(bool abort_on_loss, double grace_s);
  double peer_timeout_s() const { return options_.peer_timeout_s; }

  // Whether this object watches peers (false for the inert cases above).
  bool active() const { return active_; }
  // Seconds between beats; 0 when inert.
  double interval_s() const { return interval_s_; }

 private:
  Liveness() = default;
  void Run();
  static void RegisterForFinalize(Liveness* l);
  static void UnregisterForFinalize(Liveness* l);
  // Builds the status naming the lost peers, publishes it, prints it, arms the abort timer and
  // calls on_lost. Liveness thread only.
  void DeclareLost(const std::string& lost);
  // After the loop: tells every peer still watching this rank that it leaves (~100 ms at most).
  void SendLeaving(uint64_t seq, const std::vector<char>& peer_left);

  // Set by Create, read-only afterwards but for abort_on_loss and grace_s (abort_mu_).
  LivenessOptions options_;
  mutable std::mutex abort_mu_;  // a leaf
  std::function<void(const Status&)> on_lost_;
  double interval_s_ = 0;
  bool active_ = false;
  std::chrono::steady_clock::time_point start_;
  std::unique_ptr<HeartbeatChannel> channel_;  // used by the liveness thread only while it runs

  std::atomic<bool> lost_{false};  // set (release) after status_ is written

  // Lock order: leave_mu_, then thread_mu_. status_mu_ is a leaf (never held while taking
  // another lock or calling out).
  std::mutex leave_mu_;  // serializes Leave() (a user thread and the destructor)
  std::mutex thread_mu_;
  std::condition_variable wake_;  // with thread_mu_: stop_ was set
  bool stop_ = false;             // guarded by thread_mu_
  std::mutex observers_mu_;  // held while observers run
  std::vector<std::pair<int, std::function<void(const Status&)>>> observers_;
  int next_observer_ = 1;  // guarded by observers_mu_
  mutable std::mutex status_mu_;
  Status status_;  // guarded by status_mu_; non-OK once lost_ is set

  std::thread thread_;
};

}  // namespace poseidon
