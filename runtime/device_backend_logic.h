// The device backends' logic that needs no CUDA, NCCL or MPI, kept apart so that it is tested
// alone (test/unit/device_backend_logic_test.cc):
//  - Deadline: one bound on a wait, POSEIDON_PEER_TIMEOUT_S by default, 0 = none;
//  - DeadlineInterrupt: a Deadline as an Interrupt, for the MPI waits of NcclBackend::Create;
//  - Backoff: the pause between two polls of a wait;
//  - ProgressWatch: the NCCL watchdog's rule (pending work with no completion for the bound);
//  - GrowCapacity: how scratch buffers grow (rarely, never shrinking);
//  - PlanReduceScatter: which NCCL calls a ReduceScatter with any counts turns into.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/backend.h"
#include "runtime/status.h"

namespace poseidon {
namespace device {

using Clock = std::chrono::steady_clock;

// "POSEIDON_PEER_TIMEOUT_S = 2.5 s": how every deadline error names its bound.
inline std::string BoundText(double seconds) {
  return StrCat("POSEIDON_PEER_TIMEOUT_S = ", seconds, " s");
}

// A bound of `seconds` from `start`. seconds <= 0 (or not finite) never expires, the meaning of
// POSEIDON_PEER_TIMEOUT_S = 0.
class Deadline {
 public:
  Deadline() = default;  // never expires
  Deadline(double seconds, Clock::time_point start)
      : seconds_(std::isfinite(seconds) && seconds > 0 ? seconds : 0),
        end_(start + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(seconds_))) {}
  static Deadline After(double seconds) { return Deadline(seconds, Clock::now()); }

  bool enabled() const { return seconds_ > 0; }
  double seconds() const { return seconds_; }
  bool Expired(Clock::time_point now = Clock::now()) const { return enabled() && now >= end_; }
  // Seconds left: infinity when disabled, 0 once expired.
  double RemainingS(Clock::time_point now = Clock::now()) const {
    if (!enabled()) return std::numeric_limits<double>::infinity();
    return now >= end_ ? 0.0 : std::chrono::duration<double>(end_ - now).count();
  }

 private:
  double seconds_ = 0;
  Clock::time_point end_{};
};

// kTimeout "<what> did not finish within POSEIDON_PEER_TIMEOUT_S = <s> s<why>".
inline Status DeadlineError(const std::string& what, double seconds, const std::string& why) {
  return TimeoutError(what, " did not finish within ", BoundText(seconds), why);
}

// A Deadline as an Interrupt (WaitMpi polls it): OK until the deadline, then the kTimeout
// naming `what` and the bound. Never fires when the deadline is disabled.
class DeadlineInterrupt : public Interrupt {
 public:
  DeadlineInterrupt(std::string what, Deadline deadline, std::string why)
      : what_(std::move(what)), why_(std::move(why)), deadline_(deadline) {}
  Status Check() const override {
    if (!deadline_.Expired()) return Status::Ok();
    return DeadlineError(what_, deadline_.seconds(), why_);
  }

 private:
  std::string what_, why_;
  Deadline deadline_;
};

// The pause between two polls of a wait: yields for the first 5 ms (work about to finish costs
// no sleep), then sleeps 8 us doubling to 1 ms (a long wait does not burn a shared core).
class Backoff {
 public:
  // The pause the next Pause() takes: 0 while yielding.
  std::chrono::microseconds Next(Clock::time_point now) const {
    if (now - start_ < std::chrono::milliseconds(5)) return std::chrono::microseconds(0);
    return sleep_;
  }
  void Pause() {
    const std::chrono::microseconds next = Next(Clock::now());
    if (next.count() == 0) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(next);
    sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(1000));
  }

 private:
  Clock::time_point start_ = Clock::now();
  std::chrono::microseconds sleep_{8};
};

// The NCCL watchdog's rule. Operations are enqueued and complete (in any order); the work is
// overdue once some is pending and none has completed for timeout_s, counted from the last
// completion or from the enqueue that ended an idle period. A dead or stopped peer, or ranks
// calling different collectives, complete nothing. The watchdog cannot tell a stall from a
// single operation that needs longer than the bound, nor from one queued behind longer work on
// its stream: the bound must exceed both. timeout_s <= 0 never declares anything overdue.
class ProgressWatch {
 public:
  explicit ProgressWatch(double timeout_s = 0)
      : timeout_s_(std::isfinite(timeout_s) && timeout_s > 0 ? timeout_s : 0) {}

