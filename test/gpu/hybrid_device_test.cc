// The hybrid collective and the engine on device memory, against the same runs on host memory
// (run at np 1 and 2, with the MPI-staged device backend so that ranks may share one GPU).
//
// Without a GPU (CI, this machine) the checks of the failure path run and must pass on every
// rank: a device collective is refused with kUnavailable everywhere, and the engine's stream
// seam reports the CUDA error. With a GPU, each strategy runs the same steps on host and on
// device: inputs are multiples of 1/8 (factors of 1/4), so sums are exact, and the results
// must be bitwise equal (allreduce, ps, topk with its residual; the optimizer kernels match
// bit for bit), except sfb, whose GEMM (cuBLAS vs BLAS) is compared to float32 rounding. The
// engine test hands gradients over on a caller stream and orders that stream after each
// handle's event: the host never waits for the exchange's transfer. DeviceHybridGraph captures
// one top-k exchange in a CUDA graph (one rank, NCCL).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "collectives/hybrid.h"
#include "engine/engine.h"
#include "engine/stream_sync.h"
#include "test/collectives/hybrid_test_util.h"
#include "test/gpu/gpu_test_util.h"
#include "test/mpi_test_main.h"

namespace poseidon {
namespace {

using testing::DeviceBuffer;
using testing::Grad;
using testing::Layer;
using testing::NoGpuReason;
using testing::World;

// The same skip decision on every rank (a rank-local skip would leave peers in a collective).
bool AnyRankWithoutGpu() {
  int mine = NoGpuReason().empty() ? 0 : 1, any = 0;
  MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, World()->mpi_comm());
  return any != 0;
}

#define PSD_SKIP_UNLESS_ALL_HAVE_GPU()                                               \
  do {                                                                               \
    if (AnyRankWithoutGpu()) GTEST_SKIP() << "a rank has no GPU: " << NoGpuReason(); \
  } while (0)

float Factor(int rank, int64_t step, size_t row, size_t col) {
  return static_cast<float>(static_cast<int>((row * 5 + col * 3 + rank * 7 + step) % 9) - 4) / 4.0f;
}
float Param(size_t i) { return 0.125f * static_cast<float>(i % 13) - 0.75f; }

// Every strategy, with and without an optimizer.
std::vector<LayerSpec> Layers() {
  std::vector<LayerSpec> v;
  v.push_back(Layer("dense", {1001}, LayerKind::kDense, StrategyKind::kAllReduce));
  LayerSpec adam = Layer("dense_adam", {777}, LayerKind::kDense, StrategyKind::kAllReduce);
  adam.optimizer = OptimizerSpec::Adam(AdamParams{});
  v.push_back(adam);
  LayerSpec ps = Layer("ps_sgd", {1001}, LayerKind::kDense, StrategyKind::kPs);
  ps.optimizer = OptimizerSpec::Sgd(SgdParams{0.1f, 0.9f, 0.0f, false});
  v.push_back(ps);
  v.push_back(Layer("fc", {12, 9}, LayerKind::kFullyConnected, StrategyKind::kSfb));
  LayerSpec fc_sgd = Layer("fc_sgd", {10, 6}, LayerKind::kFullyConnected, StrategyKind::kSfb);
  fc_sgd.optimizer = OptimizerSpec::Sgd(SgdParams{0.05f, 0.5f, 0.0f, false});
  v.push_back(fc_sgd);
  LayerSpec topk = Layer("topk", {2000}, LayerKind::kSparse, StrategyKind::kTopk);
  topk.topk.density = 0.05;
  topk.topk.min_elements = 0;
  topk.topk.warmup_steps = 1;  // step 0 is dense, then sparse
  topk.topk.momentum = 0.9;
  v.push_back(topk);
  return v;
}

constexpr size_t kBatch = 4;

// What one layer produced at one step (host copies), plus top-k's residual.
struct Outputs {
  std::vector<std::vector<float>> grad, params, residual;
};

// Runs `steps` steps of every layer on `memory` and returns the results after each step.
Outputs RunSteps(MemoryKind memory, int steps) {
  Outputs out;
  auto hc = HybridCollective::Create(World(), memory);
  EXPECT_TRUE(hc.ok()) << hc.status().ToString();
  if (!hc.ok()) return out;
  HybridCollective& h = **hc;
  const auto layers = Layers();
  for (const auto& l : layers) EXPECT_TRUE(h.RegisterLayer(l).ok()) << l.name;
  Status plan = h.BuildPlan(kBatch, CostModel::BytesOnly(), PlannerOptions{});
  EXPECT_TRUE(plan.ok()) << plan.ToString();
  const bool dev = memory == MemoryKind::kDevice;
  const int me = World()->rank();
  std::vector<std::vector<float>> params(layers.size());
  std::vector<std::unique_ptr<DeviceBuffer<float>>> d_params(layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    const size_t n = h.layer(static_cast<int>(l)).NumElements();
    params[l].resize(n);
    for (size_t i = 0; i < n; ++i) params[l][i] = Param(i);
    if (dev) d_params[l] = std::make_unique<DeviceBuffer<float>>(params[l]);
  }
  for (int64_t step = 0; step < steps; ++step) {
    for (size_t l = 0; l < layers.size(); ++l) {
      const LayerSpec& spec = h.layer(static_cast<int>(l));
      const size_t n = spec.NumElements();
      std::vector<float> g(n), u, v;
      for (size_t i = 0; i < n; ++i) g[i] = Grad(me, step, i) * static_cast<float>(1 + i % 3);
      ExchangeBuffers b;
      b.batch = 0;
      if (spec.kind == LayerKind::kFullyConnected) {
        // Rank r hands over K - r % 2 rows: a short batch on odd ranks (padded by sfb).
        b.batch = kBatch - static_cast<size_t>(me % 2);
        u.resize(b.batch * spec.rows());
        v.resize(b.batch * spec.cols());
        for (size_t r = 0; r < b.batch; ++r) {
          for (size_t c = 0; c < spec.rows(); ++c) u[r * spec.rows() + c] = Factor(me, step, r, c);
          for (size_t c = 0; c < spec.cols(); ++c) {
            v[r * spec.cols() + c] = Factor(me, step + 1, r, c);
          }
        }
      }
      const bool opt = spec.optimizer.enabled();
      if (dev) {
        DeviceBuffer<float> dg(g), du(u), dv(v);
        b.grad = dg.get();
        b.params = opt ? d_params[l]->get() : nullptr;
        b.u = u.empty() ? nullptr : du.get();
        b.v = v.empty() ? nullptr : dv.get();
        Status st = h.Exchange(static_cast<int>(l), b, step);
        EXPECT_TRUE(st.ok()) << st.ToString();
        EXPECT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(h.stream())), cudaSuccess);
        g = dg.Download();
        if (opt) params[l] = d_params[l]->Download();
      } else {
        b.grad = g.data();
        b.params = opt ? params[l].data() : nullptr;
        b.u = u.empty() ? nullptr : u.data();
        b.v = v.empty() ? nullptr : v.data();
        Status st = h.Exchange(static_cast<int>(l), b, step);
        EXPECT_TRUE(st.ok()) << st.ToString();
      }
      out.grad.push_back(opt ? std::vector<float>() : g);
      out.params.push_back(opt ? params[l] : std::vector<float>());
      auto* topk = dynamic_cast<const TopkLayerState*>(h.state(static_cast<int>(l)));
      out.residual.push_back(topk ? topk->residual() : std::vector<float>());
    }
  }
  return out;
}

