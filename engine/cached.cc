// The engine thread's cached cycle (response_cache.h has the protocol): one op of the learned
// schedule, with no negotiation round.
//   1. Wait (sleeping on the submission condition variable, never spinning) until every layer
//      of the op has a submission here, or until this rank cannot run the op as cached: a
//      shutdown or an error here, a submission the schedule does not hold or whose descriptor
//      differs, a user thread waiting on an incomplete group, or the patience ran out.
//      Submit wakes the sleeper only for what it can act on (ArmLocked).
// The waiter runs (RunForWaiter): a user thread in Handle::Wait that finds the engine thread
// asleep here and the op complete runs steps 2-3 itself, holding exec_mu_ as the engine
// thread would: the ops run one at a time, in schedule order, whichever thread runs them, so
// every rank's sequence of collectives is the same.
//   2. One fused allreduce of the op's data (zeros when not ready) and the trailer.
//   3. From the summed trailer (the same on every rank): commit, and go on with the next op;
//      or keep every input and return to negotiation, failing first on an error or shutdown
//      flag exactly as a negotiated round would.
#include <algorithm>
#include <chrono>
#include <thread>

#include "engine/engine.h"
#include "runtime/log.h"

namespace poseidon {

namespace {

double NowUs() { return engine::Timeline::NowUs(); }

}  // namespace

Engine::CachedReadiness Engine::CheckCachedOp(const engine::CachedOp& op) const {
  CachedReadiness r;
  for (int l = 0; l < num_layers_ && !r.deviates; ++l) {
    r.deviates = !queues_[static_cast<size_t>(l)].empty() && !in_schedule_[static_cast<size_t>(l)];
  }
  r.complete = true;
  for (size_t i = 0; i < op.layers.size() && !r.deviates; ++i) {
    const auto& q = queues_[static_cast<size_t>(op.layers[i])];
    if (q.empty()) {
      r.complete = false;
      continue;
    }
    engine::Descriptor head = q.front().desc, want = op.descs[i];
    head.step = want.step = 0;
    r.deviates = !(head == want);
  }
  if (r.deviates) r.complete = false;
  return r;
}

void Engine::ArmLocked() {
  for (int l : armed_) {
    if (wake_on_[static_cast<size_t>(l)] == kWakeAwaited) {
      wake_on_[static_cast<size_t>(l)] = kWakeQuiet;
    }
  }
  armed_.clear();
  awaited_ = 0;
  kick_ = false;
  if (!cached_ || halted_) return;
  const engine::CachedOp& op = schedule_[next_op_];
  for (int l : op.layers) {
    if (!queues_[static_cast<size_t>(l)].empty()) continue;
    bool arriving = false;
    for (const Entry& e : incoming_) arriving = arriving || e.desc.layer == l;
    if (arriving) continue;
    wake_on_[static_cast<size_t>(l)] = kWakeAwaited;
    armed_.push_back(l);
    ++awaited_;
  }
  awaited_last_ = next_op_ + 1 == schedule_.size();
}

bool Engine::CachedCycle(std::unique_lock<std::mutex>* exec) {
  // How long the sleep below lasts without a wake-up. Long in the steady state, where every
  // wake-up takes a core from the training thread (ranks share cores): it is then only the
  // grain of the patience check. Short (kGraceUs) while a user thread waits on an incomplete
  // op (the grace below; WaiterBlocks wakes this thread when one starts to wait) or while a
  // step's last op lies complete with nobody waiting for it (once, see below).
  constexpr auto kIdleTick = std::chrono::milliseconds(50);
  constexpr auto kShortTick = std::chrono::milliseconds(5);
  constexpr double kGraceUs = 5000;
  bool short_tick = false;
  const size_t op_index = next_op_;
  const engine::CachedOp& op = schedule_[op_index];
  // 1. Readiness.
  const double start = NowUs();
  double waiting_since = -1;  // a user thread has been waiting since (while incomplete)
  bool ready = false, shutdown = false;
  const char* why = "";
  // A waiter that found exec_mu_ taken (RunForWaiter) raises waiter_blocked_ once; this cycle
  // takes the flag into `blocked` (clearing it), so an op still incomplete then does not keep
  // this thread from sleeping: it would spin on the core the training thread needs.
  bool blocked = false;
  for (bool first = true;; first = false) {
    if (!first) {
      // Sleep until the op's missing layers have all arrived (Submit wakes this thread only
      // then, or for a layer outside the schedule), an error, a shutdown, or a tick has
      // passed (the waiting and patience checks below; an op nobody ran). Waiters may run
      // ops meanwhile (RunForWaiter): on waking, a changed op starts a fresh cycle.
      {
        std::unique_lock<std::mutex> lock(mu_);
        const bool fresh = waiter_blocked_;
        waiter_blocked_ = false;
        blocked = blocked || fresh;
        if (incoming_.empty() && !fresh) {
          ArmLocked();
          EngineLink::busy = false;
          exec->unlock();
          cv_.wait_for(lock, short_tick ? kShortTick : kIdleTick, [&] {
            return kick_ || waiter_blocked_ || !local_errors_.empty() || shutdown_requested_ ||
                   !sticky_.ok();
          });
          lock.unlock();
          exec->lock();
          EngineLink::busy = true;
          if (halted_) return false;
          if (!cached_ || next_op_ != op_index) return true;
        }
      }
    }
    shutdown = TakeIncoming();
    short_tick = false;
    if (const Interrupt* in = interrupt(); in != nullptr) {
      Status lost = in->Check();
      if (!lost.ok()) {
        Fail(lost, false);
        return false;
      }
    }
    if (shutdown) {
      why = "shutdown";
      break;
    }
    if (!exec_error_.empty()) {
      why = "local error";
      break;
    }
    const CachedReadiness r = CheckCachedOp(op);
    if (r.deviates) {
      why = "a submission the schedule does not hold";
      break;
    }
    if (r.complete) {
      if (op_index + 1 == schedule_.size() && !wake_for_last_.load(std::memory_order_relaxed)) {
        // The step's last op: its user is about to wait for it and run it (RunForWaiter). Run
        // it here only for a waiter that could not (this thread held exec_mu_), or once it has
        // lain complete for kGraceUs: then nobody waits (callbacks, polling), and from now
        // on its completion wakes this thread at once.
        {
          std::lock_guard<std::mutex> lock(mu_);
          blocked = blocked || waiter_blocked_;
          waiter_blocked_ = false;
        }
        if (!blocked && link_->waiters.load(std::memory_order_seq_cst) == 0) {
          double newest = 0;
          for (int l : op.layers) {
            newest = std::max(newest, queues_[static_cast<size_t>(l)].front().submit_us);
          }
          if (NowUs() - newest < kGraceUs) {
            short_tick = true;
            continue;
          }
          wake_for_last_.store(true, std::memory_order_relaxed);
        }
      }
      ready = true;
      if (op_index + 1 == schedule_.size() && link_->waited.exchange(false)) {
        // Users wait for their handles after all (this op was run here before they came):
        // leave the step's last op to them again.
        wake_for_last_.store(false, std::memory_order_relaxed);
      }
      break;
    }
    const double now = NowUs();
    if (link_->waiters.load(std::memory_order_relaxed) > 0) {
      if (waiting_since < 0) waiting_since = now;
      // A thread blocked in Wait submits nothing more: after a short grace (another thread may
      // still submit), the group will not complete as cached.
      short_tick = true;
      if (now - waiting_since > kGraceUs) {
        why = "a user thread waits on an incomplete group";
        break;
      }
    } else {
      waiting_since = -1;
    }
    if ((now - start) * 1e-6 > patience_s_) {
      why = "patience";
      break;
    }
  }
  return CachedRound(ready, shutdown, why, start);
}

void Engine::RunForWaiter(const Handle& h) {
  // Users wait for their handles: the step's last op is theirs to run (see CachedCycle).
  wake_for_last_.store(false, std::memory_order_relaxed);
  // The engine thread holds the executor for a moment after each round (its bookkeeping,
  // while this thread, woken by that round, has already submitted the next step): wait that
  // moment out rather than leave it the op (and then the next one, and so on). Never long: the
  // engine thread may be inside an exchange, and a handle failed meanwhile (a lost peer) must
  // reach this waiter.
  // (Polled: TSan does not see std::timed_mutex's clock-based lock.)
  std::unique_lock<std::mutex> exec(exec_mu_, std::try_to_lock);
  if (!exec.owns_lock()) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
    do {
      std::this_thread::yield();
    } while (!exec.try_lock() && std::chrono::steady_clock::now() < give_up);
  }
  if (!exec.owns_lock()) {
    // The engine thread holds the executor: it runs the op if it is complete (this flag stops
    // it from leaving the step's last op to this thread), else this thread sleeps until it is.
    {
      std::lock_guard<std::mutex> lock(mu_);
      waiter_blocked_ = true;
    }
    cv_.notify_one();
    return;
  }
  EngineLink::busy = true;
  bool ran = false;
  while (!halted_ && cached_ && !h.Test()) {
    // Only a complete op that every rank will find complete too; anything else (a shutdown,
    // an error, a deviation, a lost peer) is the engine thread's, which is awake for it.
    if (TakeIncoming() || !exec_error_.empty()) break;
    if (const Interrupt* in = interrupt(); in != nullptr && !in->Check().ok()) break;
    if (!CheckCachedOp(schedule_[next_op_]).complete) break;
    ran = true;
    counters_.waiter_ops.fetch_add(1, std::memory_order_relaxed);
    if (!CachedRound(true, false, "", timeline_ ? NowUs() : 0)) {
      halted_ = true;
      break;
    }
  }
  // Stopping, or back to negotiation (a rank was not ready): the engine thread's turn at once.
  const bool wake = ran && (halted_ || !cached_);
  if (ran) {
    // The engine thread sleeps armed for an op that has run: arm it for the current one (no
    // wake-up: it would only go back to sleep), or wake it to stop or negotiate.
    std::lock_guard<std::mutex> lock(mu_);
    ArmLocked();
    kick_ = wake;
  }
  EngineLink::busy = false;
  exec.unlock();
  if (wake) cv_.notify_one();
}

