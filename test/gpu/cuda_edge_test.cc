// Edge cases of the CUDA kernels against their CPU twins, through the public Kernels contract
// only (kernels/kernels.h: exact top-k, NaN above +infinity, ties to the smaller index, results
// bit-identical to CpuKernels(); NaN bits: see cuda_edge_test.h). FusedResidualTopK with and
// without momentum on NaN (several payloads, both signs), infinities, signed zeros and
// denormals; all-equal magnitudes; k == 1 and k == n; sizes that are no multiple of a vector
// width and bases off a vector boundary; one workspace through growing and shrinking calls.
// ScatterAdd on the same special values and odd sizes. Streams, a CUDA graph, n > 2^31 and the
// profiled step are in cuda_edge_test_calls.cc. Every test skips without a GPU (CUDA error given).
#include "test/gpu/cuda_edge_test.h"

namespace poseidon {
namespace {

using namespace edge_test;  // NOLINT: the helpers of this test only

class CudaEdgeTopK : public ::testing::TestWithParam<bool> {};  // the parameter: momentum

// NaNs of every payload in the gradient, the residual, both, and the momentum buffer;
// +-infinity (inf - inf gives a NaN); signed zeros; denormals whose sums cross into normals.
TEST_P(CudaEdgeTopK, SpecialValues) {
  PSD_SKIP_WITHOUT_GPU();
  const bool mom = GetParam();
  const size_t n = 777;
  for (size_t k : {size_t{1}, size_t{6}, size_t{13}, size_t{40}, n}) {
    TopKCase c = NormalCase(n, k, mom, 11, 4);
    std::vector<float>& g = c.grads[0];
    std::vector<float>& r = c.residual;
    for (size_t i = 0; i < 8; ++i) {
      (i % 2 ? g : r)[3 + 40 * i] = FromBits(kNaNs[i]);
      g[500 + i] = FromBits(kNaNs[i]);  // NaN + NaN: two payloads meet
      r[500 + i] = FromBits(kNaNs[7 - i]);
    }
    if (mom) c.momentum[9] = FromBits(kNaNs[1]);
    g[50] = kInf;
    r[60] = -kInf;
    r[70] = kInf, g[70] = -kInf;  // NaN
    r[80] = kInf, g[80] = kInf;
    r[100] = -0.0f, g[100] = -0.0f;  // -0
    r[101] = 0.0f, g[101] = -0.0f;   // +0
    r[102] = -0.0f, g[102] = 0.0f;
    r[200] = FromBits(1), g[200] = FromBits(0x80000001u);  // smallest denormals: +0
    r[201] = FromBits(0x007fffffu), g[201] = FromBits(1);  // largest denormal + 1: normal
    r[202] = FromBits(0x80000400u), g[202] = -0.0f;
    if (mom) c.momentum[203] = FromBits(0x00000007u);  // 0.9 * denormal rounds
    c.grads[1][600] = FromBits(kNaNs[5]);  // NaNs and infinities arrive in later steps too
    c.grads[2][610] = FromBits(kNaNs[6]);
    c.grads[3][620] = -kInf;
    c.grads[3][630] = FromBits(kNaNs[0]);
    ExpectTopKMatches(c, "special values");
    if (HasFatalFailure()) return;
  }
}

// Only signed zeros and denormals: magnitudes tie or differ in the last bits.
TEST_P(CudaEdgeTopK, ZerosAndDenormalsOnly) {
  PSD_SKIP_WITHOUT_GPU();
  const uint32_t levels[] = {0u, 1u, 2u, 0x400u, 0x7fffffu};
  const size_t n = 1031;
  std::mt19937 gen(5);
  auto draw = [&] {
    uint32_t b = levels[gen() % 5] | ((gen() & 1) ? 0x80000000u : 0u);
    return FromBits(b);
  };
  for (size_t k : {size_t{1}, size_t{5}, size_t{100}, n}) {
    TopKCase c;
    c.k = k;
    c.residual.resize(n);
    for (auto& x : c.residual) x = draw();
    if (GetParam()) {
      c.momentum.resize(n);
      for (auto& x : c.momentum) x = draw();
    }
    c.grads.assign(4, std::vector<float>(n));
    for (auto& gr : c.grads) {
      for (auto& x : gr) x = draw();
    }
    ExpectTopKMatches(c, "zeros and denormals");
    if (HasFatalFailure()) return;
  }
}

TEST_P(CudaEdgeTopK, AllEqualMagnitudes) {
  PSD_SKIP_WITHOUT_GPU();
  const size_t n = 10007;
  for (size_t k : {size_t{1}, size_t{100}, size_t{5003}, n - 1, n}) {
    ExpectTopKMatches(AllEqualCase(n, k, GetParam()), "all equal");
    if (HasFatalFailure()) return;
  }
}

// k == 1, k == n and between, on sizes around powers of two (never a multiple of 4 or 8 except
// the powers of two themselves).
TEST_P(CudaEdgeTopK, SmallAndOddSizes) {
  PSD_SKIP_WITHOUT_GPU();
  for (size_t n :
       {1, 2, 3, 5, 7, 8, 17, 31, 33, 127, 129, 1023, 1025, 4095, 4097, 8191, 8193, 65535, 65537}) {
    for (size_t k : {size_t{1}, n, (n + 1) / 2, std::min<size_t>(n, 33)}) {
      ExpectTopKMatches(NormalCase(n, k, GetParam(), static_cast<uint32_t>(n)), "odd sizes");
      if (HasFatalFailure()) return;
    }
  }
}

// Buffers 1, 2 and 3 floats past a vector boundary (the contract asks no alignment).
TEST_P(CudaEdgeTopK, UnalignedBases) {
  PSD_SKIP_WITHOUT_GPU();
  for (size_t offset : {1, 2, 3}) {
    ExpectTopKMatches(NormalCase(4099, 41, GetParam(), 21), "offset " + std::to_string(offset),
                      offset);
    if (HasFatalFailure()) return;
    ExpectTopKMatches(NormalCase(100003, 1000, GetParam(), 22), "offset " + std::to_string(offset),
                      offset);
    if (HasFatalFailure()) return;
  }
}

// One workspace per implementation through calls whose n and k grow, then shrink, then grow.
TEST_P(CudaEdgeTopK, WorkspaceGrowsAndShrinks) {
  PSD_SKIP_WITHOUT_GPU();
  Workspaces ws;
  const size_t shapes[][2] = {{1000, 10},   {65537, 700},  {(1 << 20) + 5, 10000},
                              {4097, 4097}, {33, 2},       {(1 << 20) + 5, 1},
                              {1, 1},       {300007, 3001}};
  uint32_t seed = 30;
  for (const auto& nk : shapes) {
    ExpectTopKMatches(NormalCase(nk[0], nk[1], GetParam(), seed++, 1), "shared workspace", 0,
                      nullptr, &ws);
    if (HasFatalFailure()) return;
  }
}

// One workspace, one n, while k and the gradient's scale jump between calls, so that anything
// a call learns from the one before (a threshold guess, a buffer size) is far off: too many
// entries reach it, then too few.
TEST_P(CudaEdgeTopK, WorkspaceAcrossShiftingCalls) {
  PSD_SKIP_WITHOUT_GPU();
  Workspaces ws;
  const size_t n = (1 << 20) + 5;
  const struct {
    size_t k;
    float scale;
  } calls[] = {{100, 1.0f}, {100, 100.0f}, {100, 1.0f}, {50000, 1.0f},
               {100, 1.0f}, {1, 1e-3f},    {n, 1.0f},   {100, 1e3f}};
  uint32_t seed = 40;
  for (const auto& c : calls) {
    ExpectTopKMatches(NormalCase(n, c.k, GetParam(), seed++, 1, c.scale), "shifting calls", 0,
                      nullptr, &ws);
    if (HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Momentum, CudaEdgeTopK, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "On" : "Off";
                         });

// ScatterAdd with special values at distinct indices (bit for bit, NaNs as above), and
// repeated indices whose sums are exact in any order (small integers and signed zeros).
TEST(CudaEdgeScatterAdd, SpecialValuesAndExactDuplicates) {
  PSD_SKIP_WITHOUT_GPU();
  const size_t n = 1001, m = 500;
  std::vector<float> dense = Normal(n, 41), val = Normal(m, 42);
  std::vector<uint32_t> idx(m);
  for (size_t j = 0; j < m; ++j) idx[j] = static_cast<uint32_t>((n - 1) - (j * 2) % n);  // n-1..
  idx[m - 1] = 0;
  auto plant = [&](size_t j, float d, float v) { dense[idx[j]] = d, val[j] = v; };
  for (size_t i = 0; i < 8; ++i) {
    plant(i, 1.0f, FromBits(kNaNs[i]));
    plant(10 + i, FromBits(kNaNs[i]), 1.0f);
    plant(20 + i, FromBits(kNaNs[i]), FromBits(kNaNs[7 - i]));
  }
  plant(30, kInf, -kInf);
  plant(31, -kInf, -kInf);
  plant(32, 2.0f, kInf);
  plant(33, -0.0f, -0.0f);
  plant(34, -0.0f, 0.0f);
  plant(35, 1.5f, -1.5f);
  plant(36, FromBits(0x007fffffu), FromBits(1));
  plant(37, FromBits(0x80000003u), FromBits(2));
  DeviceBuffer<float> d_dense(dense), d_val(val);
  DeviceBuffer<uint32_t> d_idx(idx);
  ASSERT_TRUE(Cpu().ScatterAdd(idx.data(), val.data(), m, dense.data(), n, nullptr).ok());
  Status s = Gpu().ScatterAdd(d_idx.get(), d_val.get(), m, d_dense.get(), n, nullptr);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(SameFloats(dense, d_dense.Download(), "dense (distinct indices)"));

  const size_t dm = 3001;
  std::vector<uint32_t> rep(dm);
  std::vector<float> small(dm);
  for (size_t j = 0; j < dm; ++j) {
    rep[j] = static_cast<uint32_t>((j * 7) % 50);
    small[j] =
        j % 11 == 0 ? (j % 2 ? -0.0f : 0.0f) : static_cast<float>(static_cast<int>(j % 9) - 4);
  }
  DeviceBuffer<uint32_t> d_rep(rep);
  DeviceBuffer<float> d_small(small);
  ASSERT_TRUE(Cpu().ScatterAdd(rep.data(), small.data(), dm, dense.data(), n, nullptr).ok());
  s = Gpu().ScatterAdd(d_rep.get(), d_small.get(), dm, d_dense.get(), n, nullptr);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(SameFloats(dense, d_dense.Download(), "dense (exact duplicates)"));
}

TEST(CudaEdgeScatterAdd, OddSizes) {
  PSD_SKIP_WITHOUT_GPU();
  const size_t shapes[][2] = {{1, 1}, {7, 3}, {4097, 17}, {4097, 1025}, {65537, 4099}};
  for (const auto& nm : shapes) {
    const size_t n = nm[0], m = nm[1];
    std::vector<float> dense = Normal(n, 50), val = Normal(m, 51);
    std::vector<uint32_t> idx(m);
    for (size_t j = 0; j < m; ++j) idx[j] = static_cast<uint32_t>((j * 4099 + n - 1) % n);
    DeviceBuffer<float> d_dense(dense), d_val(val);
    DeviceBuffer<uint32_t> d_idx(idx);
    ASSERT_TRUE(Cpu().ScatterAdd(idx.data(), val.data(), m, dense.data(), n, nullptr).ok());
    Status s = Gpu().ScatterAdd(d_idx.get(), d_val.get(), m, d_dense.get(), n, nullptr);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_TRUE(SameFloats(dense, d_dense.Download(), "dense n " + std::to_string(n)));
  }
}

}  // namespace
}  // namespace poseidon
