// Edge cases of how the CUDA kernels are called, against their CPU twins (public Kernels
// contract only; see cuda_edge_test.h): a created non-blocking stream whose results are read
// after synchronizing that stream alone; one FusedResidualTopK call captured into a CUDA graph
// and launched twice; large sizes, n > 2^31 among them (it needs about 26 GiB of device memory
// and 18 GiB of host memory, and skips, saying so, where there is less). Every test skips
// without a GPU, giving the CUDA error.
//
// CudaEdgeProfile.DISABLED_OneStep25M is no check: it brackets one 25M-entry, 0.1% step with
// cudaProfilerStart / Stop for `ncu --profile-from-start off` (run it with
// --gtest_also_run_disabled_tests; scripts/gpu-first-run.sh does).
#include <cuda_profiler_api.h>
#include <unistd.h>

#include "test/gpu/cuda_edge_test.h"

namespace poseidon {
namespace {

using namespace edge_test;  // NOLINT: the helpers of this test only

// A TopKCase on the device, stepped together with its CPU twin, plus a dense buffer that
// receives each step's (index, value) pairs through ScatterAdd.
struct Pair {
  TopKCase c;
  size_t n, k;
  bool mom;
  std::vector<float> dense;
  DeviceBuffer<float> grad, res, mbuf, val, d_dense;
  DeviceBuffer<uint32_t> idx;
  Workspaces ws;
  explicit Pair(TopKCase tc)
      : c(std::move(tc)),
        n(c.residual.size()),
        k(c.k),
        mom(!c.momentum.empty()),
        dense(Normal(n, 99)),
        grad(n),
        res(n),
        mbuf(mom ? n : 0),
        val(k),
        d_dense(n),
        idx(k) {}
  // The buffers before the first step, on stream s.
  void Upload(cudaStream_t s) {
    Put(res.get(), c.residual, s);
    if (mom) Put(mbuf.get(), c.momentum, s);
    Put(d_dense.get(), dense, s);
  }
  // This step's gradient, and the outputs poisoned, on stream s.
  void Prepare(size_t step, cudaStream_t s) {
    Put(grad.get(), c.grads[step], s);
    EDGE_CUDA(cudaMemsetAsync(idx.get(), 0xff, k * sizeof(uint32_t), s));
    EDGE_CUDA(cudaMemsetAsync(val.get(), 0xff, k * sizeof(float), s));
  }
  Status GpuTopK(cudaStream_t s) {
    return Gpu().FusedResidualTopK(grad.get(), res.get(), mom ? mbuf.get() : nullptr,
                                   mom ? c.m : 0.0f, n, k, idx.get(), val.get(), ws.gpu.get(), s);
  }
  // The CPU step (top-k, then ScatterAdd of its output into dense), then the comparison of
  // everything, read back on stream s with a wait on s alone.
  void CpuStepAndCompare(size_t step, bool scatter, const std::string& what, cudaStream_t s) {
    const std::string at = what + (mom ? ", momentum" : "") + ", step " + std::to_string(step);
    std::vector<uint32_t> want_idx(k);
    std::vector<float> want_val(k);
    Status cs = Cpu().FusedResidualTopK(c.grads[step].data(), c.residual.data(),
                                        mom ? c.momentum.data() : nullptr, mom ? c.m : 0.0f, n, k,
                                        want_idx.data(), want_val.data(), ws.cpu.get(), nullptr);
    ASSERT_TRUE(cs.ok()) << at << ": " << cs.ToString();
    ASSERT_TRUE(SameIndices(want_idx, Get(idx.get(), k, s), at));
    ASSERT_TRUE(SameFloats(want_val, Get(val.get(), k, s), at + " values"));
    ASSERT_TRUE(SameFloats(c.residual, Get(res.get(), n, s), at + " residual"));
    if (mom) {
      ASSERT_TRUE(SameFloats(c.momentum, Get(mbuf.get(), n, s), at + " momentum"));
    }
    if (!scatter) return;
    ASSERT_TRUE(
        Cpu().ScatterAdd(want_idx.data(), want_val.data(), k, dense.data(), n, nullptr).ok());
    ASSERT_TRUE(SameFloats(dense, Get(d_dense.get(), n, s), at + " scattered"));
  }
};

// A step's work on a created non-blocking stream: uploads, top-k, ScatterAdd of its output,
// copies back, and a wait on that stream only (never the device or the default stream). The
// step is large enough (2^24 entries) to be still running when the copies back are queued.
TEST(CudaEdgeStream, NonBlockingStreamOnly) {
  PSD_SKIP_WITHOUT_GPU();
  for (bool mom : {false, true}) {
    Stream st;
    ASSERT_NE(st.s, nullptr);
    Pair p(NormalCase((size_t{1} << 24) + 3, 16411, mom, 60));
    p.Upload(st.s);
    for (size_t step = 0; step < p.c.grads.size(); ++step) {
      p.Prepare(step, st.s);
      Status s = p.GpuTopK(st.s);
      ASSERT_TRUE(s.ok()) << s.ToString();
      s = Gpu().ScatterAdd(p.idx.get(), p.val.get(), p.k, p.d_dense.get(), p.n, st.s);
      ASSERT_TRUE(s.ok()) << s.ToString();
      p.CpuStepAndCompare(step, /*scatter=*/true, "non-blocking stream", st.s);
      if (HasFatalFailure()) return;
    }
  }
}

// Owns a captured graph and its executable form.
struct Graph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~Graph() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
};

// One FusedResidualTopK call captured into a CUDA graph (a non-blocking stream, global capture
// mode) after an ordinary call with the same n and k sized the workspace; the graph then runs
// twice, each launch compared with a CPU step. A call that allocates, synchronizes or waits
// for the host while the stream is captured fails here, naming the error.
TEST(CudaEdgeGraph, CapturedTopKRunsTwice) {
  PSD_SKIP_WITHOUT_GPU();
  for (bool mom : {false, true}) {
    Stream st;
    ASSERT_NE(st.s, nullptr);
    Pair p(NormalCase(300007, 3001, mom, 80, 3));
    p.Upload(st.s);
    p.Prepare(0, st.s);
    Status s = p.GpuTopK(st.s);  // sizes the workspace
    ASSERT_TRUE(s.ok()) << s.ToString();
    p.CpuStepAndCompare(0, false, "before capture", st.s);
    if (HasFatalFailure()) return;

    Graph g;
    EDGE_CUDA(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeGlobal));
    s = p.GpuTopK(st.s);
    cudaError_t end = cudaStreamEndCapture(st.s, &g.graph);
    (void)cudaGetLastError();  // a failed capture leaves a non-sticky error behind
    ASSERT_TRUE(s.ok()) << "FusedResidualTopK while the stream is captured: " << s.ToString();
    ASSERT_EQ(end, cudaSuccess) << "cudaStreamEndCapture: " << cudaGetErrorString(end)
                                << " (the call did something a graph cannot hold)";
    ASSERT_NE(g.graph, nullptr);
    size_t nodes = 0;
    EDGE_CUDA(cudaGraphGetNodes(g.graph, nullptr, &nodes));
    std::printf("[   NOTE   ] the captured top-k step is a graph of %zu nodes\n", nodes);
    EDGE_CUDA(cudaGraphInstantiate(&g.exec, g.graph, 0));
    for (size_t step = 1; step <= 2; ++step) {
      p.Prepare(step, st.s);
      EDGE_CUDA(cudaGraphLaunch(g.exec, st.s));
      p.CpuStepAndCompare(step, false, "graph launch " + std::to_string(step), st.s);
      if (HasFatalFailure()) return;
    }
  }
}

