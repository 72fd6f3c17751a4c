// osu_topk: the sparse top-k exchange of one layer as an operation, against MPI_Allreduce of
// the same dense n floats in the same run.
//
// Per size (n = size / 4 floats, one layer) and density D (-D, default 0.001):
//  1. One HybridCollective holds one kSparse layer of n floats, forced to topk, with no
//     warm-up and min_elements 0, so every exchange is the compressed one:
//     fused residual top-k selection (k = ceil(D n)), one allgather of the k (index, value)
//     pairs of every rank, scatter-add in rank order and the 1/P average.
//  2. Inputs are built so that the selection and the sums are known exactly: rank r's
//     gradient has exactly k large entries, (r + 1) F(m) with alternating signs, at positions
//     (m s) mod n for m in [r h, r h + k) (s = n / k, h = ceil(k / 2): neighbouring ranks share
//     half their positions). Every other entry is small noise, a multiple of 2^-30 below
//     2^-20 in magnitude, zero where any rank has a large entry (so the peer's sums stay exact
//     in any order). Top-k picks exactly the k large entries (the residual at their positions
//     is zero before each run; the noise accumulates elsewhere but stays below 1 for 2^20
//     runs), so the average is (float) sum of the large entries * (1/P), summed in rank order,
//     bitwise. --zero-rest makes the noise exact zeros: every unselected entry ties, the worst
//     case for a threshold-search selection (and the residual stays zero).
//  3. The exchange is in place (the gradient buffer becomes the average), so the input is
//     restored before every run, outside the timed region (the timed runs restore it in
//     PoisonOutput; a warm-up run restores it itself, untimed).
//  4. The peer is MPI_Allreduce of the same dense gradient (sum, separate output), checked
//     against the exact sum. Time ratio peer / ours = the harness's busbw ratio (same bytes,
//     same factor): algbw / busbw of ours are dense-equivalent figures.
//  5. Extra columns: k, the bytes this rank actually sent per exchange (8 k (P-1), from the
//     collective's traffic counter) and their fraction of a dense allreduce's.
//
// Options: the harness's (-m -i -x -f -d --json --no-peer; -T float32 only) and
//   -D DENSITY   fraction of entries sent per exchange, in (0, 1] (default 0.001)
//   --zero-rest  unselected entries are exact zeros instead of small noise
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bench/osu/harness.h"
#include "collectives/hybrid.h"
#include "collectives/strategy.h"
#include "runtime/mpi_backend.h"

namespace poseidon::osu {
namespace {

class TopkBench : public Collective {
 public:
  void AddFlags(cli::Flags& flags) override {
    flags.Number("-D,--density", &density_, cli::Range{0, 1, true, false}, "DENSITY",
                 "fraction of entries sent per exchange, in (0, 1] (default 0.001)");
    flags.Bool("--zero-rest", &zero_rest_,
               "unselected entries are exact zeros instead of small noise");
  }
  std::string program() const override { return "osu_topk"; }
  std::string ours_name() const override {
    return StrCat("HybridCollective topk exchange (density ", density_,
                  zero_rest_ ? ", zeros elsewhere" : ", small noise elsewhere", ")");
  }
  std::string peer_name() const override { return "MPI_Allreduce"; }
  // Dense-equivalent: the same factor as the peer, so the busbw ratio is peer time / ours.
  std::string factor_text() const override { return "2(P-1)/P (dense-equivalent)"; }
  double BusFactor(int world) const override { return 2.0 * (world - 1) / world; }

