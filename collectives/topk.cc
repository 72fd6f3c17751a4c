// Top-k sparsification with residuals (RedSync / DGC).
//  1. Fall back to a dense allreduce during the first W steps (warm-up: early gradients change
//     fast and compression hurts most there) and for layers under POSEIDON_TOPK_MIN_ELEMENTS
//     (their latency, not their bytes, dominates). The residual is left untouched.
//  2. One fused kernel pass: residual += gradient (or, with DGC momentum correction,
//     u = m u + gradient; residual += u), then exactly k = ceil(density n) entries of largest
//     magnitude leave the residual (ties to the smaller index, indices ascending). Nothing is
//     lost: residual_before + update == sent + residual_after, exactly in float32.
//  3. The kernel writes this rank's k indices and k values (as raw 32-bit words) straight into
//     one message, which is allgathered: every rank sends the same k, so a plain allgather
//     works, and one message instead of two halves the latency. 2 k (P-1) words sent per rank.
//  4. Zero the gradient buffer and add every rank's block in rank order 0..P-1 with one
//     ScatterAddBlocks call: the same additions in the same order on every rank, so bitwise
//     identical results. On device memory nothing in the step waits for the stream: a block
//     that breaks the contract (a peer's bad index) is found on the device and fails the
//     layer's next exchange on every rank (Kernels::ScatterWorkspace::Fault).
//  5. Average (1/P) or, with an optimizer, apply the step to the full parameter with the 1/P
//     fused in.
#include <cstring>
#include <vector>

#include "collectives/strategy.h"

namespace poseidon {
namespace {

class TopkState final : public TopkLayerState {
 public:
  TopkState(const OptimizerSpec& spec, std::unique_ptr<KernelWorkspace> w,
            std::unique_ptr<ScatterWorkspace> sw, const Kernels* k, void* stream)
      : opt(spec), ws(std::move(w)), scatter(std::move(sw)), kernels_(k), stream_(stream) {}

  // Host views, copied from the buffers once after each exchange (a plain memcpy for host
  // memory; a device copy and a stream synchronization for device memory).
  const std::vector<float>& residual() const override { return Refresh().residual; }
  const std::vector<float>& momentum() const override { return Refresh().momentum; }
  const std::vector<uint32_t>& last_indices() const override { return Refresh().idx; }
  const std::vector<float>& last_values() const override { return Refresh().val; }
  size_t k() const override { return k_; }

  // Called by every exchange: the host views are stale from here on.
  void Touch() { fresh_ = false; }

  OptimizerState opt;
  std::unique_ptr<KernelWorkspace> ws;
  std::unique_ptr<ScatterWorkspace> scatter;
  // State (kept across steps) and scratch, in the collective's memory. send_ holds the last
  // selection: k indices, then k values.
  StrategyBuffer residual_, momentum_;
  StrategyBuffer send_, gathered_;
  size_t n_ = 0, k_ = 0;
  bool has_momentum_ = false;

 private:
  struct HostView {
    std::vector<float> residual, momentum, val;
    std::vector<uint32_t> idx;
  };
  const HostView& Refresh() const {
    if (!fresh_) {
      view_.residual = residual_.Download<float>(*kernels_, n_, stream_);
      view_.momentum =
          has_momentum_ ? momentum_.Download<float>(*kernels_, n_, stream_) : std::vector<float>();
      const std::vector<uint32_t> words = send_.Download<uint32_t>(*kernels_, 2 * k_, stream_);
      view_.idx.assign(words.begin(), words.begin() + static_cast<std::ptrdiff_t>(k_));
      view_.val.resize(k_);
      if (k_ > 0) std::memcpy(view_.val.data(), words.data() + k_, k_ * sizeof(float));
      fresh_ = true;
    }
    return view_;
  }

  const Kernels* kernels_;
  void* stream_;
  mutable HostView view_;
  mutable bool fresh_ = false;
};

bool FallsBack(const LayerSpec& layer, int64_t step) {
  return static_cast<long long>(layer.NumElements()) < layer.topk.min_elements.value_or(0) ||
         step < layer.topk.warmup_steps.value_or(0);
}

class Topk final : public Strategy {
 public:
  StrategyKind kind() const override { return StrategyKind::kTopk; }

