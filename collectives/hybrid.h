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

  // Exchanges one layer with its planned strategy (see ExchangeBuffers for the buffers).
  Status Exchange(int id, const ExchangeBuffers& buffers, int64_t step);

  // For the engine, which sums dense allreduce layers itself (fusion buffer, chunks): buffers.grad
  // holds the sum over ranks of layer `id` (planned allreduce); applies the 1/P average or,
  // with an optimizer, the step on buffers.params with the average fused in: bitwise what
  // Exchange would have produced. Local (no communication); does not count traffic (AddTraffic).
  Status FinishDenseSum(int id, const ExchangeBuffers& buffers, int64_t step);
  // Counts one exchange of layer `id` that ran outside Exchange (fused or chunked by the
  // engine): bytes_sent on the wire per rank, dense_bytes what a dense allreduce would send.
  void AddTraffic(int id, double bytes_sent, double dense_bytes);

  // The stream the strategies' kernels and device collectives are ordered on (device memory;
  // null: the default stream). The engine sets its own; set it only while no exchange runs.
  void set_stream(void* stream) { ctx_.call.stream = stream; }
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
  // The layer's state for its planned strategy, made on first use.
  Result<LayerState*> StateFor(int id);

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
};

}  // namespace poseidon
