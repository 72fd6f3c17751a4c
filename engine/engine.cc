// The engine thread's cycle (see engine.h for the contract):
//   1. Take new submissions (under mu_) into per-layer FIFO queues; sleep up to the cycle time
//      first when the previous cycle ran nothing and nothing new arrived.
//   2. Fill the negotiation vector: the head of each non-empty queue marks its layer ready and
//      contributes its descriptor hash; flags for a local error, a stall past the warn / abort
//      limits, a requested shutdown.
//   3. MPI_Iallreduce(BOR) of the vector, polled with growing sleeps (no spinning). Pipelined
//      (POSEIDON_PIPELINE_NEGOTIATION): a cycle that runs layers plans its ops first, which
//      leaves the queues as the cycle will leave them, then posts the next cycle's vector and
//      only then runs the exchanges; the next cycle waits for that reduction (done by then on a
//      busy engine) instead of starting one. Every rank posts it at the same point, since they
//      all decided to run the same layers.
//   4. Decide from the reduced vector (identical on every rank):
//        error flag        -> gather every rank's error text, fail everywhere;
//        hash mismatch     -> gather every rank's waiting descriptors, fail with kMismatch;
//        stall warn/abort  -> gather the ready masks; rank 0 logs, or fail with kTimeout;
//        shutdown flag     -> fail what is pending with kAborted and stop;
//        otherwise run the layers ready everywhere, lowest index first (fusion.h decides
//        fused / chunked / direct / strategy).
//   5. Complete handles as their op finishes (device memory: after recording the handle's
//      event on the engine's stream); publish timeline records.
// Every gather in step 4 is collective, and all ranks enter it because they read the same
// reduced flags: that is how a disagreement becomes an error on every rank instead of a hang.
#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "kernels/kernels.h"
#include "engine/fusion.h"
#include "runtime/log.h"
#include "runtime/mpi_backend.h"
#include "runtime/settings.h"

namespace poseidon {

using engine::Descriptor;
using engine::NegotiationVector;
using engine::Timeline;

namespace {

double NowUs() { return Timeline::NowUs(); }

void SleepUs(long long us) { std::this_thread::sleep_for(std::chrono::microseconds(us)); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// EngineOptions

Result<EngineOptions> EngineOptions::FromSettings() {
  PSD_CHECK(Settings::Global().Validate());
  EngineOptions o;
  o.fusion_bytes = settings::FusionBytes();
  o.chunk_bytes = settings::ChunkBytes();
  o.stall_warn_s = settings::StallWarnS();
  o.stall_abort_s = settings::StallAbortS();
  o.cycle_us = settings::CycleUs();
  o.fusion_wait_us = settings::FusionWaitUs();
  o.slice_bytes = settings::SliceBytes();
  o.pipeline_negotiation = settings::PipelineNegotiation();
  o.timeline = settings::Timeline();
  PSD_CHECK(o.Validate());
  return o;
}

Status EngineOptions::Validate() const {
  PSD_REQUIRE_ARG(fusion_bytes >= 0, "Engine: POSEIDON_FUSION_BYTES=", fusion_bytes,
                  "; expected >= 0 (0 disables fusion)");
  PSD_REQUIRE_ARG(chunk_bytes >= 0, "Engine: POSEIDON_CHUNK_BYTES=", chunk_bytes,
                  "; expected >= 0 (0 disables chunking)");
  PSD_REQUIRE_ARG(std::isfinite(stall_warn_s) && stall_warn_s >= 0,
                  "Engine: POSEIDON_STALL_WARN_S=", stall_warn_s,
                  "; expected a finite number of seconds >= 0 (0 disables the warning)");
  PSD_REQUIRE_ARG(std::isfinite(stall_abort_s) && stall_abort_s >= 0,
                  "Engine: POSEIDON_STALL_ABORT_S=", stall_abort_s,
                  "; expected a finite number of seconds >= 0 (0 disables the abort)");
  PSD_REQUIRE_ARG(cycle_us >= 1 && cycle_us <= 1000000, "Engine: POSEIDON_CYCLE_US=", cycle_us,
                  "; expected 1 to 1000000 microseconds");
  PSD_REQUIRE_ARG(fusion_wait_us >= 0 && fusion_wait_us <= 1000000,
                  "Engine: POSEIDON_FUSION_WAIT_US=", fusion_wait_us,
                  "; expected 0 to 1000000 microseconds (0 negotiates at once)");
  PSD_REQUIRE_ARG(slice_bytes >= 0, "Engine: POSEIDON_SLICE_BYTES=", slice_bytes,
                  "; expected >= 0 (0 runs whole layers every cycle)");
  PSD_REQUIRE_ARG(memory == MemoryKind::kHost || memory == MemoryKind::kDevice,
                  "Engine: memory kind ", static_cast<int>(memory), "; expected host or device");
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Handle

Handle::Handle(int layer, int64_t step, std::string layer_name)
    : layer_(layer), step_(step), layer_name_(std::move(layer_name)) {}

Status Handle::Wait(double timeout_s) const {
  // Counted while blocked, so the engine closes its fusion window early (nothing more is
  // coming from a thread that waits).
  struct WaitCount {
    std::atomic<int>* n;
    explicit WaitCount(std::atomic<int>* c) : n(c) {
      if (n) n->fetch_add(1, std::memory_order_relaxed);
    }
    ~WaitCount() {
      if (n) n->fetch_sub(1, std::memory_order_relaxed);
    }
  } count(done_.load(std::memory_order_acquire) ? nullptr : engine_waiters_.get());
  std::unique_lock<std::mutex> lock(mu_);
  auto done = [&] { return done_.load(std::memory_order_acquire); };
  if (timeout_s < 0) {
    cv_.wait(lock, done);
  } else if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), done)) {
    return TimeoutError("Handle::Wait: layer ", layer_, " (", layer_name_, ") step ", step_,
                        " is not complete after ", timeout_s,
                        " s; the exchange goes on (wait again, or raise the timeout)");
  }
  return status_;
}

Status Handle::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!done_.load(std::memory_order_acquire)) {
    return UnavailableError("Handle::status: layer ", layer_, " (", layer_name_, ") step ", step_,
                            " is still pending; expected Test() to be true first");
  }
  return status_;
}

