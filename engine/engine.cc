// The engine's public side: creation (collective, failing together), submission, shutdown.
// The engine thread's cycles live in loop.cc (negotiated) and cached.cc (response cache).
#include "engine/engine.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "runtime/liveness.h"
#include "runtime/agreement.h"
#include "runtime/log.h"

namespace poseidon {

using engine::Timeline;

namespace {

double NowUs() { return Timeline::NowUs(); }

}  // namespace

Result<std::unique_ptr<Engine>> Engine::Create(std::shared_ptr<Communicator> comm,
                                               HybridCollective* collective) {
  PSD_ASSIGN_OR_RETURN(EngineOptions options, EngineOptions::FromSettings());
  return Create(std::move(comm), collective, options);
}

Result<std::unique_ptr<Engine>> Engine::Create(std::shared_ptr<Communicator> comm,
                                               HybridCollective* collective,
                                               const EngineOptions& options) {
  // Argument errors that are the same on every rank (each rank calls Create with its own,
  // but a null pointer cannot take part in any agreement).
  PSD_REQUIRE_ARG(comm != nullptr, "Engine::Create: communicator is null");
  PSD_REQUIRE_ARG(collective != nullptr, "Engine::Create: collective is null");
  PSD_REQUIRE_ARG(collective->world() == comm->size(), "Engine::Create: the collective spans ",
                  collective->world(), " ranks but the communicator ", comm->size(),
                  "; expected the communicator the collective was made on");
  // Everything below fails on every rank together: the option values first (a difference
  // names the setting, the values and the ranks), then each rank's local checks and set-up.
  std::vector<AgreedValue> shaping;
  for (auto& [name, value] : options.Shaping()) shaping.push_back(AgreedValue{name, value});
  PSD_CHECK(AgreeOnValues(comm->mpi_comm(), shaping, "Engine::Create"));
  Status local = options.Validate();
  if (local.ok() && !collective->has_plan()) {
    local = InvalidArgument(
        "Engine::Create: the HybridCollective has no plan; expected BuildPlan(batch) to have "
        "run on every rank first");
  }
  if (local.ok() && options.memory != collective->memory()) {
    local = InvalidArgument("Engine::Create: options.memory is ", MemoryKindName(options.memory),
                            " but the collective works on ", MemoryKindName(collective->memory()),
                            " memory; expected the memory kind the collective was made for");
  }
  const int level = comm->mpi_thread_level();
  if (local.ok() && level < MPI_THREAD_SERIALIZED) {
    local = UnavailableError(
        "Engine::Create: MPI provides thread level ", level,
        " but the engine's background thread needs at least MPI_THREAD_SERIALIZED (",
        MPI_THREAD_SERIALIZED,
        "); initialize MPI with poseidon::InitMpi or MPI_Init_thread(MPI_THREAD_MULTIPLE)");
  }
  std::unique_ptr<Engine> e(new Engine(std::move(comm), collective, options));
  auto controller = engine::Controller::Create(e->comm_->mpi_comm(), e->num_layers_);
  if (!controller.ok()) return controller.status();  // MPI_Comm_dup: collective already failed
  e->controller_ = std::move(*controller);
  if (local.ok()) local = e->SetUp();
  PSD_CHECK(e->controller_->GatherErrors(local.code(), local.message(), nullptr));
  if (level < MPI_THREAD_MULTIPLE && e->comm_->rank() == 0) {
    PSD_LOG(kWarn,
            "Engine: MPI provides only MPI_THREAD_SERIALIZED: no other thread may call MPI "
            "while the engine runs, and peers are not watched (no heartbeats)");
  }
  e->hc_->set_interrupt(e->interrupt());
  if (!e->device()) {
    // Host memory: a waiting user thread may run a ready cached op itself (engine.h). Device
    // memory stays with the engine thread and its stream.
    e->link_->run = [p = e.get()](const Handle& h) { p->RunForWaiter(h); };
    e->link_->blocked = [p = e.get()] { p->WaiterBlocks(); };
  }
  e->thread_ = std::thread([p = e.get()] { p->Loop(); });
  return e;
}

Status Engine::SetUp() {
  // The fusion buffer holds the largest fused group plus a cached round's trailer, reserved
  // now so that no allocation can fail on one rank mid-run.
  const size_t fused_max =
      static_cast<size_t>(std::max<long long>(options_.fusion_bytes, 0)) +
      engine::kTrailerFloats * sizeof(float);
  PSD_CHECK(hc_->ReserveFusion(fused_max));
  if (device()) {
    // The engine thread works on the creator's device, on a stream of its own; the collective
    // runs its kernels and device collectives there too while the engine lives.
    PSD_ASSIGN_OR_RETURN(device_, engine::CurrentDevice());
    PSD_ASSIGN_OR_RETURN(stream_, engine::Stream::Create());
    previous_stream_ = hc_->stream();
    hc_->set_stream(stream_->get());
  }
  if (!options_.timeline.empty()) {
    PSD_ASSIGN_OR_RETURN(timeline_,
                         Timeline::Open(options_.timeline, comm_->rank(), comm_->size()));
    for (int l = 0; l < num_layers_; ++l) timeline_->SetLayerName(l, LayerName(l));
    // One more track after the layers: the negotiation rounds of the cycles that ran work.
    timeline_->SetLayerName(num_layers_, "negotiation");
  }
  Liveness& shared = comm_->liveness();
  if (shared.active() && shared.peer_timeout_s() == options_.peer_timeout_s) {
    // The communicator's watch (the same on every rank: the timeout is agreed), with this
    // engine's choice of abort and grace while it lives.
    watch_ = &shared;
    previous_abort_ = shared.SetAbort(options_.peer_lost_abort, options_.peer_lost_grace_s);
    observer_ = shared.AddObserver([this](const Status& s) { OnPeerLost(s); });
  } else if (comm_->mpi_thread_level() >= MPI_THREAD_MULTIPLE && options_.peer_timeout_s > 0) {
    // Options of its own (a test, a caller's EngineOptions): a watch of its own.
    LivenessOptions lo;
    lo.peer_timeout_s = options_.peer_timeout_s;
    lo.abort_on_loss = options_.peer_lost_abort;
    lo.grace_s = options_.peer_lost_grace_s;
    PSD_ASSIGN_OR_RETURN(liveness_, Liveness::Create(comm_->mpi_comm(), lo,
                                                     [this](const Status& s) { OnPeerLost(s); }));
    watch_ = liveness_.get();
  }
  // A cached op waits this long for its layers before it gives up (doubled after each time it
  // had to): long enough for a forward pass between steps, short enough that a stall warning
  // still comes from the negotiated mode in time.
  patience_s_ = 1.0;
  return Status::Ok();
}

Engine::Engine(std::shared_ptr<Communicator> comm, HybridCollective* collective,
               const EngineOptions& options)
    : comm_(std::move(comm)),
      hc_(collective),
      options_(options),
      num_layers_(collective->num_layers()),
      queues_(static_cast<size_t>(num_layers_)),
      stall_since_us_(static_cast<size_t>(num_layers_), -1.0),
      stall_warned_(static_cast<size_t>(num_layers_), false) {
  for (int l = 0; l < num_layers_; ++l) {
    const LayerSpec& spec = hc_->layer(l);
    link_->layer_names.push_back(spec.name);
    layer_count_.push_back(spec.NumElements());
    layer_strategy_.push_back(hc_->has_plan() ? hc_->strategy(l) : StrategyKind::kAllReduce);
  }
}

Engine::~Engine() {
  Status s = Shutdown();
  bool stuck = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stuck = thread_.joinable() && !stopped_;
  }
  if (stuck) {
    // The engine thread is inside a call that ignores every deadline (a vendor call) and holds
    // pointers into this object: freeing it would be undefined, and waiting has no bound. The
    // job cannot go on safely.
    PSD_LOG(kError, "Engine: the engine thread did not stop within ", shutdown_deadline_s(),
            " s (", s.message(), "); ending the job");
    MPI_Abort(MPI_COMM_WORLD, 70);
  }
  if (liveness_ != nullptr) liveness_->Leave();
  if (observer_ != 0) {
    comm_->liveness().RemoveObserver(observer_);  // waits for a call under way
    comm_->liveness().SetAbort(previous_abort_.first, previous_abort_.second);
  }
}

