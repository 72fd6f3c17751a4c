// Engine: wait-free backpropagation. One background thread per communicator owns all
// communication progress; user threads hand over gradients and get a Handle.
//
// Use (every rank registers the same layers):
//   auto hc = HybridCollective::Create(comm);   ... RegisterLayer ... BuildPlan(batch);
//   auto engine = Engine::Create(comm, hc.get());          // collective: every rank calls it
//   backward pass, layer L done:  handles[L] = (*engine)->Submit(L, grad, count, step);
//   next forward, before layer L:  PSD_CHECK(handles[L]->Wait());
//   (*engine)->Shutdown();                                 // collective; also in ~Engine
//
// Contract:
//  - Matching. Layers are matched across ranks by id (as Horovod matches by name): within a
//    step, every rank submits the same layers, in any order, from any thread. A layer's
//    submissions run in submission order (its step numbers must agree). The engine agrees on
//    one execution order; a rank whose submission differs (element count, dtype, step,
//    strategy, factors) makes every rank fail within a cycle with kMismatch naming the layer,
//    the field and the ranks on each side. A layer some ranks never submit stalls: rank 0
//    logs which ranks miss which layers after POSEIDON_STALL_WARN_S, and every handle fails
//    with kTimeout after POSEIDON_STALL_ABORT_S.
//  - Settings. Create agrees on every option that shapes the collectives (fusion, chunk,
//    slice, pipelining, response cache, peer timeout, memory kind); a difference fails Create
//    on every rank naming the setting, the values and the ranks.
//  - Deadlines. The engine thread never blocks in a collective: negotiation, dense sums and
//    every strategy's collectives are polled against the liveness monitor (liveness.h). A peer
//    not heard from for POSEIDON_PEER_TIMEOUT_S (heartbeats, independent of submissions, so a
//    rank busy in user code is only slow, never lost) is lost: every pending and future handle
//    on every survivor fails with kPeerLost naming the rank and host, the line is printed once
//    on stderr, and the job ends with MPI_Abort after POSEIDON_PEER_LOST_GRACE_S (MPI cannot
//    cancel a posted collective; POSEIDON_PEER_LOST_ABORT=0 keeps the process, its handles
//    failed). Shutdown and the destructor never wait past their deadline.
//  - Steady state. Once two consecutive steps ran the same schedule of fused dense groups, the
//    engine skips its negotiation round: each group is one allreduce carrying a descriptor
//    check (response_cache.h), and any deviation returns every rank to negotiation within
//    that step. The waiter runs: in this mode (host memory), a user thread that calls Wait
//    without a timeout while the engine thread has not started the op it needs, and the op
//    is complete, runs it itself (the same op the engine thread would run, in the same order;
//    one runner at a time) instead of sleeping through two thread hand-overs. The engine
//    thread is woken by a submission only when it completes the op it waits for, and not even
//    then for the last op of a step while nobody waits (the user is about to wait for it),
//    unless that op once lay complete with nobody waiting when the engine thread's idle tick
//    (50 ms) came (callbacks or polling drive this user: the engine thread then runs it at
//    once). A user thread that starts to sleep on an incomplete handle wakes the engine
//    thread (EngineLink::blocked): after a 5 ms grace the op returns to negotiation.
//  - Errors are sticky: the first failure fails every pending handle on every rank with that
//    status and stops the engine; later Submit calls return handles failed with it.
//  - Threads and MPI: while the engine runs, its threads are the only users of the
//    communicator's duplicates and of the HybridCollective. The engine needs
//    MPI_THREAD_MULTIPLE for its liveness thread (InitMpi asks for it); with
//    MPI_THREAD_SERIALIZED it runs without heartbeats (the user must not call MPI while it
//    runs); below that Create fails (kUnavailable).
//  - Device memory (EngineOptions::memory == kDevice): the engine runs every exchange on a
//    CUDA stream of its own; Submit records a ready event on the caller's stream (the host
//    never blocks); a device handle completes once the exchange is queued; order the consumer
//    after cuda_event() (Handle::WaitOnStream). Buffers passed to Submit must stay valid and
//    untouched until the handle completes.
// How a cycle works, and the measured latency work behind it: engine.cc, loop.cc and
// bench/RESULTS.md ("Engine").
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collectives/hybrid.h"
#include "engine/controller.h"
#include "engine/handle.h"
#include "engine/negotiation.h"
#include "engine/options.h"
#include "engine/response_cache.h"
#include "engine/stream_sync.h"
#include "engine/timeline.h"
#include "runtime/communicator.h"
#include "runtime/status.h"

