#include "examples/mlp/options.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "collectives/layer.h"

namespace poseidon::mlp {
namespace {

Result<int64_t> ParseInt(const std::string& flag, const std::string& text, int64_t min,
                         int64_t max) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  PSD_REQUIRE_ARG(!text.empty() && *end == '\0' && errno == 0 && v >= min && v <= max, flag,
                  ": got '", text, "'; expected an integer in [", min, ", ", max, "]");
  return static_cast<int64_t>(v);
}

Result<double> ParseDouble(const std::string& flag, const std::string& text, double min, double max,
                           bool max_inclusive) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  const bool in_range = v >= min && (max_inclusive ? v <= max : v < max);
  PSD_REQUIRE_ARG(!text.empty() && *end == '\0' && errno == 0 && std::isfinite(v) && in_range, flag,
                  ": got '", text, "'; expected a number in [", min, ", ", max,
                  max_inclusive ? "]" : ")");
  return v;
}

}  // namespace

Result<std::vector<int>> ParseWidths(const std::string& text) {
  std::vector<int> widths;
  if (text.empty()) return widths;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string part =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    Result<int64_t> w = ParseInt("--hidden", part, 1, 1 << 16);
    PSD_REQUIRE_ARG(w.ok(), "--hidden: got '", text, "'; width '", part,
                    "' is not an integer in [1, 65536] (expected e.g. 128,64)");
    widths.push_back(static_cast<int>(*w));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return widths;
}

