// Engine: wait-free backpropagation. One background thread per communicator owns all
// communication progress; user threads hand over gradients and get a Handle.
//
// Use (every rank, same layers, same order):
//   auto hc = HybridCollective::Create(comm);   ... RegisterLayer ... BuildPlan(batch);
//   auto engine = Engine::Create(comm, hc.get());          // collective: every rank calls it
//   backward pass, layer L done:  handles[L] = (*engine)->Submit(L, grad, count, step);
//   next forward, before layer L:  PSD_CHECK(handles[L]->Wait());
//   (*engine)->Shutdown();                                 // collective; also in ~Engine
//
// How a cycle of the engine thread works (engine.cc has the details):
//   1. Move new submissions into per-layer FIFO queues (engine thread only).
//   2. One small MPI_Allreduce (negotiation.h): ready masks, flags, descriptor hashes. A busy
//      engine posts it (non-blocking) while the previous cycle's exchange runs, announcing
//      the queues as that cycle leaves them, so it costs no latency of its own.
//   3. From the reduced vector alone, every rank decides the same thing: fail everywhere
//      (error flag, descriptor mismatch, stall abort, shutdown), log a stall, or run the
//      layers ready everywhere, lowest layer index first, fused / chunked (fusion.h) or
//      through the layer's planned strategy.
//   4. Complete handles (status, then callback); publish timeline records.
//   When no rank has work the thread sleeps up to POSEIDON_CYCLE_US between cycles (a local
//   submission wakes it); while waiting for the other ranks it polls the negotiation with
//   growing sleeps instead of spinning, which matters when ranks share cores.
//
// Agreement, always on: ranks must submit the same layers in the same order with the same
// element count, dtype and step. A rank that differs (size, dtype, order, a skipped layer)
// makes every rank fail within a cycle with kMismatch naming the layer, the differing field and
// the ranks on each side. A layer some ranks submitted and others did not for
// POSEIDON_STALL_WARN_S is logged by rank 0 (which ranks are missing which layers); after
// POSEIDON_STALL_ABORT_S every pending handle on every rank fails with kTimeout saying so.
//
// Errors are sticky: the first failure (mismatch, stall abort, a failed exchange on any rank,
// an invalid submission on any rank) fails every pending handle on every rank with that status
// and stops the engine; later Submit calls return handles failed with the same status.
//
// MPI and threads: while the engine runs, its thread is the only one that calls MPI on the
// communicator's duplicate, and the only caller of the HybridCollective. Users must not call
// blocking Poseidon collectives (Backend, HybridCollective) on the same communicator until
// Shutdown returns. The engine needs MPI_THREAD_MULTIPLE (InitMpi asks for it) so user threads
// may keep calling MPI on their own communicators; with MPI_THREAD_SERIALIZED it runs but logs
// that the user must not call MPI at all while it runs; below that Create fails (kUnavailable).
//
// Latency (what decides scaling on a slow network, measured in bench/cluster): the engine's
// own allreduces pass CallOptions::agreed (the negotiation already agreed on count and dtype,
// so the backend skips its argument-agreement allreduce); an idle engine woken by a submission
// waits up to POSEIDON_FUSION_WAIT_US so that layers handed over right after it share one
// negotiation and one fused allreduce; and one cycle runs at most POSEIDON_SLICE_BYTES of dense
// work, lowest layer first, so the layer the next forward pass needs first (conv1: last in the
// backward pass) waits for one slice, never for a whole large layer (fusion.h, PlanSlices).
// A busy engine posts the next cycle's negotiation before running the current cycle's
// exchanges (POSEIDON_PIPELINE_NEGOTIATION, on by default), and a rank whose announced work
// waits for other ranks negotiates again without the idle sleep.
//
// Fusion and chunking: float32 dense allreduce layers (no factors), with or without an
// optimizer, are summed by the engine itself (fusion buffer, chunks, or alone on their own
// buffer); the collective then finishes each layer (HybridCollective::FinishDenseSum: the 1/P
// average, or the optimizer step with the average fused in) and counts its traffic
// (AddTraffic), so fused and unfused runs give bitwise identical results, optimizer included.
// Other layers run whole through HybridCollective::Exchange. Fused and single layers use the
// backend's blocking AllReduce (its shared-memory path on one node); chunks (host memory only)
// use IAllReduce so chunk i+1 is in flight while chunk i is scaled (layers with an optimizer
// take their step once, after the last chunk). With Open MPI 4.1.4 on one node the
// non-blocking path is slower than the shared-memory one, so there POSEIDON_CHUNK_BYTES=0 is
// the faster choice (bench/overlap measures both).
//
// Device memory (EngineOptions::memory == kDevice, the collective made for device memory):
// the engine owns a CUDA stream and runs every exchange on it (the collective's stream is set
// to it while the engine runs). Submit records a ready event on the caller's stream
// (Gradient::stream); the engine thread makes its stream wait for that event on the device
// (the caller's host never blocks), runs the exchange, and records the handle's completion
// event on its stream. A device handle completes (Test / Wait / callback) once the exchange is
// queued on the engine's stream; the data is there once cuda_event() has fired, so order the
// consumer's stream after it (Handle::WaitOnStream, or cudaStreamWaitEvent yourself).
// Buffers passed to Submit must stay valid and untouched until the handle completes.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <mpi.h>

