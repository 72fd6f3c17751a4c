// The model tables, built from each network's structure (so the counts are checkable against
// the published ones) rather than typed in layer by layer.
#include "tools/models/models.h"

namespace poseidon {
namespace {

class Builder {
 public:
  explicit Builder(ModelTable* m, bool sparse) : m_(m), sparse_(sparse) {}
  void Dense(const std::string& name, std::vector<size_t> shape) {
    LayerSpec l;
    l.name = name;
    l.shape = std::move(shape);
    l.kind = sparse_ ? LayerKind::kSparse : LayerKind::kDense;
    m_->layers.push_back(std::move(l));
  }
  // Convolution with bias (VGG).
  void ConvBias(const std::string& name, size_t in, size_t out, size_t kh, size_t kw) {
    Dense(name + ".w", {out, in, kh, kw});
    Dense(name + ".b", {out});
  }
  // Convolution without bias, then batch norm (ResNet, Inception).
  void ConvBn(const std::string& name, size_t in, size_t out, size_t kh, size_t kw) {
    Dense(name + ".w", {out, in, kh, kw});
    Dense(name + ".bn", {2, out});
  }
  void Fc(const std::string& name, size_t in, size_t out) {
    LayerSpec l;
    l.name = name + ".w";
    l.shape = {out, in};
    l.kind = LayerKind::kFullyConnected;
    m_->layers.push_back(std::move(l));
    Dense(name + ".b", {out});
  }

