// HybridCollective: Poseidon's per-layer gradient exchange. The engine and the trainers call it.
//
// Use:
//   auto hc = HybridCollective::Create(comm);                    // host memory, CPU kernels
//   LayerSpec fc6;
//   fc6.name = "fc6"; fc6.shape = {4096, 25088}; fc6.kind = LayerKind::kFullyConnected;
//   int id = *(*hc)->RegisterLayer(fc6);
//   PSD_CHECK((*hc)->BuildPlan(/*batch=*/32));   // probe (or cache) + planner
//   std::cout << (*hc)->PrintPlan();
//   ... every step, on every rank, same layers in the same order:
//   ExchangeBuffers b; b.grad = g; b.u = u; b.v = v; b.batch = 32;
//   PSD_CHECK((*hc)->Exchange(id, b, step));
//
// Threading: not thread-safe; one thread (the engine's) calls it. Exchange is blocking and
// collective: every rank must call it for the same layer id in the same order.
// Registration is local; BuildPlan is collective and fails on every rank (kMismatch) when the
// ranks' plans differ (different layers registered, different batch).
// Memory: host (CPU kernels, MPI backend) or device (CUDA kernels, comm->backend(kDevice):
// NCCL or MPI staged through pinned buffers). Every strategy keeps its state and scratch in
// the collective's memory (Kernels::Allocate). With device memory, Exchange queues its kernels
// and copies on stream() and returns once the host part is done: the results are ordered on
// that stream, so synchronize it (or wait on an event recorded after it) before the host
// reads them.
// Layer state (top-k residuals, optimizer state) is kept per layer and strategy; rebuilding the
// plan keeps the state of layers whose strategy did not change. State does not migrate between
// strategies: a layer that moves from allreduce to ps starts with fresh optimizer state.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/cost_model.h"
#include "collectives/layer.h"
#include "collectives/planner.h"
#include "collectives/strategy.h"
#include "runtime/communicator.h"

namespace poseidon {

// One piece of a dense layer's sum (a layer planned allreduce, float32, no factors): elements
// [begin, end) of the layer's gradient. `last` when the piece reaches the layer's end: the
// layer's tail (the 1/P average or the optimizer step, and its traffic) runs after it.
struct DensePart {
  int layer = 0;
  int64_t step = 0;
  float* grad = nullptr;    // the whole layer's gradient (the piece starts at grad + begin)
  float* params = nullptr;  // the layer's parameters (layers with an optimizer)
  size_t begin = 0, end = 0;
  bool last = true;
  // Sum only, no tail: this rank failed an earlier piece of the layer locally but still takes
  // part in the collective, which the peers are in.
  bool sum_only = false;
};

// How a batch of dense parts is summed:
//  kFused    packed into the collective's fusion buffer, one allreduce, unpacked; the only kind
//            that carries a trailer (see DenseBatch);
//  kInPlace  one part, summed in place;
//  kChunked  one part, cut into chunk_bytes pieces pipelined with non-blocking allreduces
//            (host memory): piece i+1 is in flight while piece i is averaged.
enum class DenseBatchKind { kFused, kInPlace, kChunked };

struct DenseBatch {
  DenseBatchKind kind = DenseBatchKind::kFused;
  std::vector<DensePart> parts;
  size_t chunk_bytes = 0;  // kChunked
  // kFused: zeros summed after the parts, so a rank without (all of) the data still makes the
  // collective its peers make (a cached round it cannot take part in with data).
  size_t pad = 0;
  // kFused: floats summed in the same allreduce, after the parts (the engine's control words in
  // a cached round). With a trailer, `commit` sees the summed trailer and decides whether the
  // parts take the result (true) or keep their input untouched (false: nothing is unpacked).
  std::vector<float> trailer;
  std::function<bool(const float* trailer_sum)> commit;
  // Whether the report's phase times are wanted (the engine's timeline); false skips the clock
  // reads and leaves them 0.
  bool timed = true;
};

struct DenseBatchReport {
  std::vector<Status> status;  // per part: the sum's status, then the tail's
  bool committed = true;       // false when `commit` declined (every part keeps its input)
  std::vector<float> trailer_sum;
  int chunks = 0;                                 // kChunked: allreduces run
  double pack_us = 0, reduce_us = 0, finish_us = 0;  // wall times of the three phases
};

// Traffic counters (wire bytes per rank, see cost_model.h).
struct Traffic {
  int64_t exchanges = 0;
  double bytes_sent = 0;        // what the chosen strategies sent
  double dense_bytes = 0;       // what dense allreduce would have sent for the same exchanges
  double last_bytes_sent = 0;   // the most recent exchange (per layer) or iteration (total)
  int64_t dense_fallbacks = 0;  // topk exchanges that ran dense (warm-up, small layer)
};

class HybridCollective {
 public:
  // kernels == nullptr: KernelsFor(memory). The communicator must outlive this object.
  // Device memory takes comm->backend(kDevice), which is collective on its first use (every
  // rank must then create its collective); kUnavailable without CUDA or a GPU.
  static Result<std::unique_ptr<HybridCollective>> Create(std::shared_ptr<Communicator> comm,
                                                          MemoryKind memory = MemoryKind::kHost,
                                                          const Kernels* kernels = nullptr);
  // Not copied or moved: its kept sinks (sinks_) hold its address.
  HybridCollective(const HybridCollective&) = delete;
  HybridCollective& operator=(const HybridCollective&) = delete;