void* Handle::cuda_event() const {
  if (!done_.load(std::memory_order_acquire) || done_event_ == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  return status_.ok() ? done_event_->get() : nullptr;
}

Status Handle::WaitOnStream(void* stream, double timeout_s) const {
  PSD_CHECK(Wait(timeout_s));
  if (done_event_ == nullptr) return Status::Ok();  // host memory: the data is there
  Status s = done_event_->OrderStream(stream);
  if (!s.ok()) {
    return s.WithPrefix(
        StrCat("Handle::WaitOnStream: layer ", layer_, " (", layer_name_, ") step ", step_, ": "));
  }
  return Status::Ok();
}

void Handle::Complete(const Status& s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_.load(std::memory_order_relaxed)) return;
    status_ = s;
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
  // Only the first completer gets here, so the callback runs exactly once.
  if (callback_) {
    DoneCallback cb = std::move(callback_);
    callback_ = nullptr;
    cb(s);
  }
}

// ---------------------------------------------------------------------------------------------
// Engine: creation, submission, shutdown

Result<std::unique_ptr<Engine>> Engine::Create(std::shared_ptr<Communicator> comm,
                                               HybridCollective* collective) {
  PSD_ASSIGN_OR_RETURN(EngineOptions options, EngineOptions::FromSettings());
  return Create(std::move(comm), collective, options);
}

Result<std::unique_ptr<Engine>> Engine::Create(std::shared_ptr<Communicator> comm,
                                               HybridCollective* collective,
                                               const EngineOptions& options) {
  PSD_REQUIRE_ARG(comm != nullptr, "Engine::Create: communicator is null");
  PSD_REQUIRE_ARG(collective != nullptr, "Engine::Create: collective is null");
  PSD_REQUIRE_ARG(collective->has_plan(),
                  "Engine::Create: the HybridCollective has no plan; "
                  "expected BuildPlan(batch) to have run on every rank first");
  PSD_REQUIRE_ARG(collective->world() == comm->size(), "Engine::Create: the collective spans ",
                  collective->world(), " ranks but the communicator ", comm->size(),
                  "; expected the communicator the collective was made on");
  PSD_CHECK(options.Validate());
  PSD_REQUIRE_ARG(options.memory == collective->memory(), "Engine::Create: options.memory is ",
                  MemoryKindName(options.memory), " but the collective works on ",
                  MemoryKindName(collective->memory()),
                  " memory; expected the memory kind the collective was made for");
  const int level = comm->mpi_thread_level();
  PSD_REQUIRE(level >= MPI_THREAD_SERIALIZED, StatusCode::kUnavailable,
              "Engine::Create: MPI provides thread level ", level,
              " but the engine's background thread needs at least MPI_THREAD_SERIALIZED (",
              MPI_THREAD_SERIALIZED,
              "); initialize MPI with poseidon::InitMpi or "
              "MPI_Init_thread(MPI_THREAD_MULTIPLE)");
  if (level < MPI_THREAD_MULTIPLE && comm->rank() == 0) {
    PSD_LOG(kWarn,
            "Engine: MPI provides only MPI_THREAD_SERIALIZED: no other thread may call "
            "MPI while the engine runs");
  }
  std::unique_ptr<Engine> e(new Engine(std::move(comm), collective, options));
  PSD_ASSIGN_OR_RETURN(e->backend_, e->comm_->backend(options.memory));
  e->kernels_ = &collective->kernels();
  if (e->device()) {
    // The engine thread works on the creator's device, on a stream of its own; the collective
    // runs its kernels and device collectives there too while the engine lives.
    PSD_ASSIGN_OR_RETURN(e->device_, engine::CurrentDevice());
    PSD_ASSIGN_OR_RETURN(e->stream_, engine::Stream::Create());
    e->previous_stream_ = collective->stream();
    collective->set_stream(e->stream_->get());
  }
  if (!options.timeline.empty()) {
    PSD_ASSIGN_OR_RETURN(e->timeline_,
                         Timeline::Open(options.timeline, e->comm_->rank(), e->comm_->size()));
    for (int l = 0; l < e->num_layers_; ++l) e->timeline_->SetLayerName(l, e->layer_names_[l]);
    // One more track after the layers: the negotiation rounds of the cycles that ran work.
    e->timeline_->SetLayerName(e->num_layers_, "negotiation");
  }
  e->thread_ = std::thread([p = e.get()] { p->Loop(); });
  return e;
}