// Large sizes: ties across many blocks, and an odd size past 2^20.
TEST(CudaEdgeBig, AllEqualMagnitudes4M) {
  PSD_SKIP_WITHOUT_GPU();
  const size_t n = (size_t{1} << 22) + 3;
  for (bool mom : {false, true}) {
    for (size_t k : {size_t{4096}, n / 2 + 1}) {
      ExpectTopKMatches(AllEqualCase(n, k, mom), "all equal");
      if (HasFatalFailure()) return;
    }
  }
}

TEST(CudaEdgeBig, OddSize1M) {
  PSD_SKIP_WITHOUT_GPU();
  const size_t n = (size_t{1} << 20) + 7;
  for (bool mom : {false, true}) {
    for (size_t k : {size_t{1}, size_t{1049}, n}) {
      ExpectTopKMatches(NormalCase(n, k, mom, 90), "odd size");
      if (HasFatalFailure()) return;
    }
  }
}

// Skips unless the device has `device_bytes` free and the host `host_bytes` in all.
#define EDGE_SKIP_WITHOUT_MEMORY(device_bytes, host_bytes)                                     \
  do {                                                                                         \
    size_t free_ = 0, total_ = 0;                                                              \
    EDGE_CUDA(cudaMemGetInfo(&free_, &total_));                                                \
    if (free_ < (device_bytes)) {                                                              \
      GTEST_SKIP() << "device memory: " << GiB(free_) << " free of " << GiB(total_)            \
                   << ", this test needs about " << GiB(device_bytes);                         \
    }                                                                                          \
    const double host_ = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE); \
    if (host_ < static_cast<double>(host_bytes)) {                                             \
      GTEST_SKIP() << "host memory: " << GiB(host_) << ", this test needs about "              \
                   << GiB(host_bytes);                                                         \
    }                                                                                          \
  } while (0)

