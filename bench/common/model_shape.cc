// Model shapes: output resolutions by layer name, FLOPs, and uniform shrinking (see the header
// for the steps).
#include "bench/common/model_shape.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace poseidon::bench {
namespace {

bool StartsWith(const std::string& s, const std::string& p) {
  return s.compare(0, p.size(), p) == 0;
}

// The part of `layer` before its last '.', e.g. "layer2.0.conv1" for "layer2.0.conv1.w".
std::string Module(const std::string& layer) {
  size_t dot = layer.rfind('.');
  return dot == std::string::npos ? layer : layer.substr(0, dot);
}

Result<double> VggSide(const std::string& layer) {
  if (StartsWith(layer, "fc")) return 1.0;
  // conv<s>_<i>: stage s halves the side after each of the four pools.
  if (StartsWith(layer, "conv") && layer.size() > 4) {
    int s = layer[4] - '0';
    if (s >= 1 && s <= 5) return static_cast<double>(224 >> (s - 1));
  }
  return InvalidArgument("OutputPositions: VGG layer '", layer, "' is not conv<1..5>_* or fc*");
}

Result<double> ResNetSide(const std::string& layer) {
  if (StartsWith(layer, "fc")) return 1.0;
  if (StartsWith(layer, "conv1.")) return 112.0;
  // layer<s>.<i>.<conv1|conv2|conv3|downsample>; the stride-2 3x3 of block 0 (stages 2-4)
  // means that block's first 1x1 still runs at the previous stage's resolution.
  if (StartsWith(layer, "layer") && layer.size() > 7) {
    int s = layer[5] - '0';
    size_t dot2 = layer.find('.', 7);
    if (s >= 1 && s <= 4 && dot2 != std::string::npos) {
      int block = std::atoi(layer.substr(7, dot2 - 7).c_str());
      std::string conv = Module(layer).substr(dot2 + 1);
      int side = 56 >> (s - 1);
      if (block == 0 && s > 1 && conv == "conv1") side *= 2;
      return static_cast<double>(side);
    }
  }
  return InvalidArgument("OutputPositions: ResNet layer '", layer,
                         "' is not conv1.*, layer<1..4>.<i>.* or fc*");
}

Result<double> InceptionSide(const std::string& layer) {
  const std::string m = Module(layer);
  struct Entry {
    const char* module;
    double side;
  };
  // Exact modules first (the stem and the two grid reductions), then block prefixes.
  static const Entry kExact[] = {{"Conv2d_1a_3x3", 149},          {"Conv2d_2a_3x3", 147},
                                 {"Conv2d_2b_3x3", 147},          {"Conv2d_3b_1x1", 73},
                                 {"Conv2d_4a_3x3", 71},           {"Mixed_6a.branch3x3", 17},
                                 {"Mixed_6a.branch3x3dbl_1", 35}, {"Mixed_6a.branch3x3dbl_2", 35},
                                 {"Mixed_6a.branch3x3dbl_3", 17}, {"Mixed_7a.branch3x3_1", 17},
                                 {"Mixed_7a.branch3x3_2", 8},     {"Mixed_7a.branch7x7x3_1", 17},
                                 {"Mixed_7a.branch7x7x3_2", 17},  {"Mixed_7a.branch7x7x3_3", 17},
                                 {"Mixed_7a.branch7x7x3_4", 8},   {"fc", 1}};
  for (const Entry& e : kExact) {
    if (m == e.module) return e.side;
  }
  if (StartsWith(m, "Mixed_5")) return 35.0;
  if (StartsWith(m, "Mixed_6") && !StartsWith(m, "Mixed_6a")) return 17.0;
  if (StartsWith(m, "Mixed_7b") || StartsWith(m, "Mixed_7c")) return 8.0;
  return InvalidArgument("OutputPositions: Inception-V3 layer '", layer,
                         "' has no known output resolution");
}

ModelTable SmallModel() {
  // Two 3x3 conv layers on 32x32 inputs (the second after a 2x2 pool), then two FC layers:
  // small enough for a smoke test, with one FC layer where sfb can win.
  ModelTable m;
  m.name = "small";
  m.batch = 32;
  auto dense = [&](const std::string& name, std::vector<size_t> shape) {
    LayerSpec l;
    l.name = name;
    l.shape = std::move(shape);
    m.layers.push_back(l);
  };
  auto fc = [&](const std::string& name, size_t out, size_t in) {
    LayerSpec l;
    l.name = name + ".w";
    l.shape = {out, in};
    l.kind = LayerKind::kFullyConnected;
    m.layers.push_back(l);
    dense(name + ".b", {out});
  };
  dense("conv1.w", {16, 3, 3, 3});
  dense("conv1.b", {16});
  dense("conv2.w", {32, 16, 3, 3});
  dense("conv2.b", {32});
  fc("fc1", 512, 32 * 8 * 8);
  fc("fc2", 10, 512);
  return m;
}

}  // namespace