namespace poseidon {

class Liveness;

// What one Submit hands over. Pointers must stay valid until the handle completes.
struct Gradient {
  void* data = nullptr;  // the gradient (count elements of dtype); the averaged result lands
                         // here (with an optimizer: scratch, params hold the result)
  size_t count = 0;      // must equal the layer's element count on every rank
  // Layers are float32 (RegisterLayer refuses any other dtype); another value fails the
  // handle, on every rank (kMismatch when the ranks differ, kInvalidArgument when they agree).
  DType dtype = DType::kFloat32;
  float* params = nullptr;   // required when the layer has an optimizer
  const float* u = nullptr;  // sufficient factors (fully connected layers), batch x M
  const float* v = nullptr;  // batch x N
  size_t batch = 0;          // factor rows
  // Device memory: the caller's cudaStream_t that produces the gradient (null: the default
  // stream). The exchange starts after the work queued on it before Submit.
  void* stream = nullptr;
};

// Counters for tests and tools (monotonic; read any time).
struct EngineStats {
  int64_t cycles = 0;           // negotiation rounds
  int64_t completed = 0;        // handles completed successfully
  int64_t fused_groups = 0;     // fusion-buffer allreduces (2+ layers)
  int64_t fused_layers = 0;     // layers exchanged inside them
  int64_t chunked_layers = 0;   // layers cut into chunks
  int64_t chunks = 0;           // chunk allreduces
  int64_t direct_layers = 0;    // fusible layers exchanged alone
  int64_t slices = 0;           // partial exchanges of a layer cut by POSEIDON_SLICE_BYTES
  int64_t strategy_layers = 0;  // layers run through HybridCollective::Exchange
  int64_t stall_warnings = 0;   // stall warnings raised (every rank counts them)
  int64_t pipelined = 0;        // negotiations posted while an exchange ran (of `cycles`)
  int64_t cached_ops = 0;       // ops run from the response cache (no negotiation round)
  int64_t cache_exits = 0;      // cached rounds that sent every rank back to negotiation
  int64_t waiter_ops = 0;       // cached ops run by a user thread in Wait (of `cached_ops`)
};

class Engine {
 public:
  // Collective. `collective` must have a plan (BuildPlan) and outlive the engine; nothing else
  // may call it while the engine runs. Options default to the settings. Any rank's failure
  // (bad options, differing settings, a local set-up error) fails Create on every rank.
  static Result<std::unique_ptr<Engine>> Create(std::shared_ptr<Communicator> comm,
                                                HybridCollective* collective);
  static Result<std::unique_ptr<Engine>> Create(std::shared_ptr<Communicator> comm,
                                                HybridCollective* collective,
                                                const EngineOptions& options);
  // Shutdown(), then frees everything.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues one layer's gradient for `step`. Never blocks on the network; thread-safe. Returns
  // a handle that is never null; a local argument error (bad layer id, null buffer) fails it
  // at once and, since the other ranks would wait for this rank, fails the engine everywhere.
  HandlePtr Submit(int layer, const Gradient& gradient, int64_t step, DoneCallback done = {});
  // Float32 gradient, no factors.
  HandlePtr Submit(int layer, float* grad, size_t count, int64_t step, DoneCallback done = {});
  // Submit for a caller that returns a refused submission as the error of its own call `call`
  // (psdSubmit): the local argument error comes back here, its message naming no call, instead
  // of in a failed handle; it still fails the engine on every rank (the peers' message names
  // `call`), as Submit's does. The one place a submission's arguments are checked.
  Result<HandlePtr> TrySubmit(const char* call, int layer, const Gradient& gradient, int64_t step,
                              DoneCallback done = {});

  // A local error the other ranks cannot see (a caller's bad argument found before Submit,
  // e.g. by a binding): fails the engine on every rank within a cycle, naming this rank and
  // the message, instead of leaving the peers waiting for a submission that never comes.
  void ReportError(const Status& error);

  // Collective: stops the engine. Pending handles (here and on ranks that have not called
  // Shutdown yet) fail with kAborted "engine was shut down". Idempotent; returns the sticky
  // status (OK when the engine never failed). Waits at most shutdown_deadline_s() for the
  // engine thread (kTimeout after that, the thread left behind).
  Status Shutdown();

  // OK while healthy; the sticky error once failed; kAborted after a clean shutdown.
  Status status() const;
  bool running() const;
  EngineStats stats() const;
  // The timeline file this rank writes ("" when off).
  std::string timeline_file() const;
  const EngineOptions& options() const { return options_; }
  // The longest Shutdown waits for the engine thread.
  double shutdown_deadline_s() const;

