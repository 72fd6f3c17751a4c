// Pieces every strategy shares: the dense allreduce (allreduce itself and topk's fall-back),
// buffer checks, forming an FC gradient from its factors, and the optimizer state.
#include <cmath>
#include <cstring>

#include "collectives/strategy.h"

namespace poseidon {

const Strategy& GetStrategy(StrategyKind kind) {
  switch (kind) {
    case StrategyKind::kPs:
      return strategy_internal::PsStrategy();
    case StrategyKind::kSfb:
      return strategy_internal::SfbStrategy();
    case StrategyKind::kTopk:
      return strategy_internal::TopkStrategy();
    case StrategyKind::kAllReduce:
      break;
  }
  return strategy_internal::AllReduceStrategy();
}

Status OptimizerState::Apply(float* params, const float* grads, int num_grads, size_t stride,
                             float grad_scale, size_t n, const StrategyContext& ctx) {
  const Kernels& k = *ctx.kernels;
  ++steps_;
  if (n == 0) return Status::Ok();
  switch (spec_.kind) {
    case OptimizerSpec::Kind::kSgd:
      if (first_.size() != n) first_.assign(n, 0.0f);
      return k.SgdStep(params, grads, num_grads, stride, grad_scale, first_.data(), n, spec_.sgd,
                       ctx.call.stream);
    case OptimizerSpec::Kind::kAdam: {
      if (first_.size() != n) first_.assign(n, 0.0f);
      if (second_.size() != n) second_.assign(n, 0.0f);
      AdamParams p = spec_.adam;
      p.step = steps_;  // bias correction counts the steps this state has taken
      return k.AdamStep(params, grads, num_grads, stride, grad_scale, first_.data(), second_.data(),
                        n, p, ctx.call.stream);
    }
    case OptimizerSpec::Kind::kNone:
      break;
  }
  return InternalError("OptimizerState::Apply: no optimizer attached");
}

namespace strategy_internal {

CostEstimate DenseAllReduceCost(const LayerSpec& layer, int world, const CostModel& model) {
  double bytes = 4.0 * static_cast<double>(layer.NumElements());
  CostEstimate c;
  c.time_s = model.CollectiveTime(CollectiveKind::kAllReduce, world, bytes);
  c.bytes_sent = CostModel::WireBytes(CollectiveKind::kAllReduce, world, bytes);
  if (layer.optimizer.enabled()) c.time_s += model.OptimizerTime(bytes);
  return c;
}

double FormGradientTime(const LayerSpec& layer, size_t batch, const CostModel& model) {
  if (layer.kind != LayerKind::kFullyConnected) return 0;
  return model.GemmTime(2.0 * static_cast<double>(batch) * static_cast<double>(layer.rows()) *
                        static_cast<double>(layer.cols()));
}

Status CheckBuffers(const char* call, const LayerSpec& layer, const ExchangeBuffers& buf,
                    bool needs_grad_input) {
  size_t n = layer.NumElements();
  if (n == 0) return Status::Ok();
  PSD_REQUIRE_ARG(buf.grad != nullptr, call, ": layer ", layer.name,
                  ": grad is null; expected a buffer of ", n, " floats");
  if (layer.optimizer.enabled()) {
    PSD_REQUIRE_ARG(buf.params != nullptr, call, ": layer ", layer.name,
                    ": params is null but the layer has an optimizer (",
                    OptimizerName(layer.optimizer.kind), "); expected ", n, " floats");
  }
  (void)needs_grad_input;
  return Status::Ok();
}

Status FailTogether(const StrategyContext& ctx, const Status& local) {
  // A null buffer with count 1 fails the backend's local check; its agreement step then
  // reports this rank's error to every rank blocked in the matching collective.
  Status ignored = ctx.backend->AllReduce(nullptr, nullptr, 1, DType::kFloat32, ctx.call);
  (void)ignored;
  return local;
}

Status FormGradientFromFactors(const LayerSpec& layer, const ExchangeBuffers& buf,
                               const StrategyContext& ctx) {
  if (layer.kind != LayerKind::kFullyConnected || buf.u == nullptr || buf.v == nullptr) {
    return Status::Ok();  // grad already holds this rank's gradient
  }
  if (buf.batch == 0) return Zero(buf.grad, layer.NumElements(), ctx);
  return ctx.kernels->SufficientFactorGemm(buf.u, buf.v, buf.batch, layer.rows(), layer.cols(),
                                           1.0f, 0.0f, buf.grad, ctx.call.stream);
}

Status Scale(float* data, size_t n, float scale, const StrategyContext& ctx) {
  PSD_REQUIRE(ctx.call.memory == MemoryKind::kHost, StatusCode::kUnimplemented,
              "Scale: only host memory is supported (the Kernels contract has no scale kernel)");
  for (size_t i = 0; i < n; ++i) data[i] *= scale;
  return Status::Ok();
}

Status Zero(float* data, size_t n, const StrategyContext& ctx) {
  // SumInto over zero pieces writes zeros: a fill that works wherever the kernels do.
  return ctx.kernels->SumInto(data, data, 0, 0, n, ctx.call.stream);
}

Status DenseAllReduce(const LayerSpec& layer, OptimizerState* opt, const ExchangeBuffers& buf,
                      const StrategyContext& ctx, ExchangeReport* report) {
  const size_t n = layer.NumElements();
  const int world = ctx.backend->size();
  PSD_CHECK(ctx.backend->AllReduce(buf.grad, buf.grad, n, DType::kFloat32, ctx.call));
  report->bytes_sent +=
      CostModel::WireBytes(CollectiveKind::kAllReduce, world, 4.0 * static_cast<double>(n));
  const float inv = 1.0f / static_cast<float>(world);
  if (layer.optimizer.enabled()) {
    // The 1/P average rides in the optimizer's pass over the summed gradient.
    return opt->Apply(buf.params, buf.grad, 1, 0, inv, n, ctx);
  }
  return Scale(buf.grad, n, inv, ctx);
}

size_t TopkCount(const LayerSpec& layer) {
  size_t n = layer.NumElements();
  if (n == 0) return 0;
  if (layer.topk.k) return *layer.topk.k;
  double d = layer.topk.density.value_or(1.0);
  // ceil(d * n), forgiving the last bit of rounding in d * n (0.001 * 1000 must give 1).
  double x = d * static_cast<double>(n);
  double k = std::ceil(x - 1e-9 * x);
  if (k < 1) k = 1;
  if (k > static_cast<double>(n)) k = static_cast<double>(n);
  return static_cast<size_t>(k);
}

}  // namespace strategy_internal
}  // namespace poseidon
