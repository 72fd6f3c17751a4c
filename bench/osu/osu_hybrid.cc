// osu_hybrid: one iteration of a model's gradient exchange through HybridCollective, every
// layer with the strategy the planner picks, against MPI_Allreduce of every layer's dense
// gradient in the same run.
//
// Steps:
//  1. The layer table (--model, tools/models/models.h, or the trainers' small model) shrunk to
//     the fraction --scale of its parameters (bench/common/model_shape.h: dense layers keep
//     f n elements, M x N fully connected layers sqrt(f) per side and their factor batch
//     sqrt(f) K). The row's size is the model's dense gradient (sum of layers x 4 bytes); -m
//     is set to it.
//  2. Prepare registers every layer (with --sparse the non-FC layers are kSparse, so topk
//     competes at --density), builds the plan with the measured cost model (the probe, or
//     POSEIDON_COST_CACHE) and the planner's settings (POSEIDON_STRATEGY etc.).
//  3. Inputs with exactly known averages, whatever strategy a layer gets:
//       dense layer:  rank r's gradient is (r + 1) F(i); the average S F(i) / P, S = P(P+1)/2;
//       sparse layer: k = ceil(d n) large entries per rank at known positions and small
//                     noise elsewhere (as osu_topk): top-k sends exactly the large ones, so a
//                     compressed layer's average is that of the large entries; a layer that
//                     runs dense (another strategy, or under POSEIDON_TOPK_MIN_ELEMENTS)
//                     averages everything, exactly too (the noise sums are exact);
//       FC layer:     factors U (K x M) and V (K x N) of small integers, gradient U^T V formed
//                     by the strategy (sfb rebuilds the sum from every rank's factors,
//                     allreduce forms it and sums it); every partial sum is an integer < 2^24.
//  4. One timed run = Exchange of every layer in backward order (last layer first), then a
//     stream synchronization. Layers work in place, so the inputs are restored before each
//     run outside the timed region (PoisonOutput; a warm-up run restores them itself).
//  5. Check: every element of dense and sparse layers bitwise against float(sum) * (1/P) (the
//     strategies' own operation; for a compressed layer the sum of the large entries), and
//     sampled entries of FC layers (all of them up to 65536) with their sums recomputed from
//     the factors: bitwise when P is a power of two (1/P exact), else within 2 ulp (sfb folds
//     1/P into its GEMM). The peer's sums are checked whole.
//  6. Extra columns: the plan (layers per strategy), bytes this rank sent per iteration and
//     what dense allreduce sends for the same layers, and their ratio.
//
// Options: the harness's (-i -x -f -d --json --no-peer; not -m; -T float32 only) and
//   --model NAME   small (default), vgg19, vgg19-22k, resnet152, inception-v3
//   --scale F      fraction of the parameters kept, in (0, 1] (default 1)
//   --batch K      images per rank (default: the model's; FC factor rows shrink with sqrt(F))
//   --sparse       non-FC layers are kSparse (topk becomes a candidate)
//   --density D    top-k density of sparse layers, in (0, 1] (default 0.001)
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/common/model_shape.h"
#include "bench/osu/harness.h"
#include "collectives/hybrid.h"
#include "collectives/strategy.h"
#include "runtime/mpi_backend.h"