 private:
  struct Entry {
    HandlePtr handle;
    Gradient grad;
    engine::Descriptor desc;
    double submit_us = 0;
    std::unique_ptr<engine::Event> ready;  // device memory: recorded on the caller's stream
    Status local_error;  // a failure on this rank before the exchange (reported by Finish)
    size_t offset = 0;   // elements already summed by earlier slices (same on every rank)
    bool started = false;  // checked and timed (its first slice ran or runs this cycle)
    bool error_reported = false;  // local_error already went into exec_error_
  };
  // The part [begin, end) of an entry's elements that one op of this cycle sums; `last` when
  // it reaches the end of the layer (the entry then completes).
  struct Part {
    Entry* e = nullptr;
    size_t begin = 0, end = 0;
    bool last = true;
  };
  struct Counters {
    std::atomic<int64_t> cycles{0}, completed{0}, fused_groups{0}, fused_layers{0},
        chunked_layers{0}, chunks{0}, direct_layers{0}, strategy_layers{0}, stall_warnings{0},
        slices{0}, pipelined{0}, cached_ops{0}, cache_exits{0}, waiter_ops{0};
  };

  Engine(std::shared_ptr<Communicator> comm, HybridCollective* collective,
         const EngineOptions& options);
  // Submit and TrySubmit: checks and queues the submission. A refusal is reported to every
  // rank, then returned through `refused` (nullptr returned) when it is not null, else in a
  // handle failed with it (the message prefixed with `call`).
  HandlePtr Enqueue(const char* call, int layer, const Gradient& g, int64_t step,
                    DoneCallback done, Status* refused);
  // Local set-up after construction (controller, liveness, stream, timeline, fusion buffer).
  Status SetUp();
  void Loop();
  // One negotiated cycle (loop.cc); returns false when the engine must stop.
  bool Cycle();
  // One op from the response cache (cached.cc); returns false when the engine must stop.
  // Called with exec_mu_ held through `exec`; released while it sleeps.
  bool CachedCycle(std::unique_lock<std::mutex>* exec);
  // The cached op's state from the queues: complete, or deviating from the schedule.
  struct CachedReadiness {
    bool complete = false;
    bool deviates = false;
  };
  CachedReadiness CheckCachedOp(const engine::CachedOp& op) const;
  // Steps 2-3 of the cached cycle (one round for op next_op_): false when the engine must stop.
  bool CachedRound(bool ready, bool shutdown, const char* why, double start_us);
  // Under mu_: arms the wake-ups for the current cached op's layers that have not arrived.
  void ArmLocked();
  // The waiter runs (Handle::Wait through EngineLink::run): runs complete cached ops until `h`
  // is done, if the engine thread is not running one.
  void RunForWaiter(const Handle& h);
  // Handle::Wait through EngineLink::blocked: a user thread sleeps on an incomplete handle.
  // In cached mode, wakes the engine thread, which starts the grace after which an incomplete
  // cached op returns to negotiation (CachedCycle).
  void WaiterBlocks();
  // Moves new submissions into the queues and takes over local errors; returns whether a
  // shutdown was requested.
  bool TakeIncoming();
  // Fills the controller's send vector from the queue heads, the stall timers, the local
  // error and `shutdown`.
  void BuildVector(bool shutdown);
  // Pipelining: after RunReady planned this cycle's ops (the queues already show the state the
  // cycle leaves behind), posts the next cycle's negotiation before the exchange runs.
  void PostNext();
  // Agreed failure: sets the sticky status (clean: a shutdown, not an error) and fails every
  // pending entry with it.
  void Fail(const Status& s, bool clean);
  // The liveness thread's report of a lost peer: sticky status, every pending handle failed.
  void OnPeerLost(const Status& s);
  void RunReady(const std::vector<int>& layers);
  // Sums dense parts through HybridCollective::ExchangeDense and completes what finished.
  void RunDense(DenseBatchKind kind, const std::vector<Part>& parts);
  // A part short of the layer's end failed on this rank: keeps the entry (see loop.cc).
  void FailSlice(Entry* e, const Status& s);
  void RunStrategy(Entry* e);
  bool device() const { return options_.memory == MemoryKind::kDevice; }
  const Interrupt* interrupt() const;
  // Completes the entry's handle; a failure is also reported to the other ranks next cycle.
  void Finish(Entry* e, const Status& s);
  const std::string& LayerName(int layer) const;  // "?" outside 0..num_layers_-1
  void Record(const Entry& e, const char* name, double begin_us, double end_us);
  std::vector<engine::Descriptor> WaitingDescriptors() const;