double ShapedModel::FwdFlops() const {
  double f = 0;
  for (const ShapedLayer& l : layers) f += l.fwd_flops;
  return f;
}
size_t ShapedModel::Elements() const {
  size_t n = 0;
  for (const ShapedLayer& l : layers) n += l.spec.NumElements();
  return n;
}
size_t ShapedModel::FullElements() const {
  size_t n = 0;
  for (const ShapedLayer& l : layers) n += l.full_elements;
  return n;
}

std::vector<std::string> TrainerModelNames() {
  std::vector<std::string> names = ModelNames();
  names.push_back("small");
  return names;
}

Result<ModelTable> TrainerModelTable(const std::string& name) {
  if (name == "small") return SmallModel();
  auto t = ModelByName(name);
  if (!t.ok()) {
    return InvalidArgument("--model '", name,
                           "' is unknown; expected vgg19, vgg19-22k, resnet152, inception-v3 or "
                           "small");
  }
  return t;
}

Result<double> OutputPositions(const std::string& model, const std::string& layer) {
  Result<double> side = 0.0;
  if (model == "vgg19" || model == "vgg19-22k") {
    side = VggSide(layer);
  } else if (model == "resnet152") {
    side = ResNetSide(layer);
  } else if (model == "inception-v3") {
    side = InceptionSide(layer);
  } else if (model == "small") {
    side = StartsWith(layer, "conv1") ? 32.0 : StartsWith(layer, "conv2") ? 16.0 : 1.0;
  } else {
    return InvalidArgument("OutputPositions: unknown model '", model, "'");
  }
  if (!side.ok()) return side.status();
  return *side * *side;
}

Result<ShapedModel> MakeShapedModel(const std::string& name, size_t batch, double scale) {
  PSD_REQUIRE_ARG(std::isfinite(scale) && scale > 0 && scale <= 1, "--scale ", scale,
                  " is out of range; expected a fraction of the parameters in (0, 1]");
  PSD_ASSIGN_OR_RETURN(ModelTable table, TrainerModelTable(name));
  ShapedModel m;
  m.name = name;
  m.batch = batch > 0 ? batch : table.batch;
  m.scale = scale;
  const double side = std::sqrt(scale);
  auto shrink = [](size_t n, double s) {
    return std::max<size_t>(1, static_cast<size_t>(std::llround(static_cast<double>(n) * s)));
  };
  m.factor_batch = shrink(m.batch, side);
  for (const LayerSpec& full : table.layers) {
    ShapedLayer l;
    l.full_elements = full.NumElements();
    PSD_ASSIGN_OR_RETURN(double positions, OutputPositions(name, full.name));
    const double n = static_cast<double>(l.full_elements);
    const bool weight = full.kind == LayerKind::kFullyConnected || full.shape.size() == 4;
    l.fwd_flops = (weight ? 2.0 : 1.0) * n * positions * static_cast<double>(m.batch);
    l.spec = full;
    if (scale < 1) {
      if (full.kind == LayerKind::kFullyConnected) {
        l.spec.shape = {shrink(full.shape[0], side), shrink(full.shape[1], side)};
      } else {
        l.spec.shape = {shrink(l.full_elements, scale)};
      }
    }
    m.layers.push_back(std::move(l));
  }
  return m;
}

void AddModelFlags(cli::Flags& flags, ModelFlags* m, bool with_batch) {
  std::string names;
  for (const std::string& n : TrainerModelNames()) names += StrCat(names.empty() ? "" : "|", n);
  flags.Text("--model", &m->model, "NAME",
             StrCat(names, " (default ", m->model.empty() ? "none" : m->model, ")"));
  flags.Number("--scale", &m->scale, cli::Range{0, 1, true, false}, "S",
               StrCat("fraction of the model's parameters kept, in (0, 1] (default ", m->scale,
                      "):\ndense layers S x elements, FC layers and factor batch sqrt(S) "
                      "per side"));
  if (with_batch) {
    flags.Int("--batch", &m->batch, 0, 65536, "K", "images per rank (default: the model's)");
  }
}

Result<ShapedModel> MakeShapedModel(const ModelFlags& m) {
  return MakeShapedModel(m.model, static_cast<size_t>(m.batch), m.scale);
}

}  // namespace poseidon::bench
