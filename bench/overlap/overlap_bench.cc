// poseidon_overlap_bench: how much of the gradient exchange the engine hides behind compute.
//
// Steps:
//   1. A layer table: a small built-in CNN-like table (elements, forward ms, backward ms per
//      layer), or --model=<name> (bench/common/model_shape.h) shrunk to the fraction --scale of
//      its parameters, with a total backward compute of --compute-ms split in proportion to
//      layer size.
//   2. Compute is emulated per layer: sleeping by default (on a GPU the device computes, the
//      host thread waits, so a sleeping CPU is the honest stand-in), or --busy for a
//      calibrated busy-wait.
//   3. Four timings in the same run, each the slowest rank's mean over --iters iterations:
//        compute     forward + backward only;
//        exchange    every layer submitted and waited, no compute;
//        sequential  backward with each layer's exchange waited right after it (no overlap);
//        overlapped  wait-free backprop: submit after each layer's backward, wait each layer
//                    just before its next forward.
//   4. Prints overlapped / max(compute, exchange) (1.0 = perfect overlap; target <= 1.1) and
//      sequential / overlapped (the speedup over no overlap).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/common/model_shape.h"
#include "bench/common/preamble.h"
#include "collectives/hybrid.h"
#include "engine/engine.h"
#include "runtime/settings.h"
#include "tools/flags.h"

