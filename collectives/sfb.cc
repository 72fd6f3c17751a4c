// Sufficient-factor broadcasting (Poseidon). The gradient of an M x N fully connected layer
// over a batch of K rows is U^T V with U (K x M, output-gradient rows) and V (K x N, input
// rows); sending the factors costs K (M + N) floats instead of M N.
//  1. Pack this rank's [U | V] into one send buffer of Kmax (M + N) floats, where Kmax is the
//     planned batch; a rank with a shorter batch (K < Kmax) leaves zero rows, which contribute
//     exact zeros to U^T V. So K may differ per rank at the price of no extra round trip.
//  2. One allgather of every rank's block: Kmax (M + N) (P-1) floats sent per rank.
//  3. Gather the U blocks into one (Kmax P) x M matrix and the V blocks into (Kmax P) x N.
//  4. One GEMM over all Kmax P gathered rows: G = (1/P) U_all^T V_all, not P separate rank-K
//     updates (one large GEMM runs near the machine's peak; P small ones do not). It equals
//     the average of the ranks' dense gradients to float32 rounding.
//  5. With an optimizer every rank applies the step to the full parameter from G.
// Every rank runs the same GEMM on the same bytes, so results are bitwise identical.
#include <cstring>
#include <vector>

#include "collectives/strategy.h"

namespace poseidon {
namespace {

class SfbState : public LayerState {
 public:
  explicit SfbState(const OptimizerSpec& spec) : opt(spec) {}
  OptimizerState opt;
  // Scratch in the collective's memory (host or device), grown on demand.
  StrategyBuffer send, gathered, u_all, v_all;
};

class Sfb final : public Strategy {
 public:
  StrategyKind kind() const override { return StrategyKind::kSfb; }

  // time = AG(4 K P (M+N)) + GEMM of 2 K P M N flops [+ optimizer over 4 M N bytes]
  // bytes = 4 K (M+N) (P-1)
  CostEstimate Cost(const LayerSpec& layer, size_t batch, int world,
                    const CostModel& model) const override {
    double k = static_cast<double>(batch), m = static_cast<double>(layer.rows()),
           n = static_cast<double>(layer.cols()), p = world;
    double payload = 4.0 * k * p * (m + n);
    CostEstimate c;
    c.time_s = model.CollectiveTime(CollectiveKind::kAllGather, world, payload) +
               model.GemmTime(2.0 * k * p * m * n);
    if (layer.optimizer.enabled()) c.time_s += model.OptimizerTime(4.0 * m * n);
    c.bytes_sent = CostModel::WireBytes(CollectiveKind::kAllGather, world, payload);
    return c;
  }

  Result<std::unique_ptr<LayerState>> NewState(const LayerSpec& layer,
                                               const StrategyContext&) const override {
    std::string why;
    PSD_REQUIRE_ARG(StrategyApplies(StrategyKind::kSfb, layer, &why), "sfb: layer ", layer.name,
                    ": ", why);
    return std::unique_ptr<LayerState>(new SfbState(layer.optimizer));
  }

  Status Exchange(const LayerSpec& layer, LayerState* state, const ExchangeBuffers& buf,
                  int64_t step, const StrategyContext& ctx, ExchangeReport* report) const override {
    const char* call = "Exchange(sfb)";
    const size_t kmax = buf.max_batch == 0 ? buf.batch : buf.max_batch;
    if (buf.batch > kmax) {
      return strategy_internal::FailTogether(
          ctx, InvalidArgument(call, ": layer ", layer.name, ": batch ", buf.batch,
                               " exceeds max_batch ", kmax,
                               "; expected batch <= max_batch (the planned K)"));
    }
    auto* s = static_cast<SfbState*>(state);
    const size_t m = layer.rows(), n = layer.cols();
    const int world = ctx.backend->size();
    const size_t block = kmax * (m + n);  // floats each rank contributes

    // 1. [U | V] with zero rows past this rank's batch.
    const Kernels& kern = *ctx.kernels;
    void* stream = ctx.call.stream;
    PSD_CHECK(strategy_internal::BeforeCollective(ctx, [&]() -> Status {
      PSD_CHECK(s->send.Grow(kern, block * sizeof(float)));
      float* send = s->send.as<float>();
      if (buf.batch > 0) {
        PSD_CHECK(kern.Copy(send, buf.u, buf.batch * m * sizeof(float), stream));
        PSD_CHECK(kern.Copy(send + kmax * m, buf.v, buf.batch * n * sizeof(float), stream));
      }
      PSD_CHECK(strategy_internal::Zero(send + buf.batch * m, (kmax - buf.batch) * m, ctx));
      PSD_CHECK(
          strategy_internal::Zero(send + kmax * m + buf.batch * n, (kmax - buf.batch) * n, ctx));
      return s->gathered.Grow(kern, block * static_cast<size_t>(world) * sizeof(float));
    }));
    // 2. One allgather; the backend's argument check fails every rank (no hang) if the ranks
    // disagree on Kmax.
    const float* send = s->send.as<float>();
    const float* gathered = s->gathered.as<float>();
    PSD_CHECK(ctx.backend->AllGather(send, s->gathered.data(), block, DType::kFloat32, ctx.call));
    report->bytes_sent += CostModel::WireBytes(CollectiveKind::kAllGather, world,
                                               4.0 * static_cast<double>(block) * world);
    const size_t rows = kmax * static_cast<size_t>(world);
    if (rows == 0) {
      PSD_CHECK(strategy_internal::Zero(buf.grad, m * n, ctx));
    } else {
      // 3. Rank blocks -> contiguous U_all and V_all (byte copies: Pack works on either memory).
      std::vector<ConstByteRange> us, vs;
      for (int r = 0; r < world; ++r) {
        const float* b = gathered + static_cast<size_t>(r) * block;
        us.push_back({b, kmax * m * sizeof(float)});
        vs.push_back({b + kmax * m, kmax * n * sizeof(float)});
      }
      PSD_CHECK(s->u_all.Grow(kern, rows * m * sizeof(float)));
      PSD_CHECK(s->v_all.Grow(kern, rows * n * sizeof(float)));
      PSD_CHECK(kern.Pack(us, s->u_all.data(), stream));
      PSD_CHECK(kern.Pack(vs, s->v_all.data(), stream));
      // 4. One GEMM over every gathered row, averaged.
      PSD_CHECK(kern.SufficientFactorGemm(s->u_all.as<float>(), s->v_all.as<float>(), rows, m, n,
                                          1.0f / static_cast<float>(world), 0.0f, buf.grad,
                                          stream));
    }
    // 5. The optimizer on the full parameter.
    if (layer.optimizer.enabled()) {
      PSD_CHECK(s->opt.Apply(buf.params, buf.grad, 1, 0, 1.0f, m * n, ctx));
    }
    return Status::Ok();
  }
};

}  // namespace

namespace strategy_internal {
const Strategy& SfbStrategy() {
  static const Sfb s;
  return s;
}
}  // namespace strategy_internal
}  // namespace poseidon
