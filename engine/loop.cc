// The engine thread's negotiated cycle (see engine.h for the contract):
//   1. Take new submissions (under mu_) into per-layer FIFO queues; sleep up to the cycle time
//      first when the previous cycle ran nothing and nothing new arrived; an idle engine woken
//      by a submission holds a short fusion window (POSEIDON_FUSION_WAIT_US) unless a user
//      thread already waits.
//   2. Fill the negotiation vector: the head of each non-empty queue marks its layer ready and
//      contributes its descriptor hash; flags for a local error, a stall past the warn / abort
//      limits, a requested shutdown.
//   3. One bitwise-OR reduction through the controller, polled against the liveness monitor.
//      Pipelined (POSEIDON_PIPELINE_NEGOTIATION): a cycle that runs layers plans its ops first,
//      which leaves the queues as the cycle will leave them, then posts the next cycle's
//      vector and only then runs the exchanges.
//   4. Decide from the reduced vector (identical on every rank):
//        error flag        -> gather every rank's error text, fail everywhere;
//        hash mismatch     -> gather every rank's waiting descriptors, fail with kMismatch;
//        stall warn/abort  -> gather the ready masks; rank 0 logs, or fail with kTimeout;
//        shutdown flag     -> fail what is pending with kAborted and stop;
//        otherwise run the layers ready everywhere, lowest index first (fusion.h decides
//        fused / chunked / direct / strategy; the dense ones go to
//        HybridCollective::ExchangeDense, the others to their strategy).
//   5. Complete handles as their op finishes; publish timeline records. When the last two
//      steps ran the same cacheable schedule, switch to the response cache (cached.cc).
// Every gather in step 4 is collective, and all ranks enter it because they read the same
// reduced flags: that is how a disagreement becomes an error on every rank instead of a hang.
#include <algorithm>
#include <chrono>
#include <utility>

#include "engine/engine.h"
#include "engine/fusion.h"
#include "runtime/log.h"

