// The engine thread's cached cycle (response_cache.h has the protocol): one op of the learned
// schedule, with no negotiation round.
//   1. Wait (sleeping on the submission condition variable, never spinning) until every layer
//      of the op has a submission here, or until this rank cannot run the op as cached: a
//      shutdown or an error here, a submission the schedule does not hold or whose descriptor
//      differs, a user thread waiting on an incomplete group, or the patience ran out.
//   2. One fused allreduce of the op's data (zeros when not ready) and the trailer.
//   3. From the summed trailer (the same on every rank): commit, and go on with the next op;
//      or keep every input and return to negotiation, failing first on an error or shutdown
//      flag exactly as a negotiated round would.
#include <algorithm>
#include <chrono>

#include "engine/engine.h"
#include "runtime/log.h"

namespace poseidon {

namespace {

double NowUs() { return engine::Timeline::NowUs(); }

}  // namespace

bool Engine::CachedCycle() {
  const engine::CachedOp& op = schedule_[next_op_];
  // 1. Readiness.
  const double start = NowUs();
  double waiting_since = -1;  // a user thread has been waiting since (while incomplete)
  bool ready = false, shutdown = false;
  const char* why = "";
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::microseconds(1000), [&] {
        return !incoming_.empty() || !local_errors_.empty() || shutdown_requested_ ||
               !sticky_.ok();
      });
    }
    shutdown = TakeIncoming();
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
    bool deviates = false, complete = true;
    for (int l = 0; l < num_layers_ && !deviates; ++l) {
      deviates = !queues_[static_cast<size_t>(l)].empty() && !in_schedule_[static_cast<size_t>(l)];
    }
    for (size_t i = 0; i < op.layers.size() && !deviates; ++i) {
      const auto& q = queues_[static_cast<size_t>(op.layers[i])];
      if (q.empty()) {
        complete = false;
        continue;
      }
      engine::Descriptor head = q.front().desc, want = op.descs[i];
      head.step = want.step = 0;
      deviates = !(head == want);
    }
    if (deviates) {
      why = "a submission the schedule does not hold";
      break;
    }
    if (complete) {
      ready = true;
      break;
    }
    const double now = NowUs();
    if (waiters_->load(std::memory_order_relaxed) > 0) {
      if (waiting_since < 0) waiting_since = now;
      // A thread blocked in Wait submits nothing more: after a short grace (another thread may
      // still submit), the group will not complete as cached.
      if (now - waiting_since > 5000) {
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

  // 2. The round.
  std::vector<engine::Descriptor> heads;
  DenseBatch batch;
  batch.kind = DenseBatchKind::kFused;
  std::vector<Entry*> entries;
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
  batch.trailer = engine::EncodeTrailer(ready, !exec_error_.empty(), shutdown, hash);
  engine::TrailerVerdict verdict;
  const int world = comm_->size();
  batch.commit = [&](const float* sum) {
    verdict = engine::DecodeTrailer(sum, world);
    return verdict.commit();
  };
  const double t0 = NowUs();
  const DenseBatchReport rep = hc_->ExchangeDense(batch);
  const double t1 = NowUs();
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
