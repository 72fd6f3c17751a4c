// Layer tables of the models Poseidon's papers evaluate, for planning studies (poseidon_plan)
// and model-level benchmarks. Every learnable tensor is one layer:
//   conv weights ({out, in, kh, kw}) and biases / batch-norm scale+shift as kDense (or kSparse
//   when `sparse_dense_layers` is set, to let topk compete), fully connected weights as
//   kFullyConnected with shape {M = outputs, N = inputs}, so their gradient is U^T V with
//   U = output gradients (K x M) and V = inputs (K x N).
// Parameter counts: VGG19 143,667,240; VGG19-22K 229,052,817 (last FC 21841 x 4096);
// ResNet-152 60,192,808 (torchvision, batch norm counted as scale + shift); Inception-V3
// 23,834,568 (torchvision without the auxiliary classifier).
#pragma once

#include <string>
#include <vector>

#include "collectives/layer.h"

namespace poseidon {

struct ModelTable {
  std::string name;
  size_t batch = 32;  // per-rank batch the papers use
  std::vector<LayerSpec> layers;
  size_t NumParameters() const;
};

// "vgg19", "vgg19-22k", "resnet152", "inception-v3".
std::vector<std::string> ModelNames();
Result<ModelTable> ModelByName(const std::string& name, bool sparse_dense_layers = false);

}  // namespace poseidon