namespace poseidon::osu {
namespace {

constexpr size_t kFullCheckElements = 65536;  // FC layers up to this are checked whole
constexpr size_t kFcSamples = 4096;

// Factor entries: small integers, different per rank, row and column, so a transposed or
// mis-strided GEMM gives different numbers. |u v| <= 6.
float FactorU(int r, size_t k, size_t m) { return static_cast<float>((r + k + m) % 3 + 1); }
float FactorV(int r, size_t k, size_t n) {
  return static_cast<float>(static_cast<int>((2 * static_cast<size_t>(r) + k + n) % 5) - 2);
}

class HybridBench : public Collective {
 public:
  std::string program() const override { return "osu_hybrid"; }
  void AddFlags(cli::Flags& flags) override {
    bench::AddModelFlags(flags, &model_flags_);
    flags.Bool("--sparse", &sparse_, "non-FC layers are kSparse (topk becomes a candidate)");
    flags.Number("--density", &density_, cli::Range{0, 1, true, false}, "D",
                 "top-k density of sparse layers, in (0, 1] (default 0.001)");
  }
  // The size is the model's: -m does not apply.
  Status Configure(const cli::Flags& flags, Options* opt) override {
    PSD_REQUIRE_ARG(!flags.Given("-m") && !flags.Given("--message-size"),
                    "option -m does not apply: the size is the model's (--model, --scale)");
    PSD_ASSIGN_OR_RETURN(model_, bench::MakeShapedModel(model_flags_));
    PSD_REQUIRE_ARG(model_.Elements() > 0, "the model has no elements at this --scale");
    opt->min_bytes = opt->max_bytes = model_.Elements() * sizeof(float);
    return Status::Ok();
  }
  std::string ours_name() const override {
    return StrCat("HybridCollective planned exchange of ", model_.name, " x", model_.scale, " (",
                  model_.layers.size(), " layers", sparse_ ? ", sparse" : "", ")");
  }
  std::string peer_name() const override { return "MPI_Allreduce"; }
  std::string factor_text() const override { return "2(P-1)/P (dense-equivalent)"; }
  double BusFactor(int world) const override { return 2.0 * (world - 1) / world; }