namespace poseidon {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchLayer {
  std::string name;
  size_t elements;
  double fwd_ms;
  double bwd_ms;
};

// AlexNet-like proportions: big early compute with small tensors, big late tensors with
// little compute, about 4.2 M floats (17 MB) in all.
std::vector<BenchLayer> DefaultTable() {
  return {{"conv1", 23232, 1.5, 3.0},   {"conv2", 307200, 2.0, 4.0},
          {"conv3", 663552, 1.5, 3.0},  {"conv4", 884736, 1.5, 3.0},
          {"conv5", 589824, 1.0, 2.0},  {"fc6", 1048576, 0.75, 1.5},
          {"fc7", 524288, 0.5, 1.0},    {"fc8", 40960, 0.25, 0.5},
          {"bias", 9192, 0.05, 0.1}};
}

struct Args {
  int iters = 10;
  int warmup = 2;
  bench::ModelFlags model{"", 0.02, 0};  // no --model: the built-in table
  double compute_ms = 40;
  bool busy = false;
};

Result<Args> ParseArgs(int argc, char** argv, bool* help) {
  Args a;
  cli::Flags flags("poseidon_overlap_bench");
  flags.Int("--iters", &a.iters, 1, 1000000, "N", "timed iterations per mode (default 10)");
  flags.Int("--warmup", &a.warmup, 0, 1000000, "N", "warm-up iterations per mode (default 2)");
  bench::AddModelFlags(flags, &a.model, /*with_batch=*/false);
  flags.Number("--compute-ms", &a.compute_ms, cli::Range{0, 1e6}, "MS",
               "backward ms per iteration of a --model, split by layer size (default 40)");
  flags.Bool("--busy", &a.busy, "busy-wait instead of sleeping for the emulated compute");
  Status st = flags.Parse(argc, argv);
  if (!st.ok()) {
    return InvalidArgument("poseidon_overlap_bench: ", st.message(), "\n", flags.Usage());
  }
  *help = flags.help();
  if (*help) return InvalidArgument(flags.Usage());
  return a;
}

Result<std::vector<BenchLayer>> LoadTable(const Args& a) {
  if (a.model.model.empty()) return DefaultTable();
  PSD_ASSIGN_OR_RETURN(bench::ShapedModel m, bench::MakeShapedModel(a.model));
  std::vector<BenchLayer> out;
  double total = 0;
  for (const bench::ShapedLayer& l : m.layers) {
    const size_t n = l.spec.NumElements();
    out.push_back(BenchLayer{l.spec.name, n, 0, 0});
    total += static_cast<double>(n);
  }
  for (auto& l : out) {
    l.bwd_ms = a.compute_ms * static_cast<double>(l.elements) / total;
    l.fwd_ms = 0.5 * l.bwd_ms;
  }
  return out;
}

// Emulated compute of `ms` milliseconds.
void Compute(double ms, bool busy) {
  if (ms <= 0) return;
  const auto until = Clock::now() + std::chrono::duration<double, std::milli>(ms);
  if (!busy) {
    std::this_thread::sleep_until(until);
    return;
  }
  while (Clock::now() < until) {
  }
}

int Run(int argc, char** argv) {
  auto level = InitMpi(&argc, &argv);
  if (!level.ok()) {
    std::fprintf(stderr, "%s\n", level.status().ToString().c_str());
    return 1;
  }
  int rc = 0;
  {
    auto comm_r = Communicator::Create(MPI_COMM_WORLD);
    bool help = false;
    auto args_r = ParseArgs(argc, argv, &help);
    if (help || !args_r.ok()) {
      // Same argv on every rank: rank 0 speaks for all.
      if (comm_r.ok() && (*comm_r)->rank() == 0) {
        std::fputs(args_r.status().message().c_str(), help ? stdout : stderr);
      }
      MPI_Finalize();
      return help ? 0 : 2;
    }
    Status bad = !comm_r.ok() ? comm_r.status() : Status::Ok();
    auto table_r = bad.ok() ? LoadTable(*args_r) : Result<std::vector<BenchLayer>>(bad);
    if (!table_r.ok()) {
      std::fprintf(stderr, "poseidon_overlap_bench: %s\n",
                   cli::OptionError(table_r.status()).ToString().c_str());
      MPI_Finalize();
      return 2;
    }
    auto comm = *comm_r;
    const Args args = *args_r;
    const std::vector<BenchLayer> table = *table_r;
    const int rank = comm->rank();
    const size_t L = table.size();

    auto hc_r = HybridCollective::Create(comm);
    if (!hc_r.ok()) {
      std::fprintf(stderr, "%s\n", hc_r.status().ToString().c_str());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    auto hc = std::move(*hc_r);
    size_t total = 0;
    for (const auto& l : table) {
      LayerSpec s;
      s.name = l.name;
      s.shape = {l.elements};  // dense: every layer is a dense allreduce here
      total += l.elements;
      Status st = hc->RegisterLayer(s).status();
      if (!st.ok()) {
        std::fprintf(stderr, "%s\n", st.ToString().c_str());
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
    }
    PlannerOptions po;
    po.global_force = StrategyKind::kAllReduce;
    Status st = hc->BuildPlan(32, CostModel::Network(25e-6, 1.25e9), po);
    auto opts_r = EngineOptions::FromSettings();
    if (!st.ok() || !opts_r.ok()) {
      std::fprintf(stderr, "%s\n", (!st.ok() ? st : opts_r.status()).ToString().c_str());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    auto engine_r = Engine::Create(comm, hc.get(), *opts_r);
    if (!engine_r.ok()) {
      std::fprintf(stderr, "%s\n", engine_r.status().ToString().c_str());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    auto engine = std::move(*engine_r);
    double compute_ms = 0;
    for (const auto& l : table) compute_ms += l.fwd_ms + l.bwd_ms;

    if (rank == 0) {
      auto pre =
          bench::Preamble::Gather("poseidon_overlap_bench", "wait-free backprop with the engine");
      pre.SetRun(*comm, comm->host_backend(), MemoryKind::kHost);
      const std::string model_text = args.model.model.empty()
                                         ? "built-in table"
                                         : StrCat(args.model.model, " x", args.model.scale);
      char sizes[128];
      std::snprintf(sizes, sizeof sizes, "%zu floats = %.1f MB of gradient, compute %.2f ms/iter",
                    total, 4.0 * static_cast<double>(total) / 1e6, compute_ms);
      pre.lines.push_back(StrCat("layers ", L, " (", model_text, "), ", sizes, " (",
                                 args.busy ? "busy-wait" : "sleep", ")"));
      pre.lines.push_back(StrCat(
          "compute is emulated by ",
          args.busy ? "busy-waiting (pessimistic: it competes for the cores)" : "sleeping",
          ": on a GPU the device computes while the host thread waits, so the CPU stays free "
          "for communication; the ",
          std::thread::hardware_concurrency(), " hardware threads here are shared by all ranks"));
      pre.lines.push_back(StrCat("engine: fusion ", engine->options().fusion_bytes, " B, chunk ",
                                 engine->options().chunk_bytes, " B, cycle ",
                                 engine->options().cycle_us, " us; iters ", args.iters, " (+",
                                 args.warmup, " warm-up), time = slowest rank's mean"));
      std::fputs(pre.Text().c_str(), stdout);
    }

    std::vector<std::vector<float>> grad(L);
    for (size_t l = 0; l < L; ++l) grad[l].assign(table[l].elements, 1.0f);
    std::vector<HandlePtr> handles(L);
    int64_t step = 0;
    Status failure;
    auto wait = [&](size_t l) {
      if (!handles[l]) return;
      Status s = handles[l]->Wait();
      if (!s.ok() && failure.ok()) failure = s;
      handles[l].reset();
    };
    auto submit = [&](size_t l) {
      handles[l] = engine->Submit(static_cast<int>(l), grad[l].data(), grad[l].size(), step);
    };
    auto forward = [&](bool wait_first) {
      for (size_t l = 0; l < L; ++l) {
        if (wait_first) wait(l);
        Compute(table[l].fwd_ms, args.busy);
      }
    };

    enum Mode { kCompute, kExchange, kSequential, kOverlapped };
    auto iteration = [&](Mode m) {
      switch (m) {
        case kCompute:
          forward(false);
          for (size_t l = L; l-- > 0;) Compute(table[l].bwd_ms, args.busy);
          break;
        case kExchange:
          for (size_t l = L; l-- > 0;) submit(l);
          for (size_t l = 0; l < L; ++l) wait(l);
          break;
        case kSequential:
          forward(false);
          for (size_t l = L; l-- > 0;) {
            Compute(table[l].bwd_ms, args.busy);
            submit(l);
            wait(l);
          }
          break;
        case kOverlapped:
          forward(true);  // layer l's exchange from the last iteration must be done first
          for (size_t l = L; l-- > 0;) {
            Compute(table[l].bwd_ms, args.busy);
            submit(l);
          }
          break;
      }
      ++step;
    };
    auto measure = [&](Mode m) {
      for (int i = 0; i < args.warmup; ++i) iteration(m);
      for (size_t l = 0; l < L; ++l) wait(l);
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = Clock::now();
      for (int i = 0; i < args.iters; ++i) iteration(m);
      for (size_t l = 0; l < L; ++l) wait(l);  // the last iteration's exchanges count too
      double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count() /
                  args.iters;
      double slowest = 0;
      MPI_Allreduce(&ms, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      return slowest;
    };

    const double t_compute = measure(kCompute);
    const double t_exchange = measure(kExchange);
    const double t_seq = measure(kSequential);
    const double t_over = measure(kOverlapped);
    if (!failure.ok()) {
      std::fprintf(stderr, "rank %d: exchange failed: %s\n", rank, failure.ToString().c_str());
      rc = 1;
    }
    if (rank == 0) {
      const double bound = std::max(t_compute, t_exchange);
      std::printf("%-12s %12s\n", "# mode", "ms/iter");
      std::printf("%-12s %12.2f\n", "compute", t_compute);
      std::printf("%-12s %12.2f\n", "exchange", t_exchange);
      std::printf("%-12s %12.2f\n", "sequential", t_seq);
      std::printf("%-12s %12.2f\n", "overlapped", t_over);
      std::printf("overlapped / max(compute, exchange) = %.3f  (1.0 = fully hidden; target <= "
                  "1.1)\n",
                  t_over / bound);
      std::printf("sequential / overlapped = %.3f  (speedup of wait-free backprop over no "
                  "overlap)\n",
                  t_seq / t_over);
      EngineStats s = engine->stats();
      std::printf("# engine rank 0: %lld cycles, %lld fused allreduces (%lld layers), %lld "
                  "chunked layers (%lld chunks), %lld single allreduces\n",
                  static_cast<long long>(s.cycles), static_cast<long long>(s.fused_groups),
                  static_cast<long long>(s.fused_layers),
                  static_cast<long long>(s.chunked_layers), static_cast<long long>(s.chunks),
                  static_cast<long long>(s.direct_layers));
      std::printf("\n");
    }
    Status shut = engine->Shutdown();
    if (!shut.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, shut.ToString().c_str());
      rc = 1;
    }
  }
  MPI_Finalize();
  return rc;
}

}  // namespace
}  // namespace poseidon

int main(int argc, char** argv) { return poseidon::Run(argc, argv); }