Engine::Engine(std::shared_ptr<Communicator> comm, HybridCollective* collective,
               const EngineOptions& options)
    : comm_(std::move(comm)),
      hc_(collective),
      options_(options),
      num_layers_(collective->num_layers()),
      queues_(static_cast<size_t>(num_layers_)),
      stall_since_us_(static_cast<size_t>(num_layers_), -1.0),
      stall_warned_(static_cast<size_t>(num_layers_), false),
      send_vec_(std::make_unique<NegotiationVector>(num_layers_)),
      recv_vec_(std::make_unique<NegotiationVector>(num_layers_)) {
  for (int l = 0; l < num_layers_; ++l) {
    const LayerSpec& spec = hc_->layer(l);
    layer_names_.push_back(spec.name);
    layer_count_.push_back(spec.NumElements());
    layer_dtype_.push_back(spec.dtype);
    layer_optimizer_.push_back(spec.optimizer.enabled());
    layer_strategy_.push_back(hc_->strategy(l));
  }
}

Engine::~Engine() { (void)Shutdown(); }

std::string Engine::LayerName(int layer) const {
  if (layer < 0 || layer >= num_layers_) return "?";
  return layer_names_[static_cast<size_t>(layer)];
}

HandlePtr Engine::Submit(int layer, float* grad, size_t count, int64_t step, DoneCallback done) {
  Gradient g;
  g.data = grad;
  g.count = count;
  return Submit(layer, g, step, std::move(done));
}

HandlePtr Engine::Submit(int layer, const Gradient& g, int64_t step, DoneCallback done) {
  auto h = std::make_shared<Handle>(layer, step, LayerName(layer));
  h->engine_waiters_ = waiters_;
  h->callback_ = std::move(done);
  // Device memory: capture the caller's stream now (the gradient is complete once the work
  // queued there so far has run) and make the handle's completion event. Only the recording
  // happens here: the host never waits for the device in Submit.
  std::unique_ptr<engine::Event> ready;
  // Local checks: what only this rank can see. Agreement (count, dtype, order) is checked
  // across ranks by the engine, so that the error names every side.
  std::string err;
  const bool in_range = layer >= 0 && layer < num_layers_;
  if (!in_range) {
    err = StrCat("Engine::Submit: layer id ", layer, " is out of range; expected 0..",
                 num_layers_ - 1, " (the layers registered with the HybridCollective)");
  } else {
    const size_t n = layer_count_[static_cast<size_t>(layer)];
    const bool factors = g.u != nullptr || g.v != nullptr;
    if (n > 0 && g.data == nullptr) {
      err = StrCat("Engine::Submit: layer ", layer, " (", LayerName(layer), ") step ", step,
                   ": gradient buffer is null; expected ", n, " elements");
    } else if (factors && (g.u == nullptr || g.v == nullptr) && g.batch > 0) {
      err = StrCat("Engine::Submit: layer ", layer, " (", LayerName(layer), ") step ", step,
                   ": only one of the factors u, v is set; expected both or neither");
    } else if (layer_optimizer_[static_cast<size_t>(layer)] && n > 0 && g.params == nullptr) {
      err = StrCat("Engine::Submit: layer ", layer, " (", LayerName(layer), ") step ", step,
                   ": params is null but the layer has an optimizer; expected ", n, " floats");
    } else if (step < 0) {
      err = StrCat("Engine::Submit: layer ", layer, " (", LayerName(layer), ") step ", step,
                   ": expected a step >= 0");
    } else if (!device() && g.stream != nullptr) {
      err = StrCat("Engine::Submit: layer ", layer, " (", LayerName(layer), ") step ", step,
                   ": a stream was given but the engine works on host memory; expected a null "
                   "stream (streams order device memory only)");
    }
  }
  if (err.empty() && device()) {
    Status es;
    auto r = engine::Event::Create();
    if (r.ok()) {
      ready = std::move(*r);
      es = ready->Record(g.stream);
    } else {
      es = r.status();
    }
    if (es.ok()) {
      auto d = engine::Event::Create();
      if (d.ok()) {
        h->done_event_ = std::move(*d);
      } else {
        es = d.status();
      }
    }
    if (!es.ok()) {
      err = StrCat("Engine::Submit: layer ", layer, " (", LayerName(layer), ") step ", step, ": ",
                   es.message());
    }
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (!sticky_.ok() || stopped_ || shutdown_requested_) {
    Status s = !sticky_.ok() ? sticky_ : AbortedError("Engine::Submit: the engine was shut down");
    lock.unlock();
    h->Complete(Status(s.code(), StrCat("layer ", layer, " (", LayerName(layer), ") step ", step,
                                        ": ", s.message())));
    return h;
  }
  if (!err.empty()) {
    // The other ranks will wait for this submission: report it so that they fail too.
    local_errors_.push_back(StrCat("invalid submission: ", err));
    lock.unlock();
    cv_.notify_one();
    h->Complete(InvalidArgument(err));
    return h;
  }
  Entry e;
  e.handle = h;
  e.grad = g;
  e.desc.layer = layer;
  e.desc.seq = next_seq_++;
  e.desc.step = step;
  e.desc.count = static_cast<int64_t>(g.count);
  e.desc.dtype = static_cast<int64_t>(g.dtype);
  e.desc.strategy = static_cast<int64_t>(layer_strategy_[static_cast<size_t>(layer)]);
  e.desc.factors = (g.u != nullptr && g.v != nullptr) ? 1 : 0;
  e.submit_us = NowUs();
  e.ready = std::move(ready);
  incoming_.push_back(std::move(e));
  lock.unlock();
  cv_.notify_one();
  return h;
}

void Engine::ReportError(const Status& error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    local_errors_.push_back(error.message());
  }
  cv_.notify_one();
}

