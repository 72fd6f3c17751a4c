// The liveness thread, step by step (one loop iteration, about twice per beat interval):
//   0. If this iteration starts later than the thread meant to run, the lateness is added to
//      every last-heard time: while this process was stopped or starved, peers' beats may have
//      been queued unread, so that time is not their silence.
//   1. Drain the beats that arrived: each refreshes its sender's last-heard time; a "leaving"
//      beat removes the sender from the watched set.
//   2. When the interval has passed, post one beat to every peer still watching us (the channel
//      skips a peer whose previous beat is still in flight).
//   3. Once per object: any watched peer silent for peer_timeout_s is lost (DeclareLost).
//   4. Sleep until the next beat or half an interval, whichever is first.
// Leave() stops the loop; the thread then sends its "leaving" beat and exits.
#include "runtime/liveness.h"

#include <pthread.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <system_error>

#include "runtime/heartbeat.h"
#include "runtime/log.h"
#include "runtime/or_agreement.h"

namespace poseidon {
namespace {

using Clock = std::chrono::steady_clock;
using Seconds = std::chrono::duration<double>;

// How long Leave() may spend getting the leaving beat out (a frozen peer never takes it).
constexpr Seconds kLeaveBudget{0.1};

const char* ThreadLevelName(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "unknown";
}

// Ends the job grace_s from now. It waits for nothing but the clock: the engine thread may be
// stuck in a vendor call with the lost peer, and MPI requests to it never complete.
void EndJobAfter(double grace_s) {
  std::this_thread::sleep_for(Seconds(grace_s));
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Abort(MPI_COMM_WORLD, kPeerLostExitCode);
  // MPI_Abort does not return; after MPI_Finalize it may not be called at all.
  std::_Exit(kPeerLostExitCode);
}

// Liveness objects whose thread runs. MPI_Finalize stops them first (through an attribute on
// MPI_COMM_SELF, whose delete callback MPI runs at the start of MPI_Finalize while MPI is still
// usable): an object kept past it (a binding's communicator freed late) must not call MPI after.
std::mutex g_live_mu;
std::vector<Liveness*>* g_live = nullptr;  // guarded by g_live_mu; never freed (exit order)

int LeaveAllAtFinalize(MPI_Comm, int, void*, void*) {
  std::lock_guard<std::mutex> lock(g_live_mu);
  if (g_live != nullptr) {
    for (Liveness* l : *g_live) l->Leave();
  }
  return MPI_SUCCESS;
}

std::string OneDecimal(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

}  // namespace

Result<std::unique_ptr<Liveness>> Liveness::Create(MPI_Comm comm, const LivenessOptions& options,
                                                   std::function<void(const Status&)> on_lost) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  PSD_REQUIRE(initialized && !finalized, StatusCode::kInvalidArgument, "Liveness::Create: MPI is ",
              finalized ? "already finalized" : "not initialized",
              "; expected it initialized (poseidon::InitMpi) and not yet finalized");
  PSD_REQUIRE_ARG(comm != MPI_COMM_NULL, "Liveness::Create: comm is MPI_COMM_NULL");

  std::unique_ptr<Liveness> l(new Liveness());
  l->options_ = options;
  l->on_lost_ = std::move(on_lost);

  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    // The liveness thread would call MPI while the engine thread does. The thread level is the
    // same on every rank (one program), so every rank skips the collectives below alike.
    static std::atomic<bool> warned{false};
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    if (options.peer_timeout_s != 0 && rank == 0 && !warned.exchange(true)) {
      PSD_LOG(kWarn, "Liveness: MPI provides ", ThreadLevelName(provided),
              ", below MPI_THREAD_MULTIPLE, so no heartbeat thread can run beside the engine "
              "thread: a frozen peer is not detected (POSEIDON_PEER_TIMEOUT_S=",
              options.peer_timeout_s,
              " has no effect; initialize MPI with MPI_THREAD_MULTIPLE, as poseidon::InitMpi "
              "does)");
    }
    return l;
  }

