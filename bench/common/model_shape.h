// The models as the benchmarks run them: per-layer compute figures (FLOPs) for the layer tables
// of tools/models/models.h, a small default model, uniform shrinking of a model (so that 8
// emulated hosts fit in one machine's memory), and the flags that pick one (--model, --scale,
// --batch), declared once for every benchmark that takes a model.
//
// How the figures are made, step by step:
//  1. The layer tables carry parameter shapes only. The output resolution of each layer comes
//     from the network's structure, keyed by the layer's name (VGG19: 224 input, five stages
//     224/112/56/28/14; ResNet-152: 112 stem, stages 56/28/14/7 with the stride in the first
//     block's 3x3; Inception-V3: 299 input, 149/147/73/71/35/17/8 as in torchvision).
//  2. Forward FLOPs per image: conv / FC weights 2 x elements x output positions (a
//     multiply-add per weight per position); biases and batch-norm scale+shift one FLOP per
//     element per position. Backward costs twice the forward (gradients of inputs and
//     weights), the usual rule.
//  3. Shrinking by a factor f keeps the ratios that decide the exchange: a dense layer keeps
//     round(f n) elements (flattened); an M x N fully connected layer becomes
//     round(sqrt(f) M) x round(sqrt(f) N) and its factor batch round(sqrt(f) K), so dense bytes
//     (~MN) and factor bytes (~K(M+N)) both shrink by f, and Poseidon's rule
//     P K <= 2 M N / (M + N) gives the same answer. Compute times shrink by f as well.
//  4. --scale S is this f everywhere (osu_hybrid, poseidon_hybrid_bench, poseidon_overlap_bench,
//     poseidon_model_trainer): the fraction of the model's parameters kept, 0 < S <= 1.
#pragma once

#include <string>
#include <vector>

#include "collectives/layer.h"
#include "runtime/status.h"
#include "tools/flags.h"
#include "tools/models/models.h"

namespace poseidon::bench {

// One layer of a model as the trainer runs it.
struct ShapedLayer {
  LayerSpec spec;            // as exchanged (shrunk when f < 1)
  size_t full_elements = 0;  // elements at full size
  double fwd_flops = 0;      // forward FLOPs for the model's batch, full size
};

struct ShapedModel {
  std::string name;
  size_t batch = 32;         // images per rank per iteration (the model's)
  size_t factor_batch = 32;  // sufficient-factor rows of the FC layers (shrunk with sqrt(f))
  double scale = 1.0;        // f
  std::vector<ShapedLayer> layers;
  double FwdFlops() const;  // full-size forward FLOPs per iteration (batch images)
  size_t Elements() const;  // exchanged elements (shrunk)
  size_t FullElements() const;
};

// "vgg19", "vgg19-22k", "resnet152", "inception-v3", "small".
std::vector<std::string> TrainerModelNames();

// The table of `name` (ModelByName, or the small default), with the output positions of every
// layer; errors name the model or the layer whose resolution is unknown.
Result<ModelTable> TrainerModelTable(const std::string& name);
// Output positions (H x W) of one layer of a known model (1 for FC layers).
Result<double> OutputPositions(const std::string& model, const std::string& layer);

// The model at batch `batch` (0: the model's own) shrunk by `scale` in (0, 1].
Result<ShapedModel> MakeShapedModel(const std::string& name, size_t batch, double scale);

// The model flags, with their defaults in the fields when declared.
struct ModelFlags {
  std::string model = "small";
  double scale = 1.0;   // --scale: the fraction of the parameters kept, in (0, 1]
  long long batch = 0;  // --batch: images per rank; 0: the model's own
};
// Declares --model NAME and --scale S, and --batch K when with_batch.
void AddModelFlags(cli::Flags& flags, ModelFlags* m, bool with_batch = true);
// MakeShapedModel of the flags.
Result<ShapedModel> MakeShapedModel(const ModelFlags& m);

}  // namespace poseidon::bench