  // Validates and resolves the spec (settings fill unset options); returns the layer id
  // (0, 1, 2, ... in registration order). Names must be unique.
  Result<int> RegisterLayer(const LayerSpec& spec);
  int num_layers() const { return static_cast<int>(layers_.size()); }
  const LayerSpec& layer(int id) const { return layers_[static_cast<size_t>(id)].spec; }

  // Plans every registered layer for batch K per rank. The first form measures the cost model
  // (or loads the cache, see LoadOrMeasureCostModel); the second uses the given figures.
  // Planner options come from the settings unless given. Collective.
  Status BuildPlan(size_t batch);
  Status BuildPlan(size_t batch, const CostModel& model,
                   std::optional<PlannerOptions> options = std::nullopt);
  bool has_plan() const { return plan_.has_value(); }
  const Plan& plan() const { return *plan_; }
  std::string PrintPlan() const;
  const CostModel& cost_model() const { return model_; }
  StrategyKind strategy(int id) const;

  // Exchanges one layer with its planned strategy (see ExchangeBuffers for the buffers). The
  // id, the plan, the step and the buffers (CheckSubmission) are checked first; a refused
  // buffer on one rank also fails the peers' exchange (Backend::FailTogether) instead of
  // leaving them waiting for this rank.
  Status Exchange(int id, const ExchangeBuffers& buffers, int64_t step);
  // Exchange without those checks, for a caller that ran them on every submission itself and
  // made every rank fail on a refusal (the engine: Engine::Submit), so that they run once.
  Status ExchangeChecked(int id, const ExchangeBuffers& buffers, int64_t step);

  // Sums a batch of dense layer parts over ranks in one collective (fused), in place, or as a
  // chunk pipeline, then runs each finished layer's tail: bitwise what Exchange gives for each
  // layer alone, however the layers are fused, sliced or chunked. Collective: every rank passes
  // the same kind and the same part sizes (the engine agreed on them, so the backend's argument
  // agreement is skipped). A failure of the collective fails every part; a tail failure only its
  // part. The engine's entry point: the parts' buffers are checked by its caller, as for
  // ExchangeChecked; local errors of one rank are reported per part, and the rank still takes
  // part in the collective, so the peers are never left waiting.
  DenseBatchReport ExchangeDense(const DenseBatch& batch);
  // The same, into a report the caller keeps across calls (its vectors keep their capacity:
  // the engine's cached rounds allocate nothing per step).
  void ExchangeDense(const DenseBatch& batch, DenseBatchReport* rep);
  // Allocates the fusion buffer ExchangeDense packs into (at least `bytes`), so no allocation
  // can fail on one rank mid-run. Local.
  Status ReserveFusion(size_t bytes);