Status Engine::Shutdown() {
  std::lock_guard<std::mutex> serial(shutdown_mu_);
  if (thread_.joinable() && std::this_thread::get_id() == thread_.get_id()) {
    return InvalidArgument(
        "Engine::Shutdown: called from the engine thread (a completion "
        "callback); expected a user thread");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_requested_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (stream_ != nullptr) {
    // Whatever the engine queued has finished before the collective goes back to its own
    // stream (the buffers belong to the caller again).
    Status w = stream_->Synchronize();
    if (!w.ok()) PSD_LOG(kWarn, w.message());
    hc_->set_stream(previous_stream_);
    previous_stream_ = nullptr;
  }
  if (timeline_) {
    Status t = timeline_->Close();
    if (!t.ok()) PSD_LOG(kWarn, t.message());
  }
  std::lock_guard<std::mutex> lock(mu_);
  return clean_shutdown_ ? Status::Ok() : sticky_;
}

Status Engine::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (sticky_.ok() && (stopped_ || shutdown_requested_)) {
    return AbortedError("Engine: the engine was shut down");
  }
  return sticky_;
}

bool Engine::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !stopped_;
}

EngineStats Engine::stats() const {
  EngineStats s;
  s.cycles = counters_.cycles.load();
  s.completed = counters_.completed.load();
  s.fused_groups = counters_.fused_groups.load();
  s.fused_layers = counters_.fused_layers.load();
  s.chunked_layers = counters_.chunked_layers.load();
  s.chunks = counters_.chunks.load();
  s.direct_layers = counters_.direct_layers.load();
  s.slices = counters_.slices.load();
  s.strategy_layers = counters_.strategy_layers.load();
  s.stall_warnings = counters_.stall_warnings.load();
  s.pipelined = counters_.pipelined.load();
  return s;
}

std::string Engine::timeline_file() const { return timeline_ ? timeline_->file() : ""; }

// ---------------------------------------------------------------------------------------------
// Engine thread

void Engine::Loop() {
  if (device()) {
    // CUDA's current device is per thread: use the one the engine was created on.
    Status s = engine::UseDevice(device_);
    if (!s.ok()) {
      // Every rank must stop together: report it through the first cycle's error flag.
      exec_error_ = StrCat("engine thread: ", s.message());
      exec_error_code_ = s.code();
    }
  }
  while (Cycle()) {
  }
  if (timeline_) timeline_->Publish();
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
}

void Engine::Fail(const Status& s, bool clean) {
  std::vector<Entry> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (sticky_.ok()) {
      sticky_ = s;
      clean_shutdown_ = clean;
    }
    // Taken in the same critical section that sets sticky_: a later Submit sees the error.
    for (auto& e : incoming_) pending.push_back(std::move(e));
    incoming_.clear();
  }
  for (auto& q : queues_) {
    for (auto& e : q) pending.push_back(std::move(e));
    q.clear();
  }
  for (auto& e : pending) {
    e.handle->Complete(Status(
        s.code(), StrCat("layer ", e.desc.layer, " (", LayerName(static_cast<int>(e.desc.layer)),
                         ") step ", e.desc.step, ": ", s.message())));
  }
}

bool Engine::TakeIncoming() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!incoming_.empty()) unannounced_ = true;
  for (auto& e : incoming_) queues_[static_cast<size_t>(e.desc.layer)].push_back(std::move(e));
  incoming_.clear();
  for (auto& m : local_errors_) {
    exec_error_ += (exec_error_.empty() ? "" : "; ") + m;
    if (exec_error_code_ == StatusCode::kOk) exec_error_code_ = StatusCode::kInvalidArgument;
  }
  local_errors_.clear();
  return shutdown_requested_;
}

