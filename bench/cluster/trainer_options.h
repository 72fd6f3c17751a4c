// poseidon_model_trainer's modes and command line: the four exchange modes and the flags
// (identical on every rank), parsed into Options.
#pragma once

#include <string>
#include <vector>

#include "bench/common/model_shape.h"
#include "runtime/status.h"

namespace poseidon::cluster {

enum class Mode : int { kDense = 0, kDenseOverlap = 1, kHybridOverlap = 2, kHybrid = 3 };
const char* ModeName(Mode m);
// The engine exchanges each layer as soon as its backward is done.
bool Overlaps(Mode m);
// The planner's per-layer choice (else the plan is forced to allreduce).
bool Hybrid(Mode m);

struct Options {
  bench::ModelFlags model;  // --model (default small), --scale, --batch
  long long iters = 5;
  long long warmup = 1;
  double compute_scale = 1.0;
  std::string gpu = "titanx";
  double gpu_tflops = 0;  // 0: from --gpu
  std::vector<Mode> modes = {Mode::kDense, Mode::kDenseOverlap, Mode::kHybridOverlap};
  std::vector<int> predict;
  bool print_plan = false;
  double link_gbit = 0;  // rate of the links this run crosses, for the preamble (0: unknown)
  std::string network = "shared memory (one host)";
  long long seed = 1;
};

// Parses argv; *usage gets the usage text, and *help whether it was asked for.
Result<Options> ParseArgs(int argc, char** argv, std::string* usage, bool* help);

}  // namespace poseidon::cluster
