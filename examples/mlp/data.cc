#include "examples/mlp/data.h"

#include <cmath>
#include <cstdio>

namespace poseidon::mlp {

uint64_t Rng::Next() {
  state_ += 0x9e3779b97f4a7c15ull;
  uint64_t z = state_;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double Rng::Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

uint64_t Rng::Below(uint64_t n) {
  // Rejection keeps every value equally likely: draws in the last partial block of n values
  // are thrown away.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t v;
  do {
    v = Next();
  } while (v >= limit);
  return v % n;
}

double Rng::Normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  double u1 = Uniform();
  while (u1 <= 0.0) u1 = Uniform();  // log(0) would be -inf
  const double u2 = Uniform();
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double t = 2.0 * M_PI * u2;
  spare_ = r * std::sin(t);
  has_spare_ = true;
  return r * std::cos(t);
}

uint64_t MixSeed(uint64_t a, uint64_t b, uint64_t c) {
  Rng r(a);
  uint64_t h = r.Next() ^ (b * 0xd6e8feb86659fd93ull);
  Rng r2(h);
  h = r2.Next() ^ (c * 0xa0761d6478bd642full);
  Rng r3(h);
  return r3.Next();
}

Result<SyntheticTask> SyntheticTask::Create(const TaskConfig& c, uint64_t seed) {
  PSD_REQUIRE_ARG(c.features >= 1, "SyntheticTask::Create: features = ", c.features,
                  "; expected >= 1");
  PSD_REQUIRE_ARG(c.classes >= 2, "SyntheticTask::Create: classes = ", c.classes,
                  "; expected >= 2");
  PSD_REQUIRE_ARG(c.clusters_per_class >= 1,
                  "SyntheticTask::Create: clusters_per_class = ", c.clusters_per_class,
                  "; expected >= 1");
  PSD_REQUIRE_ARG(c.latent_dim >= 1, "SyntheticTask::Create: latent_dim = ", c.latent_dim,
                  "; expected >= 1");
  PSD_REQUIRE_ARG(c.map_width >= 1, "SyntheticTask::Create: map_width = ", c.map_width,
                  "; expected >= 1");
  PSD_REQUIRE_ARG(c.center_scale > 0 && std::isfinite(c.center_scale),
                  "SyntheticTask::Create: center_scale = ", c.center_scale,
                  "; expected a finite value > 0");
  PSD_REQUIRE_ARG(c.cluster_sigma > 0 && std::isfinite(c.cluster_sigma),
                  "SyntheticTask::Create: cluster_sigma = ", c.cluster_sigma,
                  "; expected a finite value > 0");
  PSD_REQUIRE_ARG(c.label_noise >= 0 && c.label_noise < 1,
                  "SyntheticTask::Create: label_noise = ", c.label_noise,
                  "; expected a value in [0, 1)");

  SyntheticTask t;
  t.config_ = c;
  t.seed_ = seed;
  // The fixed parts come from their own stream (split id 2), apart from every sample's.
  Rng rng(MixSeed(seed, 2, 0));
  t.centers_.resize(static_cast<size_t>(c.classes) * c.clusters_per_class * c.latent_dim);
  for (double& v : t.centers_) v = c.center_scale * rng.Normal();
  // Scaled so that tanh sees inputs of order one (neither linear nor saturated).
  const double s1 = 1.5 / std::sqrt(static_cast<double>(c.latent_dim));
  t.a1_.resize(static_cast<size_t>(c.map_width) * c.latent_dim);
  for (double& v : t.a1_) v = s1 * rng.Normal();
  t.b1_.resize(c.map_width);
  for (double& v : t.b1_) v = 0.5 * rng.Normal();
  const double s2 = 1.0 / std::sqrt(static_cast<double>(c.map_width));
  t.a2_.resize(static_cast<size_t>(c.features) * c.map_width);
  for (double& v : t.a2_) v = s2 * rng.Normal();
  return t;
}

void SyntheticTask::Sample(Split split, uint64_t index, float* x, int32_t* label) const {
  const TaskConfig& c = config_;
  Rng rng(MixSeed(seed_, static_cast<uint64_t>(split), index));
  const int cls = static_cast<int>(rng.Below(c.classes));
  const int cluster = static_cast<int>(rng.Below(c.clusters_per_class));
  const double* center =
      &centers_[(static_cast<size_t>(cls) * c.clusters_per_class + cluster) * c.latent_dim];
  std::vector<double> z(c.latent_dim), h(c.map_width);
  for (int d = 0; d < c.latent_dim; ++d) z[d] = center[d] + c.cluster_sigma * rng.Normal();
  for (int j = 0; j < c.map_width; ++j) {
    double acc = b1_[j];
    for (int d = 0; d < c.latent_dim; ++d)
      acc += a1_[static_cast<size_t>(j) * c.latent_dim + d] * z[d];
    h[j] = std::tanh(acc);
  }
  for (int f = 0; f < c.features; ++f) {
    double acc = 0;
    for (int j = 0; j < c.map_width; ++j)
      acc += a2_[static_cast<size_t>(f) * c.map_width + j] * h[j];
    x[f] = static_cast<float>(acc);
  }
  int32_t y = cls;
  // Always draw both numbers so the stream's use does not depend on the outcome.
  const double flip = rng.Uniform();
  const int other = static_cast<int>(rng.Below(c.classes - 1));
  if (flip < c.label_noise) y = other >= cls ? other + 1 : other;
  *label = y;
}

Result<Dataset> SyntheticTask::Generate(Split split, uint64_t total, uint64_t offset,
                                        uint64_t stride) const {
  PSD_REQUIRE_ARG(stride >= 1, "SyntheticTask::Generate: stride = ", stride, "; expected >= 1");
  PSD_REQUIRE_ARG(offset < stride, "SyntheticTask::Generate: offset = ", offset,
                  "; expected < stride (", stride, ")");
  Dataset d;
  d.features = config_.features;
  d.classes = config_.classes;
  const uint64_t n = total > offset ? (total - offset + stride - 1) / stride : 0;
  d.x.resize(n * config_.features);
  d.y.resize(n);
  for (uint64_t k = 0; k < n; ++k) {
    Sample(split, offset + k * stride, &d.x[k * config_.features], &d.y[k]);
  }
  return d;
}

std::string SyntheticTask::Describe() const {
  const TaskConfig& c = config_;
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "%d classes x %d Gaussian clusters (sigma %.2f) in a %d-d latent space -> fixed "
                "random tanh map (width %d) -> %d features, %.1f%% label noise",
                c.classes, c.clusters_per_class, c.cluster_sigma, c.latent_dim, c.map_width,
                c.features, 100.0 * c.label_noise);
  return buf;
}

}  // namespace poseidon::mlp
