// The model layer tables (tools/models): parameter counts against the published ones, every
// layer a valid spec, a known layer's shape and kind, and an unknown name refused.
#include "tools/models/models.h"

#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "collectives/layer.h"

namespace poseidon {
namespace {

TEST(Models, ParameterCountsMatchThePublishedOnes) {
  const std::pair<const char*, size_t> expected[] = {{"vgg19", 143667240},
                                                     {"vgg19-22k", 229052817},
                                                     {"resnet152", 60192808},
                                                     {"inception-v3", 23834568}};
  for (const auto& e : expected) {
    auto m = ModelByName(e.first);
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(m->NumParameters(), e.second) << e.first;
    for (const LayerSpec& l : m->layers) ASSERT_TRUE(ResolveLayerSpec(l).ok()) << l.name;
  }
  auto vgg = ModelByName("vgg19");
  const LayerSpec& fc6 = vgg->layers[32];
  EXPECT_EQ(fc6.name, "fc6.w");
  EXPECT_EQ(fc6.kind, LayerKind::kFullyConnected);
  EXPECT_EQ(fc6.shape, (std::vector<size_t>{4096, 25088}));
  EXPECT_FALSE(ModelByName("alexnet").ok());
}

}  // namespace
}  // namespace poseidon