void Engine::BuildVector(bool shutdown) {
  NegotiationVector& send = *send_vec_;
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
  if (!negotiation_pending_) {
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
           left_us > 0 && waiters_->load(std::memory_order_relaxed) == 0;
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
  pipelined_round_ = negotiation_pending_;
  if (ns.ok() && !negotiation_pending_) {
    BuildVector(shutdown);
    ns = PostNegotiation();
  }
  if (ns.ok()) ns = WaitNegotiation();
  if (!ns.ok()) {
    Fail(ns, false);
    return false;
  }
  counters_.cycles.fetch_add(1, std::memory_order_relaxed);
  const double now = NowUs();
  const NegotiationVector& r = *recv_vec_;

  // 4. Decisions every rank takes alike.
  if (r.flag(engine::kFlagError)) {
    Fail(GatherErrors(), false);
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
    Fail(GatherMismatch(mismatched), false);
    return false;
  }
  const bool stall_abort = r.flag(engine::kFlagStallAbort);
  if ((stall_abort || r.flag(engine::kFlagStallWarn)) && !stalled.empty()) {
    Result<std::string> what = GatherStall(stalled);
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
                    negotiation_posted_us_, now);
  }
  ran_last_cycle_ = !ready.empty();
  if (!ready.empty()) RunReady(ready);
  if (timeline_) timeline_->Publish();
  return true;
}

Status Engine::PostNegotiation() {
  negotiation_req_ = MPI_REQUEST_NULL;
  int rc = MPI_Iallreduce(send_vec_->data(), recv_vec_->data(), send_vec_->size(), MPI_UINT64_T,
                          MPI_BOR, comm_->mpi_comm(), &negotiation_req_);
  if (rc != MPI_SUCCESS) return MpiError("Engine: MPI_Iallreduce (negotiation)", rc);
  negotiation_pending_ = true;
  negotiation_posted_us_ = NowUs();
  return Status::Ok();
}

void Engine::PostNext() {
  // Every rank runs this at the same point of the same cycle (it ran layers), so the posted
  // reduction sits at the same place in every rank's sequence of collectives. The queues
  // already look as the cycle leaves them: entries finishing now have left, a layer cut into
  // slices stays at the head with the same descriptor, and a part that fails keeps its entry
  // at the head (EndPart), so what this vector announces is exactly what the next cycle holds.
  // Submissions arriving during the exchange are announced by the cycle after.
  if (!options_.pipeline_negotiation || negotiation_pending_ || !post_error_.ok()) return;
  const bool shutdown = TakeIncoming();
  BuildVector(shutdown);
  post_error_ = PostNegotiation();
  if (post_error_.ok()) counters_.pipelined.fetch_add(1, std::memory_order_relaxed);
}

Status Engine::WaitNegotiation() {
  // The other ranks may be asleep for up to one cycle, or busy in user code: poll with growing
  // sleeps so that oversubscribed ranks leave the cores to those doing work.
  const double start = NowUs();
  long long sleep_us = 0;
  for (int polls = 0;; ++polls) {
    int done = 0;
    int rc = MPI_Test(&negotiation_req_, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      negotiation_pending_ = false;
      return MpiError("Engine: MPI_Test (negotiation)", rc);
    }
    if (done) {
      negotiation_pending_ = false;
      return Status::Ok();
    }
    if (polls < 8) {
      std::this_thread::yield();
      continue;
    }
    sleep_us = std::min<long long>(std::max<long long>(2 * sleep_us, 10), 500);
    SleepUs(sleep_us);
    const double waited_s = (NowUs() - start) * 1e-6;
    // Stalls are normally caught by the cycle's flags; this catches a rank whose engine
    // stopped answering altogether (process gone, engine never created, stuck in an exchange).
    if (options_.stall_abort_s > 0 && waited_s > 2 * options_.stall_abort_s + 5) {
      // MPI still owns the buffers of the abandoned request: keep them alive forever.
      (void)send_vec_.release();
      (void)recv_vec_.release();
      negotiation_pending_ = false;
      return TimeoutError("Engine: rank ", comm_->rank(),
                          ": the other ranks' engines did not "
                          "answer the negotiation for ",
                          waited_s,
                          " s (a rank exited, never created its engine, or is stuck); "
                          "limit 2 x POSEIDON_STALL_ABORT_S + 5 s");
    }
  }
}