#include "collectives/hybrid.h"
#include "runtime/communicator.h"
#include "runtime/dtype.h"
#include "engine/negotiation.h"
#include "engine/stream_sync.h"
#include "engine/timeline.h"
#include "runtime/status.h"

namespace poseidon {

// Settings of one engine; FromSettings reads the POSEIDON_* values.
struct EngineOptions {
  long long fusion_bytes = 4 << 20;       // POSEIDON_FUSION_BYTES (0: no fusion)
  long long chunk_bytes = 16 << 20;       // POSEIDON_CHUNK_BYTES (0: no chunking)
  double stall_warn_s = 60;               // POSEIDON_STALL_WARN_S (0: never warn)
  double stall_abort_s = 300;             // POSEIDON_STALL_ABORT_S (0: never abort)
  long long cycle_us = 1000;              // POSEIDON_CYCLE_US
  long long fusion_wait_us = 200;         // POSEIDON_FUSION_WAIT_US (0: negotiate at once)
  long long slice_bytes = 1 << 20;        // POSEIDON_SLICE_BYTES (0: whole layers per cycle)
  bool pipeline_negotiation = true;       // POSEIDON_PIPELINE_NEGOTIATION
  std::string timeline;                   // POSEIDON_TIMELINE ("" = off)
  MemoryKind memory = MemoryKind::kHost;  // where the submitted buffers live (as the collective)

  static Result<EngineOptions> FromSettings();
  // Ranges: bytes >= 0, seconds finite and >= 0, cycle in [1, 1000000] us, fusion wait in
  // [0, 1000000] us.
  Status Validate() const;
};

// Completion callback: runs exactly once, with the final status, on the engine thread (or on
// the calling thread when Submit fails at once). Keep it short; it may call Submit, but must
// not call Shutdown or Wait on a handle of the same engine.
using DoneCallback = std::function<void(const Status&)>;

// What one Submit hands over. Pointers must stay valid until the handle completes.
struct Gradient {
  void* data = nullptr;  // the gradient (count elements of dtype); the averaged result lands
                         // here (with an optimizer: scratch, params hold the result)
  size_t count = 0;      // must equal the layer's element count on every rank
  DType dtype = DType::kFloat32;
  float* params = nullptr;   // required when the layer has an optimizer
  const float* u = nullptr;  // sufficient factors (fully connected layers), batch x M
  const float* v = nullptr;  // batch x N
  size_t batch = 0;          // factor rows
  // Device memory: the caller's cudaStream_t that produces the gradient (null: the default
  // stream). The exchange starts after the work queued on it before Submit.
  void* stream = nullptr;
};

// Shared completion state of one submission. Thread-safe: any thread may Test, Wait or read
// status. Lock order: mu_ is a leaf (never held while calling out).
class Handle {
 public:
  Handle(int layer, int64_t step, std::string layer_name);

  int layer() const { return layer_; }
  int64_t step() const { return step_; }
  // True once complete, successfully or not. Never blocks.
  bool Test() const { return done_.load(std::memory_order_acquire); }
  // Waits until complete and returns the final status. timeout_s < 0 waits forever; on
  // timeout returns kTimeout (the exchange goes on; wait again later).
  Status Wait(double timeout_s = -1) const;
  // The final status once Test() is true; while pending, kUnavailable saying so.
  Status status() const;

