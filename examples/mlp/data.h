// The synthetic classification task the example trainer learns, generated from a seed.
//
// How a sample is made (every step is deterministic in (seed, split, index), so any rank can
// generate any sample without talking to the others, and the data set does not depend on the
// number of ranks):
//  1. From the seed alone: for each class, a few cluster centres in a small latent space
//     (default 10 classes x 3 clusters in 16 dimensions), and a fixed random two-layer map
//     latent -> features (x = A2 tanh(A1 z + b1), 64 features by default).
//  2. For sample i of a split: a private random stream seeded from (seed, split, i) draws the
//     class, one of its clusters, and a latent point z = centre + sigma * N(0, I).
//  3. z goes through the fixed map to give the features; the nonlinearity folds the clusters,
//     so the classes are not linearly separable in feature space.
//  4. With probability label_noise (2%) the label is replaced by a different, uniformly drawn
//     class, so even a perfect model cannot pass ~98% accuracy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/status.h"

namespace poseidon::mlp {

struct TaskConfig {
  int features = 64;
  int classes = 10;
  int clusters_per_class = 3;
  int latent_dim = 16;
  int map_width = 32;          // hidden width of the fixed feature map
  double center_scale = 1.0;   // standard deviation of the cluster centres
  double cluster_sigma = 0.8;  // spread of a cluster around its centre
  double label_noise = 0.02;   // fraction of labels replaced by another class
};

// The two splits draw from disjoint random streams.
enum class Split : int { kTrain = 0, kTest = 1 };

// A block of samples: row i of x (features floats) has label y[i].
struct Dataset {
  int features = 0;
  int classes = 0;
  std::vector<float> x;
  std::vector<int32_t> y;
  size_t size() const { return y.size(); }
};

class SyntheticTask {
 public:
  // Checks the config (every count >= 1, classes >= 2, noise in [0, 1), scales > 0) and
  // draws the fixed centres and map from seed.
  static Result<SyntheticTask> Create(const TaskConfig& config, uint64_t seed);

  const TaskConfig& config() const { return config_; }
  uint64_t seed() const { return seed_; }

  // Writes sample `index` of `split` into x (config().features floats) and *label.
  void Sample(Split split, uint64_t index, float* x, int32_t* label) const;

  // The samples index = offset, offset + stride, ... below `total` (the shard a rank owns when
  // offset = rank and stride = world size). stride >= 1, offset < stride.
  Result<Dataset> Generate(Split split, uint64_t total, uint64_t offset, uint64_t stride) const;

  // One line for logs: "10 classes x 3 Gaussian clusters in 16-d latent -> tanh map -> 64
  // features, 2% label noise".
  std::string Describe() const;

 private:
  SyntheticTask() = default;

  TaskConfig config_;
  uint64_t seed_ = 0;
  std::vector<double> centers_;  // [classes][clusters][latent_dim]
  std::vector<double> a1_;       // [map_width][latent_dim]
  std::vector<double> b1_;       // [map_width]
  std::vector<double> a2_;       // [features][map_width]
};

// SplitMix64: a small, fast generator whose output depends only on its 64-bit state, so
// streams are identical on every rank and platform (std::normal_distribution is not).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next();
  // Uniform in [0, 1) with 53 random bits.
  double Uniform();
  // Uniform integer in [0, n), n >= 1.
  uint64_t Below(uint64_t n);
  // Standard normal (Box-Muller; the second value is kept for the next call).
  double Normal();

 private:
  uint64_t state_;
  bool has_spare_ = false;
  double spare_ = 0;
};

// Mixes several words into one seed (used to give every sample its own stream).
uint64_t MixSeed(uint64_t a, uint64_t b, uint64_t c = 0);

}  // namespace poseidon::mlp
