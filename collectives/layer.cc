#include "collectives/layer.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "runtime/settings.h"

namespace poseidon {

const char* LayerKindName(LayerKind kind) {
  switch (kind) {
    case LayerKind::kDense:
      return "dense";
    case LayerKind::kFullyConnected:
      return "fc";
    case LayerKind::kSparse:
      return "sparse";
  }
  return "invalid";
}

Result<LayerKind> ParseLayerKind(const std::string& name) {
  if (name == "dense") return LayerKind::kDense;
  if (name == "fc" || name == "fully_connected") return LayerKind::kFullyConnected;
  if (name == "sparse") return LayerKind::kSparse;
  return InvalidArgument("ParseLayerKind: unknown layer kind '", name,
                         "'; expected dense, fc or sparse");
}

const char* StrategyName(StrategyKind kind) {
  switch (kind) {
    case StrategyKind::kAllReduce:
      return "allreduce";
    case StrategyKind::kPs:
      return "ps";
    case StrategyKind::kSfb:
      return "sfb";
    case StrategyKind::kTopk:
      return "topk";
  }
  return "invalid";
}

Result<StrategyKind> ParseStrategy(const std::string& name) {
  for (StrategyKind s : kAllStrategies) {
    if (name == StrategyName(s)) return s;
  }
  return InvalidArgument("ParseStrategy: unknown strategy '", name,
                         "'; expected allreduce, ps, sfb or topk");
}

Result<std::vector<StrategyKind>> ParseStrategyList(const std::string& text) {
  std::vector<StrategyKind> out;
  std::string item;
  auto flush = [&]() -> Status {
    if (item.empty()) return Status::Ok();
    auto s = ParseStrategy(item);
    if (!s.ok()) {
      return InvalidArgument("ParseStrategyList: '", text, "': ", s.status().message());
    }
    for (StrategyKind seen : out) {
      if (seen == *s) {
        return InvalidArgument("ParseStrategyList: '", text, "' names ", item, " twice");
      }
    }
    out.push_back(*s);
    item.clear();
    return Status::Ok();
  };
  for (char c : text) {
    if (c == ',') {
      PSD_CHECK(flush());
    } else if (!std::isspace(static_cast<unsigned char>(c))) {
      item.push_back(c);
    }
  }
  PSD_CHECK(flush());
  if (out.empty()) {
    return InvalidArgument("ParseStrategyList: '", text,
                           "' names no strategy; expected a comma-separated subset of "
                           "allreduce,ps,sfb,topk");
  }
  return out;
}

std::string StrategyListName(const std::vector<StrategyKind>& list) {
  std::string s;
  for (size_t i = 0; i < list.size(); ++i) {
    if (i) s += ",";
    s += StrategyName(list[i]);
  }
  return s;
}

const char* OptimizerName(OptimizerSpec::Kind kind) {
  switch (kind) {
    case OptimizerSpec::Kind::kNone:
      return "none";
    case OptimizerSpec::Kind::kSgd:
      return "sgd";
    case OptimizerSpec::Kind::kAdam:
      return "adam";
  }
  return "invalid";
}

size_t LayerSpec::NumElements() const {
  size_t n = 1;
  for (size_t d : shape) n *= d;
  return n;
}

std::string ShapeString(const std::vector<size_t>& shape) {
  if (shape.empty()) return "scalar";
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += "x";
    s += std::to_string(shape[i]);
  }
  return s;
}

Result<std::vector<size_t>> ParseShape(const std::string& text) {
  if (text == "scalar") return std::vector<size_t>{};
  std::vector<size_t> shape;
  size_t i = 0;
  while (i <= text.size()) {
    size_t j = text.find('x', i);
    if (j == std::string::npos) j = text.size();
    std::string part = text.substr(i, j - i);
    // Any size_t extent reads back (ShapeString prints up to 20 digits).
    errno = 0;
    unsigned long long d = 0;
    if (!part.empty() && part.size() <= 20 &&
        part.find_first_not_of("0123456789") == std::string::npos) {
      d = std::strtoull(part.c_str(), nullptr, 10);
    } else {
      errno = EINVAL;
    }
    static_assert(sizeof(unsigned long long) == sizeof(size_t), "extents are 64-bit");
    if (errno != 0) {
      return InvalidArgument("ParseShape: '", text,
                             "' is not a shape; expected dimensions joined by 'x', e.g. 64x3x7x7");
    }
    shape.push_back(static_cast<size_t>(d));
    i = j + 1;
  }
  return shape;
}