Status Engine::GatherErrors() {
  MPI_Comm comm = comm_->mpi_comm();
  const int world = comm_->size();
  int mine[2] = {static_cast<int>(exec_error_code_), static_cast<int>(exec_error_.size())};
  std::vector<int> all(2 * static_cast<size_t>(world));
  int rc = MPI_Allgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, comm);
  if (rc != MPI_SUCCESS) return MpiError("Engine: MPI_Allgather (errors)", rc);
  std::vector<int> counts(static_cast<size_t>(world)), displs(static_cast<size_t>(world));
  int total = 0;
  for (int i = 0; i < world; ++i) {
    counts[static_cast<size_t>(i)] = all[2 * static_cast<size_t>(i) + 1];
    displs[static_cast<size_t>(i)] = total;
    total += counts[static_cast<size_t>(i)];
  }
  std::string text(static_cast<size_t>(total), '\0');
  rc = MPI_Allgatherv(exec_error_.data(), mine[1], MPI_CHAR, text.data(), counts.data(),
                      displs.data(), MPI_CHAR, comm);
  if (rc != MPI_SUCCESS) return MpiError("Engine: MPI_Allgatherv (errors)", rc);
  std::vector<int> ranks;
  std::string detail;
  StatusCode code = StatusCode::kOk;
  for (int i = 0; i < world; ++i) {
    if (counts[static_cast<size_t>(i)] == 0) continue;
    ranks.push_back(i);
    if (code == StatusCode::kOk) code = static_cast<StatusCode>(all[2 * static_cast<size_t>(i)]);
    detail += StrCat(detail.empty() ? "" : "; ", "rank ", i, ": ",
                     text.substr(static_cast<size_t>(displs[static_cast<size_t>(i)]),
                                 static_cast<size_t>(counts[static_cast<size_t>(i)])));
  }
  if (code == StatusCode::kOk) code = StatusCode::kInternal;
  return Status(code, StrCat("Engine: failed on rank", ranks.size() > 1 ? "s " : " ",
                             engine::RankList(ranks), ": ", detail));
}

Status Engine::GatherMismatch(const std::vector<int>& layers) {
  MPI_Comm comm = comm_->mpi_comm();
  const int world = comm_->size();
  std::vector<int64_t> mine;
  for (const auto& q : queues_) {
    if (q.empty()) continue;
    int64_t w[Descriptor::kWords];
    q.front().desc.ToWords(w);
    mine.insert(mine.end(), w, w + Descriptor::kWords);
  }
  int n = static_cast<int>(mine.size());
  std::vector<int> counts(static_cast<size_t>(world)), displs(static_cast<size_t>(world));
  int rc = MPI_Allgather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, comm);
  if (rc != MPI_SUCCESS) return MpiError("Engine: MPI_Allgather (descriptors)", rc);
  int total = 0;
  for (int i = 0; i < world; ++i) {
    displs[static_cast<size_t>(i)] = total;
    total += counts[static_cast<size_t>(i)];
  }
  std::vector<int64_t> all(static_cast<size_t>(std::max(total, 1)));
  rc = MPI_Allgatherv(mine.data(), n, MPI_INT64_T, all.data(), counts.data(), displs.data(),
                      MPI_INT64_T, comm);
  if (rc != MPI_SUCCESS) return MpiError("Engine: MPI_Allgatherv (descriptors)", rc);
  std::vector<std::vector<Descriptor>> per_rank(static_cast<size_t>(world));
  for (int i = 0; i < world; ++i) {
    for (int k = 0; k < counts[static_cast<size_t>(i)]; k += Descriptor::kWords) {
      per_rank[static_cast<size_t>(i)].push_back(
          Descriptor::FromWords(&all[static_cast<size_t>(displs[static_cast<size_t>(i)] + k)]));
    }
  }
  return MismatchError(
      "Engine: ranks submitted different work: ",
      engine::DescribeMismatch(per_rank, layers, [this](int l) { return LayerName(l); }),
      ". Every rank must submit the same layers in the same order with the same element count, "
      "dtype and step");
}

Result<std::string> Engine::GatherStall(const std::vector<int>& layers) {
  const int world = comm_->size();
  std::vector<uint64_t> mine = send_vec_->MaskWords();
  const int w = static_cast<int>(mine.size());
  std::vector<uint64_t> all(static_cast<size_t>(w) * static_cast<size_t>(world));
  int rc =
      MPI_Allgather(mine.data(), w, MPI_UINT64_T, all.data(), w, MPI_UINT64_T, comm_->mpi_comm());
  if (rc != MPI_SUCCESS) return MpiError("Engine: MPI_Allgather (stall masks)", rc);
  std::vector<std::vector<uint64_t>> masks(static_cast<size_t>(world));
  for (int i = 0; i < world; ++i) {
    masks[static_cast<size_t>(i)].assign(all.begin() + i * w, all.begin() + (i + 1) * w);
  }
  return engine::DescribeStall(masks, layers, [this](int l) { return LayerName(l); });
}