  // Layers under min_elements: the dense allreduce's cost. Otherwise, with k = ceil(d n):
  // time = select over 4n bytes + AG(8 k P) + scatter-add of 8 k P bytes [+ optimizer 4n]
  // bytes = 8 k (P-1), i.e. 2 d n (P-1) words. (Warm-up steps are not the steady state.)
  CostEstimate Cost(const LayerSpec& layer, size_t batch, int world,
                    const CostModel& model) const override {
    if (FallsBack(layer, 1ll << 62)) {
      CostEstimate c = strategy_internal::DenseAllReduceCost(layer, world, model);
      c.time_s += strategy_internal::FormGradientTime(layer, batch, model);
      return c;
    }
    double n = static_cast<double>(layer.NumElements());
    double k = static_cast<double>(strategy_internal::TopkCount(layer));
    double payload = 8.0 * k * world;
    CostEstimate c;
    c.time_s =
        model.TopkTime(4.0 * n) + model.CollectiveTime(CollectiveKind::kAllGather, world, payload) +
        model.ScatterTime(payload) + strategy_internal::FormGradientTime(layer, batch, model);
    if (layer.optimizer.enabled()) c.time_s += model.OptimizerTime(4.0 * n);
    c.bytes_sent = CostModel::WireBytes(CollectiveKind::kAllGather, world, payload);
    return c;
  }

  Result<std::unique_ptr<LayerState>> NewState(const LayerSpec& layer,
                                               const StrategyContext& ctx) const override {
    std::string why;
    PSD_REQUIRE_ARG(StrategyApplies(StrategyKind::kTopk, layer, &why), "topk: layer ", layer.name,
                    ": ", why);
    return std::unique_ptr<LayerState>(new TopkState(layer.optimizer, ctx.kernels->NewWorkspace(),
                                                     ctx.kernels->NewScatterWorkspace(),
                                                     ctx.kernels, ctx.call.stream));
  }

  Status Exchange(const LayerSpec& layer, LayerState* state, const ExchangeBuffers& buf,
                  int64_t step, const StrategyContext& ctx, ExchangeReport* report) const override {
    const char* call = "Exchange(topk)";
    auto* s = static_cast<TopkState*>(state);
    s->Touch();
    PSD_CHECK(strategy_internal::BeforeCollective(
        ctx, [&] { return strategy_internal::FormGradientFromFactors(layer, buf, ctx); }));
    const size_t n = layer.NumElements();
    if (n == 0 || FallsBack(layer, step)) {
      report->fell_back_dense = true;
      return strategy_internal::DenseAllReduce(layer, &s->opt, buf, ctx, report);
    }
    const int world = ctx.backend->size();
    const size_t k = strategy_internal::TopkCount(layer);
    PSD_REQUIRE_ARG(k > 0 && k <= n, call, ": layer ", layer.name, ": k ", k, " for ", n,
                    " elements; expected 0 < k <= n");
    const double mom = layer.topk.momentum.value_or(0.0);
    const Kernels& kern = *ctx.kernels;
    void* stream = ctx.call.stream;
    PSD_CHECK(strategy_internal::BeforeCollective(ctx, [&]() -> Status {
      // A bad block found on the device by an earlier step fails this one (on every rank:
      // through FailTogether when this rank learns of it first).
      PSD_CHECK(s->scatter->Fault());
      // Residual and momentum are state: zero when first made (or when n changes).
      PSD_CHECK(s->residual_.Reset(kern, n * sizeof(float)));
      if (mom > 0) PSD_CHECK(s->momentum_.Reset(kern, n * sizeof(float)));
      s->n_ = n;
      s->has_momentum_ = mom > 0;
      s->k_ = k;
      PSD_CHECK(s->send_.Grow(kern, 2 * k * 4));

      // 2. Fused residual accumulation + exact top-k, written as the message of step 3:
      // [k indices | k values], 2k 32-bit words.
      uint32_t* send_idx = s->send_.as<uint32_t>();
      PSD_CHECK(kern.FusedResidualTopK(
          buf.grad, s->residual_.as<float>(), mom > 0 ? s->momentum_.as<float>() : nullptr,
          static_cast<float>(mom), n, k, send_idx, reinterpret_cast<float*>(send_idx + k),
          s->ws.get(), stream));
      return s->gathered_.Grow(kern, 2 * k * 4 * static_cast<size_t>(world));
    }));
    PSD_CHECK(ctx.backend->AllGather(s->send_.data(), s->gathered_.data(), 2 * k, DType::kInt32,
                                     ctx.call));
    report->bytes_sent += CostModel::WireBytes(CollectiveKind::kAllGather, world,
                                               8.0 * static_cast<double>(k) * world);
    // 4. Dense result, ranks added in order (one call for all blocks).
    PSD_CHECK(strategy_internal::Zero(buf.grad, n, ctx));
    PSD_CHECK(kern.ScatterAddBlocks(s->gathered_.data(), world, k, buf.grad, n, s->scatter.get(),
                                    stream));
    // 5. Average or optimizer step.
    const float inv = 1.0f / static_cast<float>(world);
    if (layer.optimizer.enabled()) {
      return s->opt.Apply(buf.params, buf.grad, 1, 0, inv, n, ctx);
    }
    return strategy_internal::Scale(buf.grad, n, inv, ctx);
  }
};

}  // namespace

namespace strategy_internal {
const Strategy& TopkStrategy() {
  static const Topk s;
  return s;
}
}  // namespace strategy_internal
}  // namespace poseidon