Result<LayerSpec> ResolveLayerSpec(const LayerSpec& in) {
  LayerSpec s = in;
  const char* call = "RegisterLayer";
  PSD_REQUIRE_ARG(!s.name.empty(), call, ": layer name is empty; expected a non-empty name");
  for (char c : s.name) {
    PSD_REQUIRE_ARG(!std::isspace(static_cast<unsigned char>(c)) && c != '\0', call,
                    ": layer name '", s.name, "' contains whitespace; expected a single word");
  }
  PSD_REQUIRE_ARG(s.name[0] != '#', call, ": layer name '", s.name,
                  "' starts with '#', which starts a comment in the plan table; expected a name "
                  "that does not");
  const std::string who = StrCat(call, ": layer ", s.name);
  PSD_REQUIRE_ARG(s.dtype == DType::kFloat32, who, ": dtype ", DTypeName(s.dtype),
                  " is not supported; expected float32 (the kernels' GEMM, top-k and "
                  "optimizer steps are float32)");
  PSD_REQUIRE_ARG(s.kind == LayerKind::kDense || s.kind == LayerKind::kFullyConnected ||
                      s.kind == LayerKind::kSparse,
                  who, ": kind ", static_cast<int>(s.kind),
                  " is invalid; expected dense, fc or "
                  "sparse");
  // Element count must fit the 32-bit top-k indices and the backend's int counts.
  double elems = 1;
  for (size_t d : s.shape) elems *= static_cast<double>(d);
  PSD_REQUIRE_ARG(elems < 2147483647.0, who, ": shape ", ShapeString(s.shape), " has ", elems,
                  " elements; expected fewer than 2^31");
  if (s.kind == LayerKind::kFullyConnected) {
    PSD_REQUIRE_ARG(s.shape.size() == 2 && s.shape[0] > 0 && s.shape[1] > 0, who, ": shape ",
                    ShapeString(s.shape),
                    " is not a fully connected weight; expected {M, N} with M, N > 0");
  }
  if (s.optimizer.kind != OptimizerSpec::Kind::kNone &&
      s.optimizer.kind != OptimizerSpec::Kind::kSgd &&
      s.optimizer.kind != OptimizerSpec::Kind::kAdam) {
    return InvalidArgument(who, ": optimizer kind ", static_cast<int>(s.optimizer.kind),
                           " is invalid; expected none, sgd or adam");
  }
  if (s.optimizer.kind == OptimizerSpec::Kind::kSgd) {
    const SgdParams& p = s.optimizer.sgd;
    PSD_REQUIRE_ARG(std::isfinite(p.lr) && p.lr >= 0, who, ": sgd lr ", p.lr,
                    " is invalid; expected a finite value >= 0");
    PSD_REQUIRE_ARG(std::isfinite(p.momentum) && p.momentum >= 0 && p.momentum < 1, who,
                    ": sgd momentum ", p.momentum, " is invalid; expected [0, 1)");
    PSD_REQUIRE_ARG(std::isfinite(p.weight_decay) && p.weight_decay >= 0, who,
                    ": sgd weight_decay ", p.weight_decay, " is invalid; expected >= 0");
  }
  if (s.optimizer.kind == OptimizerSpec::Kind::kAdam) {
    const AdamParams& p = s.optimizer.adam;
    PSD_REQUIRE_ARG(std::isfinite(p.lr) && p.lr >= 0, who, ": adam lr ", p.lr,
                    " is invalid; expected a finite value >= 0");
    PSD_REQUIRE_ARG(p.beta1 >= 0 && p.beta1 < 1, who, ": adam beta1 ", p.beta1,
                    " is invalid; expected [0, 1)");
    PSD_REQUIRE_ARG(p.beta2 >= 0 && p.beta2 < 1, who, ": adam beta2 ", p.beta2,
                    " is invalid; expected [0, 1)");
    PSD_REQUIRE_ARG(p.eps > 0 && std::isfinite(p.eps), who, ": adam eps ", p.eps,
                    " is invalid; expected a finite value > 0");
    PSD_REQUIRE_ARG(std::isfinite(p.weight_decay) && p.weight_decay >= 0, who,
                    ": adam weight_decay ", p.weight_decay, " is invalid; expected >= 0");
  }

  // Top-k options: the layer's own values, else the settings.
  if (!s.topk.density) s.topk.density = settings::TopkDensity();
  if (!s.topk.warmup_steps) s.topk.warmup_steps = settings::TopkWarmupSteps();
  if (!s.topk.momentum) s.topk.momentum = settings::TopkMomentum();
  if (!s.topk.min_elements) s.topk.min_elements = settings::TopkMinElements();
  double d = *s.topk.density;
  PSD_REQUIRE_ARG(std::isfinite(d) && d > 0 && d <= 1, who, ": topk density ", d,
                  " is outside (0, 1]; expected a fraction such as 0.001");
  PSD_REQUIRE_ARG(*s.topk.warmup_steps >= 0, who, ": topk warmup_steps ", *s.topk.warmup_steps,
                  " is negative; expected >= 0");
  double m = *s.topk.momentum;
  PSD_REQUIRE_ARG(std::isfinite(m) && m >= 0 && m < 1, who, ": topk momentum ", m,
                  " is outside [0, 1); expected 0 (off) or a factor such as 0.9");
  if (s.topk.k) {
    size_t n = s.NumElements();
    PSD_REQUIRE_ARG(*s.topk.k > 0 && *s.topk.k <= n, who, ": topk k ", *s.topk.k,
                    " is invalid for ", n, " elements; expected 0 < k <= n");
  }
  PSD_REQUIRE_ARG(*s.topk.min_elements >= 0, who, ": topk min_elements ", *s.topk.min_elements,
                  " is negative; expected >= 0");

  // Candidates and force.
  for (size_t i = 0; i < s.candidates.size(); ++i) {
    int v = static_cast<int>(s.candidates[i]);
    PSD_REQUIRE_ARG(v >= 0 && v < kNumStrategies, who, ": candidate ", v,
                    " is not a strategy; expected allreduce, ps, sfb or topk");
    for (size_t j = 0; j < i; ++j) {
      PSD_REQUIRE_ARG(s.candidates[j] != s.candidates[i], who, ": candidate ",
                      StrategyName(s.candidates[i]), " is listed twice");
    }
  }
  if (s.force) {
    int v = static_cast<int>(*s.force);
    PSD_REQUIRE_ARG(v >= 0 && v < kNumStrategies, who, ": forced strategy ", v,
                    " is not a strategy; expected allreduce, ps, sfb or topk");
    std::string why;
    PSD_REQUIRE_ARG(StrategyApplies(*s.force, s, &why), who, ": forced strategy ",
                    StrategyName(*s.force), " does not apply: ", why);
  }
  return s;
}

bool StrategyApplies(StrategyKind strategy, const LayerSpec& layer, std::string* why) {
  std::string reason;
  switch (strategy) {
    case StrategyKind::kAllReduce:
      return true;
    case StrategyKind::kPs:
      if (layer.optimizer.enabled()) return true;
      reason = "ps needs an optimizer (the shard owner applies it)";
      break;
    case StrategyKind::kSfb:
      if (layer.kind == LayerKind::kFullyConnected) return true;
      reason = StrCat("sfb needs a fully connected layer, not ", LayerKindName(layer.kind));
      break;
    case StrategyKind::kTopk:
      if (layer.kind == LayerKind::kSparse) return true;
      reason = StrCat("topk needs a sparse-eligible layer, not ", LayerKindName(layer.kind));
      break;
  }
  if (why != nullptr) *why = reason;
  return false;
}

}  // namespace poseidon
