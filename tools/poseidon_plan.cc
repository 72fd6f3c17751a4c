// poseidon_plan: prints Poseidon's per-layer plan for a known model at any world size, from a
// given network (latency, bandwidth, compute rates) or from the cost model measured on the
// communicator it runs on (under mpirun, --measured).
//
//   poseidon_plan --model vgg19 --np 8 --latency-us 25 --bandwidth-gbit 10
//   poseidon_plan --model vgg19-22k --np 1,2,4,8,16,32,64 --summary
//   mpirun -np 4 poseidon_plan --model resnet152 --measured
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "collectives/cost_model.h"
#include "collectives/planner.h"
#include "runtime/communicator.h"
#include "tools/flags.h"
#include "tools/models/models.h"

namespace poseidon {
namespace {

struct Args {
  std::vector<std::string> models = {"vgg19"};
  std::vector<int> nps = {8};
  long long batch = -1;  // -1: the model's
  double latency_us = 25;
  double bandwidth_gbit = 10;
  double gemm_gflops = 1000;  // a GPU's GEMM; --gemm-gflops for a CPU
  double topk_gbytes = 100;   // GPU-class selection throughput
  double optimizer_gbytes = 200;
  std::string optimizer = "sgd";
  bool sparse = false;
  bool summary = false;
  bool measured = false;
};

// Declares every flag of poseidon_plan on `flags`, the values landing in `a`.
void AddFlags(cli::Flags& flags, Args* a) {
  flags.Custom("--model", "NAME",
               "vgg19 (default), vgg19-22k, resnet152, inception-v3, or all of them",
               [a](const std::string&, const std::string& v) -> Status {
                 a->models = v == "all" ? ModelNames() : std::vector<std::string>{v};
                 return Status::Ok();
               });
  flags.Custom("--np", "P[,P...]", "world sizes to plan for (default 8)",
               [a](const std::string& flag, const std::string& v) -> Status {
                 PSD_ASSIGN_OR_RETURN(std::vector<std::string> items, cli::SplitList(flag, v));
                 a->nps.clear();
                 for (const std::string& item : items) {
                   PSD_ASSIGN_OR_RETURN(long long p, cli::ParseInteger(flag, item, 1, 1 << 24));
                   a->nps.push_back(static_cast<int>(p));
                 }
                 return Status::Ok();
               });
  flags.Int("--batch", &a->batch, 1, 1LL << 30, "K", "samples per rank (default: the model's)");
  flags.Number("--latency-us", &a->latency_us, cli::Range{0, 1e9}, "US",
               "network latency in microseconds (default 25)");
  flags.Number("--bandwidth-gbit", &a->bandwidth_gbit, cli::Range{0, 1e9, true, false}, "GBIT",
               "network bandwidth in Gbit/s (default 10)");
  flags.Number("--gemm-gflops", &a->gemm_gflops, cli::Range{0, 1e9, true, false}, "GF",
               "GEMM rate in GFLOP/s (default 1000, a GPU's; lower for a CPU)");
  flags.Number("--topk-gbytes", &a->topk_gbytes, cli::Range{0, 1e9, true, false}, "GB",
               "top-k selection throughput in GB/s (default 100)");
  flags.Number("--optimizer-gbytes", &a->optimizer_gbytes, cli::Range{0, 1e9, true, false}, "GB",
               "optimizer step throughput in GB/s (default 200)");
  flags.Custom("--optimizer", "none|sgd|adam", "the optimizer every layer gets (default sgd)",
               [a](const std::string& flag, const std::string& v) -> Status {
                 PSD_REQUIRE_ARG(v == "none" || v == "sgd" || v == "adam", "option ", flag, ": '",
                                 v, "' is not an optimizer; expected none, sgd or adam");
                 a->optimizer = v;
                 return Status::Ok();
               });
  flags.Bool("--sparse", &a->sparse, "lets topk compete on every non-FC layer");
  flags.Bool("--summary", &a->summary, "one line per world size instead of the plan tables");
  flags.Bool("--measured", &a->measured,
             "under mpirun: plans with this communicator's probed (or cached) cost model");
}

int Run(int argc, char** argv) {
  Args a;
  cli::Flags flags("poseidon_plan");
  AddFlags(flags, &a);
  Status parsed = flags.Parse(argc, argv);
  if (!parsed.ok() || flags.help()) {
    if (!parsed.ok()) std::fprintf(stderr, "poseidon_plan: %s\n", parsed.message().c_str());
    std::fputs(flags.Usage().c_str(), parsed.ok() ? stdout : stderr);
    return parsed.ok() ? 0 : 2;
  }
  CostModel model = CostModel::Network(a.latency_us * 1e-6, a.bandwidth_gbit * 1e9 / 8);
  model.gemm_flops = a.gemm_gflops * 1e9;
  model.topk_bytes_per_s = a.topk_gbytes * 1e9;
  model.scatter_bytes_per_s = a.topk_gbytes * 1e9;
  model.optimizer_bytes_per_s = a.optimizer_gbytes * 1e9;
  model.source =
      StrCat("network(", a.latency_us, "us,", a.bandwidth_gbit, "Gbit/s,", a.gemm_gflops, "GF/s)");
  std::vector<int> nps = a.nps;
  std::shared_ptr<Communicator> comm;
  bool print = true;
  if (a.measured) {
    auto lvl = InitMpi(&argc, &argv);
    if (!lvl.ok()) {
      std::fprintf(stderr, "%s\n", lvl.status().ToString().c_str());
      return 1;
    }
    auto c = Communicator::Create(MPI_COMM_WORLD);
    if (!c.ok()) {
      std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
      return 1;
    }
    comm = *c;
    auto m = LoadOrMeasureCostModel(*comm, CpuKernels());
    if (!m.ok()) {
      std::fprintf(stderr, "%s\n", m.status().ToString().c_str());
      return 1;
    }
    model = *m;
    nps = {comm->size()};
    print = comm->rank() == 0;
    if (print) std::printf("# cost model: %s\n", model.Summary().c_str());
  }
  auto opts = PlannerOptions::FromSettings();
  int rc = 0;
  if (!opts.ok()) {
    std::fprintf(stderr, "%s\n", opts.status().message().c_str());
    rc = 2;
  }
  for (const std::string& name : a.models) {
    if (rc != 0) break;
    auto table = ModelByName(name, a.sparse);
    if (!table.ok()) {
      std::fprintf(stderr, "%s\n", table.status().message().c_str());
      rc = 2;
      break;
    }
    std::vector<LayerSpec> layers;
    for (LayerSpec l : table->layers) {
      if (a.optimizer == "sgd") l.optimizer = OptimizerSpec::Sgd(SgdParams{});
      if (a.optimizer == "adam") l.optimizer = OptimizerSpec::Adam(AdamParams{});
      auto r = ResolveLayerSpec(l);
      if (!r.ok()) {
        std::fprintf(stderr, "%s\n", r.status().message().c_str());
        return 2;
      }
      layers.push_back(*r);
    }
    size_t batch = a.batch > 0 ? static_cast<size_t>(a.batch) : table->batch;
    if (print && a.summary) {
      std::printf("# %s: %zu layers, %zu parameters, K=%zu, %s\n", name.c_str(), layers.size(),
                  table->NumParameters(), batch, model.source.c_str());
      std::printf("%5s %9s %5s %5s %5s %12s %12s %8s %14s %14s %8s\n", "P", "allreduce", "ps",
                  "sfb", "topk", "plan_ms", "dense_ms", "speedup", "plan_MB", "dense_MB",
                  "bytes_x");
    }
    for (int p : nps) {
      auto plan = MakePlan(layers, batch, p, model, *opts);
      if (!plan.ok()) {
        std::fprintf(stderr, "%s\n", plan.status().message().c_str());
        rc = 1;
        break;
      }
      if (!print) continue;
      if (!a.summary) {
        std::printf("# model %s, %zu parameters\n%s", name.c_str(), table->NumParameters(),
                    plan->ToString().c_str());
        continue;
      }
      int count[kNumStrategies] = {0, 0, 0, 0};
      for (const PlanEntry& e : plan->entries) ++count[static_cast<int>(e.choice)];
      double t = plan->PredictedTime(), td = plan->DenseAllReduceTime();
      double b = plan->PredictedBytes(), bd = plan->DenseAllReduceBytes();
      std::printf("%5d %9d %5d %5d %5d %12.3f %12.3f %8.2f %14.2f %14.2f %8.2f\n", p, count[0],
                  count[1], count[2], count[3], t * 1e3, td * 1e3, t > 0 ? td / t : 1.0, b / 1e6,
                  bd / 1e6, b > 0 ? bd / b : 1.0);
    }
  }
  if (comm) {
    comm.reset();
    MPI_Finalize();
  }
  return rc;
}

}  // namespace
}  // namespace poseidon

int main(int argc, char** argv) { return poseidon::Run(argc, argv); }