void ExpectClose(const std::vector<float>& want, const std::vector<float>& got, bool bitwise,
                 const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    if (bitwise) {
      ASSERT_EQ(std::memcmp(&want[i], &got[i], sizeof(float)), 0)
          << what << "[" << i << "]: host " << want[i] << " device " << got[i];
    } else {
      ASSERT_NEAR(want[i], got[i], 1e-5 * (1.0 + std::fabs(want[i]))) << what << "[" << i << "]";
    }
  }
}

// ---- Runs everywhere: the no-GPU path. ----

TEST(DeviceHybridNoGpu, DeviceCollectiveIsRefusedOnEveryRank) {
  if (!AnyRankWithoutGpu()) GTEST_SKIP() << "every rank has a GPU: this checks the no-GPU path";
  auto hc = HybridCollective::Create(World(), MemoryKind::kDevice);
  ASSERT_FALSE(hc.ok());
  EXPECT_EQ(hc.status().code(), StatusCode::kUnavailable) << hc.status().ToString();
  // The host collective still works beside it.
  auto host = HybridCollective::Create(World(), MemoryKind::kHost);
  ASSERT_TRUE(host.ok()) << host.status().ToString();
}

TEST(DeviceHybridNoGpu, StreamSeamReportsTheCudaError) {
  if (NoGpuReason().empty()) GTEST_SKIP() << "a GPU is present: this checks the no-GPU path";
  auto ev = engine::Event::Create();
  ASSERT_FALSE(ev.ok());
  EXPECT_NE(ev.status().message().find("cudaEventCreateWithFlags"), std::string::npos)
      << ev.status().ToString();
  auto st = engine::Stream::Create();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("cudaStreamCreateWithFlags"), std::string::npos)
      << st.status().ToString();
}