  // Device memory: the cudaEvent_t recorded on the engine's stream after this exchange, once
  // Test() is true and the exchange succeeded; null otherwise (pending, failed, host memory).
  // Valid while the handle lives.
  void* cuda_event() const;
  // Device memory: waits (host) until the exchange is queued, then orders `stream` (a
  // cudaStream_t, null: the default stream) after its completion on the device, so work
  // queued there later sees the result; the host never waits for the transfer itself. Host
  // memory: the same as Wait(timeout_s).
  Status WaitOnStream(void* stream, double timeout_s = -1) const;

 private:
  friend class Engine;
  // Sets the final status (first call wins), wakes waiters, then runs the callback.
  void Complete(const Status& s);

  const int layer_;
  const int64_t step_;
  const std::string layer_name_;
  DoneCallback callback_;  // set before the handle is shared; run once by Complete
  // Device memory: recorded on the engine's stream before Complete (set before sharing).
  std::unique_ptr<engine::Event> done_event_;
  // The engine's count of user threads blocked in Wait (set before sharing): an engine holding
  // its fusion window open stops waiting for more layers once somebody waits for a result.
  std::shared_ptr<std::atomic<int>> engine_waiters_;
  std::atomic<bool> done_{false};
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  Status status_;  // guarded by mu_, final once done_
};
using HandlePtr = std::shared_ptr<Handle>;

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
};

class Engine {
 public:
  // Collective. `collective` must have a plan (BuildPlan) and outlive the engine; nothing else
  // may call it while the engine runs. Options default to the settings.
  static Result<std::unique_ptr<Engine>> Create(std::shared_ptr<Communicator> comm,
                                                HybridCollective* collective);
  static Result<std::unique_ptr<Engine>> Create(std::shared_ptr<Communicator> comm,
                                                HybridCollective* collective,
                                                const EngineOptions& options);
  // Shutdown(), then frees everything.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues one layer's gradient for `step`. Never blocks on the network; thread-safe, but the
  // order of submissions must be the same on every rank (submit from one thread). Returns a
  // handle that is never null; a local argument error (bad layer id, null buffer) fails it at
  // once and, since the other ranks would wait for this rank, fails the engine everywhere.
  HandlePtr Submit(int layer, const Gradient& gradient, int64_t step, DoneCallback done = {});
  // Float32 gradient, no factors.
  HandlePtr Submit(int layer, float* grad, size_t count, int64_t step, DoneCallback done = {});

  // A local error that the other ranks cannot see (a caller's bad argument found before
  // Submit, e.g. by a binding): fails the engine on every rank within a cycle, naming this rank
  // and the message, instead of leaving the peers waiting for a submission that never comes.
  void ReportError(const Status& error);

  // Collective: stops the engine. Pending handles (here and on ranks that have not called
  // Shutdown yet) fail with kAborted "engine was shut down". Idempotent; returns the sticky
  // status (OK when the engine never failed).
  Status Shutdown();