bool Engine::CachedRound(bool ready, bool shutdown, const char* why, double start) {
  const engine::CachedOp& op = schedule_[next_op_];
  {
    std::lock_guard<std::mutex> lock(mu_);
    waiter_blocked_ = false;  // a blocked waiter's op may be this one; if not, Submit wakes us
  }
  // 2. The round. Its lists live in members, so a steady-state round allocates nothing.
  std::vector<engine::Descriptor>& heads = round_heads_;
  std::vector<Entry*>& entries = round_entries_;
  DenseBatch& batch = round_batch_;
  DenseBatchReport& rep = round_report_;
  heads.clear();
  entries.clear();
  batch.parts.clear();
  batch.kind = DenseBatchKind::kFused;
  batch.pad = 0;
  if (ready) {
    for (int l : op.layers) {
      Entry& e = queues_[static_cast<size_t>(l)].front();
      heads.push_back(e.desc);
      entries.push_back(&e);
      if (!e.started && timeline_) {
        timeline_->Instant(l, "submit", e.desc.step, e.submit_us);
        Record(e, "queue", e.submit_us, start);
      }
      e.started = true;
      DensePart d;
      d.layer = l;
      d.step = e.desc.step;
      d.grad = static_cast<float*>(e.grad.data);
      d.params = e.grad.params;
      d.begin = 0;
      d.end = layer_count_[static_cast<size_t>(l)];
      d.last = true;
      batch.parts.push_back(d);
    }
  } else {
    batch.pad = op.elems;
  }
  const uint64_t hash = ready ? engine::CachedOpHash(next_op_, heads) : 0;
  engine::EncodeTrailer(ready, !exec_error_.empty(), shutdown, hash, &batch.trailer);
  engine::TrailerVerdict verdict;
  const int world = comm_->size();
  batch.commit = [&verdict, world](const float* sum) {
    verdict = engine::DecodeTrailer(sum, world);
    return verdict.commit();
  };
  // Without a timeline nothing reads the times: no clock reads in the steady state.
  batch.timed = timeline_ != nullptr;
  const double t0 = batch.timed ? NowUs() : 0;
  hc_->ExchangeDense(batch, &rep);
  batch.commit = nullptr;  // it refers to this frame's verdict
  const double t1 = batch.timed ? NowUs() : 0;
  if (rep.trailer_sum.empty()) {
    // The allreduce itself failed (a lost peer, MPI): nothing is known of the others.
    Fail(rep.status.empty() ? InternalError("Engine: cached round failed") : rep.status[0],
         false);
    return false;
  }

  // 3. The verdict.
  if (rep.committed) {
    counters_.cached_ops.fetch_add(1, std::memory_order_relaxed);
    counters_.fused_groups.fetch_add(1, std::memory_order_relaxed);
    counters_.fused_layers.fetch_add(static_cast<int64_t>(op.layers.size()),
                                     std::memory_order_relaxed);
    for (size_t i = 0; i < entries.size(); ++i) {
      Record(*entries[i], "allreduce(cached)", t0, t1);
      auto& q = queues_[static_cast<size_t>(op.layers[i])];
      Entry done = std::move(q.front());
      q.pop_front();
      Finish(&done, rep.status[i]);
    }
    next_op_ = (next_op_ + 1) % schedule_.size();
    if (timeline_) timeline_->Publish();
    return true;
  }
  counters_.cache_exits.fetch_add(1, std::memory_order_relaxed);
  cached_ = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    wake_on_.clear();  // negotiated mode: every submission wakes the engine
  }
  recorder_.Reset();
  unannounced_ = true;  // negotiate at once: the queues may hold work
  if (std::string(why) == "patience") {
    // Bailing because a step takes longer than the patience costs a round each step: wait
    // longer next time, within the stall warning's reach.
    const double cap = options_.stall_warn_s > 0 ? std::max(1.0, options_.stall_warn_s / 2) : 30;
    patience_s_ = std::min(2 * patience_s_, std::min(cap, 30.0));
  }
  PSD_LOG(kDebug, "Engine: rank ", comm_->rank(), " leaves the response cache at op ", next_op_,
          " (", ready ? "ready" : why, "; all ready: ", verdict.all_ready,
          ", agree: ", verdict.agree, ")");
  if (verdict.error) {
    Fail(controller_->GatherErrors(exec_error_code_, exec_error_, interrupt()), false);
    return false;
  }
  if (verdict.shutdown) {
    Fail(AbortedError("the engine was shut down (Engine::Shutdown on some rank) before this "
                      "submission was exchanged"),
         true);
    return false;
  }
  return true;
}

}  // namespace poseidon