  const std::shared_ptr<Communicator> comm_;
  HybridCollective* const hc_;
  const EngineOptions options_;
  const int num_layers_;
  // Per layer, copied from the collective at construction (immutable, read by any thread;
  // the names are link_->layer_names, shared with the handles).
  std::vector<size_t> layer_count_;
  std::vector<StrategyKind> layer_strategy_;
  std::unique_ptr<engine::Timeline> timeline_;
  std::unique_ptr<engine::Controller> controller_;
  // The peer watch: the communicator's when the timeout matches (watch_ points there and
  // observer_ is set), else one of its own (liveness_); null when off.
  std::unique_ptr<Liveness> liveness_;
  Liveness* watch_ = nullptr;
  int observer_ = 0;
  std::pair<bool, double> previous_abort_{true, 0};
  std::unique_ptr<engine::Stream> stream_;  // device memory: the engine's stream
  int device_ = -1;                         // device memory: the CUDA device of the creator
  void* previous_stream_ = nullptr;         // the collective's stream before the engine

  // Shared between user threads, the liveness thread and the engine thread.
  // Lock order: shutdown_mu_ before mu_; mu_ before Handle::mu_ is never needed (handles are
  // completed with mu_ released). mu_ is never held while calling MPI, the collective or a
  // callback.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Entry> incoming_;            // guarded by mu_
  std::vector<std::string> local_errors_;  // guarded by mu_: invalid submissions to report
  std::vector<std::weak_ptr<Handle>> live_handles_;  // guarded by mu_: for OnPeerLost
  size_t live_prune_at_ = 64;                        // guarded by mu_
  bool shutdown_requested_ = false;        // guarded by mu_
  bool stopped_ = false;                   // guarded by mu_: the engine thread has finished
  Status sticky_;                          // guarded by mu_
  bool clean_shutdown_ = false;            // guarded by mu_: sticky_ came from a shutdown
  std::condition_variable stopped_cv_;     // signalled (under mu_) when stopped_ turns true
  // Cached mode wakes the engine thread only for what it can act on (cached.cc): a submission
  // of a layer outside the schedule, or the one that completes the op it waits for. Per layer
  // (guarded by mu_): kWakeAlways, kWakeQuiet (in the schedule, not awaited now) or
  // kWakeAwaited (the current op waits for it and it has not arrived).
  enum : uint8_t { kWakeAlways = 0, kWakeQuiet = 1, kWakeAwaited = 2 };
  std::vector<uint8_t> wake_on_;           // guarded by mu_
  std::vector<int> armed_;                 // guarded by mu_: the layers set kWakeAwaited
  int awaited_ = 0;                        // guarded by mu_: layers still kWakeAwaited
  bool awaited_last_ = false;              // guarded by mu_: the armed op ends a step
  std::atomic<bool> wake_for_last_{false};  // nobody waits for the step's last op
  bool waiter_blocked_ = false;  // guarded by mu_: a waiter found exec_mu_ taken (cached.cc)
  bool kick_ = false;                      // guarded by mu_: a submission asked for a wake-up

  // The executor: held by the engine thread while it runs (released while a cached cycle
  // sleeps) and by a waiter running a cached op. Everything under "Engine thread only" below
  // belongs to its holder. Order: EngineLink::mu, exec_mu_, mu_.
  std::mutex exec_mu_;
  bool halted_ = false;  // guarded by exec_mu_: a round decided the engine stops
  std::shared_ptr<EngineLink> link_ = std::make_shared<EngineLink>();
  std::mutex shutdown_mu_;                 // serializes Shutdown callers (taken before mu_)

  // Engine thread only (the holder of exec_mu_).
  std::vector<std::deque<Entry>> queues_;  // per layer, FIFO
  std::vector<double> stall_since_us_;     // per layer: when it became ready somewhere only
  std::vector<bool> stall_warned_;
  std::string exec_error_;  // a local failure to report next cycle
  StatusCode exec_error_code_ = StatusCode::kOk;
  bool ran_last_cycle_ = false;
  // Entries moved into the queues after the last vector was built (not announced yet): an
  // engine holding them never sleeps before its next negotiation.
  bool unannounced_ = false;
  bool pipelined_round_ = false;  // this cycle's round was posted by the previous cycle
  // A failure posting the next negotiation from inside RunReady, reported by the next cycle.
  Status post_error_;
  bool in_agreed_check_ = false;  // failing an entry every rank fails alike
  // Response cache (response_cache.h).
  engine::ScheduleRecorder recorder_;
  bool cached_ = false;  // in cached mode
  std::vector<engine::CachedOp> schedule_;
  std::vector<bool> in_schedule_;  // per layer: appears in schedule_ (set on entering the cache)
  size_t next_op_ = 0;
  double patience_s_ = 1.0;  // how long a cached op waits for its layers before bailing
  // CachedRound's lists, kept across rounds so that a steady-state round allocates nothing.
  std::vector<engine::Descriptor> round_heads_;
  std::vector<Entry*> round_entries_;
  DenseBatch round_batch_;
  DenseBatchReport round_report_;
  bool switch_to_cache_ = false;  // set by RunReady, taken at the end of the cycle

  Counters counters_;
  std::thread thread_;
};

}  // namespace poseidon