// ---------------------------------------------------------------------------------------------
// Running the agreed layers

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
    const DType dt = layer_dtype_[static_cast<size_t>(l)];
    Status bad;
    if (e.desc.count != static_cast<int64_t>(n)) {
      bad = InvalidArgument("Engine::Submit: layer ", l, " (", LayerName(l), ") step ", e.desc.step,
                            ": count ", e.desc.count,
                            " on every rank, but the "
                            "layer has ",
                            n, " elements; expected ", n);
    } else if (static_cast<DType>(e.desc.dtype) != dt) {
      bad = InvalidArgument("Engine::Submit: layer ", l, " (", LayerName(l), ") step ", e.desc.step,
                            ": dtype ", DTypeName(static_cast<DType>(e.desc.dtype)),
                            " on every rank, but the layer is ", DTypeName(dt), "; expected ",
                            DTypeName(dt));
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
    return layer_dtype_[static_cast<size_t>(l)] == DType::kFloat32 &&
           layer_strategy_[static_cast<size_t>(l)] == StrategyKind::kAllReduce &&
           e.desc.factors == 0;
  };
  std::vector<engine::SliceItem> slice_items;
  for (int l : runnable) {
    const Entry& e = queues_[static_cast<size_t>(l)].front();
    engine::SliceItem it;
    it.elem_bytes = DTypeSize(layer_dtype_[static_cast<size_t>(l)]);
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
  // The queues now hold what this cycle leaves behind: the next negotiation runs while the
  // exchanges below do, so a busy engine pays no separate negotiation latency.
  PostNext();
  for (const auto& op : ops) {
    switch (op.kind) {
      case engine::OpKind::kFused: {
        std::vector<Part> group;
        for (size_t i : op.items) group.push_back(parts[i]);
        RunFused(group);
        break;
      }
      case engine::OpKind::kChunked:
        RunChunked(parts[op.items[0]]);
        break;
      case engine::OpKind::kDirect:
        RunDirect(parts[op.items[0]]);
        break;
      case engine::OpKind::kStrategy:
        RunStrategy(parts[op.items[0]].e);
        break;
    }
  }
}

CallOptions Engine::Call() const {
  CallOptions call;
  call.memory = options_.memory;
  call.stream = stream_ ? stream_->get() : nullptr;
  // The negotiation agreed on every layer's count and dtype, and the ops derive from agreed
  // values alone: the backend's own argument-agreement allreduce would only add a latency.
  call.agreed = true;
  return call;
}

Status Engine::FinishSum(Entry* e) {
  // The same operation DenseAllReduce applies after its sum (grad *= 1/P, or the optimizer
  // step with 1/P fused in), so fused, chunked, sliced and unfused exchanges give bitwise
  // identical results.
  ExchangeBuffers b;
  b.grad = static_cast<float*>(e->grad.data);
  b.params = e->grad.params;
  return hc_->FinishDenseSum(static_cast<int>(e->desc.layer), b, e->desc.step);
}

void Engine::CountTraffic(const Entry& e) {
  // A ring allreduce's wire bytes are linear in its size, so a layer's share of a fused or
  // chunked allreduce is what its own allreduce would send.
  const double bytes = CostModel::WireBytes(CollectiveKind::kAllReduce, comm_->size(),
                                            4.0 * static_cast<double>(e.desc.count));
  hc_->AddTraffic(static_cast<int>(e.desc.layer), bytes, bytes);
}

