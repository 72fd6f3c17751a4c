// Sharded parameter server (PHub-style), co-located with the workers: every rank owns one
// contiguous shard of the parameter (shard.h: the first n % P ranks hold one element more, so
// any n and P work, shards may be empty).
//  1. A fully connected layer handed over as factors forms its gradient locally: G = U^T V.
//  2. Reduce-scatter with the uneven shard counts: each owner receives the sum of its shard
//     ((P-1)/P n floats sent per rank).
//  3. The owner applies the optimizer to its shard, the 1/P average fused into the same pass
//     over the summed gradient (SgdStep / AdamStep with grad_scale 1/P). Optimizer state
//     (momentum, Adam's m and v) exists only for the shard: 1/P of the memory per rank.
//  4. Allgather(v) of the updated shards into the full parameter on every rank ((P-1)/P n
//     floats sent per rank). Every rank ends with the owner's bytes, so bitwise identical.
// The wire bytes equal the ring allreduce's; ps wins when the optimizer's pass is expensive
// (each rank updates only n / P parameters) and needs an optimizer to exist at all.
#include <vector>

#include "collectives/strategy.h"
#include "runtime/shard.h"

namespace poseidon {
namespace {

class PsState : public LayerState {
 public:
  explicit PsState(const OptimizerSpec& spec) : opt(spec) {}
  OptimizerState opt;    // for this rank's shard only
  StrategyBuffer shard;  // the summed gradient of the shard, then the updated shard
};

class Ps final : public Strategy {
 public:
  StrategyKind kind() const override { return StrategyKind::kPs; }

  // time = RS(4n) + AG(4n) + optimizer over 4 ceil(n/P) bytes [+ local U^T V for FC factors]
  // bytes = (P-1)/P 4n + (P-1)/P 4n
  CostEstimate Cost(const LayerSpec& layer, size_t batch, int world,
                    const CostModel& model) const override {
    double n = static_cast<double>(layer.NumElements());
    double bytes = 4.0 * n;
    double shard = 4.0 * static_cast<double>(ShardCount(layer.NumElements(), world, 0));
    CostEstimate c;
    c.time_s = model.CollectiveTime(CollectiveKind::kReduceScatter, world, bytes) +
               model.CollectiveTime(CollectiveKind::kAllGather, world, bytes) +
               model.OptimizerTime(shard) +
               strategy_internal::FormGradientTime(layer, batch, model);
    c.bytes_sent = CostModel::WireBytes(CollectiveKind::kReduceScatter, world, bytes) +
                   CostModel::WireBytes(CollectiveKind::kAllGather, world, bytes);
    return c;
  }

  Result<std::unique_ptr<LayerState>> NewState(const LayerSpec& layer,
                                               const StrategyContext&) const override {
    std::string why;
    PSD_REQUIRE_ARG(StrategyApplies(StrategyKind::kPs, layer, &why), "ps: layer ", layer.name, ": ",
                    why);
    return std::unique_ptr<LayerState>(new PsState(layer.optimizer));
  }

  Status Exchange(const LayerSpec& layer, LayerState* state, const ExchangeBuffers& buf,
                  int64_t step, const StrategyContext& ctx, ExchangeReport* report) const override {
    const char* call = "Exchange(ps)";
    if (!layer.optimizer.enabled()) {
      return strategy_internal::FailTogether(
          ctx, InvalidArgument(call, ": layer ", layer.name,
                               " has no optimizer; ps updates parameters on the shard owner, so "
                               "it needs one (use allreduce to average gradients)"));
    }
    auto* s = static_cast<PsState*>(state);
    const size_t n = layer.NumElements();
    const int world = ctx.backend->size();
    const int rank = ctx.backend->rank();
    const std::vector<size_t> counts = ShardCounts(n, world);
    const size_t mine = counts[static_cast<size_t>(rank)];
    const size_t offset = ShardOffset(n, world, rank);
    PSD_CHECK(strategy_internal::BeforeCollective(ctx, [&]() -> Status {
      PSD_CHECK(s->shard.Grow(*ctx.kernels, mine * sizeof(float)));
      return strategy_internal::FormGradientFromFactors(layer, buf, ctx);
    }));
    float* shard = s->shard.as<float>();
    PSD_CHECK(ctx.backend->ReduceScatter(buf.grad, shard, counts, DType::kFloat32, ctx.call));
    const float inv = 1.0f / static_cast<float>(world);
    PSD_CHECK(strategy_internal::BeforeCollective(ctx, [&]() -> Status {
      PSD_CHECK(s->opt.Apply(buf.params + offset, shard, 1, 0, inv, mine, ctx));
      // MPI may not alias send and receive buffers, so the updated shard travels from scratch.
      return ctx.kernels->Copy(shard, buf.params + offset, mine * sizeof(float), ctx.call.stream);
    }));
    PSD_CHECK(ctx.backend->AllGatherV(shard, buf.params, counts, DType::kFloat32, ctx.call));
    double bytes = 4.0 * static_cast<double>(n);
    report->bytes_sent += CostModel::WireBytes(CollectiveKind::kReduceScatter, world, bytes) +
                          CostModel::WireBytes(CollectiveKind::kAllGather, world, bytes);
    return Status::Ok();
  }
};

}  // namespace

namespace strategy_internal {
const Strategy& PsStrategy() {
  static const Ps s;
  return s;
}
}  // namespace strategy_internal
}  // namespace poseidon
