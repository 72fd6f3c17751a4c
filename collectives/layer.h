// Layers and strategies: the vocabulary the planner, the strategies and the engine share.
//
// A layer is one parameter tensor whose gradient Poseidon exchanges every step. Its kind says
// which exchanges can apply to it:
//   kDense           conv or any other tensor: allreduce, ps (with an optimizer)
//   kFullyConnected  an M x N weight whose gradient is U^T V for sufficient factors U (K x M,
//                    output-gradient rows) and V (K x N, input rows): adds sfb
//   kSparse          a tensor that tolerates sparsified updates (the user says so): adds topk
//
// Semantics that make every strategy interchangeable:
//  - Without an optimizer, Exchange returns the gradient averaged over ranks in the gradient
//    buffer; ps is not a candidate then (it exists to update parameters on a shard owner).
//  - With an optimizer, Exchange applies the optimizer step to the parameters on every rank,
//    whatever the strategy: allreduce / sfb / topk apply it on every rank to the full tensor
//    from the averaged gradient; ps applies it on the shard owner only (optimizer state lives
//    there, 1/P of the memory) and allgathers the updated parameters. The gradient buffer is
//    scratch afterwards.
//  - float32 is the only dtype: the kernels' GEMM, top-k and optimizer steps are float32.
//    Other dtypes are rejected with a clear error at RegisterLayer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "runtime/dtype.h"
#include "runtime/status.h"

namespace poseidon {

enum class LayerKind : int { kDense = 0, kFullyConnected = 1, kSparse = 2 };
// "dense", "fc", "sparse".
const char* LayerKindName(LayerKind kind);
// Accepts the names above and "fully_connected".
Result<LayerKind> ParseLayerKind(const std::string& name);

// Order matters only for printing (plan columns) and for breaking exact cost ties (see
// planner.h); never renumber, the C ABI may carry these numbers.
enum class StrategyKind : int { kAllReduce = 0, kPs = 1, kSfb = 2, kTopk = 3 };
inline constexpr int kNumStrategies = 4;
inline constexpr StrategyKind kAllStrategies[kNumStrategies] = {
    StrategyKind::kAllReduce, StrategyKind::kPs, StrategyKind::kSfb, StrategyKind::kTopk};
// "allreduce", "ps", "sfb", "topk".
const char* StrategyName(StrategyKind kind);
Result<StrategyKind> ParseStrategy(const std::string& name);
// "allreduce,sfb" -> {kAllReduce, kSfb}; spaces allowed, duplicates and unknown names rejected,
// an empty list is an error (a layer needs at least one candidate).
Result<std::vector<StrategyKind>> ParseStrategyList(const std::string& text);
std::string StrategyListName(const std::vector<StrategyKind>& list);

struct OptimizerSpec {
  enum class Kind : int { kNone = 0, kSgd = 1, kAdam = 2 };
  Kind kind = Kind::kNone;
  SgdParams sgd;    // used when kind == kSgd
  AdamParams adam;  // used when kind == kAdam (adam.step is ignored: Poseidon counts steps)

  static OptimizerSpec None() { return {}; }
  static OptimizerSpec Sgd(const SgdParams& p) {
    OptimizerSpec o;
    o.kind = Kind::kSgd;
    o.sgd = p;
    return o;
  }
  static OptimizerSpec Adam(const AdamParams& p) {
    OptimizerSpec o;
    o.kind = Kind::kAdam;
    o.adam = p;
    return o;
  }
  bool enabled() const { return kind != Kind::kNone; }
};
// "none", "sgd", "adam".
const char* OptimizerName(OptimizerSpec::Kind kind);

// Per-layer top-k settings; unset fields take the POSEIDON_TOPK_* settings at registration.
// With momentum correction the residual accumulates u = m u + g (and u is cleared where an
// entry is sent, DGC's momentum factor masking), so pair it with an optimizer without momentum
// (SGD momentum 0) or the momentum is applied twice.
struct TopkOptions {
  std::optional<double> density;          // fraction sent per step, in (0, 1]
  std::optional<long long> warmup_steps;  // dense exchanges before compression starts
  std::optional<double> momentum;         // DGC momentum correction factor, in [0, 1)
  std::optional<long long> min_elements;  // smaller layers fall back to dense allreduce
  std::optional<size_t> k;                // exact entries per step; overrides density
};

struct LayerSpec {
  std::string name;           // non-empty, no whitespace, no leading '#' (plans are whitespace
                              // tables where '#' starts a comment)
  std::vector<size_t> shape;  // kFullyConnected: exactly {M, N}; others: any, may hold 0
  DType dtype = DType::kFloat32;
  LayerKind kind = LayerKind::kDense;
  std::optional<StrategyKind> force;     // this layer always uses this strategy
  std::vector<StrategyKind> candidates;  // empty: POSEIDON_CANDIDATES
  TopkOptions topk;
  OptimizerSpec optimizer;

  size_t NumElements() const;
  // The M and N of a fully connected layer (0 for other kinds).
  size_t rows() const { return kind == LayerKind::kFullyConnected ? shape[0] : 0; }
  size_t cols() const { return kind == LayerKind::kFullyConnected ? shape[1] : 0; }
};

// "25088x4096" ("scalar" for an empty shape).
std::string ShapeString(const std::vector<size_t>& shape);
Result<std::vector<size_t>> ParseShape(const std::string& text);

// Checks a spec (name, shape, dtype, kind, options) and fills unset top-k options from the
// settings. Errors name the layer, the field, the value and what was expected.
Result<LayerSpec> ResolveLayerSpec(const LayerSpec& spec);

// Whether `strategy` can exchange this layer at all; when not, *why says why.
//   allreduce: always; ps: needs an optimizer; sfb: needs kFullyConnected;
//   topk: needs kSparse (layers under topk.min_elements still apply: topk then falls back to a
//   dense allreduce, and its cost says so).
bool StrategyApplies(StrategyKind strategy, const LayerSpec& resolved, std::string* why);

}  // namespace poseidon
