// The planner: picks one exchange strategy per layer from predicted costs.
//
// For each layer:
//   1. Candidates: the layer's own list, else PlannerOptions::candidates (POSEIDON_CANDIDATES);
//      a candidate that does not apply to the layer (StrategyApplies) is shown as "-".
//   2. Each applicable candidate's Cost(layer, K, P, model): predicted time and wire bytes.
//   3. Choice: a per-layer force wins; then a global force (POSEIDON_STRATEGY) where it applies
//      (where it does not, e.g. sfb on a conv layer, the layer falls back to the cheapest
//      candidate and the plan says so); otherwise the cheapest candidate. Times within a
//      relative 1e-12 of the cheapest count as a tie, broken in the order sfb, allreduce, ps,
//      topk: lossless before lossy, and sfb first because Poseidon's rule sends factors when
//      their bytes are no more than the dense exchange's (P K <= 2 M N / (M + N)).
//   4. Fusion (MakePlan, with PlannerOptions::fusion_bytes): the layers chosen "auto" whose
//      allreduce is a candidate and fits the fusion buffer would be summed by the engine in
//      ceil(total / fusion_bytes) allreduces; when that costs less than their separate choices
//      (each paying its own latencies), they all take allreduce with the reason "fused".
//
// The Plan prints as a whitespace table and parses back (ParsePlan(plan.ToString()) gives the
// same plan up to the printed precision of times and bytes).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "collectives/cost_model.h"
#include "collectives/layer.h"

namespace poseidon {

struct CandidateCost {
  StrategyKind strategy = StrategyKind::kAllReduce;
  bool applies = false;    // false: not applicable or not considered (printed "-")
  bool candidate = false;  // may be chosen; allreduce is always costed as the baseline and
                           // printed in parentheses when it is not a candidate
  double time_s = 0;
  double bytes_sent = 0;
};

struct PlanEntry {
  std::string layer;
  std::vector<size_t> shape;
  LayerKind kind = LayerKind::kDense;
  std::vector<CandidateCost> candidates;  // one per strategy, in kAllStrategies order
  StrategyKind choice = StrategyKind::kAllReduce;
  // "auto" (cheapest candidate), "layer" (per-layer force), "global" (POSEIDON_STRATEGY),
  // "global-na" (the global force does not apply here: cheapest candidate instead) or
  // "fallback" (no candidate applies: allreduce).
  std::string reason = "auto";

  const CandidateCost& cost(StrategyKind s) const { return candidates[static_cast<int>(s)]; }
};

struct Plan {
  int world = 1;
  size_t batch = 0;
  std::string model_source;  // where the cost figures came from
  std::vector<PlanEntry> entries;

  // Totals of the chosen strategies' predictions.
  double PredictedTime() const;
  double PredictedBytes() const;
  // What dense allreduce would cost for every layer (for the "saved" line).
  double DenseAllReduceTime() const;
  double DenseAllReduceBytes() const;

  std::string ToString() const;
};

Result<Plan> ParsePlan(const std::string& text);

struct PlannerOptions {
  std::optional<StrategyKind> global_force;  // POSEIDON_STRATEGY unless "auto"
  std::vector<StrategyKind> candidates = {kAllStrategies, kAllStrategies + kNumStrategies};
  // The engine's fusion buffer (POSEIDON_FUSION_BYTES; 0: no fusion). Dense layers up to this
  // size are summed together in one allreduce, so they share its latency: the planner then
  // compares "every such layer allreduced, fused" with their separate choices (reason "fused").
  long long fusion_bytes = 0;

  // From POSEIDON_STRATEGY and POSEIDON_CANDIDATES; bad values are errors naming the setting.
  static Result<PlannerOptions> FromSettings();
};

// Plans `layers` (each resolved with ResolveLayerSpec) for batch K per rank on `world` ranks.
Result<Plan> MakePlan(const std::vector<LayerSpec>& layers, size_t batch, int world,
                      const CostModel& model, const PlannerOptions& options);

// Costs and choice for one layer (MakePlan calls it for each).
Result<PlanEntry> PlanLayer(const LayerSpec& layer, size_t batch, int world, const CostModel& model,
                            const PlannerOptions& options);

}  // namespace poseidon