  // OK while healthy; the sticky error once failed; kAborted after a clean shutdown.
  Status status() const;
  bool running() const;
  EngineStats stats() const;
  // The timeline file this rank writes ("" when off).
  std::string timeline_file() const;
  const EngineOptions& options() const { return options_; }

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
        slices{0}, pipelined{0};
  };

  Engine(std::shared_ptr<Communicator> comm, HybridCollective* collective,
         const EngineOptions& options);
  void Loop();
  // One cycle; returns false when the engine must stop (sticky status set).
  bool Cycle();
  // Moves new submissions into the queues and takes over local errors; returns whether a
  // shutdown was requested.
  bool TakeIncoming();
  // Fills send_vec_ from the queue heads, the stall timers, the local error and `shutdown`.
  void BuildVector(bool shutdown);
  // Posts the reduction of send_vec_ into recv_vec_ (negotiation_pending_ until it completes).
  Status PostNegotiation();
  // Waits for the posted reduction, polling with growing sleeps.
  Status WaitNegotiation();
  // Pipelining: after RunReady planned this cycle's ops (the queues already show the state the
  // cycle leaves behind), posts the next cycle's negotiation before the exchange runs.
  void PostNext();
  // Agreed failure: sets the sticky status (clean: a shutdown, not an error) and fails every
  // pending entry with it.
  void Fail(const Status& s, bool clean);
  Status GatherErrors();
  Status GatherMismatch(const std::vector<int>& layers);
  Result<std::string> GatherStall(const std::vector<int>& layers);
  void RunReady(const std::vector<int>& layers);
  void RunFused(const std::vector<Part>& group);
  void RunDirect(const Part& p);
  void RunChunked(const Part& p);
  // After a part's sum: the layer's tail (FinishSum, traffic, Finish) when it was the last
  // part, or the failure; a middle slice that succeeded only advances the entry's offset.
  void EndPart(const Part& p, const Status& s);
  // A part short of the layer's end failed on this rank: keeps the entry (see engine.cc).
  void FailSlice(Entry* e, const Status& s);
  // Backend options of the engine's own collectives (agreement checked by the negotiation).
  CallOptions Call() const;
  void RunStrategy(Entry* e);
  // The collective's local tail for a layer the engine summed (average or optimizer step),
  // and its traffic.
  Status FinishSum(Entry* e);
  void CountTraffic(const Entry& e);
  bool device() const { return options_.memory == MemoryKind::kDevice; }
  // Completes the entry's handle; a failure is also reported to the other ranks next cycle.
  void Finish(Entry* e, const Status& s);
  std::string LayerName(int layer) const;
  void Record(const Entry& e, const char* name, double begin_us, double end_us);

  const std::shared_ptr<Communicator> comm_;
  HybridCollective* const hc_;
  const EngineOptions options_;
  const int num_layers_;
  // Per layer, copied from the collective at construction (immutable, read by any thread).
  std::vector<std::string> layer_names_;
  std::vector<size_t> layer_count_;
  std::vector<DType> layer_dtype_;
  std::vector<bool> layer_optimizer_;
  std::vector<StrategyKind> layer_strategy_;
  std::unique_ptr<engine::Timeline> timeline_;
  Backend* backend_ = nullptr;              // the communicator's backend for options_.memory
  const Kernels* kernels_ = nullptr;        // the collective's kernels
  std::unique_ptr<engine::Stream> stream_;  // device memory: the engine's stream
  int device_ = -1;                         // device memory: the CUDA device of the creator
  void* previous_stream_ = nullptr;         // the collective's stream before the engine

  // Shared between user threads and the engine thread.
  // Lock order: mu_ before Handle::mu_ is never needed: handles are completed with mu_
  // released. mu_ is never held while calling MPI, the collective or a callback.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Entry> incoming_;            // guarded by mu_
  std::vector<std::string> local_errors_;  // guarded by mu_: invalid submissions to report
  int64_t next_seq_ = 0;                   // guarded by mu_
  bool shutdown_requested_ = false;        // guarded by mu_
  bool stopped_ = false;                   // guarded by mu_: the engine thread has finished
  Status sticky_;                          // guarded by mu_
  bool clean_shutdown_ = false;            // guarded by mu_: sticky_ came from a shutdown
  std::mutex shutdown_mu_;                 // serializes Shutdown callers (taken before mu_)

  // Engine thread only.
  std::vector<std::deque<Entry>> queues_;  // per layer, FIFO
  std::vector<double> stall_since_us_;     // per layer: when it became ready somewhere only
  std::vector<bool> stall_warned_;
  std::unique_ptr<KernelBuffer> fusion_buf_;  // from the collective's kernels (host / device)
  std::string exec_error_;                    // a local failure to report next cycle
  StatusCode exec_error_code_ = StatusCode::kOk;
  bool ran_last_cycle_ = false;
  // User threads blocked in Handle::Wait (shared with the handles, which may outlive us).
  std::shared_ptr<std::atomic<int>> waiters_ = std::make_shared<std::atomic<int>>(0);
  // Entries moved into the queues after the last vector was built (not announced yet): an
  // engine holding them never sleeps before its next negotiation.
  bool unannounced_ = false;
  // A negotiation posted (pipelined or not) and not yet complete; its request and start.
  bool negotiation_pending_ = false;
  MPI_Request negotiation_req_ = MPI_REQUEST_NULL;
  double negotiation_posted_us_ = 0;  // for the timeline's negotiation track
  bool pipelined_round_ = false;      // this cycle's round was posted by the previous cycle
  // A failure posting the next negotiation from inside RunReady, reported by the next cycle.
  Status post_error_;
  bool in_agreed_check_ = false;  // failing an entry every rank fails alike
  // Negotiation buffers live on the heap and are released only once the request completed,
  // so an abandoned request (timeout) never writes into freed memory.
  std::unique_ptr<engine::NegotiationVector> send_vec_, recv_vec_;

  Counters counters_;
  std::thread thread_;
};

}  // namespace poseidon