// ---- With a GPU on every rank. ----

TEST(DeviceHybridGpu, EveryStrategyMatchesHost) {
  PSD_SKIP_UNLESS_ALL_HAVE_GPU();
  const int steps = 3;
  Outputs host = RunSteps(MemoryKind::kHost, steps);
  Outputs dev = RunSteps(MemoryKind::kDevice, steps);
  const auto layers = Layers();
  ASSERT_EQ(dev.grad.size(), host.grad.size());
  for (size_t k = 0; k < host.grad.size(); ++k) {
    const LayerSpec& l = layers[k % layers.size()];
    const bool bitwise = l.force != StrategyKind::kSfb;
    const std::string what = l.name + " step " + std::to_string(k / layers.size());
    ExpectClose(host.grad[k], dev.grad[k], bitwise, what + " grad");
    ExpectClose(host.params[k], dev.params[k], bitwise, what + " params");
    ExpectClose(host.residual[k], dev.residual[k], true, what + " residual");
  }
}

TEST(DeviceHybridGpu, EngineOnStreamsMatchesHost) {
  PSD_SKIP_UNLESS_ALL_HAVE_GPU();
  const int me = World()->rank();
  auto make = [](MemoryKind memory) {
    auto hc = HybridCollective::Create(World(), memory);
    EXPECT_TRUE(hc.ok()) << hc.status().ToString();
    LayerSpec sgd = Layer("w_sgd", {500}, LayerKind::kDense, StrategyKind::kAllReduce);
    sgd.optimizer = OptimizerSpec::Sgd(SgdParams{0.1f, 0.9f, 0.0f, false});
    LayerSpec topk = Layer("emb", {3000}, LayerKind::kSparse, StrategyKind::kTopk);
    topk.topk.density = 0.01;
    topk.topk.min_elements = 0;
    topk.topk.warmup_steps = 0;
    for (const LayerSpec& l :
         {Layer("a", {1001}, LayerKind::kDense, StrategyKind::kAllReduce),
          Layer("b", {7}, LayerKind::kDense, StrategyKind::kAllReduce), sgd, topk}) {
      EXPECT_TRUE((*hc)->RegisterLayer(l).ok());
    }
    EXPECT_TRUE((*hc)->BuildPlan(8, CostModel::BytesOnly(), PlannerOptions{}).ok());
    return std::move(*hc);
  };
  EngineOptions o;
  o.fusion_bytes = 64 << 10;
  o.chunk_bytes = 0;
  o.stall_warn_s = 0;
  o.stall_abort_s = 20;
  o.cycle_us = 200;
  const std::vector<size_t> sizes = {1001, 7, 500, 3000};
  const int steps = 3;
  auto input = [&](size_t l, int step) {
    std::vector<float> g(sizes[l]);
    for (size_t i = 0; i < g.size(); ++i) g[i] = Grad(me, step, i + l);
    return g;
  };

  // Host reference.
  auto host_hc = make(MemoryKind::kHost);
  std::vector<std::vector<float>> host_g(sizes.size()), host_w(1, std::vector<float>(500));
  for (size_t i = 0; i < 500; ++i) host_w[0][i] = Param(i);
  {
    auto engine = Engine::Create(World(), host_hc.get(), o);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    for (int step = 0; step < steps; ++step) {
      std::vector<HandlePtr> h;
      for (size_t l = sizes.size(); l-- > 0;) {
        host_g[l] = input(l, step);
        Gradient g;
        g.data = host_g[l].data();
        g.count = sizes[l];
        g.params = l == 2 ? host_w[0].data() : nullptr;
        h.push_back((*engine)->Submit(static_cast<int>(l), g, step));
      }
      for (auto& x : h) ASSERT_TRUE(x->Wait(30).ok()) << x->status().ToString();
    }
    ASSERT_TRUE((*engine)->Shutdown().ok());
  }

  // Device: the caller's stream produces the gradients and consumes the results.
  auto dev_hc = make(MemoryKind::kDevice);
  EngineOptions od = o;
  od.memory = MemoryKind::kDevice;
  auto engine = Engine::Create(World(), dev_hc.get(), od);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  std::vector<std::unique_ptr<DeviceBuffer<float>>> d_g;
  for (size_t s : sizes) d_g.push_back(std::make_unique<DeviceBuffer<float>>(s));
  DeviceBuffer<float> d_w(std::vector<float>(host_w[0].size()));
  std::vector<float> w0(500);
  for (size_t i = 0; i < 500; ++i) w0[i] = Param(i);
  d_w.Upload(w0);
  std::vector<std::vector<float>> staged(sizes.size());
  for (int step = 0; step < steps; ++step) {
    std::vector<HandlePtr> h(sizes.size());
    for (size_t l = sizes.size(); l-- > 0;) {
      staged[l] = input(l, step);  // kept alive until the copy has run (synchronized below)
      ASSERT_EQ(cudaMemcpyAsync(d_g[l]->get(), staged[l].data(), sizes[l] * 4,
                                cudaMemcpyHostToDevice, stream),
                cudaSuccess);
      Gradient g;
      g.data = d_g[l]->get();
      g.count = sizes[l];
      g.params = l == 2 ? d_w.get() : nullptr;
      g.stream = stream;
      h[l] = (*engine)->Submit(static_cast<int>(l), g, step);
    }
    for (size_t l = 0; l < sizes.size(); ++l) {
      ASSERT_TRUE(h[l]->WaitOnStream(stream, 30).ok()) << h[l]->status().ToString();
      EXPECT_NE(h[l]->cuda_event(), nullptr);
    }
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  }
  std::vector<std::vector<float>> got(sizes.size());
  for (size_t l = 0; l < sizes.size(); ++l) {
    got[l].resize(sizes[l]);
    ASSERT_EQ(
        cudaMemcpyAsync(got[l].data(), d_g[l]->get(), sizes[l] * 4, cudaMemcpyDeviceToHost, stream),
        cudaSuccess);
  }
  std::vector<float> got_w(500);
  ASSERT_EQ(cudaMemcpyAsync(got_w.data(), d_w.get(), 500 * 4, cudaMemcpyDeviceToHost, stream),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EngineStats st = (*engine)->stats();
  EXPECT_GT(st.fused_layers + st.direct_layers, 0);
  EXPECT_GT(st.strategy_layers, 0);  // the top-k layer
  ASSERT_TRUE((*engine)->Shutdown().ok());
  EXPECT_EQ(dev_hc->stream(), nullptr);  // the collective is back on its own stream
  for (size_t l : {size_t{0}, size_t{1}, size_t{3}}) {
    ExpectClose(host_g[l], got[l], true, "layer " + std::to_string(l));
  }
  ExpectClose(host_w[0], got_w, true, "sgd params");
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// One whole top-k exchange (fused selection, allgather, block scatter-add, average) captured in
// a CUDA graph and replayed: capture fails on any host synchronization, so this shows the step
// has none. One rank over NCCL (POSEIDON_DEVICE_BACKEND=nccl; its collectives are capturable),
// compared bit for bit with the same steps on host memory.
TEST(DeviceHybridGraph, TopkExchangeCapturesInACudaGraph) {
  PSD_SKIP_UNLESS_ALL_HAVE_GPU();
  if (World()->size() != 1) GTEST_SKIP() << "one rank: NCCL takes one GPU per rank";
  LayerSpec l = Layer("topk", {200003}, LayerKind::kSparse, StrategyKind::kTopk);
  l.topk.density = 0.01;
  l.topk.min_elements = 0;
  l.topk.warmup_steps = 0;
  l.topk.momentum = 0.9;
  auto host = HybridCollective::Create(World(), MemoryKind::kHost);
  auto dev = HybridCollective::Create(World(), MemoryKind::kDevice);
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  (*dev)->set_stream(stream);
  for (HybridCollective* h : {host->get(), dev->get()}) {
    ASSERT_TRUE(h->RegisterLayer(l).ok());
    ASSERT_TRUE(h->BuildPlan(kBatch, CostModel::BytesOnly(), PlannerOptions{}).ok());
  }
  const size_t n = l.NumElements();
  auto grad = [&](int64_t step) {
    std::vector<float> g(n);
    for (size_t i = 0; i < n; ++i) g[i] = Grad(0, step, i) * static_cast<float>(1 + i % 5);
    return g;
  };
  DeviceBuffer<float> dg(n);
  ExchangeBuffers b;
  b.grad = dg.get();
  // Step 0 outside the graph: the strategy state and the kernel workspaces are made here.
  std::vector<float> want = grad(0);
  ExchangeBuffers hb;
  hb.grad = want.data();
  ASSERT_TRUE((*host)->Exchange(0, hb, 0).ok());
  dg.Upload(grad(0));
  Status st = (*dev)->Exchange(0, b, 0);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ExpectClose(want, dg.Download(), true, "step 0 (not captured)");

  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  st = (*dev)->Exchange(0, b, 1);
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  ASSERT_TRUE(st.ok()) << "the exchange under capture: " << st.ToString();
  ASSERT_EQ(end, cudaSuccess) << "capture ended with " << cudaGetErrorString(end)
                              << ": something in the exchange synchronized with the host";
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int64_t step = 1; step <= 3; ++step) {
    want = grad(step);
    hb.grad = want.data();
    ASSERT_TRUE((*host)->Exchange(0, hb, step).ok());
    dg.Upload(grad(step));
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    ExpectClose(want, dg.Download(), true, "graph replay, step " + std::to_string(step));
    auto* hs = dynamic_cast<const TopkLayerState*>((*host)->state(0));
    auto* ds = dynamic_cast<const TopkLayerState*>((*dev)->state(0));
    ASSERT_TRUE(hs != nullptr && ds != nullptr);
    ExpectClose(hs->residual(), ds->residual(), true, "residual, step " + std::to_string(step));
  }
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  (*dev)->set_stream(nullptr);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

}  // namespace
}  // namespace poseidon
