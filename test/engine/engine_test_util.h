// What the engine tests (engine_test.cc, engine_faults_test.cc) share: gradients with exact
// averages, a planned all-allreduce collective and the engine options and factory they use.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "collectives/hybrid.h"
#include "engine/engine.h"
#include "test/mpi_test_main.h"

namespace poseidon::testing {

inline float F(size_t i) { return static_cast<float>(i % 5 + 1); }

// A collective with dense layers of the given sizes, planned (all allreduce) without a probe.
inline std::unique_ptr<HybridCollective> MakeCollective(const std::vector<size_t>& sizes) {
  auto hc = HybridCollective::Create(World());
  EXPECT_TRUE(hc.ok()) << hc.status().ToString();
  for (size_t i = 0; i < sizes.size(); ++i) {
    LayerSpec s;
    s.name = "l" + std::to_string(i);
    s.shape = {sizes[i]};
    auto id = (*hc)->RegisterLayer(s);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
  }
  PlannerOptions po;
  Status st = (*hc)->BuildPlan(32, CostModel::Network(25e-6, 1.25e9), po);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return std::move(*hc);
}

inline EngineOptions Options(long long fusion, long long chunk) {
  EngineOptions o;
  o.fusion_bytes = fusion;
  o.chunk_bytes = chunk;
  o.stall_warn_s = 0;
  o.stall_abort_s = 20;  // far above any test's time: a hang still ends
  o.cycle_us = 200;
  return o;
}

inline std::vector<float> Grad(size_t n, int rank, int step) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = static_cast<float>(rank + 1 + step) * F(i);
  return g;
}

inline float Expected(size_t i, int world, int step) {
  float sum = 0;
  for (int r = 0; r < world; ++r) sum += static_cast<float>(r + 1 + step) * F(i);
  return sum * (1.0f / static_cast<float>(world));
}

inline std::unique_ptr<Engine> MakeEngine(HybridCollective* hc, const EngineOptions& o) {
  auto e = Engine::Create(World(), hc, o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(*e) : nullptr;
}

// A handle reads complete (Test, Wait) before its completion callback has run: Complete sets
// the status, wakes the waiters, then runs the callback. The count of callbacks that have run
// once it reaches `want` or 20 s pass.
inline int CallbacksRun(const std::atomic<int>& count, int want) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (count.load() < want && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return count.load();
}

}  // namespace poseidon::testing
