// poseidon_model_trainer: a model-shaped data-parallel training loop whose compute is emulated
// and whose gradient exchange is real, to measure what Poseidon's exchange costs a model.
//
// Step by step (every rank runs the same program under mpirun):
//  1. Parse the flags (identical on every rank) and take the layer table of --model
//     (tools/models/models.h, or a small default), shrunk to the fraction --scale of its
//     parameters when asked (bench/common/model_shape.h keeps the ratios that decide each
//     layer's exchange).
//  2. Emulated compute: each layer's forward time is its FLOPs / the modelled GPU's effective
//     FLOP rate x --compute-scale x the shrink factor, backward twice that. The wait is a sleep
//     against a running deadline: on a GPU cluster the GPU computes, so the host CPU stays free
//     for communication, and 8 emulated hosts can share 2 real cores.
//  3. Real gradients: every rank fills each layer from a counter-based hash of (seed, rank,
//     layer, index), so any rank can recompute any other rank's value. Fully connected layers
//     get sufficient factors U (K x M) and V (K x N) and the dense gradient U^T V.
//  4. The modes, in one run, each with its own HybridCollective and plan:
//       dense           the papers' baseline: backward completes, then every layer is
//                       allreduced in turn (no overlap);
//       dense-overlap   the engine exchanges each layer as soon as its backward is done
//                       (wait-free backprop), the plan forced to allreduce;
//       hybrid-overlap  the engine with the planner's per-layer choice (sfb layers hand over
//                       their factors, the rest their dense gradient);
//       hybrid          the planner's choice, exchanged after backward (pure exchange time).
//     The next forward of layer L waits for layer L's handle (wait-free backprop).
//  5. Per mode: iteration time (the slowest rank's), images/s, wire bytes per rank per
//     iteration (the plan's byte model), and a correctness check of sampled entries of every
//     layer against the average recomputed from the hash (exit code 3 when it fails).
//  6. --predict P,P,...: the planner's predicted exchange time and bytes for the full-size
//     model at each P, with the cost model measured here and with a stated 10 Gbit/s network.
//
//   mpirun -np 4 poseidon_model_trainer --model vgg19 --scale 0.0625 --compute-scale 10
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/cluster/trainer_options.h"
#include "bench/common/model_shape.h"
#include "bench/common/preamble.h"
#include "collectives/hybrid.h"
#include "collectives/planner.h"
#include "engine/engine.h"
#include "runtime/communicator.h"
#include "tools/flags.h"

namespace poseidon::cluster {
namespace {

using bench::ShapedLayer;
using bench::ShapedModel;
using Clock = std::chrono::steady_clock;

// Counter-based values in [-1, 1): splitmix64 of (seed, rank, layer, stream, index), so any
// rank can recompute any other rank's gradient entry without generating the whole tensor.
float HashValue(uint64_t seed, int rank, int layer, int stream, uint64_t index) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(rank) << 48) ^
               (static_cast<uint64_t>(layer) << 32) ^ (static_cast<uint64_t>(stream) << 62) ^
               index * 0xD1B54A32D192ED03ull;
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return static_cast<float>(static_cast<double>(x >> 40) * (2.0 / 16777216.0) - 1.0);
}

// The emulated GPU: a running deadline, so that sleep overshoot does not accumulate over the
// hundreds of short layers of ResNet-152; Sync() restarts it after the host waited.
class GpuClock {
 public:
  void Sync() { deadline_ = Clock::now(); }
  void Compute(double seconds) {
    deadline_ +=
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    std::this_thread::sleep_until(deadline_);
  }

 private:
  Clock::time_point deadline_ = Clock::now();
};

struct LayerBuffers {
  std::vector<float> src;   // this rank's gradient (dense form)
  std::vector<float> work;  // what is exchanged; holds the average afterwards
  std::vector<float> u, v;  // sufficient factors (FC layers)
};

struct ModeResult {
  Mode mode;
  double iter_s = 0;
  double bytes = 0;        // wire bytes per rank per iteration (the plan's model)
  double predicted_s = 0;  // the plan's predicted exchange time per iteration
  int counts[kNumStrategies] = {0, 0, 0, 0};
  double max_err = 0;
  bool check_ok = true;
};