Result<TrainerOptions> ParseTrainerOptions(const std::vector<std::string>& args) {
  TrainerOptions o;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i];
    std::string value;
    bool has_value = false;
    const size_t eq = flag.find('=');
    if (flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      has_value = true;
    }
    if (flag == "--help" || flag == "-h") {
      o.help = true;
      continue;
    }
    struct Switch {
      const char* name;
      bool* target;
      bool value;
    };
    const Switch switches[] = {{"--check-loss-falls", &o.check_loss_falls, true},
                               {"--print-plan", &o.print_plan, true},
                               {"--no-print-plan", &o.print_plan, false},
                               {"--no-engine", &o.no_engine, true},
                               {"--dense-baseline", &o.dense_baseline, true},
                               {"--compare-to-dense", &o.compare_to_dense, true}};
    bool is_switch = false;
    for (const Switch& sw : switches) {
      if (flag != sw.name) continue;
      PSD_REQUIRE_ARG(!has_value, flag, ": takes no value (got '", value, "')");
      *sw.target = sw.value;
      is_switch = true;
    }
    if (is_switch) continue;
    static const char* const kValued[] = {
        "--iters",         "--batch",        "--lr",
        "--momentum",      "--hidden",       "--seed",
        "--log-every",     "--samples",      "--test-samples",
        "--min-accuracy",  "--corrupt-rank", "--strategy",
        "--density",       "--warmup-steps", "--compare-tolerance",
        "--stop-rank",     "--stop-at-iter", "--sleep-rank",
        "--sleep-at-iter", "--sleep-s"};
    bool known = false;
    for (const char* k : kValued) known = known || flag == k;
    PSD_REQUIRE_ARG(known, "poseidon_mlp: unknown argument '", args[i], "'; see --help");
    if (!has_value) {
      PSD_REQUIRE_ARG(i + 1 < args.size(), flag, ": missing value; see --help");
      value = args[++i];
    }
    if (flag == "--iters") {
      PSD_ASSIGN_OR_RETURN(o.iters, ParseInt(flag, value, 1, int64_t{1} << 40));
    } else if (flag == "--batch") {
      PSD_ASSIGN_OR_RETURN(int64_t b, ParseInt(flag, value, 1, 1 << 20));
      o.batch = static_cast<int>(b);
    } else if (flag == "--lr") {
      PSD_ASSIGN_OR_RETURN(o.lr, ParseDouble(flag, value, 1e-12, 100.0, true));
    } else if (flag == "--momentum") {
      PSD_ASSIGN_OR_RETURN(o.momentum, ParseDouble(flag, value, 0.0, 1.0, false));
    } else if (flag == "--hidden") {
      PSD_ASSIGN_OR_RETURN(o.hidden, ParseWidths(value));
    } else if (flag == "--seed") {
      PSD_ASSIGN_OR_RETURN(int64_t s, ParseInt(flag, value, 0, INT64_MAX));
      o.seed = static_cast<uint64_t>(s);
    } else if (flag == "--log-every") {
      PSD_ASSIGN_OR_RETURN(o.log_every, ParseInt(flag, value, 0, INT64_MAX));
    } else if (flag == "--samples") {
      PSD_ASSIGN_OR_RETURN(o.samples, ParseInt(flag, value, 1, int64_t{1} << 32));
    } else if (flag == "--test-samples") {
      PSD_ASSIGN_OR_RETURN(o.test_samples, ParseInt(flag, value, 1, int64_t{1} << 32));
    } else if (flag == "--min-accuracy") {
      PSD_ASSIGN_OR_RETURN(o.min_accuracy, ParseDouble(flag, value, 0.0, 1.0, true));
    } else if (flag == "--corrupt-rank") {
      PSD_ASSIGN_OR_RETURN(int64_t r, ParseInt(flag, value, 0, 1 << 30));
      o.corrupt_rank = static_cast<int>(r);
    } else if (flag == "--stop-rank" || flag == "--sleep-rank") {
      PSD_ASSIGN_OR_RETURN(int64_t r, ParseInt(flag, value, 0, 1 << 30));
      (flag == "--stop-rank" ? o.stop_rank : o.sleep_rank) = static_cast<int>(r);
    } else if (flag == "--stop-at-iter" || flag == "--sleep-at-iter") {
      PSD_ASSIGN_OR_RETURN(int64_t n, ParseInt(flag, value, 1, int64_t{1} << 40));
      (flag == "--stop-at-iter" ? o.stop_at_iter : o.sleep_at_iter) = n;
    } else if (flag == "--sleep-s") {
      PSD_ASSIGN_OR_RETURN(double s, ParseDouble(flag, value, 0.0, 86400.0, true));
      o.sleep_s = s;
    } else if (flag == "--strategy") {
      PSD_REQUIRE_ARG(value == "auto" || ParseStrategy(value).ok(), "--strategy: got '", value,
                      "'; expected auto, allreduce, ps, sfb or topk");
      o.strategy = value;
    } else if (flag == "--density") {
      PSD_ASSIGN_OR_RETURN(double d, ParseDouble(flag, value, 0.0, 1.0, true));
      PSD_REQUIRE_ARG(d > 0, "--density: got '", value, "'; expected a fraction in (0, 1]");
      o.density = d;
    } else if (flag == "--warmup-steps") {
      PSD_ASSIGN_OR_RETURN(int64_t w, ParseInt(flag, value, 0, int64_t{1} << 40));
      o.warmup_steps = w;
    } else if (flag == "--compare-tolerance") {
      PSD_ASSIGN_OR_RETURN(o.compare_tolerance, ParseDouble(flag, value, 0.0, 1.0, true));
    }
  }
  // Combinations that would silently do nothing are errors too.
  const bool topk = o.strategy == "topk";
  PSD_REQUIRE_ARG(topk || !o.density.has_value(), "--density: given with --strategy ", o.strategy,
                  "; expected --strategy topk (density applies to topk only)");
  PSD_REQUIRE_ARG(topk || !o.warmup_steps.has_value(), "--warmup-steps: given with --strategy ",
                  o.strategy, "; expected --strategy topk (warm-up applies to topk only)");
  // The fault drills: every flag of a pair given, at an iteration the run reaches.
  PSD_REQUIRE_ARG((o.stop_rank >= 0) == o.stop_at_iter.has_value(),
                  "--stop-rank and --stop-at-iter: got only ",
                  o.stop_rank >= 0 ? "--stop-rank" : "--stop-at-iter", "; expected both");
  PSD_REQUIRE_ARG(!o.stop_at_iter || *o.stop_at_iter <= o.iters, "--stop-at-iter: got ",
                  o.stop_at_iter.value_or(0), " with --iters ", o.iters,
                  "; expected an iteration in [1, --iters]");
  PSD_REQUIRE_ARG((o.sleep_rank >= 0) == o.sleep_at_iter.has_value() &&
                      o.sleep_at_iter.has_value() == o.sleep_s.has_value(),
                  "--sleep-rank, --sleep-at-iter and --sleep-s: expected all three or none (got ",
                  o.sleep_rank >= 0 ? "--sleep-rank " : "",
                  o.sleep_at_iter ? "--sleep-at-iter " : "", o.sleep_s ? "--sleep-s" : "", ")");
  PSD_REQUIRE_ARG(!o.sleep_at_iter || *o.sleep_at_iter <= o.iters, "--sleep-at-iter: got ",
                  o.sleep_at_iter.value_or(0), " with --iters ", o.iters,
                  "; expected an iteration in [1, --iters]");
  PSD_REQUIRE_ARG(
      !o.dense_baseline || (o.strategy == "auto" && !o.no_engine && !o.compare_to_dense),
      "--dense-baseline: runs the single fused allreduce alone; expected no "
      "--strategy, --no-engine or --compare-to-dense with it");
  return o;
}