  // Every rank makes the same collectives whatever its options, so that a rank with different
  // options fails here with the others instead of leaving them waiting.
  PSD_ASSIGN_OR_RETURN(l->channel_, HeartbeatChannel::Create(comm));
  const double timeout = options.peer_timeout_s;
  const bool valid = std::isfinite(timeout) && timeout >= 0 && std::isfinite(options.grace_s) &&
                     options.grace_s >= 0;
  const double t = valid ? timeout + 0.0 : 0;  // + 0.0: -0 and 0 agree
  // The timeout as an agreed value and an "invalid here" flag, in one OR round.
  uint64_t words[3];
  uint64_t bits = 0;
  std::memcpy(&bits, &t, sizeof(bits));
  or_agreement::PutValue(words, bits);
  words[2] = valid ? 0 : 1;
  PSD_CHECK(l->channel_->OrOverRanks(words, 3));
  PSD_REQUIRE_ARG(valid, "Liveness::Create: peer_timeout_s is ", timeout, " and grace_s is ",
                  options.grace_s,
                  "; expected finite values >= 0 (POSEIDON_PEER_TIMEOUT_S, 0 disables liveness)");
  PSD_REQUIRE_ARG(words[2] == 0,
                  "Liveness::Create: another rank passed an invalid peer_timeout_s or grace_s "
                  "(its own error names them); expected finite values >= 0 on every rank");
  if (!or_agreement::AllSame(words)) {
    PSD_ASSIGN_OR_RETURN(std::vector<double> all, l->channel_->GatherValues(t));
    const auto [lo, hi] = std::minmax_element(all.begin(), all.end());
    return InvalidArgument("Liveness::Create: peer_timeout_s differs across ranks (", *lo,
                           " s to ", *hi, " s; this rank ", t,
                           " s); expected the same value on every rank (POSEIDON_PEER_TIMEOUT_S)");
  }
  if (t == 0 || l->channel_->size() == 1) {
    l->channel_.reset();  // only collectives ran on it: freed at once
    return l;
  }

  l->interval_s_ = std::clamp(t / 10, 0.05, 1.0);
  l->start_ = Clock::now();
  try {
    l->thread_ = std::thread(&Liveness::Run, l.get());
  } catch (const std::system_error& e) {
    return InternalError("Liveness::Create: could not start the liveness thread: ", e.what());
  }
  l->active_ = true;
  RegisterForFinalize(l.get());
  return l;
}

Liveness::~Liveness() {
  UnregisterForFinalize(this);
  Leave();
}

Status Liveness::Check() const {
  if (!lost_.load(std::memory_order_acquire)) return Status::Ok();
  std::lock_guard<std::mutex> lock(status_mu_);
  return status_;
}