  Status Prepare(const Context& ctx, size_t count) override {
    PSD_REQUIRE_ARG(ctx.dtype == DType::kFloat32, "osu_hybrid: -T ", DTypeName(ctx.dtype),
                    "; layers are float32 only (expected -T float32)");
    PSD_REQUIRE_ARG(count == model_.Elements(), "osu_hybrid: size of ", count,
                    " elements; expected the model's ", model_.Elements());
    ctx_ = ctx;
    total_ = count;
    const int world = ctx.world;
    const size_t kf = model_.factor_batch;
    // The communicator outlives every size (RunMain holds it), so a non-owning pointer.
    std::shared_ptr<Communicator> comm(ctx.comm, [](Communicator*) {});
    PSD_ASSIGN_OR_RETURN(hc_, HybridCollective::Create(comm, ctx.memory));
    layers_.clear();
    size_t offset = 0, u_off = 0, v_off = 0;
    for (const bench::ShapedLayer& shaped : model_.layers) {
      LayerSpec spec = shaped.spec;
      if (sparse_ && spec.kind == LayerKind::kDense) {
        spec.kind = LayerKind::kSparse;
        spec.topk.density = density_;
        spec.topk.warmup_steps = 0;  // steady state: every exchange the compressed one
        spec.topk.momentum = 0.0;
      }
      PSD_ASSIGN_OR_RETURN(int id, hc_->RegisterLayer(spec));
      Layer l;
      l.id = id;
      l.n = spec.NumElements();
      l.offset = offset;
      offset += l.n;
      if (spec.kind == LayerKind::kFullyConnected) {
        l.m = spec.rows();
        l.cols = spec.cols();
        l.u_offset = u_off;
        l.v_offset = v_off;
        u_off += kf * l.m;
        v_off += kf * l.cols;
      }
      layers_.push_back(l);
    }
    PSD_REQUIRE_ARG(offset == total_, "osu_hybrid: layers hold ", offset, " elements; expected ",
                    total_);
    PSD_CHECK(hc_->BuildPlan(kf));
    plan_counts_.clear();
    for (Layer& l : layers_) {
      l.strategy = hc_->strategy(l.id);
      ++plan_counts_[StrategyName(l.strategy)];
    }

    // Host inputs and exact sums (every rank builds every rank's contribution).
    std::vector<float> input(total_, 0.0f);
    want_sum_.assign(total_, 0.0f);
    want_avg_.assign(total_, 0.0f);
    const float inv = 1.0f / static_cast<float>(world);
    std::vector<float> u_host(u_off), v_host(v_off);
    const double s_ranks = world * (world + 1) / 2.0;
    for (Layer& l : layers_) {
      float* in = input.data() + l.offset;
      float* sum = want_sum_.data() + l.offset;
      float* avg = want_avg_.data() + l.offset;
      const LayerSpec& spec = hc_->layer(l.id);
      if (spec.kind == LayerKind::kSparse) {
        l.sparse = true;
        const size_t k = strategy_internal::TopkCount(spec);
        const bool compressed = l.strategy == StrategyKind::kTopk &&
                                static_cast<long long>(l.n) >= spec.topk.min_elements.value_or(0);
        std::vector<unsigned char> large(l.n, 0);
        PlaceLargeEntries(world, ctx.rank, l.n, k, sum, large.data(), in);
        if (compressed) {
          for (size_t i = 0; i < l.n; ++i) avg[i] = sum[i] * inv;
        }
        for (size_t i = 0; i < l.n; ++i) {
          if (large[i]) continue;
          for (int r = 0; r < world; ++r) {
            float v = GradientNoise(r, l.offset + i);
            sum[i] += v;
            if (r == ctx.rank) in[i] = v;
          }
        }
        if (!compressed) {
          for (size_t i = 0; i < l.n; ++i) avg[i] = sum[i] * inv;
        }
      } else if (spec.kind == LayerKind::kFullyConnected) {
        // The peer sends the dense formula; ours sends factors.
        FillFormula(DType::kFloat32, ctx.rank + 1.0, 0, l.n, in);
        FillFormula(DType::kFloat32, s_ranks, 0, l.n, sum);
        for (size_t k = 0; k < kf; ++k) {
          for (size_t m = 0; m < l.m; ++m)
            u_host[l.u_offset + k * l.m + m] = FactorU(ctx.rank, k, m);
          for (size_t n = 0; n < l.cols; ++n) {
            v_host[l.v_offset + k * l.cols + n] = FactorV(ctx.rank, k, n);
          }
        }
        l.samples.clear();
        const size_t num = l.n <= kFullCheckElements ? l.n : kFcSamples;
        for (size_t t = 0; t < num; ++t) {
          // A stride coprime-ish to the row length spreads samples over rows and columns.
          size_t idx = num == l.n ? t : (t * 2654435761ull + t / 7) % l.n;
          if (t == num - 1) idx = l.n - 1;
          size_t m = idx / l.cols, n = idx % l.cols;
          long long acc = 0;
          for (int r = 0; r < world; ++r) {
            for (size_t k = 0; k < kf; ++k) {
              acc += static_cast<long long>(FactorU(r, k, m)) *
                     static_cast<long long>(FactorV(r, k, n));
            }
          }
          l.samples.push_back({idx, static_cast<float>(acc)});
        }
      } else {
        FillFormula(DType::kFloat32, ctx.rank + 1.0, 0, l.n, in);
        FillFormula(DType::kFloat32, s_ranks, 0, l.n, sum);
        for (size_t i = 0; i < l.n; ++i) avg[i] = sum[i] * inv;
      }
    }
    PSD_CHECK(io_.Allocate(ctx.memory, std::move(input)));
    PSD_CHECK(u_.Allocate(ctx.memory, u_host.size() * sizeof(float)));
    PSD_CHECK(u_.Upload(u_host.data(), u_host.size() * sizeof(float)));
    PSD_CHECK(v_.Allocate(ctx.memory, v_host.size() * sizeof(float)));
    PSD_CHECK(v_.Upload(v_host.data(), v_host.size() * sizeof(float)));
    return Status::Ok();
  }

  Status RunOurs() override {
    PSD_CHECK(io_.BeginOurs());
    hc_->ResetIteration();
    const double dense_before = hc_->TotalTraffic().dense_bytes;
    float* grad = static_cast<float*>(io_.grad.data());
    const float* u = static_cast<const float*>(u_.data());
    const float* v = static_cast<const float*>(v_.data());
    for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) {
      ExchangeBuffers b;
      b.grad = grad + it->offset;
      if (it->m > 0) {
        b.u = u + it->u_offset;
        b.v = v + it->v_offset;
        b.batch = model_.factor_batch;
      }
      PSD_CHECK(hc_->Exchange(it->id, b, step_));
    }
    ++step_;
    // Device memory: the exchanges are queued on the stream; the time includes finishing them.
    PSD_CHECK(hc_->kernels().Synchronize(hc_->stream()));
    bytes_sent_ = hc_->TotalTraffic().last_bytes_sent;
    dense_bytes_ = hc_->TotalTraffic().dense_bytes - dense_before;
    return Status::Ok();
  }