// n > 2^31 (indices past the int32 range, n odd): top-k with ties at equal magnitudes on both
// sides of 2^31 and a NaN past it, then ScatterAdd at indices on both sides, then the whole
// residual compared chunk by chunk. The gradient from a hash with 2^22 magnitude levels and the
// residual zero, so about 500 entries share each magnitude, all over the index range: the k-th
// magnitude ties across the boundary too. No momentum (it would need 9 GiB more each side).
TEST(CudaEdgeBig, MoreThan2To31Entries) {
  PSD_SKIP_WITHOUT_GPU();
  const size_t two31 = size_t{1} << 31, n = two31 + 4099, k = 1000, bytes = n * sizeof(float);
  // grad and residual, and room for a workspace as large as one of them.
  EDGE_SKIP_WITHOUT_MEMORY(3 * bytes + (size_t{1} << 30), 2 * bytes + (size_t{4} << 30));
  std::vector<float> grad(n), residual(n);
  HashFill(&grad, 1);
  for (size_t i : {size_t{3}, two31 - 1, two31, two31 + 1, two31 + 5, n - 1}) {
    residual[i] = 0.0f;
    grad[i] = (i % 2) ? -1e6f : 1e6f;  // equal magnitudes: all six are selected
  }
  grad[two31 + 2] = FromBits(kNaNs[2]);
  DeviceBuffer<float> d_grad(n), d_res(n), d_val(k);
  DeviceBuffer<uint32_t> d_idx(k);
  ASSERT_NE(d_grad.get(), nullptr);
  ASSERT_NE(d_res.get(), nullptr);
  EDGE_CUDA(cudaMemcpy(d_grad.get(), grad.data(), bytes, cudaMemcpyHostToDevice));
  EDGE_CUDA(cudaMemcpy(d_res.get(), residual.data(), bytes, cudaMemcpyHostToDevice));
  Workspaces ws;
  std::vector<uint32_t> idx(k);
  std::vector<float> val(k);
  Status s = Gpu().FusedResidualTopK(d_grad.get(), d_res.get(), nullptr, 0.0f, n, k, d_idx.get(),
                                     d_val.get(), ws.gpu.get(), nullptr);
  ASSERT_TRUE(s.ok()) << s.ToString();
  s = Cpu().FusedResidualTopK(grad.data(), residual.data(), nullptr, 0.0f, n, k, idx.data(),
                              val.data(), ws.cpu.get(), nullptr);
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::vector<uint32_t> got_idx = Get(d_idx.get(), k, nullptr);
  ASSERT_TRUE(SameIndices(idx, got_idx, "n > 2^31"));
  ASSERT_TRUE(SameFloats(val, Get(d_val.get(), k, nullptr), "n > 2^31 values"));
  EXPECT_GE(got_idx.back(), two31) << "the selection should reach past 2^31";

  // Distinct indices n - 1, n - 1 - 2^19, ..., 4098: half of them past 2^31.
  const size_t m = 4097;
  std::vector<uint32_t> sidx(m);
  for (size_t j = 0; j < m; ++j) sidx[j] = static_cast<uint32_t>(n - 1 - j * (size_t{1} << 19));
  std::vector<float> sval = Normal(m, 3);
  DeviceBuffer<uint32_t> d_sidx(sidx);
  DeviceBuffer<float> d_sval(sval);
  s = Gpu().ScatterAdd(d_sidx.get(), d_sval.get(), m, d_res.get(), n, nullptr);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(Cpu().ScatterAdd(sidx.data(), sval.data(), m, residual.data(), n, nullptr).ok());

  std::vector<float> chunk(size_t{1} << 26);
  for (size_t at = 0; at < n; at += chunk.size()) {
    const size_t len = std::min(chunk.size(), n - at);
    EDGE_CUDA(
        cudaMemcpy(chunk.data(), d_res.get() + at, len * sizeof(float), cudaMemcpyDeviceToHost));
    ASSERT_TRUE(SameFloats(residual.data() + at, chunk.data(), len, "n > 2^31 residual", at));
  }
}

// Not a check: one 25M-entry step at 0.1% density bracketed for the profiler, after a step
// that sized the workspace.
TEST(CudaEdgeProfile, DISABLED_OneStep25M) {
  PSD_SKIP_WITHOUT_GPU();
  const size_t n = 25000000, k = n / 1000;
  std::vector<float> grad(n), residual(n);
  HashFill(&grad, 5);
  HashFill(&residual, 6);
  DeviceBuffer<float> d_grad(grad), d_res(residual), d_val(k);
  DeviceBuffer<uint32_t> d_idx(k);
  Workspaces ws;
  auto step = [&] {
    return Gpu().FusedResidualTopK(d_grad.get(), d_res.get(), nullptr, 0.0f, n, k, d_idx.get(),
                                   d_val.get(), ws.gpu.get(), nullptr);
  };
  Status s = step();
  ASSERT_TRUE(s.ok()) << s.ToString();
  EDGE_CUDA(cudaDeviceSynchronize());
  EDGE_CUDA(cudaProfilerStart());
  s = step();
  EDGE_CUDA(cudaDeviceSynchronize());
  EDGE_CUDA(cudaProfilerStop());
  ASSERT_TRUE(s.ok()) << s.ToString();
}

}  // namespace
}  // namespace poseidon