void Liveness::Leave() {
  if (thread_.joinable() && std::this_thread::get_id() == thread_.get_id()) {
    // From on_lost: the thread cannot join itself; it leaves when on_lost returns.
    std::lock_guard<std::mutex> lock(thread_mu_);
    stop_ = true;
    return;
  }
  std::lock_guard<std::mutex> leave_lock(leave_mu_);
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(thread_mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Liveness::Run() {
  pthread_setname_np(pthread_self(), "psd-liveness");
  const int me = channel_->rank();
  const size_t n = static_cast<size_t>(channel_->size());
  const Seconds timeout(options_.peer_timeout_s);
  const Seconds interval(interval_s_);
  const auto tick = std::chrono::duration_cast<Clock::duration>(interval / 2);

  std::vector<Clock::time_point> last_heard(n, start_);
  std::vector<char> peer_left(n, 0);
  peer_left[static_cast<size_t>(me)] = 1;  // never watch or beat ourselves
  std::vector<Beat> arrived;
  Status transport;  // the first channel error: the channel is not used after it
  uint64_t seq = 0;
  Clock::time_point next_beat = Clock::now();
  bool declared = false;

  auto note = [&](const Status& s) {
    if (s.ok() || !transport.ok()) return;
    transport = s;
    PSD_LOG(kError,
            "Liveness: the heartbeat channel failed, so from now on every watched peer "
            "looks silent: ",
            s.ToString());
  };

  Clock::time_point wake_at = start_;  // when this thread means to run next
  while (true) {
    // 0. Our own stall. Every decision below uses `now`, taken before this iteration's poll:
    // a stall that starts later in the iteration is charged to the next one, which is
    // forgiven in turn, so a freeze at any point of the loop is never a peer's silence.
    const Clock::time_point now = Clock::now();
    if (now > wake_at) {
      for (Clock::time_point& t : last_heard) t += now - wake_at;
    }
    // 1. Arrivals, stamped when drained (which may be later than `now`).
    if (transport.ok()) {
      arrived.clear();
      Status polled = channel_->Poll(&arrived);
      const Clock::time_point heard = Clock::now();
      for (const Beat& b : arrived) {
        last_heard[static_cast<size_t>(b.from)] = heard;
        if (b.leaving) peer_left[static_cast<size_t>(b.from)] = 1;
      }
      note(polled);
    }
    // 2. Our beat.
    if (now >= next_beat && transport.ok()) {
      ++seq;
      for (size_t p = 0; p < n && transport.ok(); ++p) {
        if (!peer_left[p]) note(channel_->Send(static_cast<int>(p), seq, false).status());
      }
      next_beat = now + std::chrono::duration_cast<Clock::duration>(interval);
    }
    // 3. Loss, declared once (later losses add nothing: the job is ending or already failed).
    if (!declared) {
      std::string lost;
      for (size_t p = 0; p < n; ++p) {
        const Seconds silent = now - last_heard[p];
        if (peer_left[p] || silent < timeout) continue;
        lost += StrCat(lost.empty() ? "" : "; ", "lost peer rank ", p, " (host ",
                       channel_->host(static_cast<int>(p)), "): no heartbeat for ",
                       OneDecimal(silent.count()), " s");
      }
      if (!lost.empty()) {
        declared = true;
        if (!transport.ok()) {
          lost += StrCat(" (the heartbeat channel failed: ", transport.message(), ")");
        }
        DeclareLost(lost);
      }
    }
    // 4. Sleep. The next wake-up counts from `now`, not from the end of this iteration, so that
    // a stall after `now` (this process stopped or starved mid-iteration) makes the next
    // iteration late and is forgiven there (step 0); the iteration's own work is microseconds.
    std::unique_lock<std::mutex> lock(thread_mu_);
    wake_at = std::min(next_beat, now + tick);
    if (wake_.wait_until(lock, wake_at, [this] { return stop_; })) break;
  }
  if (transport.ok()) SendLeaving(seq + 1, peer_left);
}

void Liveness::SendLeaving(uint64_t seq, const std::vector<char>& peer_left) {
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(kLeaveBudget);
  // A beat still in flight would make Send skip the leaving one; to a live peer it completes
  // at once, to a frozen one never (and a frozen peer is not watching anyway).
  auto wait_sends = [&](Clock::time_point until) {
    while (Clock::now() < until) {
      Result<bool> done = channel_->SendsDone();
      if (!done.ok() || *done) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  wait_sends(Clock::now() + (deadline - Clock::now()) / 2);
  // Send skips a peer whose previous beat is still in flight; retry it until the budget runs
  // out, since a live peer that never gets the leaving beat would declare this rank lost.
  std::vector<char> pending(peer_left.size());
  for (size_t p = 0; p < peer_left.size(); ++p) pending[p] = !peer_left[p];
  while (true) {
    bool any = false;
    for (size_t p = 0; p < pending.size(); ++p) {
      if (!pending[p]) continue;
      Result<bool> sent = channel_->Send(static_cast<int>(p), seq, true);
      if (!sent.ok()) return;  // the job is failing anyway; peers will see silence
      pending[p] = !*sent;
      any = any || pending[p];
    }
    if (!any || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  wait_sends(deadline);
}

std::pair<bool, double> Liveness::SetAbort(bool abort_on_loss, double grace_s) {
  std::lock_guard<std::mutex> lock(abort_mu_);
  std::pair<bool, double> before{options_.abort_on_loss, options_.grace_s};
  options_.abort_on_loss = abort_on_loss;
  options_.grace_s = grace_s;
  return before;
}

void Liveness::DeclareLost(const std::string& lost) {
  const int me = channel_->rank();
  bool abort_on_loss = false;
  double grace_s = 0;
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    abort_on_loss = options_.abort_on_loss;
    grace_s = options_.grace_s;
  }
  std::string message = StrCat("rank ", me, " (host ", channel_->host(me), "): ", lost,
                               " (POSEIDON_PEER_TIMEOUT_S=", options_.peer_timeout_s, "); ");
  if (abort_on_loss) {
    message += StrCat("the job ends in ", grace_s,
                      " s (POSEIDON_PEER_LOST_ABORT=0 keeps it running)");
  } else {
    message += "POSEIDON_PEER_LOST_ABORT=0: the job keeps running";
  }
  Status status = PeerLostError(message);
  {
    std::lock_guard<std::mutex> lock(status_mu_);
    status_ = status;
  }
  lost_.store(true, std::memory_order_release);
  std::fprintf(stderr, "poseidon: %s\n", message.c_str());
  std::fflush(stderr);

  // The timer runs on a thread of its own so that the bound holds even if on_lost blocks.
  bool timer_armed = false;
  if (abort_on_loss) {
    try {
      std::thread(EndJobAfter, grace_s).detach();
      timer_armed = true;
    } catch (const std::system_error&) {
      // No thread to spare: this thread keeps the time itself, after on_lost.
    }
  }
  const Clock::time_point declared_at = Clock::now();
  auto call = [&status](const std::function<void(const Status&)>& f) {
    // Exceptions never leave a Poseidon thread.
    try {
      f(status);
    } catch (const std::exception& e) {
      PSD_LOG(kError, "Liveness: on_lost threw: ", e.what());
    } catch (...) {
      PSD_LOG(kError, "Liveness: on_lost threw a non-standard exception");
    }
  };
  if (on_lost_) call(on_lost_);
  {
    std::lock_guard<std::mutex> lock(observers_mu_);
    for (const auto& [id, f] : observers_) call(f);
  }
  if (abort_on_loss && !timer_armed) {
    const Seconds spent = Clock::now() - declared_at;
    EndJobAfter(std::max(0.0, grace_s - spent.count()));
  }
}

int Liveness::AddObserver(std::function<void(const Status&)> on_lost) {
  Status now;
  int id = 0;
  {
    std::lock_guard<std::mutex> lock(observers_mu_);
    id = next_observer_++;
    if (!lost_.load(std::memory_order_acquire)) {
      observers_.emplace_back(id, std::move(on_lost));
      return id;
    }
  }
  // Already lost: the observer hears it at once, on this thread.
  now = Check();
  if (on_lost) on_lost(now);
  return id;
}

void Liveness::RemoveObserver(int id) {
  std::lock_guard<std::mutex> lock(observers_mu_);
  observers_.erase(std::remove_if(observers_.begin(), observers_.end(),
                                  [id](const auto& o) { return o.first == id; }),
                   observers_.end());
}

void Liveness::RegisterForFinalize(Liveness* l) {
  std::lock_guard<std::mutex> lock(g_live_mu);
  if (g_live == nullptr) {
    g_live = new std::vector<Liveness*>();
    int key = MPI_KEYVAL_INVALID;
    if (MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, LeaveAllAtFinalize, &key, nullptr) ==
        MPI_SUCCESS) {
      MPI_Comm_set_attr(MPI_COMM_SELF, key, nullptr);
    }
  }
  g_live->push_back(l);
}

void Liveness::UnregisterForFinalize(Liveness* l) {
  std::lock_guard<std::mutex> lock(g_live_mu);
  if (g_live == nullptr) return;
  g_live->erase(std::remove(g_live->begin(), g_live->end(), l), g_live->end());
}

}  // namespace poseidon