double Engine::shutdown_deadline_s() const {
  // A healthy shutdown completes within one cached op's patience (peers idle in a cached op
  // join after it); a lost peer is declared within the peer timeout.
  return std::max(options_.peer_timeout_s, 1.0) + options_.peer_lost_grace_s + 30.0 + 5.0;
}

const Interrupt* Engine::interrupt() const { return watch_; }

const std::string& Engine::LayerName(int layer) const { return link_->LayerName(layer); }

HandlePtr Engine::Submit(int layer, float* grad, size_t count, int64_t step, DoneCallback done) {
  Gradient g;
  g.data = grad;
  g.count = count;
  return Submit(layer, g, step, std::move(done));
}

HandlePtr Engine::Submit(int layer, const Gradient& g, int64_t step, DoneCallback done) {
  return Enqueue("Engine::Submit", layer, g, step, std::move(done), nullptr);
}

Result<HandlePtr> Engine::TrySubmit(const char* call, int layer, const Gradient& g, int64_t step,
                                    DoneCallback done) {
  Status refused;
  HandlePtr h = Enqueue(call, layer, g, step, std::move(done), &refused);
  if (h == nullptr) return refused;
  return h;
}

HandlePtr Engine::Enqueue(const char* call, int layer, const Gradient& g, int64_t step,
                          DoneCallback done, Status* refused) {
  auto h = std::make_shared<Handle>(layer, step, link_);
  h->callback_ = std::move(done);
  // Device memory: capture the caller's stream now (the gradient is complete once the work
  // queued there so far has run) and make the handle's completion event. Only the recording
  // happens here: the host never waits for the device in Submit.
  std::unique_ptr<engine::Event> ready;
  // Local checks: what only this rank can see, the one place they run for a submission (the
  // collective's exchange does not repeat them: RunStrategy calls ExchangeChecked). Agreement
  // (count, dtype, order) is checked across ranks by the engine, so that the error names every
  // side. `err` names no call: the refusal's own message does.
  std::string err;
  const bool in_range = layer >= 0 && layer < num_layers_;
  if (!in_range) {
    err = StrCat("layer id ", layer, " is out of range; expected 0..", num_layers_ - 1,
                 " (the registered layers)");
  } else {
    ExchangeBuffers buf;
    buf.grad = static_cast<float*>(g.data);
    buf.params = g.params;
    buf.u = g.u;
    buf.v = g.v;
    buf.batch = g.batch;
    const StrategyKind kind = layer_strategy_[static_cast<size_t>(layer)];
    if (Status s = CheckSubmission(hc_->layer(layer), kind, buf); !s.ok()) {
      err = StrCat("layer ", layer, " step ", step, ": ", s.message());
    } else if (kind == StrategyKind::kSfb && (g.u == nullptr || g.v == nullptr)) {
      // Left to the engine (CheckSubmission takes null factors with batch 0 for a rank without
      // rows): submissions are matched by whether they carry factors, so a layer planned as sfb
      // always comes as factors here, and a dense gradient alone is refused, not overwritten.
      err = StrCat("layer ", layer, " (", LayerName(layer), ") step ", step,
                   ": planned as sfb but no factors were given; expected u and v (batch x M, "
                   "batch x N; not null also for a batch of 0 rows)");
    } else if (step < 0) {
      err = StrCat("layer ", layer, " (", LayerName(layer), ") step ", step,
                   ": expected a step >= 0");
    } else if (!device() && g.stream != nullptr) {
      err = StrCat("layer ", layer, " (", LayerName(layer), ") step ", step,
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
      err = StrCat("layer ", layer, " (", LayerName(layer), ") step ", step, ": ", es.message());
    }
  }
  std::unique_lock<std::mutex> lock(mu_);
  const bool failed = !sticky_.ok() || stopped_ || shutdown_requested_;
  if (!err.empty() && refused != nullptr) {
    // TrySubmit: the refusal is the caller's error, whatever state the engine is in. The other
    // ranks will wait for this submission: report it so that they fail too.
    if (!failed) local_errors_.push_back(StrCat("invalid submission: ", call, ": ", err));
    lock.unlock();
    cv_.notify_one();
    *refused = InvalidArgument(err);
    return nullptr;
  }
  if (failed) {
    Status s = !sticky_.ok() ? sticky_ : AbortedError("Engine::Submit: the engine was shut down");
    lock.unlock();
    h->Complete(Status(s.code(), StrCat("layer ", layer, " (", LayerName(layer), ") step ", step,
                                        ": ", s.message())));
    return h;
  }
  if (!err.empty()) {
    // The other ranks will wait for this submission: report it so that they fail too.
    local_errors_.push_back(StrCat("invalid submission: ", call, ": ", err));
    lock.unlock();
    cv_.notify_one();
    h->Complete(InvalidArgument(call, ": ", err));
    return h;
  }
  // For the liveness thread, which fails every pending handle when a peer is lost.
  if (live_handles_.size() >= live_prune_at_) {
    live_handles_.erase(std::remove_if(live_handles_.begin(), live_handles_.end(),
                                       [](const std::weak_ptr<Handle>& w) {
                                         auto p = w.lock();
                                         return p == nullptr || p->Test();
                                       }),
                        live_handles_.end());
    live_prune_at_ = std::max<size_t>(64, 2 * live_handles_.size());
  }
  live_handles_.push_back(h);
  Entry e;
  e.handle = h;
  e.grad = g;
  e.desc.layer = layer;
  e.desc.step = step;
  e.desc.count = static_cast<int64_t>(g.count);
  e.desc.dtype = static_cast<int64_t>(g.dtype);
  e.desc.strategy = static_cast<int64_t>(layer_strategy_[static_cast<size_t>(layer)]);
  e.desc.factors = (g.u != nullptr && g.v != nullptr) ? 1 : 0;
  e.submit_us = NowUs();
  e.ready = std::move(ready);
  incoming_.push_back(std::move(e));
  bool wake = true;
  if (!wake_on_.empty()) {
    uint8_t& w = wake_on_[static_cast<size_t>(layer)];
    if (w == kWakeAwaited) {
      w = kWakeQuiet;
      // The op is complete. The last of a step: the user is about to wait for it and then runs
      // it itself (RunForWaiter); the engine thread's tick covers one that does not.
      wake = --awaited_ == 0 &&
             (!awaited_last_ || wake_for_last_.load(std::memory_order_relaxed) ||
              link_->waiters.load(std::memory_order_seq_cst) > 0);
    } else if (w == kWakeQuiet) {
      wake = false;
    }
  }
  if (!wake) return h;
  kick_ = true;
  lock.unlock();
  cv_.notify_one();
  return h;
}

void Engine::WaiterBlocks() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Negotiated mode (no wake-up table): the cycle reads the waiters count itself.
    if (wake_on_.empty()) return;
    kick_ = true;
  }
  cv_.notify_one();
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
    std::unique_lock<std::mutex> lock(mu_);
    shutdown_requested_ = true;
    cv_.notify_all();
    // Bounded: the engine thread's every wait polls the liveness monitor, so it stops within
    // the peer timeout even when a peer is gone.
    const bool stopped = stopped_cv_.wait_for(
        lock, std::chrono::duration<double>(shutdown_deadline_s()),
        [&] { return stopped_ || !thread_.joinable(); });
    if (!stopped) {
      return TimeoutError("Engine::Shutdown: the engine thread did not stop within ",
                          shutdown_deadline_s(), " s",
                          sticky_.ok() ? std::string() : StrCat(" (", sticky_.message(), ")"));
    }
  }
  if (thread_.joinable()) thread_.join();
  {
    // No waiter runs an exchange from now on (one running now has finished: it held this).
    std::lock_guard<std::mutex> lock(link_->mu);
    link_->run = nullptr;
    link_->blocked = nullptr;
  }
  hc_->set_interrupt(nullptr);
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
  s.cached_ops = counters_.cached_ops.load();
  s.cache_exits = counters_.cache_exits.load();
  s.waiter_ops = counters_.waiter_ops.load();
  return s;
}