  void Enqueued(Clock::time_point now) {
    if (pending_++ == 0) last_ = now;
  }
  // n operations were seen complete at `now` (n may be 0).
  void Completed(size_t n, Clock::time_point now) {
    if (n == 0) return;
    pending_ = n >= pending_ ? 0 : pending_ - n;
    last_ = now;
  }
  size_t pending() const { return pending_; }
  double timeout_s() const { return timeout_s_; }
  // Seconds since the last progress while work is pending; 0 when idle.
  double StalledS(Clock::time_point now) const {
    if (pending_ == 0 || now <= last_) return 0;
    return std::chrono::duration<double>(now - last_).count();
  }
  bool Overdue(Clock::time_point now) const {
    return timeout_s_ > 0 && pending_ > 0 && StalledS(now) >= timeout_s_;
  }

 private:
  double timeout_s_ = 0;
  size_t pending_ = 0;
  Clock::time_point last_{};
};

// The capacity a grow-only scratch buffer takes to hold `needed` bytes: `capacity` when it
// already does; else at least twice `capacity` and `needed`, rounded up to 1 MiB. A slowly
// growing size therefore reallocates O(log(size)) times, and a steady one never.
inline size_t GrowCapacity(size_t capacity, size_t needed) {
  if (needed <= capacity) return capacity;
  constexpr size_t kStep = size_t{1} << 20;
  size_t want = needed;
  if (capacity <= std::numeric_limits<size_t>::max() / 2) want = std::max(want, capacity * 2);
  if (want > std::numeric_limits<size_t>::max() - (kStep - 1)) return want;
  return (want + kStep - 1) / kStep * kStep;
}

// One rank's shard of a ReduceScatter as one NCCL reduce rooted at its owner.
struct ReducePiece {
  int root = 0;
  size_t offset = 0;  // elements, into the send buffer
  size_t count = 0;
};

// How a ReduceScatter with counts[r] elements for rank r runs on NCCL:
//  - kNothing: every count is 0;
//  - kEven: every count equals `even`: one ncclReduceScatter;
//  - kPerOwner: one ncclReduce per rank with a non-empty shard, rooted at that rank and reading
//    its slice in place, all inside one ncclGroupStart / ncclGroupEnd. No re-layout copy and
//    no scratch; over NCCL's ring each rank but the root sends the slice once, so the bytes
//    on the wire equal a padded ring reduce-scatter's ((P - 1) / P of the buffer per rank).
struct ReduceScatterPlan {
  enum class Kind { kNothing, kEven, kPerOwner };
  Kind kind = Kind::kNothing;
  size_t even = 0;
  std::vector<ReducePiece> pieces;  // kPerOwner only, in rank order
  size_t total = 0;                 // sum of counts
  size_t mine = 0;                  // counts[rank]
  size_t mine_offset = 0;           // where this rank's slice starts in the send buffer
};

inline ReduceScatterPlan PlanReduceScatter(const std::vector<size_t>& counts, int rank) {
  ReduceScatterPlan plan;
  size_t offset = 0;
  bool even = true;
  for (size_t r = 0; r < counts.size(); ++r) {
    if (static_cast<int>(r) == rank) {
      plan.mine = counts[r];
      plan.mine_offset = offset;
    }
    even = even && counts[r] == counts[0];
    offset += counts[r];
  }
  plan.total = offset;
  if (plan.total == 0) return plan;
  if (even) {
    plan.kind = ReduceScatterPlan::Kind::kEven;
    plan.even = counts[0];
    return plan;
  }
  plan.kind = ReduceScatterPlan::Kind::kPerOwner;
  offset = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    if (counts[r] > 0) plan.pieces.push_back({static_cast<int>(r), offset, counts[r]});
    offset += counts[r];
  }
  return plan;
}

}  // namespace device
}  // namespace poseidon