  // The stream the strategies' kernels and device collectives are ordered on (device memory;
  // null: the default stream). The engine sets its own; set it only while no exchange runs.
  void set_stream(void* stream) { ctx_.call.stream = stream; }
  // Polled by every wait of every collective the strategies run (the engine's liveness, so a
  // lost peer ends a strategy's exchange instead of hanging it). Set only while no exchange runs.
  void set_interrupt(const Interrupt* interrupt) { ctx_.call.interrupt = interrupt; }
  void* stream() const { return ctx_.call.stream; }
  MemoryKind memory() const { return ctx_.call.memory; }
  const Kernels& kernels() const { return *ctx_.kernels; }

  // Per-layer and total traffic; "last" of the total is the current iteration (the exchanges
  // since the last ResetIteration).
  const Traffic& LayerTraffic(int id) const { return layers_[static_cast<size_t>(id)].traffic; }
  const Traffic& TotalTraffic() const { return total_; }
  void ResetIteration() { total_.last_bytes_sent = 0; }

  // The state of a layer's current strategy (nullptr before its first exchange); tests read
  // top-k residuals through it.
  const LayerState* state(int id) const;

  int rank() const { return comm_->rank(); }
  int world() const { return comm_->size(); }

 private:
  HybridCollective() = default;
  Status CheckId(const char* call, int id) const;
  // BuildPlan's error path, on every rank: where rank `other`'s plan table (`mine` there)
  // first differs from rank 0's, as "first at line N of the table: rank 0 '...', rank r '...'".
  // Collective.
  Result<std::string> FirstPlanDifference(const std::string& mine, int other);
  // ExchangeDense's tail for a layer it summed (fusion buffer, slices, chunks): buffers.grad
  // holds the sum over ranks of layer `id` (planned allreduce); applies the 1/P average or,
  // with an optimizer, the step on buffers.params with the average fused in: bitwise what
  // Exchange would have produced. Local (no communication); does not count traffic (AddTraffic).
  Status FinishDenseSum(int id, const ExchangeBuffers& buffers, int64_t step);
  // Counts one exchange of layer `id` that ran outside Exchange (fused or chunked by the
  // engine): bytes_sent on the wire per rank, dense_bytes what a dense allreduce would send.
  void AddTraffic(int id, double bytes_sent, double dense_bytes);
  // The layer's state for its planned strategy, made on first use.
  Result<LayerState*> StateFor(int id);
  // The optimizer state a dense sum of layer `id` steps (Strategy::SumOptimizer); null when the
  // layer has no optimizer, is not planned as allreduce, or its state cannot be made.
  OptimizerState* SumOptimizerOf(int id);

  struct Layer {
    LayerSpec spec;
    std::optional<StrategyKind> state_kind;  // the strategy `state` belongs to
    std::unique_ptr<LayerState> state;
    Traffic traffic;
  };

  std::shared_ptr<Communicator> comm_;
  StrategyContext ctx_;
  std::vector<Layer> layers_;
  std::map<std::string, int> ids_;
  CostModel model_;
  std::optional<Plan> plan_;
  Traffic total_;
  StrategyBuffer fusion_buf_;     // ExchangeDense's packing buffer (grown by ReserveFusion)
  std::vector<SumPiece> pieces_;  // ExchangeDense's piece list, kept across calls
  std::vector<float*> summed_;    // and its parts left in the fusion buffer
  // ExchangeDense's optimizer steps taken range by range from the backend's sum (pieces_'s
  // sinks). One per part of the current batch: the optimizer (null: the part has no sink), the
  // layer's parameters, whether the step began, its status.
  struct SinkPart {
    OptimizerState* opt = nullptr;
    float* params = nullptr;
    bool began = false;
    Status status;
  };
  std::vector<SinkPart> sink_parts_;
  // sinks_[i] steps sink_parts_[i]. Made once per index and kept: capturing only `this` and the
  // index, a steady-state call rebuilds nothing (and allocates nothing).
  std::vector<SumSink> sinks_;
  void SinkRange(size_t part, size_t offset, size_t count, const void* sum);
};

}  // namespace poseidon