std::string Engine::timeline_file() const { return timeline_ ? timeline_->file() : ""; }

void Engine::OnPeerLost(const Status& s) {
  // The liveness thread: the engine thread may be inside a collective that will now stop at
  // its next poll, or inside a call that ignores deadlines; the users must hear either way.
  std::vector<std::weak_ptr<Handle>> handles;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (sticky_.ok()) {
      sticky_ = s;
      clean_shutdown_ = false;
    }
    handles.swap(live_handles_);
  }
  cv_.notify_all();
  for (auto& w : handles) {
    if (auto h = w.lock()) {
      h->Complete(Status(s.code(), StrCat("layer ", h->layer(), " (", LayerName(h->layer()),
                                          ") step ", h->step(), ": ", s.message())));
    }
  }
}

void Engine::Loop() {
  pthread_setname_np(pthread_self(), "psd-engine");  // for top -H, gdb, perf
  if (device()) {
    // CUDA's current device is per thread: use the one the engine was created on.
    Status s = engine::UseDevice(device_);
    if (!s.ok()) {
      // Every rank must stop together: report it through the first cycle's error flag.
      exec_error_ = StrCat("engine thread: ", s.message());
      exec_error_code_ = s.code();
    }
  }
  {
    std::unique_lock<std::mutex> exec(exec_mu_);
    EngineLink::busy = true;
    while (!halted_ && (cached_ ? CachedCycle(&exec) : Cycle())) {
    }
    halted_ = true;
    if (timeline_) timeline_->Publish();
  }
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
  stopped_cv_.notify_all();
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

}  // namespace poseidon
