// poseidon_model_trainer's command line (trainer_options.h): the mode names, the modelled
// GPUs and the flag parser.
#include "bench/cluster/trainer_options.h"

#include <algorithm>

#include "tools/flags.h"

namespace poseidon::cluster {

const char* ModeName(Mode m) {
  switch (m) {
    case Mode::kDense:
      return "dense";
    case Mode::kDenseOverlap:
      return "dense-overlap";
    case Mode::kHybridOverlap:
      return "hybrid-overlap";
    case Mode::kHybrid:
      return "hybrid";
  }
  return "?";
}
bool Overlaps(Mode m) { return m == Mode::kDenseOverlap || m == Mode::kHybridOverlap; }
bool Hybrid(Mode m) { return m == Mode::kHybridOverlap || m == Mode::kHybrid; }

namespace {

// Effective FLOP rates of the papers' GPUs: half of the fp32 peak (Titan X Maxwell 6.1
// TFLOP/s, K40 4.29 TFLOP/s), what Caffe-era convolution kernels reached. An assumption, stated
// in the output; --gpu-tflops overrides it.
struct Gpu {
  const char* name;
  double tflops;
};
constexpr Gpu kGpus[] = {{"titanx", 3.05}, {"k40", 2.15}};

}  // namespace

// Parses argv; *usage gets the usage text, and *help whether it was asked for.
Result<Options> ParseArgs(int argc, char** argv, std::string* usage, bool* help) {
  Options o;
  cli::Flags flags("poseidon_model_trainer");
  bench::AddModelFlags(flags, &o.model);
  flags.Int("--iters", &o.iters, 1, 1000000000, "N", "timed iterations per mode (default 5)");
  flags.Int("--warmup", &o.warmup, 0, 1000000000, "N", "warm-up iterations per mode (default 1)");
  flags.Number("--compute-scale", &o.compute_scale, cli::Range{0, 1e6}, "C",
               "emulated compute = FLOPs / GPU rate x C x S (default 1; 0: no compute)");
  flags.Custom("--gpu", "titanx|k40", "the modelled GPU (default titanx)",
               [&o](const std::string& flag, const std::string& v) -> Status {
                 for (const Gpu& g : kGpus) {
                   if (v == g.name) {
                     o.gpu = v;
                     return Status::Ok();
                   }
                 }
                 return InvalidArgument("option ", flag, ": '", v,
                                        "' is unknown; expected titanx or k40 (or give "
                                        "--gpu-tflops)");
               });
  flags.Number("--gpu-tflops", &o.gpu_tflops, cli::Range{1e-3, 1e4}, "T",
               "effective TFLOP/s of the modelled GPU (overrides --gpu)");
  flags.Custom(
      "--modes", "M,M,...",
      "dense, dense-overlap, hybrid-overlap, hybrid (default the first three)",
      [&o](const std::string& flag, const std::string& v) -> Status {
        PSD_ASSIGN_OR_RETURN(std::vector<std::string> items, cli::SplitList(flag, v));
        o.modes.clear();
        for (const std::string& item : items) {
          bool found = false;
          for (Mode m : {Mode::kDense, Mode::kDenseOverlap, Mode::kHybridOverlap, Mode::kHybrid}) {
            if (item != ModeName(m)) continue;
            PSD_REQUIRE_ARG(std::find(o.modes.begin(), o.modes.end(), m) == o.modes.end(),
                            "option ", flag, ": '", v, "' names ", item, " twice");
            o.modes.push_back(m);
            found = true;
          }
          PSD_REQUIRE_ARG(found, "option ", flag, ": '", v, "' holds '", item,
                          "'; expected dense, dense-overlap, hybrid-overlap or hybrid");
        }
        return Status::Ok();
      });
  flags.Custom("--predict", "P,P,...",
               "also print the planner's prediction for the full-size model at these P",
               [&o](const std::string& flag, const std::string& v) -> Status {
                 PSD_ASSIGN_OR_RETURN(std::vector<std::string> items, cli::SplitList(flag, v));
                 o.predict.clear();
                 for (const std::string& item : items) {
                   PSD_ASSIGN_OR_RETURN(long long p, cli::ParseInteger(flag, item, 1, 1 << 20));
                   o.predict.push_back(static_cast<int>(p));
                 }
                 return Status::Ok();
               });
  flags.Bool("--print-plan", &o.print_plan, "print each mode's plan and the full-size plan");
  flags.Number("--link-gbit", &o.link_gbit, cli::Range{1e-3, 1e4}, "G",
               "rate of the links this run crosses, for the preamble");
  flags.Text("--network", &o.network, "TEXT", "what the ranks talk over, for the preamble");
  flags.Int("--seed", &o.seed, 0, 1000000000, "N", "seed of the gradients (default 1)");
  Status st = flags.Parse(argc, argv);
  *usage = StrCat(flags.Usage(),
                  "Compute is emulated with sleeps (FLOPs / GPU rate x compute-scale x S);\n"
                  "the gradient exchange is real.\n");
  *help = flags.help();
  if (!st.ok()) return InvalidArgument("poseidon_model_trainer: ", st.message());
  if (o.gpu_tflops == 0) {
    for (const Gpu& g : kGpus) {
      if (o.gpu == g.name) o.gpu_tflops = g.tflops;
    }
  } else {
    o.gpu = "custom";
  }
  return o;
}

}  // namespace poseidon::cluster