 private:
  ModelTable* m_;
  bool sparse_;
};

void Vgg19(Builder& b, size_t classes) {
  const size_t cfg[5][2] = {{64, 2}, {128, 2}, {256, 4}, {512, 4}, {512, 4}};
  size_t in = 3;
  for (int s = 0; s < 5; ++s) {
    for (size_t i = 0; i < cfg[s][1]; ++i) {
      b.ConvBias(StrCat("conv", s + 1, "_", i + 1), in, cfg[s][0], 3, 3);
      in = cfg[s][0];
    }
  }
  b.Fc("fc6", 512 * 7 * 7, 4096);
  b.Fc("fc7", 4096, 4096);
  b.Fc("fc8", 4096, classes);
}

void ResNet152(Builder& b) {
  b.ConvBn("conv1", 3, 64, 7, 7);
  const size_t blocks[4] = {3, 8, 36, 3};
  size_t in = 64;
  for (int s = 0; s < 4; ++s) {
    size_t width = 64u << s;
    for (size_t i = 0; i < blocks[s]; ++i) {
      std::string p = StrCat("layer", s + 1, ".", i);
      b.ConvBn(p + ".conv1", in, width, 1, 1);
      b.ConvBn(p + ".conv2", width, width, 3, 3);
      b.ConvBn(p + ".conv3", width, 4 * width, 1, 1);
      if (i == 0) b.ConvBn(p + ".downsample", in, 4 * width, 1, 1);
      in = 4 * width;
    }
  }
  b.Fc("fc", 2048, 1000);
}

void InceptionA(Builder& b, const std::string& p, size_t in, size_t pool) {
  b.ConvBn(p + ".branch1x1", in, 64, 1, 1);
  b.ConvBn(p + ".branch5x5_1", in, 48, 1, 1);
  b.ConvBn(p + ".branch5x5_2", 48, 64, 5, 5);
  b.ConvBn(p + ".branch3x3dbl_1", in, 64, 1, 1);
  b.ConvBn(p + ".branch3x3dbl_2", 64, 96, 3, 3);
  b.ConvBn(p + ".branch3x3dbl_3", 96, 96, 3, 3);
  b.ConvBn(p + ".branch_pool", in, pool, 1, 1);
}
void InceptionB(Builder& b, const std::string& p, size_t in) {
  b.ConvBn(p + ".branch3x3", in, 384, 3, 3);
  b.ConvBn(p + ".branch3x3dbl_1", in, 64, 1, 1);
  b.ConvBn(p + ".branch3x3dbl_2", 64, 96, 3, 3);
  b.ConvBn(p + ".branch3x3dbl_3", 96, 96, 3, 3);
}
void InceptionC(Builder& b, const std::string& p, size_t in, size_t c7) {
  b.ConvBn(p + ".branch1x1", in, 192, 1, 1);
  b.ConvBn(p + ".branch7x7_1", in, c7, 1, 1);
  b.ConvBn(p + ".branch7x7_2", c7, c7, 1, 7);
  b.ConvBn(p + ".branch7x7_3", c7, 192, 7, 1);
  b.ConvBn(p + ".branch7x7dbl_1", in, c7, 1, 1);
  b.ConvBn(p + ".branch7x7dbl_2", c7, c7, 7, 1);
  b.ConvBn(p + ".branch7x7dbl_3", c7, c7, 1, 7);
  b.ConvBn(p + ".branch7x7dbl_4", c7, c7, 7, 1);
  b.ConvBn(p + ".branch7x7dbl_5", c7, 192, 1, 7);
  b.ConvBn(p + ".branch_pool", in, 192, 1, 1);
}
void InceptionD(Builder& b, const std::string& p, size_t in) {
  b.ConvBn(p + ".branch3x3_1", in, 192, 1, 1);
  b.ConvBn(p + ".branch3x3_2", 192, 320, 3, 3);
  b.ConvBn(p + ".branch7x7x3_1", in, 192, 1, 1);
  b.ConvBn(p + ".branch7x7x3_2", 192, 192, 1, 7);
  b.ConvBn(p + ".branch7x7x3_3", 192, 192, 7, 1);
  b.ConvBn(p + ".branch7x7x3_4", 192, 192, 3, 3);
}
void InceptionE(Builder& b, const std::string& p, size_t in) {
  b.ConvBn(p + ".branch1x1", in, 320, 1, 1);
  b.ConvBn(p + ".branch3x3_1", in, 384, 1, 1);
  b.ConvBn(p + ".branch3x3_2a", 384, 384, 1, 3);
  b.ConvBn(p + ".branch3x3_2b", 384, 384, 3, 1);
  b.ConvBn(p + ".branch3x3dbl_1", in, 448, 1, 1);
  b.ConvBn(p + ".branch3x3dbl_2", 448, 384, 3, 3);
  b.ConvBn(p + ".branch3x3dbl_3a", 384, 384, 1, 3);
  b.ConvBn(p + ".branch3x3dbl_3b", 384, 384, 3, 1);
  b.ConvBn(p + ".branch_pool", in, 192, 1, 1);
}

void InceptionV3(Builder& b) {
  b.ConvBn("Conv2d_1a_3x3", 3, 32, 3, 3);
  b.ConvBn("Conv2d_2a_3x3", 32, 32, 3, 3);
  b.ConvBn("Conv2d_2b_3x3", 32, 64, 3, 3);
  b.ConvBn("Conv2d_3b_1x1", 64, 80, 1, 1);
  b.ConvBn("Conv2d_4a_3x3", 80, 192, 3, 3);
  InceptionA(b, "Mixed_5b", 192, 32);
  InceptionA(b, "Mixed_5c", 256, 64);
  InceptionA(b, "Mixed_5d", 288, 64);
  InceptionB(b, "Mixed_6a", 288);
  InceptionC(b, "Mixed_6b", 768, 128);
  InceptionC(b, "Mixed_6c", 768, 160);
  InceptionC(b, "Mixed_6d", 768, 160);
  InceptionC(b, "Mixed_6e", 768, 192);
  InceptionD(b, "Mixed_7a", 768);
  InceptionE(b, "Mixed_7b", 1280);
  InceptionE(b, "Mixed_7c", 2048);
  b.Fc("fc", 2048, 1000);
}

}  // namespace

size_t ModelTable::NumParameters() const {
  size_t n = 0;
  for (const LayerSpec& l : layers) n += l.NumElements();
  return n;
}

std::vector<std::string> ModelNames() {
  return {"vgg19", "vgg19-22k", "resnet152", "inception-v3"};
}

Result<ModelTable> ModelByName(const std::string& name, bool sparse_dense_layers) {
  ModelTable m;
  m.name = name;
  Builder b(&m, sparse_dense_layers);
  if (name == "vgg19") {
    Vgg19(b, 1000);
  } else if (name == "vgg19-22k") {
    Vgg19(b, 21841);
  } else if (name == "resnet152") {
    ResNet152(b);
  } else if (name == "inception-v3") {
    InceptionV3(b);
  } else {
    return InvalidArgument("ModelByName: unknown model '", name,
                           "'; expected vgg19, vgg19-22k, resnet152 or inception-v3");
  }
  return m;
}

}  // namespace poseidon