[[noreturn]] void Die(const Status& s, int rank) {
  std::fprintf(stderr, "poseidon_model_trainer (rank %d): %s\n", rank, s.ToString().c_str());
  std::fflush(stderr);
  // A failure on one rank would leave the others inside a collective: abort the job.
  MPI_Abort(MPI_COMM_WORLD, 2);
  std::exit(2);
}

class Trainer {
 public:
  Trainer(const Options& o, std::shared_ptr<Communicator> comm, ShapedModel model)
      : o_(o), comm_(std::move(comm)), m_(std::move(model)) {}

  Status Setup();
  Result<ModeResult> RunMode(Mode mode);
  Status Predict() const;
  void PrintPreamble() const;
  const CostModel& cost_model() const { return cost_; }
  const ShapedModel& model() const { return m_; }
  double ComputeSeconds() const;

 private:
  Result<std::unique_ptr<HybridCollective>> MakeCollective(Mode mode) const;
  Status Iterate(Mode mode, HybridCollective& hc, Engine* engine, int64_t step,
                 std::vector<HandlePtr>& handles);
  Status WaitAll(std::vector<HandlePtr>& handles);
  void Check(const HybridCollective& hc, ModeResult* r) const;

  const Options o_;
  std::shared_ptr<Communicator> comm_;
  ShapedModel m_;
  std::vector<LayerBuffers> buf_;
  std::vector<double> fwd_s_, bwd_s_;
  CostModel cost_;
  GpuClock gpu_;
};

double Trainer::ComputeSeconds() const {
  double t = 0;
  for (size_t l = 0; l < fwd_s_.size(); ++l) t += fwd_s_[l] + bwd_s_[l];
  return t;
}

Status Trainer::Setup() {
  const int rank = comm_->rank();
  const size_t kf = m_.factor_batch;
  const double per_flop = o_.compute_scale * m_.scale / (o_.gpu_tflops * 1e12);
  buf_.resize(m_.layers.size());
  for (size_t l = 0; l < m_.layers.size(); ++l) {
    const LayerSpec& s = m_.layers[l].spec;
    LayerBuffers& b = buf_[l];
    const size_t n = s.NumElements();
    b.src.resize(n);
    b.work.resize(n);
    const int li = static_cast<int>(l);
    if (s.kind == LayerKind::kFullyConnected) {
      b.u.resize(kf * s.rows());
      b.v.resize(kf * s.cols());
      for (size_t i = 0; i < b.u.size(); ++i) b.u[i] = HashValue(o_.seed, rank, li, 1, i);
      for (size_t i = 0; i < b.v.size(); ++i) b.v[i] = HashValue(o_.seed, rank, li, 2, i);
      // The backward pass's weight gradient of an FC layer is U^T V.
      PSD_CHECK(CpuKernels().SufficientFactorGemm(b.u.data(), b.v.data(), kf, s.rows(), s.cols(),
                                                  1.0f, 0.0f, b.src.data(), nullptr));
    } else {
      for (size_t i = 0; i < n; ++i) b.src[i] = HashValue(o_.seed, rank, li, 0, i);
    }
    fwd_s_.push_back(m_.layers[l].fwd_flops * per_flop);
    bwd_s_.push_back(2 * m_.layers[l].fwd_flops * per_flop);
  }
  // One measured (or cached) cost model for every mode, so the plans differ only by choice.
  PSD_ASSIGN_OR_RETURN(cost_, LoadOrMeasureCostModel(*comm_, CpuKernels()));
  return Status::Ok();
}

Result<std::unique_ptr<HybridCollective>> Trainer::MakeCollective(Mode mode) const {
  PSD_ASSIGN_OR_RETURN(std::unique_ptr<HybridCollective> hc, HybridCollective::Create(comm_));
  for (const ShapedLayer& l : m_.layers) PSD_CHECK(hc->RegisterLayer(l.spec));
  PSD_ASSIGN_OR_RETURN(PlannerOptions opts, PlannerOptions::FromSettings());
  if (!Hybrid(mode)) opts.global_force = StrategyKind::kAllReduce;
  PSD_CHECK(hc->BuildPlan(m_.factor_batch, cost_, opts));
  return hc;
}

Status Trainer::WaitAll(std::vector<HandlePtr>& handles) {
  for (HandlePtr& h : handles) {
    if (h) PSD_CHECK(h->Wait());
    h.reset();
  }
  return Status::Ok();
}

