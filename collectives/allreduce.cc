// Dense allreduce, the baseline every other strategy is measured against.
//  1. A fully connected layer handed over as factors forms its gradient locally: G = U^T V.
//  2. The backend sums the gradient over ranks in place (a ring on the wire: 2(P-1)/P n floats
//     sent per rank).
//  3. With an optimizer every rank applies the step to the full parameter, the 1/P average fused
//     into the step's pass; without one the sum is scaled by 1/P and returned in grad.
// Bitwise identical results on every rank follow from the backend's reduction (every rank
// receives the same reduced bytes) and the deterministic optimizer kernel.
#include "collectives/strategy.h"

namespace poseidon {
namespace {

class DenseState : public LayerState {
 public:
  explicit DenseState(const OptimizerSpec& spec) : opt(spec) {}
  OptimizerState opt;
};

class AllReduce final : public Strategy {
 public:
  StrategyKind kind() const override { return StrategyKind::kAllReduce; }

  // time = AR(4n) [+ optimizer over 4n bytes] [+ local U^T V for factor-given FC layers]
  // bytes = 2 (P-1)/P 4n
  CostEstimate Cost(const LayerSpec& layer, size_t batch, int world,
                    const CostModel& model) const override {
    CostEstimate c = strategy_internal::DenseAllReduceCost(layer, world, model);
    c.time_s += strategy_internal::FormGradientTime(layer, batch, model);
    return c;
  }

  Result<std::unique_ptr<LayerState>> NewState(const LayerSpec& layer,
                                               const StrategyContext&) const override {
    return std::unique_ptr<LayerState>(new DenseState(layer.optimizer));
  }

  Status Exchange(const LayerSpec& layer, LayerState* state, const ExchangeBuffers& buf,
                  int64_t step, const StrategyContext& ctx, ExchangeReport* report) const override {
    auto* s = static_cast<DenseState*>(state);
    PSD_CHECK(strategy_internal::BeforeCollective(
        ctx, [&] { return strategy_internal::FormGradientFromFactors(layer, buf, ctx); }));
    return strategy_internal::DenseAllReduce(layer, &s->opt, buf, ctx, report);
  }

  Status FinishSum(const LayerSpec& layer, LayerState* state, const ExchangeBuffers& buf,
                   const StrategyContext& ctx) const override {
    return strategy_internal::FinishDenseSum(layer, &static_cast<DenseState*>(state)->opt, buf,
                                             ctx);
  }

  OptimizerState* SumOptimizer(LayerState* state) const override {
    return &static_cast<DenseState*>(state)->opt;
  }
};

}  // namespace

namespace strategy_internal {
const Strategy& AllReduceStrategy() {
  static const AllReduce s;
  return s;
}
}  // namespace strategy_internal
}  // namespace poseidon