  Status Prepare(const Context& ctx, size_t count) override {
    PSD_REQUIRE_ARG(ctx.dtype == DType::kFloat32, "osu_topk: -T ", DTypeName(ctx.dtype),
                    "; the top-k exchange is float32 only (expected -T float32)");
    ctx_ = ctx;
    n_ = count;
    // The communicator outlives every size (RunMain holds it), so a non-owning pointer.
    std::shared_ptr<Communicator> comm(ctx.comm, [](Communicator*) {});
    PSD_ASSIGN_OR_RETURN(hc_, HybridCollective::Create(comm, ctx.memory));
    LayerSpec spec;
    spec.name = "topk_layer";
    spec.shape = {n_};
    spec.kind = LayerKind::kSparse;
    spec.force = StrategyKind::kTopk;
    spec.topk.density = density_;
    spec.topk.warmup_steps = 0;
    spec.topk.min_elements = 0;
    spec.topk.momentum = 0.0;
    PSD_ASSIGN_OR_RETURN(id_, hc_->RegisterLayer(spec));
    PSD_CHECK(hc_->BuildPlan(/*batch=*/1, CostModel{}, PlannerOptions{}));
    PSD_REQUIRE_ARG(hc_->strategy(id_) == StrategyKind::kTopk, "osu_topk: the plan chose ",
                    StrategyName(hc_->strategy(id_)), " for the forced topk layer");
    k_ = strategy_internal::TopkCount(hc_->layer(id_));
    PSD_REQUIRE_ARG(k_ >= 1 && k_ <= n_, "osu_topk: k = ", k_, " for n = ", n_,
                    "; expected 1 <= k <= n");

    // Every rank's gradient (each rank builds them all to know the exact sums).
    const int world = ctx.world;
    std::vector<float> sum(n_, 0.0f), input(n_, 0.0f);
    std::vector<unsigned char> large(n_, 0);  // any rank has a large entry here
    PlaceLargeEntries(world, ctx.rank, n_, k_, sum.data(), large.data(), input.data());
    const float inv = 1.0f / static_cast<float>(world);
    want_avg_.resize(n_);
    for (size_t i = 0; i < n_; ++i) want_avg_[i] = sum[i] * inv;
    if (!zero_rest_) {
      // Noise: sums of at most a few thousand multiples of 2^-30 below 2^-20 are exact.
      for (size_t i = 0; i < n_; ++i) {
        if (large[i]) continue;
        for (int r = 0; r < world; ++r) {
          float v = GradientNoise(r, i);
          sum[i] += v;
          if (r == ctx.rank) input[i] = v;
        }
      }
    }
    want_sum_ = std::move(sum);

    PSD_CHECK(io_.Allocate(ctx.memory, std::move(input)));
    bytes_sent_ = dense_bytes_ = 0;
    return Status::Ok();
  }

  Status RunOurs() override {
    PSD_CHECK(io_.BeginOurs());
    ExchangeBuffers b;
    b.grad = static_cast<float*>(io_.grad.data());
    PSD_CHECK(hc_->Exchange(id_, b, step_++));
    // Device memory: the exchange is queued on the stream; the time includes finishing it.
    PSD_CHECK(hc_->kernels().Synchronize(hc_->stream()));
    const Traffic& t = hc_->LayerTraffic(id_);
    bytes_sent_ = t.last_bytes_sent;
    dense_bytes_ = t.exchanges > 0 ? t.dense_bytes / static_cast<double>(t.exchanges) : 0;
    return Status::Ok();
  }

  Status RunPeer() override {
    io_.BeginPeer();
    return PeerCall("MPI_Allreduce",
                    MPI_Allreduce(io_.peer_send.data(), io_.peer_recv.data(),
                                  static_cast<int>(n_), MPI_FLOAT, MPI_SUM,
                                  ctx_.comm->mpi_comm()));
  }

  // Ours works in place: put this rank's gradient back. The peer's output is poisoned.
  Status PoisonOutput() override { return io_.PoisonOutput(); }

  Result<size_t> CountWrong() override {
    PSD_ASSIGN_OR_RETURN(const float* got, io_.Output());
    const std::vector<float>& want = io_.last_peer() ? want_sum_ : want_avg_;
    return CountMismatches(DType::kFloat32, got, want.data(), n_);
  }

  std::string ExtraHeader() const override {
    return " |          k   sent(B/rank)  dense(B/rank)  sent/dense";
  }
  std::string ExtraText() const override {
    char buf[128];
    std::snprintf(buf, sizeof(buf), " | %10zu %14.0f %14.0f %11.5f", k_, bytes_sent_, dense_bytes_,
                  dense_bytes_ > 0 ? bytes_sent_ / dense_bytes_ : 0.0);
    return buf;
  }
  std::string ExtraJson() const override {
    return StrCat(", \"k\": ", k_, ", \"bytes_sent\": ", bytes_sent_,
                  ", \"dense_bytes\": ", dense_bytes_);
  }

  void Release() override {
    hc_.reset();
    io_.Free();
    want_sum_ = {};
    want_avg_ = {};
  }

 private:
  double density_ = 0.001;
  bool zero_rest_ = false;
  Context ctx_;
  size_t n_ = 0, k_ = 0;
  std::unique_ptr<HybridCollective> hc_;
  int id_ = 0;
  int64_t step_ = 0;
  InPlaceBuffers io_;
  std::vector<float> want_sum_, want_avg_;
  double bytes_sent_ = 0, dense_bytes_ = 0;
};

}  // namespace
}  // namespace poseidon::osu

int main(int argc, char** argv) {
  poseidon::osu::TopkBench bench;
  return poseidon::osu::RunMain(argc, argv, bench);
}