Status Trainer::Iterate(Mode mode, HybridCollective& hc, Engine* engine, int64_t step,
                        std::vector<HandlePtr>& handles) {
  const int num = static_cast<int>(m_.layers.size());
  // Forward: layer L may start only once its previous exchange has landed.
  for (int l = 0; l < num; ++l) {
    HandlePtr& h = handles[static_cast<size_t>(l)];
    if (h) {
      const bool blocked = !h->Test();
      PSD_CHECK(h->Wait());
      h.reset();
      if (blocked) gpu_.Sync();  // the GPU idled while the host waited
    }
    gpu_.Compute(fwd_s_[static_cast<size_t>(l)]);
  }
  // Backward, last layer first; each gradient is handed over as soon as it exists.
  for (int l = num - 1; l >= 0; --l) {
    const size_t li = static_cast<size_t>(l);
    gpu_.Compute(bwd_s_[li]);
    LayerBuffers& b = buf_[li];
    const bool factors = hc.strategy(l) == StrategyKind::kSfb;
    if (!factors) std::memcpy(b.work.data(), b.src.data(), b.src.size() * sizeof(float));
    if (engine != nullptr) {
      Gradient g;
      g.data = b.work.data();
      g.count = b.work.size();
      if (factors) {
        g.u = b.u.data();
        g.v = b.v.data();
        g.batch = m_.factor_batch;
      }
      handles[li] = engine->Submit(l, g, step);
    }
  }
  if (engine == nullptr) {
    // The baseline: exchange after the whole backward pass, in the order gradients appeared.
    for (int l = num - 1; l >= 0; --l) {
      LayerBuffers& b = buf_[static_cast<size_t>(l)];
      ExchangeBuffers eb;
      eb.grad = b.work.data();
      if (hc.strategy(l) == StrategyKind::kSfb) {
        eb.u = b.u.data();
        eb.v = b.v.data();
        eb.batch = m_.factor_batch;
      }
      PSD_CHECK(hc.Exchange(l, eb, step));
    }
    gpu_.Sync();
  }
  (void)mode;
  return Status::Ok();
}

void Trainer::Check(const HybridCollective& hc, ModeResult* r) const {
  // Sampled entries of every layer against the average over ranks recomputed from the hash.
  const int world = comm_->size();
  const size_t kf = m_.factor_batch;
  for (size_t l = 0; l < m_.layers.size(); ++l) {
    const LayerSpec& s = m_.layers[l].spec;
    const size_t n = s.NumElements();
    const int li = static_cast<int>(l);
    const size_t samples = std::min<size_t>(n, 48);
    for (size_t j = 0; j < samples; ++j) {
      // Spread the samples over the tensor, first and last entries included.
      const size_t i = samples == 1 ? 0 : j * (n - 1) / (samples - 1);
      double expect = 0, magnitude = 0;
      for (int q = 0; q < world; ++q) {
        if (s.kind == LayerKind::kFullyConnected) {
          const size_t row = i / s.cols(), col = i % s.cols();
          for (size_t k = 0; k < kf; ++k) {
            double t = static_cast<double>(HashValue(o_.seed, q, li, 1, k * s.rows() + row)) *
                       HashValue(o_.seed, q, li, 2, k * s.cols() + col);
            expect += t;
            magnitude += std::fabs(t);
          }
        } else {
          double t = HashValue(o_.seed, q, li, 0, i);
          expect += t;
          magnitude += std::fabs(t);
        }
      }
      expect /= world;
      magnitude /= world;
      const double err = std::fabs(buf_[l].work[i] - expect);
      const double tol = 2e-5 * magnitude + 1e-7;
      r->max_err = std::max(r->max_err, err / (magnitude + 1e-30));
      if (!(err <= tol)) {
        if (r->check_ok) {
          std::fprintf(stderr,
                       "poseidon_model_trainer: rank %d, mode %s, layer %s (%s) entry %zu holds "
                       "%.9g, expected the average %.9g (tolerance %.3g)\n",
                       comm_->rank(), ModeName(r->mode), s.name.c_str(),
                       StrategyName(hc.strategy(li)), i, buf_[l].work[i], expect, tol);
        }
        r->check_ok = false;
      }
    }
  }
}

