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

void Usage() {
  std::fprintf(stderr,
               "usage: poseidon_plan [--model vgg19|vgg19-22k|resnet152|inception-v3|all]\n"
               "  [--np P[,P...]] [--batch K] [--latency-us 25] [--bandwidth-gbit 10]\n"
               "  [--gemm-gflops 1000] [--topk-gbytes 100] [--optimizer-gbytes 200]\n"
               "  [--optimizer none|sgd|adam] [--sparse] [--summary] [--measured]\n"
               "--sparse lets topk compete on every non-FC layer; --measured (under mpirun)\n"
               "plans for this communicator with the probed (or cached) cost model.\n");
}

Result<Args> ParseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> Result<std::string> {
      if (i + 1 >= argc) return InvalidArgument("poseidon_plan: ", k, " needs a value");
      return std::string(argv[++i]);
    };
    auto number = [&](double* out) -> Status {
      PSD_ASSIGN_OR_RETURN(std::string v, next());
      char* end = nullptr;
      *out = std::strtod(v.c_str(), &end);
      PSD_REQUIRE_ARG(end != v.c_str() && *end == '\0' && *out > 0, "poseidon_plan: ", k, " '", v,
                      "' is not a positive number");
      return Status::Ok();
    };
    if (k == "--model") {
      PSD_ASSIGN_OR_RETURN(std::string v, next());
      a.models = v == "all" ? ModelNames() : std::vector<std::string>{v};
    } else if (k == "--np") {
      PSD_ASSIGN_OR_RETURN(std::string v, next());
      a.nps.clear();
      size_t pos = 0;
      while (pos <= v.size()) {
        size_t c = v.find(',', pos);
        if (c == std::string::npos) c = v.size();
        int p = std::atoi(v.substr(pos, c - pos).c_str());
        PSD_REQUIRE_ARG(p >= 1, "poseidon_plan: --np '", v, "' holds ", p,
                        "; expected world sizes >= 1");
        a.nps.push_back(p);
        pos = c + 1;
      }
    } else if (k == "--batch") {
      double b = 0;
      PSD_CHECK(number(&b));
      a.batch = static_cast<long long>(b);
    } else if (k == "--latency-us") {
      PSD_ASSIGN_OR_RETURN(std::string v, next());
      a.latency_us = std::atof(v.c_str());
      PSD_REQUIRE_ARG(a.latency_us >= 0, "poseidon_plan: --latency-us ", v, " is negative");
    } else if (k == "--bandwidth-gbit") {
      PSD_CHECK(number(&a.bandwidth_gbit));
    } else if (k == "--gemm-gflops") {
      PSD_CHECK(number(&a.gemm_gflops));
    } else if (k == "--topk-gbytes") {
      PSD_CHECK(number(&a.topk_gbytes));
    } else if (k == "--optimizer-gbytes") {
      PSD_CHECK(number(&a.optimizer_gbytes));
    } else if (k == "--optimizer") {
      PSD_ASSIGN_OR_RETURN(a.optimizer, next());
      PSD_REQUIRE_ARG(a.optimizer == "none" || a.optimizer == "sgd" || a.optimizer == "adam",
                      "poseidon_plan: --optimizer '", a.optimizer, "'; expected none, sgd or adam");
    } else if (k == "--sparse") {
      a.sparse = true;
    } else if (k == "--summary") {
      a.summary = true;
    } else if (k == "--measured") {
      a.measured = true;
    } else {
      return InvalidArgument("poseidon_plan: unknown argument '", k, "'");
    }
  }
  return a;
}

int Run(int argc, char** argv) {
  auto args = ParseArgs(argc, argv);
  if (!args.ok()) {
    std::fprintf(stderr, "%s\n", args.status().message().c_str());
    Usage();
    return 2;
  }
  const Args& a = *args;
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