void Engine::EndPart(const Part& p, const Status& s) {
  Entry* e = p.e;
  const bool whole = p.begin == 0 && p.last;
  if (!whole) counters_.slices.fetch_add(1, std::memory_order_relaxed);
  Status st = s;
  if (st.ok() && !whole && !layer_optimizer_[static_cast<size_t>(e->desc.layer)]) {
    // A slice is averaged on its own (the element-wise 1/P of FinishDenseSum), so the last
    // slice leaves nothing else to do.
    st = kernels_->Scale(static_cast<float*>(e->grad.data) + p.begin, p.end - p.begin,
                         1.0f / static_cast<float>(comm_->size()),
                         stream_ ? stream_->get() : nullptr);
  }
  if (!p.last) {
    if (!st.ok()) FailSlice(e, st);
    e->offset = p.end;
    return;
  }
  // (Not after an earlier slice failed here: Finish reports that failure instead.)
  if (st.ok() && e->local_error.ok() &&
      (whole || layer_optimizer_[static_cast<size_t>(e->desc.layer)])) {
    // The whole layer's sum is in place: average it, or take the optimizer step once.
    st = FinishSum(e);
  }
  if (st.ok()) CountTraffic(*e);
  Finish(e, st);
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

void Engine::RunFused(const std::vector<Part>& group) {
  size_t total = 0;
  std::vector<ConstByteRange> in;
  std::vector<ByteRange> out;
  for (const Part& p : group) {
    const size_t bytes = (p.end - p.begin) * sizeof(float);
    float* data = static_cast<float*>(p.e->grad.data) + p.begin;
    in.push_back(ConstByteRange{data, bytes});
    out.push_back(ByteRange{data, bytes});
    total += p.end - p.begin;
  }
  const Kernels& k = *kernels_;
  const CallOptions call = Call();
  Status s;
  if (fusion_buf_ == nullptr || fusion_buf_->bytes() < total * sizeof(float)) {
    fusion_buf_.reset();
    auto r = k.Allocate(total * sizeof(float));
    if (r.ok()) {
      fusion_buf_ = std::move(*r);
    } else {
      s = r.status();
    }
  }
  float* buf = fusion_buf_ ? fusion_buf_->as<float>() : nullptr;
  const double t0 = NowUs();
  if (s.ok()) s = k.Pack(in, buf, call.stream);
  const double t1 = NowUs();
  if (s.ok()) s = backend_->AllReduce(buf, buf, total, DType::kFloat32, call);
  const double t2 = NowUs();
  if (s.ok()) s = k.Unpack(buf, out, call.stream);
  counters_.fused_groups.fetch_add(1, std::memory_order_relaxed);
  counters_.fused_layers.fetch_add(static_cast<int64_t>(group.size()), std::memory_order_relaxed);
  for (const Part& p : group) {
    Record(*p.e, "pack", t0, t1);
    Record(*p.e, "allreduce(fused)", t1, t2);
    const double t3 = NowUs();
    EndPart(p, s.ok() ? s : s.WithPrefix("fused allreduce: "));
    Record(*p.e, "unpack+finish", t2, t3);
  }
}

void Engine::RunDirect(const Part& p) {
  Entry* e = p.e;
  float* data = static_cast<float*>(e->grad.data) + p.begin;
  const size_t n = p.end - p.begin;
  const double t0 = NowUs();
  Status s;
  if (n > 0) s = backend_->AllReduce(data, data, n, DType::kFloat32, Call());
  const double t1 = NowUs();
  if (p.begin == 0 && p.last) counters_.direct_layers.fetch_add(1, std::memory_order_relaxed);
  Record(*e, p.last && p.begin == 0 ? "allreduce" : "allreduce(slice)", t0, t1);
  EndPart(p, s);
}

void Engine::RunChunked(const Part& p) {
  // PHub-style pipeline: the allreduce of chunk i+1 is in flight while chunk i is scaled.
  Entry* e = p.e;
  float* data = static_cast<float*>(e->grad.data) + p.begin;
  const size_t n = p.end - p.begin;
  const size_t chunk_elems =
      std::max<size_t>(1, static_cast<size_t>(options_.chunk_bytes) / sizeof(float));
  const auto ranges = engine::ChunkRanges(n, chunk_elems);
  // With an optimizer the step runs once over the whole layer after its last part (its state
  // spans the layer); without one each chunk is averaged while the next is in flight.
  const bool optimizer = layer_optimizer_[static_cast<size_t>(e->desc.layer)];
  Backend& be = *backend_;
  auto post = [&](size_t i) -> Result<std::unique_ptr<Request>> {
    return be.IAllReduce(data + ranges[i].first, data + ranges[i].first,
                         ranges[i].second - ranges[i].first, DType::kFloat32);
  };
  // A local failure (e.g. the scale) must not stop this rank from posting the layer's remaining
  // chunks: the peers are in those collectives and would wait. Only a failed post (an MPI error)
  // ends the pipeline early. The first error is reported once every chunk is through.
  Status s;
  std::unique_ptr<Request> current, next;
  double posted = NowUs();
  auto first = post(0);
  if (first.ok()) {
    current = std::move(*first);
  } else {
    s = first.status();
  }
  for (size_t i = 0; i < ranges.size() && current; ++i) {
    double next_posted = 0;
    if (i + 1 < ranges.size()) {
      next_posted = NowUs();
      auto r = post(i + 1);
      if (!r.ok()) {
        if (s.ok()) s = r.status();
      } else {
        next = std::move(*r);
      }
    }
    Status w = current->Wait();
    const double t1 = NowUs();
    if (s.ok()) s = w;
    if (s.ok() && !optimizer) {
      s = kernels_->Scale(data + ranges[i].first, ranges[i].second - ranges[i].first,
                          1.0f / static_cast<float>(comm_->size()), nullptr);
    }
    const double t2 = NowUs();
    Record(*e, "allreduce(chunk)", posted, t1);
    Record(*e, "scale(chunk)", t1, t2);
    counters_.chunks.fetch_add(1, std::memory_order_relaxed);
    current = std::move(next);
    posted = next_posted;
  }
  // Never leave a posted request behind: MPI may still be writing into the gradient.
  if (current) (void)current->Wait();
  counters_.chunked_layers.fetch_add(1, std::memory_order_relaxed);
  if (!s.ok() && p.last) {
    Finish(e, s.WithPrefix("chunked allreduce: "));
    return;
  }
  if (!s.ok()) FailSlice(e, s.WithPrefix("chunked allreduce: "));
  if (!p.last) {
    counters_.slices.fetch_add(1, std::memory_order_relaxed);
    e->offset = p.end;
    return;
  }
  if (p.begin > 0) counters_.slices.fetch_add(1, std::memory_order_relaxed);
  if (optimizer && e->local_error.ok()) s = FinishSum(e);
  if (s.ok()) CountTraffic(*e);
  Finish(e, s);
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
  Status s = hc_->Exchange(l, b, e->desc.step);
  const double t1 = NowUs();
  counters_.strategy_layers.fetch_add(1, std::memory_order_relaxed);
  Record(*e, StrategyName(layer_strategy_[static_cast<size_t>(l)]), t0, t1);
  Finish(e, s);
}

}  // namespace poseidon