Result<ModeResult> Trainer::RunMode(Mode mode) {
  ModeResult r;
  r.mode = mode;
  PSD_ASSIGN_OR_RETURN(std::unique_ptr<HybridCollective> hc, MakeCollective(mode));
  for (const PlanEntry& e : hc->plan().entries) ++r.counts[static_cast<int>(e.choice)];
  r.bytes = hc->plan().PredictedBytes();
  r.predicted_s = hc->plan().PredictedTime();
  if (o_.print_plan && comm_->rank() == 0) {
    std::printf("# plan of mode %s (layers as exchanged in this run)\n%s", ModeName(mode),
                hc->PrintPlan().c_str());
  }
  std::unique_ptr<Engine> engine;
  if (Overlaps(mode)) {
    PSD_ASSIGN_OR_RETURN(engine, Engine::Create(comm_, hc.get()));
  }
  std::vector<HandlePtr> handles(m_.layers.size());
  int64_t step = 0;
  for (long long w = 0; w < o_.warmup; ++w) {
    PSD_CHECK(Iterate(mode, *hc, engine.get(), step++, handles));
  }
  PSD_CHECK(WaitAll(handles));
  // The engine thread may be mid-negotiation; this barrier is on the user's communicator.
  MPI_Barrier(MPI_COMM_WORLD);
  gpu_.Sync();
  const Clock::time_point t0 = Clock::now();
  for (long long it = 0; it < o_.iters; ++it) {
    PSD_CHECK(Iterate(mode, *hc, engine.get(), step++, handles));
  }
  PSD_CHECK(WaitAll(handles));
  double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  if (engine) PSD_CHECK(engine->Shutdown());
  MPI_Allreduce(MPI_IN_PLACE, &elapsed, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  r.iter_s = elapsed / static_cast<double>(o_.iters);
  Check(*hc, &r);
  int ok = r.check_ok ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &r.max_err, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  r.check_ok = ok == 1;
  return r;
}

// The full-size layers, resolved, with a variant per strategy so each strategy can be priced
// alone: ps needs an optimizer (SGD on the shard owners), topk needs sparse-eligible layers.
Result<std::vector<LayerSpec>> FullLayers(const std::string& model, StrategyKind variant) {
  PSD_ASSIGN_OR_RETURN(ModelTable table, bench::TrainerModelTable(model));
  std::vector<LayerSpec> out;
  for (LayerSpec l : table.layers) {
    if (variant == StrategyKind::kPs) l.optimizer = OptimizerSpec::Sgd(SgdParams{});
    if (variant == StrategyKind::kTopk) {
      l.kind = LayerKind::kSparse;
    }
    PSD_ASSIGN_OR_RETURN(LayerSpec r, ResolveLayerSpec(l));
    out.push_back(r);
  }
  return out;
}

Status Trainer::Predict() const {
  // The 10 Gbit/s cluster model: 25 us per step, 1.25 GB/s, GPU-class kernels (as
  // poseidon_plan's defaults), stated in every line.
  CostModel net = CostModel::Network(25e-6, 10e9 / 8);
  net.gemm_flops = 1000e9;
  net.topk_bytes_per_s = 100e9;
  net.scatter_bytes_per_s = 100e9;
  net.optimizer_bytes_per_s = 200e9;
  net.source = "network(25us,10Gbit/s,1000GF/s)";
  PSD_ASSIGN_OR_RETURN(PlannerOptions base, PlannerOptions::FromSettings());
  PSD_ASSIGN_OR_RETURN(std::vector<LayerSpec> layers,
                       FullLayers(m_.name, StrategyKind::kAllReduce));
  const bool print = comm_->rank() == 0;
  struct Named {
    const char* name;
    const CostModel* model;
  };
  for (const Named& nm : {Named{"measured", &cost_}, Named{"net10g", &net}}) {
    for (int p : o_.predict) {
      PSD_ASSIGN_OR_RETURN(Plan plan, MakePlan(layers, m_.batch, p, *nm.model, base));
      int counts[kNumStrategies] = {0, 0, 0, 0};
      for (const PlanEntry& e : plan.entries) ++counts[static_cast<int>(e.choice)];
      if (print) {
        std::printf(
            "PREDICT model=%s cost=%s P=%d K=%zu hybrid_ms=%.3f dense_ms=%.3f "
            "hybrid_MB=%.3f dense_MB=%.3f n_allreduce=%d n_ps=%d n_sfb=%d n_topk=%d\n",
            m_.name.c_str(), nm.name, p, m_.batch, plan.PredictedTime() * 1e3,
            plan.DenseAllReduceTime() * 1e3, plan.PredictedBytes() / 1e6,
            plan.DenseAllReduceBytes() / 1e6, counts[0], counts[1], counts[2], counts[3]);
      }
      // Each strategy alone wherever it applies (allreduce elsewhere).
      for (StrategyKind s : kAllStrategies) {
        PSD_ASSIGN_OR_RETURN(std::vector<LayerSpec> var, FullLayers(m_.name, s));
        PlannerOptions forced = base;
        forced.global_force = s;
        forced.candidates = {StrategyKind::kAllReduce, s};
        PSD_ASSIGN_OR_RETURN(Plan sp, MakePlan(var, m_.batch, p, *nm.model, forced));
        if (print) {
          std::printf("STRATEGY model=%s cost=%s P=%d strategy=%s ms=%.3f MB=%.3f\n",
                      m_.name.c_str(), nm.name, p, StrategyName(s), sp.PredictedTime() * 1e3,
                      sp.PredictedBytes() / 1e6);
        }
      }
    }
  }
  if (o_.print_plan) {
    PSD_ASSIGN_OR_RETURN(Plan plan, MakePlan(layers, m_.batch, comm_->size(), cost_, base));
    if (print) {
      std::printf("# full-size plan of %s at P=%d with the measured cost model\n%s",
                  m_.name.c_str(), comm_->size(), plan.ToString().c_str());
    }
  }
  std::fflush(stdout);
  return Status::Ok();
}

void Trainer::PrintPreamble() const {
  if (comm_->rank() != 0) return;
  const double dense_bytes = 4.0 * static_cast<double>(m_.Elements());
  auto pre = bench::Preamble::Gather(
      "poseidon_model_trainer",
      "a model-shaped training loop, compute emulated, gradient exchange real");
  pre.SetRun(*comm_, comm_->host_backend(), MemoryKind::kHost);
  std::fputs(pre.Text().c_str(), stdout);
  std::printf(
      "# network: %s%s\n", o_.network.c_str(),
      o_.link_gbit > 0 ? StrCat(", links rate-limited to ", o_.link_gbit, " Gbit/s").c_str() : "");
  std::printf("# model %s: %zu layers, %zu parameters at full size; K=%zu images per rank\n",
              m_.name.c_str(), m_.layers.size(), m_.FullElements(), m_.batch);
  if (m_.scale < 1) {
    std::printf(
        "# SCALED: every layer shrunk by f=%g (dense layers f x elements, FC layers and "
        "their factor batch sqrt(f) per side: K_factors=%zu); exchanged %zu parameters "
        "(%.1f MB); compute shrunk by f as well\n",
        m_.scale, m_.factor_batch, m_.Elements(), dense_bytes / 1e6);
  }
  std::printf(
      "# COMPUTE IS EMULATED with sleeps, not run: forward = FLOPs / (%s GPU at %.2f "
      "TFLOP/s effective) x compute-scale %g x f %g, backward = 2 x forward; "
      "%.1f GFLOP forward per iteration at full size -> %.1f ms compute per iteration. "
      "The gradient exchange is real.\n",
      o_.gpu.c_str(), o_.gpu_tflops, o_.compute_scale, m_.scale, m_.FwdFlops() / 1e9,
      ComputeSeconds() * 1e3);
  const double wire = 2.0 * (comm_->size() - 1) / comm_->size() * dense_bytes;
  std::printf("# cost model: %s (%s)\n", cost_.Summary().c_str(), cost_.source.c_str());
  if (o_.link_gbit > 0 && comm_->size() > 1) {
    const double t_comm = wire / (o_.link_gbit * 1e9 / 8);
    std::printf(
        "# compute : dense communication = %.1f ms : %.1f ms at the link rate "
        "(ratio %.3f); the same ratio as compute-scale 1 on a %.3g Gbit/s network\n",
        ComputeSeconds() * 1e3, t_comm * 1e3, ComputeSeconds() / t_comm,
        o_.link_gbit * o_.compute_scale);
  }
  std::fflush(stdout);
}

int Main(int argc, char** argv) {
  auto lvl = InitMpi(&argc, &argv);
  if (!lvl.ok()) {
    std::fprintf(stderr, "poseidon_model_trainer: %s\n", lvl.status().ToString().c_str());
    return 1;
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::string usage;
  bool help = false;
  auto opts = ParseArgs(argc, argv, &usage, &help);
  if (!opts.ok() || help) {
    if (rank == 0) {
      if (!opts.ok()) std::fprintf(stderr, "%s\n", opts.status().message().c_str());
      std::fputs(usage.c_str(), opts.ok() ? stdout : stderr);
    }
    MPI_Finalize();
    return opts.ok() ? 0 : 2;
  }
  auto shaped = bench::MakeShapedModel(opts->model);
  if (!shaped.ok()) {
    if (rank == 0)
      std::fprintf(stderr, "poseidon_model_trainer: %s\n",
                   cli::OptionError(shaped.status()).message().c_str());
    MPI_Finalize();
    return 2;
  }
  int rc = 0;
  {
    auto comm = Communicator::Create(MPI_COMM_WORLD);
    if (!comm.ok()) Die(comm.status(), rank);
    Trainer t(*opts, *comm, std::move(*shaped));
    Status s = t.Setup();
    if (!s.ok()) Die(s, rank);
    t.PrintPreamble();
    std::vector<ModeResult> results;
    for (Mode m : opts->modes) {
      auto r = t.RunMode(m);
      if (!r.ok()) Die(r.status(), rank);
      results.push_back(*r);
      if (!r->check_ok) rc = 3;
    }
    if (rank == 0 && !results.empty()) {
      const ShapedModel& mm = t.model();
      const int p = (*comm)->size();
      std::printf("%-15s %11s %11s %13s %14s %9s %5s %5s %5s %5s %9s %6s\n", "mode", "iter_ms",
                  "img_s", "img_s_model", "MB_per_iter", "vs_dense", "ar", "ps", "sfb", "topk",
                  "max_err", "check");
      const double base = results[0].iter_s;
      for (const ModeResult& r : results) {
        const double img = p * static_cast<double>(mm.batch) / r.iter_s;
        std::printf("%-15s %11.2f %11.2f %13.2f %14.3f %9.2f %5d %5d %5d %5d %9.1e %6s\n",
                    ModeName(r.mode), r.iter_s * 1e3, img, img * mm.scale * opts->compute_scale,
                    r.bytes / 1e6, base / r.iter_s, r.counts[0], r.counts[1], r.counts[2],
                    r.counts[3], r.max_err, r.check_ok ? "ok" : "FAIL");
      }
      std::printf(
          "# img_s: images/s of this run (P x K / iteration); img_s_model = img_s x f x "
          "compute-scale, the full-size model on the modelled cluster (links x "
          "compute-scale) when time scales with bytes and FLOPs; vs_dense: speed-up over "
          "the first mode; MB_per_iter: wire bytes per rank (plan)\n");
      for (const ModeResult& r : results) {
        const double img = p * static_cast<double>(mm.batch) / r.iter_s;
        std::printf(
            "RESULT model=%s np=%d mode=%s iter_ms=%.3f img_s=%.3f img_s_model=%.3f "
            "MB_per_iter=%.3f pred_exchange_ms=%.3f compute_ms=%.3f scale=%g "
            "compute_scale=%g check=%s\n",
            mm.name.c_str(), p, ModeName(r.mode), r.iter_s * 1e3, img,
            img * mm.scale * opts->compute_scale, r.bytes / 1e6, r.predicted_s * 1e3,
            t.ComputeSeconds() * 1e3, mm.scale, opts->compute_scale, r.check_ok ? "ok" : "FAIL");
      }
      std::fflush(stdout);
    }
    if (!opts->predict.empty() || opts->print_plan) {
      Status ps = t.Predict();
      if (!ps.ok()) Die(ps, rank);
    }
  }
  MPI_Finalize();
  return rc;
}

}  // namespace
}  // namespace poseidon::cluster

int main(int argc, char** argv) { return poseidon::cluster::Main(argc, argv); }