std::string TrainerHelp() {
  const TrainerOptions d;
  std::string hidden;
  for (size_t i = 0; i < d.hidden.size(); ++i) {
    hidden += (i ? "," : "") + std::to_string(d.hidden[i]);
  }
  // One flag per line reads better than the formatter's packing.
  // clang-format off
  return StrCat(
      "poseidon_mlp: data-parallel training of a multi-layer perceptron with Poseidon.\n"
      "Run under mpirun: every rank trains on its shard of the data; each parameter tensor is a\n"
      "layer of Poseidon's hybrid collective (weights fully connected with their sufficient\n"
      "factors, biases dense), planned per layer (allreduce, ps, sfb, topk), with SGD momentum\n"
      "applied by Poseidon. The engine exchanges each layer as soon as its backward step is done\n"
      "and the trainer waits for it only before that layer's next forward (wait-free backprop).\n"
      "\n"
      "Data: a synthetic, seeded classification task, identical on every rank: 10 classes,\n"
      "each a mixture of 3 Gaussian clusters in a 16-d latent space, passed through a fixed\n"
      "random tanh map to 64 features. The clusters overlap and 2% of the labels are replaced\n"
      "by another class, so no model passes 98%; a linear model (--hidden '') reaches about\n"
      "68%, the default MLP about 91%. Rank r trains on samples r, r+P, r+2P, ...; a separate\n"
      "held-out split measures test accuracy.\n"
      "\n"
      "Model: 64 -> hidden... -> 10, fully connected, ReLU, softmax cross-entropy,\n"
      "SGD with momentum, He-initialised from the seed.\n"
      "\n"
      "Usage: mpirun -np <P> poseidon_mlp [flags]\n"
      "  --iters N            SGD steps (default ", d.iters, ")\n"
      "  --batch K            per-rank batch size; global batch K*P (default ", d.batch, ")\n"
      "  --lr X               learning rate (default ", d.lr, ")\n"
      "  --momentum X         momentum in [0, 1) (default ", d.momentum, ")\n"
      "  --hidden W1,W2,...   hidden layer widths, '' for none (default ", hidden, ")\n"
      "  --seed S             seed for data, weights and shuffling (default ", d.seed, ")\n"
      "  --log-every N        progress line every N steps, 0 for none (default ", d.log_every,
      ")\n"
      "  --samples N          training samples in total, sharded across ranks (default ",
      d.samples, ")\n"
      "  --test-samples N     held-out samples (default ", d.test_samples, ")\n"
      "  --check-loss-falls   exit 1 unless the held-out loss fell to below half its\n"
      "                       initial value and test accuracy >= --min-accuracy\n"
      "  --min-accuracy X     accuracy threshold in [0, 1] for --check-loss-falls (default ",
      d.min_accuracy, ")\n"
      "  --corrupt-rank R     testing aid: rank R changes one weight before the final\n"
      "                       identity check, which must then fail and name rank R\n"
      "  --stop-rank R        testing aid (liveness drill): rank R raises SIGSTOP on itself\n"
      "                       at iteration --stop-at-iter, mid-step (right after the engine\n"
      "                       took its first gradient of that step; with --no-engine or\n"
      "                       --dense-baseline after its backward pass, before the exchange).\n"
      "                       The whole process freezes, liveness thread included: the other\n"
      "                       ranks must declare it lost (POSEIDON_PEER_TIMEOUT_S) and end the\n"
      "                       job. It prints its stop time (Unix seconds) on stderr first.\n"
      "                       Peers are watched by the engine only: with --no-engine or\n"
      "                       --dense-baseline nobody notices, and the job hangs\n"
      "  --stop-at-iter N     the iteration (1-based, <= --iters) of --stop-rank\n"
      "  --sleep-rank R       testing aid (slow-peer drill): rank R's training thread sleeps\n"
      "                       --sleep-s seconds at iteration --sleep-at-iter, at the same\n"
      "                       point of the step as --stop-rank; its engine and liveness\n"
      "                       threads run on, so it is slow, not lost\n"
      "  --sleep-at-iter N    the iteration (1-based, <= --iters) of --sleep-rank\n"
      "  --sleep-s S          the seconds --sleep-rank sleeps, in [0, 86400]\n"
      "  --strategy S         auto (the planner picks per layer), or force allreduce, ps, sfb\n"
      "                       or topk on every layer where it applies (default auto; with\n"
      "                       topk the weights are registered as sparse-tolerant)\n"
      "  --density D          topk: fraction of each weight sent per step, in (0, 1]\n"
      "                       (default POSEIDON_TOPK_DENSITY)\n"
      "  --warmup-steps N     topk: dense steps before compression starts\n"
      "                       (default POSEIDON_TOPK_WARMUP_STEPS)\n"
      "  --print-plan         rank 0 prints the per-layer plan at start (default on)\n"
      "  --no-print-plan      do not print it\n"
      "  --no-engine          exchange synchronously through HybridCollective::Exchange\n"
      "                       after the backward pass instead of through the engine\n"
      "  --dense-baseline     the plain path: one fused dense allreduce per step and the\n"
      "                       trainer's own SGD (the reference the strategies must match)\n"
      "  --compare-to-dense   first train the dense baseline from the same seed, then the\n"
      "                       chosen exchange; exit 1 unless their held-out accuracies\n"
      "                       differ by at most --compare-tolerance\n"
      "  --compare-tolerance X  accuracy gap allowed, in [0, 1] (default ", d.compare_tolerance,
      ")\n"
      "  --help               this text\n");
  // clang-format on
}

}  // namespace poseidon::mlp