namespace poseidon {

namespace {

double NowUs() { return engine::Timeline::NowUs(); }

}  // namespace

void Engine::BuildVector(bool shutdown) {
  engine::NegotiationVector& send = controller_->send();
  send.Clear();
  const double now = NowUs();
  for (int l = 0; l < num_layers_; ++l) {
    const auto& q = queues_[static_cast<size_t>(l)];
    if (!q.empty()) send.SetReady(l, q.front().desc.Hash());
    const double since = stall_since_us_[static_cast<size_t>(l)];
    if (since < 0) continue;
    const double waited_s = (now - since) * 1e-6;
    if (options_.stall_warn_s > 0 && waited_s >= options_.stall_warn_s &&
        !stall_warned_[static_cast<size_t>(l)]) {
      send.SetFlag(engine::kFlagStallWarn);
    }
    if (options_.stall_abort_s > 0 && waited_s >= options_.stall_abort_s) {
      send.SetFlag(engine::kFlagStallAbort);
    }
  }
  if (!exec_error_.empty()) send.SetFlag(engine::kFlagError);
  if (shutdown) send.SetFlag(engine::kFlagShutdown);
  unannounced_ = false;
}

bool Engine::Cycle() {
  // 1. New submissions. An engine whose next negotiation is already in flight (posted while
  // the last exchange ran) goes straight to it; so does one holding unannounced work.
  if (!controller_->pending()) {
    // Work announced here but not yet everywhere: negotiate again at once, so the round that
    // finds it ready on every rank starts as soon as the last rank posts (each round waits for
    // every rank anyway, so this never spins ahead of the others).
    bool waiting = false;
    for (const auto& q : queues_) waiting = waiting || !q.empty();
    std::unique_lock<std::mutex> lock(mu_);
    if (!ran_last_cycle_ && !unannounced_ && !waiting && incoming_.empty() &&
        local_errors_.empty() && !shutdown_requested_) {
      cv_.wait_for(lock, std::chrono::microseconds(options_.cycle_us), [&] {
        return !incoming_.empty() || !local_errors_.empty() || shutdown_requested_;
      });
    }
    if (!ran_last_cycle_ && !incoming_.empty() && options_.fusion_wait_us > 0 &&
        local_errors_.empty() && !shutdown_requested_) {
      // An idle engine woken by a submission: layers handed over right after it (a bias after
      // its weights, layers with little compute between them) join this cycle's exchange
      // instead of costing a negotiation and a collective each. The window runs from the
      // first new submission, so a late wake-up does not add to it.
      const double until_us = incoming_.front().submit_us + options_.fusion_wait_us;
      // Checked in short steps: a user thread blocking in Wait closes the window at once.
      constexpr double kStepUs = 20;
      for (double left_us = until_us - NowUs();
           left_us > 0 && link_->waiters.load(std::memory_order_relaxed) == 0;
           left_us = until_us - NowUs()) {
        if (cv_.wait_for(lock,
                         std::chrono::microseconds(static_cast<long long>(
                             std::min(left_us, kStepUs) + 1)),
                         [&] { return !local_errors_.empty() || shutdown_requested_; })) {
          break;
        }
      }
    }
  }
  const bool shutdown = TakeIncoming();

  // 2-3. This rank's contribution and one reduction (unless the pipelined one is in flight:
  // it describes the queues exactly as the last cycle left them, see PostNext).
  Status ns = post_error_;
  pipelined_round_ = controller_->pending();
  if (ns.ok() && !controller_->pending()) {
    BuildVector(shutdown);
    ns = controller_->Post();
  }
  // Stalls are normally caught by the rounds' flags; the limit catches a rank whose engine
  // stopped answering although its process is alive (a lost one is the interrupt's case).
  if (ns.ok()) {
    ns = controller_->Wait(interrupt(),
                           options_.stall_abort_s > 0 ? 2 * options_.stall_abort_s + 5 : 0);
  }
  if (!ns.ok()) {
    Fail(ns, false);
    return false;
  }
  counters_.cycles.fetch_add(1, std::memory_order_relaxed);
  const double now = NowUs();
  const engine::NegotiationVector& r = controller_->result();

  // 4. Decisions every rank takes alike.
  if (r.flag(engine::kFlagError)) {
    Fail(controller_->GatherErrors(exec_error_code_, exec_error_, interrupt()), false);
    return false;
  }
  std::vector<int> mismatched, ready, stalled;
  for (int l = 0; l < num_layers_; ++l) {
    const bool everywhere = r.ReadyEverywhere(l);
    const bool somewhere = r.ReadySomewhere(l);
    if (everywhere && !r.HashAgrees(l)) mismatched.push_back(l);
    if (everywhere) ready.push_back(l);
    double& since = stall_since_us_[static_cast<size_t>(l)];
    if (somewhere && !everywhere) {
      if (since < 0) since = now;
      stalled.push_back(l);
    } else {
      since = -1;
      stall_warned_[static_cast<size_t>(l)] = false;
    }
  }
  if (!mismatched.empty()) {
    Fail(controller_->GatherMismatch(WaitingDescriptors(), mismatched,
                                     [this](int l) { return LayerName(l); }, interrupt()),
         false);
    return false;
  }
  const bool stall_abort = r.flag(engine::kFlagStallAbort);
  if ((stall_abort || r.flag(engine::kFlagStallWarn)) && !stalled.empty()) {
    Result<std::string> what =
        controller_->GatherStall(stalled, [this](int l) { return LayerName(l); }, interrupt());
    if (!what.ok()) {
      Fail(what.status(), false);
      return false;
    }
    if (stall_abort) {
      Fail(TimeoutError("Engine: stall abort: layers submitted on some ranks but not on others "
                        "for more than POSEIDON_STALL_ABORT_S=",
                        options_.stall_abort_s, " s: ", *what,
                        " (a rank skipped a layer, stopped submitting, or is far behind)"),
           false);
      return false;
    }
    counters_.stall_warnings.fetch_add(1, std::memory_order_relaxed);
    for (int l : stalled) stall_warned_[static_cast<size_t>(l)] = true;
    if (comm_->rank() == 0) {
      PSD_LOG(
          kWarn, "Engine: stall: waiting more than POSEIDON_STALL_WARN_S=", options_.stall_warn_s,
          " s: ", *what,
          (options_.stall_abort_s > 0 ? StrCat("; the engine fails after POSEIDON_STALL_ABORT_S=",
                                               options_.stall_abort_s, " s")
                                      : std::string()));
    }
  }
  if (r.flag(engine::kFlagShutdown)) {
    Fail(AbortedError("the engine was shut down (Engine::Shutdown on some rank) before this "
                      "submission was exchanged"),
         true);
    return false;
  }

  // 5. Run what every rank has.
  if (timeline_ && !ready.empty()) {
    timeline_->Span(num_layers_, pipelined_round_ ? "negotiate(pipelined)" : "negotiate",
                    queues_[static_cast<size_t>(ready.front())].front().desc.step,
                    controller_->posted_us(), now);
  }
  ran_last_cycle_ = !ready.empty();
  if (!ready.empty()) RunReady(ready);
  if (timeline_) timeline_->Publish();
  if (switch_to_cache_) {
    // Every rank takes this branch in the same cycle (RunReady decided from agreed ops), with
    // no round in flight (RunReady did not post one).
    switch_to_cache_ = false;
    cached_ = true;
    in_schedule_.assign(static_cast<size_t>(num_layers_), false);
    for (const auto& op : schedule_) {
      for (int l : op.layers) in_schedule_[static_cast<size_t>(l)] = true;
    }
    std::lock_guard<std::mutex> lock(mu_);
    // Raised by waiters of negotiated cycles, which never read it: the cached cycle would take
    // a stale one for a waiter blocked now.
    waiter_blocked_ = false;
    wake_on_.assign(static_cast<size_t>(num_layers_), kWakeAlways);
    for (int l = 0; l < num_layers_; ++l) {
      if (in_schedule_[static_cast<size_t>(l)]) wake_on_[static_cast<size_t>(l)] = kWakeQuiet;
    }
    awaited_ = 0;
  }
  return true;
}

void Engine::PostNext() {
  // Every rank runs this at the same point of the same cycle (it ran layers), so the posted
  // reduction sits at the same place in every rank's sequence of collectives. The queues
  // already look as the cycle leaves them: entries finishing now have left, a layer cut into
  // slices stays at the head with the same descriptor, and a part that fails keeps its entry
  // at the head (EndPart), so what this vector announces is exactly what the next cycle holds.
  // Submissions arriving during the exchange are announced by the cycle after.
  if (!options_.pipeline_negotiation || controller_->pending() || !post_error_.ok()) return;
  const bool shutdown = TakeIncoming();
  BuildVector(shutdown);
  post_error_ = controller_->Post();
  if (post_error_.ok()) counters_.pipelined.fetch_add(1, std::memory_order_relaxed);
}

void Engine::Record(const Entry& e, const char* name, double begin_us, double end_us) {
  if (timeline_)
    timeline_->Span(static_cast<int>(e.desc.layer), name, e.desc.step, begin_us, end_us);
}

void Engine::Finish(Entry* e, const Status& s) {
  if (timeline_) {
    timeline_->Instant(static_cast<int>(e->desc.layer), s.ok() ? "done" : "failed", e->desc.step,
                       NowUs());
  }
  Status st = e->local_error.ok() ? s : e->local_error;
  if (st.ok() && e->handle->done_event_ != nullptr) {
    // The handle's event follows the exchange on the engine's stream.
    st = e->handle->done_event_->Record(stream_->get());
  }
  if (st.ok()) {
    counters_.completed.fetch_add(1, std::memory_order_relaxed);
  } else if (!in_agreed_check_ && !e->error_reported) {
    // A failure inside an exchange may be this rank's alone: report it next cycle so that
    // every rank stops together.
    exec_error_ += StrCat(exec_error_.empty() ? "" : "; ", "layer ", e->desc.layer, " (",
                          LayerName(static_cast<int>(e->desc.layer)), ") step ", e->desc.step, ": ",
                          st.message());
    if (exec_error_code_ == StatusCode::kOk) exec_error_code_ = st.code();
  }
  e->handle->Complete(st);
}

void Engine::RunReady(const std::vector<int>& layers) {
  // Check the heads that start now (the same verdict on every rank: the descriptors agree).
  std::vector<int> runnable;
  for (int l : layers) {
    auto& q = queues_[static_cast<size_t>(l)];
    Entry& e = q.front();
    if (e.started) {
      runnable.push_back(l);
      continue;
    }
    e.started = true;
    const double start = NowUs();
    if (timeline_) {
      timeline_->Instant(l, "submit", e.desc.step, e.submit_us);
      Record(e, "queue", e.submit_us, start);
    }
    const size_t n = layer_count_[static_cast<size_t>(l)];
    Status bad;
    if (e.desc.count != static_cast<int64_t>(n)) {
      bad = InvalidArgument("Engine::Submit: layer ", l, " (", LayerName(l), ") step ", e.desc.step,
                            ": count ", e.desc.count,
                            " on every rank, but the "
                            "layer has ",
                            n, " elements; expected ", n);
    } else if (static_cast<DType>(e.desc.dtype) != DType::kFloat32) {
      // Layers are float32 (RegisterLayer refuses any other dtype).
      bad = InvalidArgument("Engine::Submit: layer ", l, " (", LayerName(l), ") step ", e.desc.step,
                            ": dtype ", DTypeName(static_cast<DType>(e.desc.dtype)),
                            " on every rank; expected float32 (the layer's dtype)");
    }
    if (bad.ok() && e.ready != nullptr) {
      // The engine's stream waits for the caller's gradient on the device, not the host.
      Status order = e.ready->OrderStream(stream_->get());
      // A failure here is this rank's alone: it still takes part in the exchange (the others
      // would wait for it otherwise) after a host wait, and its handle fails with the error,
      // which Finish reports to every rank.
      if (!order.ok()) {
        Status host_wait = e.ready->Synchronize();
        e.local_error = host_wait.ok() ? order : host_wait;
      }
    }
    if (!bad.ok()) {
      // Agreed by every rank, and nothing was exchanged: fail this handle only.
      Entry failed = std::move(e);
      q.pop_front();
      in_agreed_check_ = true;
      Finish(&failed, bad);
      in_agreed_check_ = false;
      continue;
    }
    runnable.push_back(l);
  }
  // Dense allreduce layers are summed by the engine itself, with or without an optimizer (the
  // collective finishes them, FinishDenseSum, exactly as its own exchange would); they can be
  // cut into slices. The other layers run whole through their strategy.
  auto fusible = [this](int l) {
    const Entry& e = queues_[static_cast<size_t>(l)].front();
    return layer_strategy_[static_cast<size_t>(l)] == StrategyKind::kAllReduce &&
           e.desc.factors == 0;
  };
  std::vector<engine::SliceItem> slice_items;
  for (int l : runnable) {
    const Entry& e = queues_[static_cast<size_t>(l)].front();
    engine::SliceItem it;
    it.elem_bytes = sizeof(float);
    it.remaining_bytes = (layer_count_[static_cast<size_t>(l)] - e.offset) * it.elem_bytes;
    it.sliceable = fusible(l);
    slice_items.push_back(it);
  }
  const std::vector<size_t> take = engine::PlanSlices(slice_items, options_.slice_bytes);
  // Entries that complete this cycle leave their queue (stable storage: reserved up front);
  // a layer cut short stays at the head of its queue, its part pointing there.
  std::vector<Entry> finishing;
  finishing.reserve(runnable.size());
  std::vector<Part> parts;
  std::vector<engine::WorkItem> items;
  for (size_t i = 0; i < runnable.size(); ++i) {
    const int l = runnable[i];
    if (take[i] == 0 && slice_items[i].remaining_bytes > 0) continue;  // next cycle
    auto& q = queues_[static_cast<size_t>(l)];
    Part p;
    p.begin = q.front().offset;
    p.end = p.begin + take[i] / slice_items[i].elem_bytes;
    p.last = p.end == layer_count_[static_cast<size_t>(l)];
    if (p.last) {
      finishing.push_back(std::move(q.front()));
      q.pop_front();
      p.e = &finishing.back();
    } else {
      p.e = &q.front();
    }
    engine::WorkItem item;
    item.layer = l;
    item.bytes = take[i];
    item.fusible = slice_items[i].sliceable;
    items.push_back(item);
    parts.push_back(p);
  }
  // Chunks need the backend's non-blocking allreduce on host memory; device layers are fused
  // or run whole (their stream keeps the device busy without a host pipeline).
  const auto ops =
      engine::PlanOps(items, options_.fusion_bytes, device() ? 0 : options_.chunk_bytes);
  // Response cache: the ops about to run, as every rank sees them. When the last two steps
  // ran this same schedule, the engine leaves negotiation after this cycle (and posts no next
  // round: every rank decides alike here).
  if (options_.response_cache && comm_->size() <= engine::kMaxCachedWorld) {
    for (const auto& op : ops) {
      std::vector<engine::Descriptor> descs;
      size_t elems = 0;
      bool cacheable = op.kind == engine::OpKind::kFused || op.kind == engine::OpKind::kDirect;
      for (size_t i : op.items) {
        const Part& p = parts[i];
        descs.push_back(p.e->desc);
        elems += p.end - p.begin;
        cacheable = cacheable && p.begin == 0 && p.last && !device();
      }
      cacheable = cacheable && elems * sizeof(float) <=
                                   static_cast<size_t>(std::max<long long>(options_.fusion_bytes, 0));
      recorder_.Record(cacheable, descs, elems);
    }
    switch_to_cache_ = recorder_.Ready(&schedule_, &next_op_);
  }
  // The queues now hold what this cycle leaves behind: the next negotiation runs while the
  // exchanges below do, so a busy engine pays no separate negotiation latency.
  if (!switch_to_cache_) PostNext();
  for (const auto& op : ops) {
    std::vector<Part> group;
    for (size_t i : op.items) group.push_back(parts[i]);
    switch (op.kind) {
      case engine::OpKind::kFused:
        RunDense(DenseBatchKind::kFused, group);
        break;
      case engine::OpKind::kChunked:
        RunDense(DenseBatchKind::kChunked, group);
        break;
      case engine::OpKind::kDirect:
        RunDense(DenseBatchKind::kInPlace, group);
        break;
      case engine::OpKind::kStrategy:
        RunStrategy(group[0].e);
        break;
    }
  }
}

void Engine::RunDense(DenseBatchKind kind, const std::vector<Part>& group) {
  DenseBatch batch;
  batch.kind = kind;
  batch.chunk_bytes = static_cast<size_t>(std::max<long long>(options_.chunk_bytes, 0));
  for (const Part& p : group) {
    DensePart d;
    d.layer = static_cast<int>(p.e->desc.layer);
    d.step = p.e->desc.step;
    d.grad = static_cast<float*>(p.e->grad.data);
    d.params = p.e->grad.params;
    d.begin = p.begin;
    d.end = p.end;
    d.last = p.last;
    // An earlier slice failed here: take part in the sum (the peers are in it), skip the tail.
    d.sum_only = !p.e->local_error.ok();
    batch.parts.push_back(d);
  }
  const double t0 = NowUs();
  const DenseBatchReport rep = hc_->ExchangeDense(batch);
  const double t1 = t0 + rep.pack_us, t2 = t1 + rep.reduce_us;
  const char* name = kind == DenseBatchKind::kFused     ? "allreduce(fused)"
                     : kind == DenseBatchKind::kChunked ? "allreduce(chunks)"
                     : (group[0].begin == 0 && group[0].last) ? "allreduce"
                                                              : "allreduce(slice)";
  if (kind == DenseBatchKind::kFused) {
    counters_.fused_groups.fetch_add(1, std::memory_order_relaxed);
    counters_.fused_layers.fetch_add(static_cast<int64_t>(group.size()),
                                     std::memory_order_relaxed);
  } else if (kind == DenseBatchKind::kChunked) {
    counters_.chunked_layers.fetch_add(1, std::memory_order_relaxed);
    counters_.chunks.fetch_add(rep.chunks, std::memory_order_relaxed);
  } else if (group[0].begin == 0 && group[0].last) {
    counters_.direct_layers.fetch_add(1, std::memory_order_relaxed);
  }
  for (size_t i = 0; i < group.size(); ++i) {
    const Part& p = group[i];
    if (kind == DenseBatchKind::kFused) Record(*p.e, "pack", t0, t1);
    Record(*p.e, name, t1, t2);
    Record(*p.e, "finish", t2, NowUs());
    const bool whole = p.begin == 0 && p.last;
    if (!whole) counters_.slices.fetch_add(1, std::memory_order_relaxed);
    if (!p.last) {
      if (!rep.status[i].ok()) FailSlice(p.e, rep.status[i]);
      p.e->offset = p.end;
      continue;
    }
    Finish(p.e, rep.status[i]);
  }
}

void Engine::FailSlice(Entry* e, const Status& s) {
  // The entry stays at the head of its queue: the other ranks go on with its remaining slices
  // (the negotiation already posted announced it there), so this rank takes part in them too
  // and fails the handle after the last one. The error goes out with the next negotiation, so
  // every rank stops within a cycle or two.
  if (!e->local_error.ok()) return;
  e->local_error = s;
  e->error_reported = true;
  exec_error_ += StrCat(exec_error_.empty() ? "" : "; ", "layer ", e->desc.layer, " (",
                        LayerName(static_cast<int>(e->desc.layer)), ") step ", e->desc.step, ": ",
                        s.message());
  if (exec_error_code_ == StatusCode::kOk) exec_error_code_ = s.code();
}

void Engine::RunStrategy(Entry* e) {
  const int l = static_cast<int>(e->desc.layer);
  ExchangeBuffers b;
  b.grad = static_cast<float*>(e->grad.data);
  b.params = e->grad.params;
  b.u = e->grad.u;
  b.v = e->grad.v;
  b.batch = e->grad.batch;
  const double t0 = NowUs();
  // Submit checked the buffers (on every rank, a refusal failing them all): not again.
  Status s = hc_->ExchangeChecked(l, b, e->desc.step);
  const double t1 = NowUs();
  counters_.strategy_layers.fetch_add(1, std::memory_order_relaxed);
  Record(*e, StrategyName(layer_strategy_[static_cast<size_t>(l)]), t0, t1);
  Finish(e, s);
}

std::vector<engine::Descriptor> Engine::WaitingDescriptors() const {
  std::vector<engine::Descriptor> out;
  for (const auto& q : queues_) {
    if (!q.empty()) out.push_back(q.front().desc);
  }
  return out;
}

}  // namespace poseidon
