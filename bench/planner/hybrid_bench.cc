// poseidon_hybrid_bench: does the planner pick what is actually fastest here?
//
//  1. Measure (or load) the cost model on this communicator.
//  2. Layer sweep: for each layer (FC layers of several shapes with SGD, sparse layers at two
//     densities), run every applicable strategy forced through HybridCollective, `iters` timed
//     exchanges each (a barrier before each, the slowest rank's time, median), and print the
//     measured and predicted times side by side with the dense allreduce peer's ratio.
//     Then the planner's choice against the measured fastest.
//  3. Model mode (--model): one training step's exchanges of a whole model (shrunk to the
//     fraction --scale of its parameters, bench/common/model_shape.h, to fit this machine),
//     the auto plan against everything forced to allreduce.
//
//   mpirun -np 4 poseidon_hybrid_bench [--iters 5] [--batch 32] [--model vgg19 --scale 0.0625]
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/common/model_shape.h"
#include "bench/common/preamble.h"
#include "collectives/hybrid.h"
#include "tools/flags.h"

namespace poseidon {
namespace {

struct Options {
  int iters = 5;
  size_t batch = 32;
  // --model (none: the layer sweep) and --scale (default 1/16: what dividing both sides of
  // every weight by 4 kept); the sweep takes --batch, the model mode the model's own batch
  // unless --batch is given.
  bench::ModelFlags model{"", 0.0625, 0};
};

double Now() { return MPI_Wtime(); }

// Slowest rank's seconds.
double MaxOverRanks(double t) {
  double m = t;
  MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

struct Buffers {
  std::vector<float> grad, params, u, v;
};

Buffers MakeBuffers(const LayerSpec& l, size_t batch, int rank) {
  Buffers b;
  size_t n = l.NumElements();
  b.grad.resize(n);
  b.params.assign(n, 0.5f);
  // Gradient-like values: a hashed, continuous spread (few ties, as real gradients).
  for (size_t i = 0; i < n; ++i) {
    uint32_t h = static_cast<uint32_t>(i * 2654435761u) ^ static_cast<uint32_t>(rank * 40503u);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    b.grad[i] = (static_cast<float>(h % 2000001u) - 1000000.0f) * 1e-6f;
  }
  if (l.kind == LayerKind::kFullyConnected) {
    b.u.assign(batch * l.rows(), 0.25f);
    b.v.assign(batch * l.cols(), 0.5f);
  }
  return b;
}

ExchangeBuffers View(Buffers& b, size_t batch) {
  ExchangeBuffers e;
  e.grad = b.grad.data();
  e.params = b.params.empty() ? nullptr : b.params.data();
  if (!b.u.empty()) {
    e.u = b.u.data();
    e.v = b.v.data();
    e.batch = batch;
  }
  return e;
}

// Median over iters of one step exchanging every layer of `hc` (slowest rank each time).
Result<double> TimeSteps(HybridCollective& hc, std::vector<Buffers>& bufs, size_t batch,
                         int iters) {
  std::vector<double> t;
  for (int it = -1; it < iters; ++it) {  // it == -1: warm-up (state allocation)
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = Now();
    for (int id = 0; id < hc.num_layers(); ++id) {
      PSD_CHECK(hc.Exchange(id, View(bufs[static_cast<size_t>(id)], batch), it + 1));
    }
    double dt = MaxOverRanks(Now() - t0);
    if (it >= 0) t.push_back(dt);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int Sweep(std::shared_ptr<Communicator> comm, const CostModel& model, const Options& o) {
  const bool root = comm->rank() == 0;
  std::vector<LayerSpec> cases;
  for (size_t d : {256, 1024, 2048}) {
    for (size_t k : {o.batch}) {
      LayerSpec l;
      l.name = StrCat("fc", d, "x", d);
      l.shape = {d, d};
      l.kind = LayerKind::kFullyConnected;
      l.optimizer = OptimizerSpec::Sgd(SgdParams{});
      (void)k;
      cases.push_back(l);
    }
  }
  {
    LayerSpec l;
    l.name = "fc1000x4096";
    l.shape = {1000, 4096};
    l.kind = LayerKind::kFullyConnected;
    l.optimizer = OptimizerSpec::Sgd(SgdParams{});
    cases.push_back(l);
  }
  for (double d : {0.001, 0.01}) {
    LayerSpec l;
    l.name = StrCat("sparse1M_d", d);
    l.shape = {1u << 20};
    l.kind = LayerKind::kSparse;
    l.topk.density = d;
    l.topk.min_elements = 0;
    cases.push_back(l);
  }
  if (root) {
    std::printf("\n# layer sweep: K=%zu, %d timed steps each, median of the slowest rank\n",
                o.batch, o.iters);
    std::printf("%-18s %-10s %12s %12s %9s %10s %14s\n", "layer", "strategy", "measured_us",
                "predicted_us", "pred/meas", "ar/this", "bytes/rank");
  }
  int agree = 0, total = 0;
  for (const LayerSpec& base : cases) {
    double measured[kNumStrategies] = {0, 0, 0, 0};
    bool ran[kNumStrategies] = {false, false, false, false};
    StrategyKind planned = StrategyKind::kAllReduce;
    for (StrategyKind s : kAllStrategies) {
      auto resolved = ResolveLayerSpec(base);
      if (!resolved.ok() || !StrategyApplies(s, *resolved, nullptr)) continue;
      LayerSpec l = base;
      l.force = s;
      auto hc = HybridCollective::Create(comm);
      if (!hc.ok() || !(*hc)->RegisterLayer(l).ok() ||
          !(*hc)->BuildPlan(o.batch, model, PlannerOptions{}).ok()) {
        if (root) std::fprintf(stderr, "set-up failed for %s\n", l.name.c_str());
        return 1;
      }
      std::vector<Buffers> bufs = {MakeBuffers(l, o.batch, comm->rank())};
      auto t = TimeSteps(**hc, bufs, o.batch, o.iters);
      if (!t.ok()) {
        if (root) std::fprintf(stderr, "%s\n", t.status().ToString().c_str());
        return 1;
      }
      measured[static_cast<int>(s)] = *t;
      ran[static_cast<int>(s)] = true;
      const CandidateCost& c = (*hc)->plan().entries[0].cost(s);
      double ar = measured[0];
      if (root) {
        std::printf("%-18s %-10s %12.1f %12.1f %9.2f %10.2f %14.0f\n", l.name.c_str(),
                    StrategyName(s), *t * 1e6, c.time_s * 1e6, c.time_s / *t,
                    ar > 0 ? ar / *t : 1.0, c.bytes_sent);
      }
    }
    // The planner's choice among the same candidates (no force).
    auto resolved = ResolveLayerSpec(base);
    auto entry = PlanLayer(*resolved, o.batch, comm->size(), model, PlannerOptions{});
    if (entry.ok()) planned = entry->choice;
    int best = -1;
    for (int s = 0; s < kNumStrategies; ++s) {
      if (ran[s] && (best < 0 || measured[s] < measured[best])) best = s;
    }
    bool ok = best == static_cast<int>(planned) ||
              measured[static_cast<int>(planned)] <= 1.10 * measured[best];
    agree += ok;
    ++total;
    if (root) {
      std::printf("%-18s planner=%s measured-best=%s (planned is %.2fx the best)%s\n",
                  base.name.c_str(), StrategyName(planned),
                  StrategyName(static_cast<StrategyKind>(best)),
                  measured[static_cast<int>(planned)] / measured[best],
                  ok ? "" : "  <-- planner off by >10%");
    }
  }
  if (root)
    std::printf("# planner within 10%% of the measured best on %d of %d layers\n", agree, total);
  return 0;
}

int ModelStep(std::shared_ptr<Communicator> comm, const CostModel& model, const Options& o) {
  const bool root = comm->rank() == 0;
  auto shaped = bench::MakeShapedModel(o.model);
  if (!shaped.ok()) {
    if (root) {
      std::fprintf(stderr, "poseidon_hybrid_bench: %s\n",
                   cli::OptionError(shaped.status()).message().c_str());
    }
    return 2;
  }
  // SGD on every layer, so that ps competes too.
  std::vector<LayerSpec> layers;
  for (const bench::ShapedLayer& sl : shaped->layers) {
    LayerSpec l = sl.spec;
    l.optimizer = OptimizerSpec::Sgd(SgdParams{});
    layers.push_back(l);
  }
  const size_t batch = shaped->factor_batch;
  double times[2] = {0, 0}, predicted[2] = {0, 0}, bytes[2] = {0, 0};
  std::string choices;
  for (int mode = 0; mode < 2; ++mode) {  // 0: all allreduce (the peer), 1: auto plan
    auto hc = HybridCollective::Create(comm);
    if (!hc.ok()) return 1;
    size_t params = 0;
    for (const LayerSpec& l : layers) {
      if (!(*hc)->RegisterLayer(l).ok()) return 1;
      params += l.NumElements();
    }
    PlannerOptions po;
    if (mode == 0) po.global_force = StrategyKind::kAllReduce;
    if (!(*hc)->BuildPlan(batch, model, po).ok()) return 1;
    std::vector<Buffers> bufs;
    for (const LayerSpec& l : layers) bufs.push_back(MakeBuffers(l, batch, comm->rank()));
    auto t = TimeSteps(**hc, bufs, batch, o.iters);
    if (!t.ok()) {
      if (root) std::fprintf(stderr, "%s\n", t.status().ToString().c_str());
      return 1;
    }
    times[mode] = *t;
    predicted[mode] = (*hc)->plan().PredictedTime();
    bytes[mode] = (*hc)->plan().PredictedBytes();
    if (mode == 1) {
      int count[kNumStrategies] = {0, 0, 0, 0};
      for (const PlanEntry& e : (*hc)->plan().entries) ++count[static_cast<int>(e.choice)];
      choices = StrCat("allreduce ", count[0], ", ps ", count[1], ", sfb ", count[2], ", topk ",
                       count[3]);
      if (root) {
        std::printf("\n# model %s x%g: %zu layers, %zu parameters, K=%zu (factor rows); plan: %s\n",
                    shaped->name.c_str(), shaped->scale, layers.size(), params, batch,
                    choices.c_str());
      }
    }
  }
  if (root) {
    std::printf("%-10s %12s %12s %9s %14s\n", "plan", "measured_ms", "predicted_ms", "pred/meas",
                "bytes/rank");
    const char* names[2] = {"allreduce", "hybrid"};
    for (int m = 0; m < 2; ++m) {
      std::printf("%-10s %12.2f %12.2f %9.2f %14.0f\n", names[m], times[m] * 1e3,
                  predicted[m] * 1e3, predicted[m] / times[m], bytes[m]);
    }
    std::printf("# hybrid speedup over allreduce: measured %.2fx, predicted %.2fx\n",
                times[0] / times[1], predicted[0] / predicted[1]);
  }
  return 0;
}

int Main(int argc, char** argv) {
  Options o;
  cli::Flags flags("poseidon_hybrid_bench");
  flags.Int("--iters", &o.iters, 1, 1000000, "N", "timed steps per case (default 5)");
  bench::AddModelFlags(flags, &o.model, /*with_batch=*/false);
  long long batch = static_cast<long long>(o.batch);
  flags.Int("--batch", &batch, 1, 65536, "K",
            "sweep: factor rows of the FC layers (default 32);\n"
            "--model: images per rank (default: the model's)");
  Status parsed = flags.Parse(argc, argv);
  if (!parsed.ok() || flags.help()) {
    if (!parsed.ok()) std::fprintf(stderr, "poseidon_hybrid_bench: %s\n", parsed.message().c_str());
    std::fputs(flags.Usage().c_str(), parsed.ok() ? stdout : stderr);
    return parsed.ok() ? 0 : 2;
  }
  o.batch = static_cast<size_t>(batch);
  if (flags.Given("--batch")) o.model.batch = batch;
  auto lvl = InitMpi(&argc, &argv);
  if (!lvl.ok()) return 1;
  int rc = 0;
  {
    auto comm = Communicator::Create(MPI_COMM_WORLD);
    if (!comm.ok()) {
      std::fprintf(stderr, "%s\n", comm.status().ToString().c_str());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    double t0 = Now();
    auto model = LoadOrMeasureCostModel(**comm, CpuKernels());
    double probe_s = MaxOverRanks(Now() - t0);
    if (!model.ok()) {
      std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if ((*comm)->rank() == 0) {
      auto pre = bench::Preamble::Gather(
          "poseidon_hybrid_bench",
          "does the planner pick what is fastest here? measured against predicted per strategy");
      pre.SetRun(**comm, (*comm)->host_backend(), MemoryKind::kHost);
      char probe[64];
      std::snprintf(probe, sizeof probe, "%.3f", probe_s);
      pre.lines.push_back(StrCat("cost model (", probe, " s to obtain): ", model->Summary()));
      std::fputs(pre.Text().c_str(), stdout);
    }
    rc = o.model.model.empty() ? Sweep(*comm, *model, o) : ModelStep(*comm, *model, o);
  }
  MPI_Finalize();
  return rc;
}

}  // namespace
}  // namespace poseidon

int main(int argc, char** argv) { return poseidon::Main(argc, argv); }