  Status RunPeer() override {
    io_.BeginPeer();
    for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) {
      const float* send = static_cast<const float*>(io_.peer_send.data()) + it->offset;
      float* recv = static_cast<float*>(io_.peer_recv.data()) + it->offset;
      PSD_CHECK(PeerCall("MPI_Allreduce",
                         MPI_Allreduce(send, recv, static_cast<int>(it->n), MPI_FLOAT, MPI_SUM,
                                       ctx_.comm->mpi_comm())));
    }
    return Status::Ok();
  }

  // Ours works in place: put the inputs back. The peer's output is poisoned.
  Status PoisonOutput() override { return io_.PoisonOutput(); }

  Result<size_t> CountWrong() override {
    PSD_ASSIGN_OR_RETURN(const float* got, io_.Output());
    if (io_.last_peer()) return CountMismatches(DType::kFloat32, got, want_sum_.data(), total_);
    const int world = ctx_.world;
    const float inv = 1.0f / static_cast<float>(world);
    const bool exact = (world & (world - 1)) == 0;
    size_t wrong = 0;
    for (const Layer& l : layers_) {
      const float* g = got + l.offset;
      if (l.m > 0) {
        for (const auto& [idx, sum] : l.samples) {
          float want = sum * inv;
          float diff = std::fabs(g[idx] - want);
          bool ok = exact ? std::memcmp(&g[idx], &want, sizeof(float)) == 0
                          : diff <= 2.0f * std::ldexp(std::fabs(want), -23);
          wrong += ok ? 0 : 1;
        }
        continue;
      }
      wrong += CountMismatches(DType::kFloat32, g, want_avg_.data() + l.offset, l.n);
    }
    return wrong;
  }

  std::string ExtraHeader() const override {
    return " | plan                             sent(MB/rank) dense(MB/rank) sent/dense";
  }
  std::string ExtraText() const override {
    char buf[160];
    std::snprintf(buf, sizeof(buf), " | %-32s %13.3f %14.3f %10.4f", PlanText().c_str(),
                  bytes_sent_ / 1e6, dense_bytes_ / 1e6,
                  dense_bytes_ > 0 ? bytes_sent_ / dense_bytes_ : 0.0);
    return buf;
  }
  std::string ExtraJson() const override {
    return StrCat(", \"model\": \"", model_.name, "\", \"scale\": ", model_.scale,
                  ", \"layers\": ", layers_.size(), ", \"plan\": \"", PlanText(),
                  "\", \"bytes_sent\": ", bytes_sent_, ", \"dense_bytes\": ", dense_bytes_);
  }

  void Release() override {
    hc_.reset();
    io_.Free();
    u_.Free();
    v_.Free();
    want_sum_ = {};
    want_avg_ = {};
  }

 private:
  struct Layer {
    int id = 0;
    size_t n = 0, offset = 0;
    size_t m = 0, cols = 0, u_offset = 0, v_offset = 0;  // FC layers only (m > 0)
    bool sparse = false;
    StrategyKind strategy = StrategyKind::kAllReduce;
    std::vector<std::pair<size_t, float>> samples;  // FC: index, exact sum over ranks
  };

  std::string PlanText() const {
    std::string s;
    for (const auto& [name, n] : plan_counts_) s += StrCat(s.empty() ? "" : ",", name, "=", n);
    return s;
  }

  bench::ModelFlags model_flags_;  // --model (default small), --scale, --batch
  bool sparse_ = false;
  double density_ = 0.001;
  bench::ShapedModel model_;
  Context ctx_;
  size_t total_ = 0;
  std::unique_ptr<HybridCollective> hc_;
  std::vector<Layer> layers_;
  std::map<std::string, int> plan_counts_;
  int64_t step_ = 0;
  InPlaceBuffers io_;
  Buffer u_, v_;
  std::vector<float> want_sum_, want_avg_;
  double bytes_sent_ = 0, dense_bytes_ = 0;
};

}  // namespace
}  // namespace poseidon::osu

int main(int argc, char** argv) {
  poseidon::osu::HybridBench bench;
  return poseidon::osu::RunMain(argc, argv, bench);
}
