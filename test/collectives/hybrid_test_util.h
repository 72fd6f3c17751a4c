// What the HybridCollective tests (hybrid_test.cc, hybrid_topk_test.cc) share: the gradient
// formula, the world rank and size, a cross-rank equality check, layer specs, planning with the
// bytes-only model and the dense average over ranks in double.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collectives/hybrid.h"
#include "test/mpi_test_main.h"

namespace poseidon::testing {

inline float Grad(int rank, int64_t step, size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + rank * 13 + step * 5) % 17) - 8) / 8.0f;
}
inline int Rank() { return World()->rank(); }
inline int Size() { return World()->size(); }

// True when every rank holds the same bytes.
inline bool SameOnAllRanks(const void* data, size_t bytes) {
  uint64_t h = 1469598103934665603ull;
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  int64_t mine = static_cast<int64_t>(h >> 1);
  std::vector<int64_t> all(static_cast<size_t>(Size()));
  EXPECT_TRUE(World()->host_backend().AllGather(&mine, all.data(), 1, DType::kInt64).ok());
  for (int64_t v : all) {
    if (v != all[0]) return false;
  }
  return true;
}

inline std::unique_ptr<HybridCollective> MakeHybrid() {
  auto h = HybridCollective::Create(World());
  EXPECT_TRUE(h.ok()) << h.status().ToString();
  return h.ok() ? std::move(*h) : nullptr;
}

inline LayerSpec Layer(const std::string& name, std::vector<size_t> shape, LayerKind kind,
                       StrategyKind force) {
  LayerSpec l;
  l.name = name;
  l.shape = std::move(shape);
  l.kind = kind;
  l.force = force;
  return l;
}

// Plans with the bytes-only model: no probe needed, and forces decide anyway.
inline Status Plan(HybridCollective& h, size_t batch) {
  return h.BuildPlan(batch, CostModel::BytesOnly(), PlannerOptions{});
}

// The average over ranks of the dense gradients, in double.
inline std::vector<double> DenseAverage(size_t n, int64_t step) {
  std::vector<double> avg(n, 0.0);
  for (int r = 0; r < Size(); ++r) {
    for (size_t i = 0; i < n; ++i) avg[i] += Grad(r, step, i);
  }
  for (double& a : avg) a /= Size();
  return avg;
}

inline LayerSpec Sparse(const std::string& name, size_t n, double density, long long warmup = 0,
                        double momentum = 0) {
  LayerSpec l = Layer(name, {n}, LayerKind::kSparse, StrategyKind::kTopk);
  l.topk.density = density;
  l.topk.min_elements = 0;
  l.topk.warmup_steps = warmup;
  l.topk.momentum = momentum;
  return l;
}

}  // namespace poseidon::testing
