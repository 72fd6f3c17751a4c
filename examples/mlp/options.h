// Command-line options of the example trainer (poseidon_mlp) and their parser.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/status.h"

namespace poseidon::mlp {

struct TrainerOptions {
  int64_t iters = 3000;  // SGD steps (every rank takes the same number)
  int batch = 32;        // per-rank batch K; the global batch is K * P
  double lr = 0.05;
  double momentum = 0.9;
  std::vector<int> hidden = {128, 64};
  uint64_t seed = 1;             // data set, initial weights and shuffling
  int64_t log_every = 500;       // 0: no progress lines
  int64_t samples = 40000;       // training samples in total, sharded across ranks
  int64_t test_samples = 10000;  // held-out samples, never trained on
  bool check_loss_falls = false;
  double min_accuracy = 0.0;  // with --check-loss-falls: required test accuracy (0..1)
  int corrupt_rank = -1;      // testing aid: this rank perturbs one weight before the check
  // Testing aids for the liveness drills (a frozen peer, a slow peer), mid-step: at iteration
  // stop_at_iter (1-based) rank stop_rank raises SIGSTOP on itself (the whole process freezes,
  // its liveness thread too); at sleep_at_iter rank sleep_rank's training thread sleeps
  // sleep_s seconds while its engine and liveness threads run on.
  int stop_rank = -1;
  std::optional<int64_t> stop_at_iter;
  int sleep_rank = -1;
  std::optional<int64_t> sleep_at_iter;
  std::optional<double> sleep_s;

  // The exchange. Default: every tensor through Poseidon's hybrid collective, driven by the
  // engine as the backward pass produces each layer (wait-free backprop).
  std::string strategy = "auto";  // auto, allreduce, ps, sfb or topk (forced where it applies)
  std::optional<double> density;  // topk: fraction sent per step (unset: POSEIDON_TOPK_DENSITY)
  std::optional<int64_t> warmup_steps;  // topk: dense steps first (unset: the setting)
  bool print_plan = true;               // rank 0 prints the plan at start
  bool no_engine = false;               // HybridCollective::Exchange after the backward pass
  bool dense_baseline = false;          // the old path: one fused allreduce, trainer's SGD
  bool compare_to_dense = false;        // also run the dense baseline first and compare accuracies
  double compare_tolerance = 0.005;     // --compare-to-dense: allowed accuracy gap (0.005 = 0.5 pt)
  bool help = false;
};

// Parses argv[1..argc) ("--flag value" or "--flag=value"). Unknown flags, missing values and
// out-of-range values are errors that name the flag, the value and what was expected.
Result<TrainerOptions> ParseTrainerOptions(const std::vector<std::string>& args);

// Parses "128,64" into {128, 64}; every width >= 1. An empty string means no hidden layer.
Result<std::vector<int>> ParseWidths(const std::string& text);

// The --help text.
std::string TrainerHelp();

}  // namespace poseidon::mlp
