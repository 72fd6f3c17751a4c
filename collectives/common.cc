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

Status Strategy::FinishSum(const LayerSpec& layer, LayerState*, const ExchangeBuffers&,
                           const StrategyContext&) const {
  return Status(StatusCode::kUnimplemented,
                StrCat("FinishSum: layer ", layer.name, " runs ", name(),
                       ", which has no local tail after a dense sum; expected allreduce"));
}

Status StrategyBuffer::Grow(const Kernels& kernels, size_t bytes) {
  if (buf_ && buf_->bytes() >= bytes) return Status::Ok();
  buf_.reset();  // free first: the old contents are not kept, and peak memory stays lower
  PSD_ASSIGN_OR_RETURN(buf_, kernels.Allocate(bytes));
  return Status::Ok();
}

Status StrategyBuffer::Reset(const Kernels& kernels, size_t bytes) {
  if (buf_ && buf_->bytes() == bytes) return Status::Ok();
  buf_.reset();
  PSD_ASSIGN_OR_RETURN(buf_, kernels.Allocate(bytes));
  return Status::Ok();
}

Status OptimizerState::Apply(float* params, const float* grads, int num_grads, size_t stride,
                             float grad_scale, size_t n, const StrategyContext& ctx) {
  ++steps_;
  if (n == 0) {
    kernels_ = ctx.kernels;
    stream_ = ctx.call.stream;
    return Status::Ok();
  }
  PSD_CHECK(Reserve(n, ctx));
  return Step(params, grads, num_grads, stride, grad_scale, n, ctx);
}

Status OptimizerState::Reserve(size_t n, const StrategyContext& ctx) {
  const Kernels& k = *ctx.kernels;
  kernels_ = ctx.kernels;
  stream_ = ctx.call.stream;
  // Fresh (zero) moments when the span changes size, as a new optimizer would start.
  n_ = n;
  switch (spec_.kind) {
    case OptimizerSpec::Kind::kSgd:
      return first_.Reset(k, n * sizeof(float));
    case OptimizerSpec::Kind::kAdam:
      PSD_CHECK(first_.Reset(k, n * sizeof(float)));
      return second_.Reset(k, n * sizeof(float));
    case OptimizerSpec::Kind::kNone:
      break;
  }
  return InternalError("OptimizerState::Reserve: no optimizer attached");
}

Status OptimizerState::ApplyRange(float* params, const float* sum, float grad_scale,
                                  size_t offset, size_t count, const StrategyContext& ctx) {
  PSD_REQUIRE(offset <= n_ && count <= n_ - offset, StatusCode::kInternal,
              "OptimizerState::ApplyRange: elements [", offset, ", ", offset + count,
              ") outside the reserved ", n_);
  return Step(params, sum, 1, 0, grad_scale, count, ctx, offset);
}

Status OptimizerState::Step(float* params, const float* grads, int num_grads, size_t stride,
                            float grad_scale, size_t n, const StrategyContext& ctx,
                            size_t offset) {
  const Kernels& k = *ctx.kernels;
  switch (spec_.kind) {
    case OptimizerSpec::Kind::kSgd:
      return k.SgdStep(params + offset, grads, num_grads, stride, grad_scale,
                       first_.as<float>() + offset, n, spec_.sgd, ctx.call.stream);
    case OptimizerSpec::Kind::kAdam: {
      AdamParams p = spec_.adam;
      p.step = steps_;  // bias correction counts the steps this state has taken
      return k.AdamStep(params + offset, grads, num_grads, stride, grad_scale,
                        first_.as<float>() + offset, second_.as<float>() + offset, n, p,
                        ctx.call.stream);
    }
    case OptimizerSpec::Kind::kNone:
      break;
  }
  return InternalError("OptimizerState::Apply: no optimizer attached");
}

std::vector<float> OptimizerState::first() const {
  return kernels_ ? first_.Download<float>(*kernels_, n_, stream_) : std::vector<float>();
}

std::vector<float> OptimizerState::second() const {
  return kernels_ ? second_.Download<float>(*kernels_, n_, stream_) : std::vector<float>();
}

Status CheckSubmission(const LayerSpec& layer, StrategyKind strategy, const ExchangeBuffers& buf) {
  const size_t n = layer.NumElements();
  const bool fc = layer.kind == LayerKind::kFullyConnected;
  PSD_REQUIRE_ARG(n == 0 || buf.grad != nullptr, "layer '", layer.name,
                  "': grad is null; expected ", n, " floats");
  PSD_REQUIRE_ARG(n == 0 || !layer.optimizer.enabled() || buf.params != nullptr, "layer '",
                  layer.name, "' has an optimizer (", OptimizerName(layer.optimizer.kind),
                  ") but params is null; expected the ", n, " parameters");
  PSD_REQUIRE_ARG(buf.batch == 0 || (buf.u == nullptr) == (buf.v == nullptr), "layer '", layer.name,
                  "': only one of u (", static_cast<const void*>(buf.u), ") and v (",
                  static_cast<const void*>(buf.v), ") is given for a batch of ", buf.batch,
                  " rows; expected both factors or neither");
  PSD_REQUIRE_ARG(fc || (buf.u == nullptr && buf.v == nullptr), "layer '", layer.name, "' is ",
                  LayerKindName(layer.kind),
                  "; sufficient factors (u, v) need a fully connected layer");
  PSD_REQUIRE_ARG(fc || buf.batch == 0, "layer '", layer.name, "' is ", LayerKindName(layer.kind),
                  ": batch ", buf.batch, " without factors; expected 0");
  // sfb exchanges the factors and rebuilds grad from them: a dense gradient alone would be
  // overwritten, not sent. (Null factors with batch 0: this rank has no rows.)
  PSD_REQUIRE_ARG(
      strategy != StrategyKind::kSfb || buf.batch == 0 || (buf.u != nullptr && buf.v != nullptr),
      "layer '", layer.name, "' is planned as sfb but no factors were given for a batch of ",
      buf.batch, " rows; expected u and v (batch x M, batch x N)");
  return Status::Ok();
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

Status FailTogether(const StrategyContext& ctx, const Status& local) {
  return ctx.backend->FailTogether("Exchange", local, ctx.call.interrupt);
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
  return ctx.kernels->Scale(data, n, scale, ctx.call.stream);
}

Status Zero(float* data, size_t n, const StrategyContext& ctx) {
  return ctx.kernels->Fill(data, n, 0.0f, ctx.call.stream);
}

Status FinishDenseSum(const LayerSpec& layer, OptimizerState* opt, const ExchangeBuffers& buf,
                      const StrategyContext& ctx) {
  const size_t n = layer.NumElements();
  const float inv = 1.0f / static_cast<float>(ctx.backend->size());
  if (layer.optimizer.enabled()) {
    // The 1/P average rides in the optimizer's pass over the summed gradient.
    return opt->Apply(buf.params, buf.grad, 1, 0, inv, n, ctx);
  }
  return Scale(buf.grad, n, inv, ctx);
}

Status DenseAllReduce(const LayerSpec& layer, OptimizerState* opt, const ExchangeBuffers& buf,
                      const StrategyContext& ctx, ExchangeReport* report) {
  const size_t n = layer.NumElements();
  const int world = ctx.backend->size();
  PSD_CHECK(ctx.backend->AllReduce(buf.grad, buf.grad, n, DType::kFloat32, ctx.call));
  report->bytes_sent +=
      CostModel::WireBytes(CollectiveKind::kAllReduce, world, 4.0 * static_cast<double>(n));
  return FinishDenseSum(layer, opt, buf, ctx);
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
