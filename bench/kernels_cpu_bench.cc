// CPU kernel benchmarks, each next to its peer in the same run:
//  - FusedResidualTopK vs (a) memcpy of the bytes its fused pass touches (read g, read and
//    write the residual: 12 bytes per element; 20 with momentum, which also reads and writes
//    the momentum buffer), (b) the same traffic as a plain `residual += g` loop, and (c) the
//    baseline residual add + std::nth_element on the magnitudes + emission of the selection;
//  - scatter-add, the sufficient-factor GEMM (OpenBLAS, one thread), the runtime's half casts,
//    pack / unpack, SGD / Adam fused with the sum of 4 pieces.
// Sizes: 25M floats at density 0.1% and 1M floats at density 1%. After the table it prints the
// two ratios the top-k target names. Single thread: run under `taskset -c 0`.
// Every top-k benchmark first checks its selection against the baseline's on the same input.
// Google Benchmark prints the machine; bench/common's preamble adds the CPU model, kernel, MPI
// library and build to its context.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "bench/common/preamble.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/kernels.h"
#include "runtime/half_cast.h"

namespace poseidon {
namespace {

const Kernels& K() { return CpuKernels(); }

std::vector<float> RandomFloats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// (n, k) pairs of the target: 25M at 0.1%, 1M at 1%.
void TopKSizes(benchmark::internal::Benchmark* b) {
  b->Args({1 << 20, 10486});
  b->Args({25000000, 25000});
  b->Unit(benchmark::kMillisecond);
}
void Sizes(benchmark::internal::Benchmark* b) {
  b->Arg(1 << 20);
  b->Arg(25000000);
  b->Unit(benchmark::kMillisecond);
}

// The baseline: residual += g, copy the magnitudes, std::nth_element for the k-th largest,
// then emit the selection in index order (ties: smaller index) and zero it in the residual.
void BaselineTopK(const float* g, float* r, size_t n, size_t k, std::vector<float>* mag,
                  uint32_t* out_idx, float* out_val) {
  mag->resize(n);
  float* m = mag->data();
  for (size_t i = 0; i < n; ++i) {
    r[i] += g[i];
    m[i] = std::fabs(r[i]);
  }
  std::nth_element(m, m + (k - 1), m + n, std::greater<float>());
  const float t = m[k - 1];
  size_t above = 0;
  for (size_t i = 0; i < n; ++i) above += std::fabs(r[i]) > t;
  size_t need_eq = k - above;
  size_t o = 0;
  for (size_t i = 0; i < n && o < k; ++i) {
    float a = std::fabs(r[i]);
    if (a > t || (a == t && need_eq > 0 && need_eq--)) {
      out_idx[o] = static_cast<uint32_t>(i);
      out_val[o++] = r[i];
      r[i] = 0.0f;
    }
  }
}

bool SelectionsAgree(size_t n, size_t k) {
  std::vector<float> g = RandomFloats(n, 1), r1 = RandomFloats(n, 2, 0.5f), r2 = r1;
  std::vector<uint32_t> i1(k), i2(k);
  std::vector<float> v1(k), v2(k), scratch;
  auto ws = K().NewWorkspace();
  if (!K().FusedResidualTopK(g.data(), r1.data(), nullptr, 0.0f, n, k, i1.data(), v1.data(),
                             ws.get(), nullptr)
           .ok()) {
    return false;
  }
  BaselineTopK(g.data(), r2.data(), n, k, &scratch, i2.data(), v2.data());
  return i1 == i2 && v1 == v2 && r1 == r2;
}

void BM_TopKFused(benchmark::State& state) {
  const size_t n = state.range(0), k = state.range(1);
  if (!SelectionsAgree(n, k)) {
    state.SkipWithError("FusedResidualTopK disagrees with the nth_element baseline");
    return;
  }
  std::vector<float> g = RandomFloats(n, 1), r = RandomFloats(n, 2, 0.5f);
  std::vector<uint32_t> idx(k);
  std::vector<float> val(k);
  auto ws = K().NewWorkspace();
  for (auto _ : state) {
    Status s = K().FusedResidualTopK(g.data(), r.data(), nullptr, 0.0f, n, k, idx.data(),
                                     val.data(), ws.get(), nullptr);
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
    benchmark::DoNotOptimize(idx.data());
  }
  auto* cws = static_cast<cpu::TopKWorkspace*>(ws.get());
  state.counters["sampled"] = cws->last_used_sample;
  state.counters["candidates"] = static_cast<double>(cws->last_candidates);
  state.SetBytesProcessed(state.iterations() * n * 12);
  state.SetLabel(cpu::TopKIsa());
}
BENCHMARK(BM_TopKFused)->Apply(TopKSizes);

void BM_TopKFusedMomentum(benchmark::State& state) {
  const size_t n = state.range(0), k = state.range(1);
  std::vector<float> g = RandomFloats(n, 1), r = RandomFloats(n, 2, 0.5f), u(n, 0.0f);
  std::vector<uint32_t> idx(k);
  std::vector<float> val(k);
  auto ws = K().NewWorkspace();
  for (auto _ : state) {
    Status s = K().FusedResidualTopK(g.data(), r.data(), u.data(), 0.9f, n, k, idx.data(),
                                     val.data(), ws.get(), nullptr);
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
    benchmark::DoNotOptimize(idx.data());
  }
  state.SetBytesProcessed(state.iterations() * n * 20);
  state.SetLabel(cpu::TopKIsa());
}
BENCHMARK(BM_TopKFusedMomentum)->Apply(TopKSizes);

// Sparse gradients (embeddings, ReLU layers): 99.9% of the gradient entries are exact zeros
// (about one nonzero in 1000, at pseudo-random positions), the residual starts at zero, and k
// is the target's density (0.1% at 25M, 1% at 1M): at 25M about as many nonzeros as k, at 1M
// far fewer (the selection adds the lowest-index zeros); 25M with k = 12500 has twice as many
// nonzeros as k (the zeros all tie below the selection). Every call re-adds the same gradient,
// so each step sees the same counts. The peer is the nth_element baseline on the same input.
std::vector<float> SparseFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n, 0.0f);
  for (size_t i = 0; i < n; ++i) {
    if (rng() % 1000 == 0) v[i] = normal(rng);
  }
  return v;
}

bool SparseSelectionsAgree(size_t n, size_t k, bool momentum) {
  std::vector<float> g = SparseFloats(n, 21), r1(n, 0.0f), r2(n, 0.0f), u(n, 0.0f);
  std::vector<uint32_t> i1(k), i2(k);
  std::vector<float> v1(k), v2(k), scratch;
  auto ws = K().NewWorkspace();
  if (!K().FusedResidualTopK(g.data(), r1.data(), momentum ? u.data() : nullptr,
                             momentum ? 0.9f : 0.0f, n, k, i1.data(), v1.data(), ws.get(),
                             nullptr)
           .ok()) {
    return false;
  }
  // With a zero momentum buffer the first step's update is the gradient itself.
  BaselineTopK(g.data(), r2.data(), n, k, &scratch, i2.data(), v2.data());
  return i1 == i2 && v1 == v2 && r1 == r2;
}

void BM_TopKFusedSparse(benchmark::State& state) {
  const size_t n = state.range(0), k = state.range(1);
  const bool momentum = state.range(2) != 0;
  if (!SparseSelectionsAgree(n, k, momentum)) {
    state.SkipWithError("FusedResidualTopK disagrees with the nth_element baseline");
    return;
  }
  std::vector<float> g = SparseFloats(n, 21), r(n, 0.0f), u(n, 0.0f);
  std::vector<uint32_t> idx(k);
  std::vector<float> val(k);
  auto ws = K().NewWorkspace();
  for (auto _ : state) {
    Status s = K().FusedResidualTopK(g.data(), r.data(), momentum ? u.data() : nullptr,
                                     momentum ? 0.9f : 0.0f, n, k, idx.data(), val.data(),
                                     ws.get(), nullptr);
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
    benchmark::DoNotOptimize(idx.data());
  }
  auto* cws = static_cast<cpu::TopKWorkspace*>(ws.get());
  state.counters["sampled"] = cws->last_used_sample;
  state.counters["candidates"] = static_cast<double>(cws->last_candidates);
  state.SetBytesProcessed(state.iterations() * n * (momentum ? 20 : 12));
  state.SetLabel(cpu::TopKIsa());
}
BENCHMARK(BM_TopKFusedSparse)
    ->ArgNames({"n", "k", "mom"})
    ->Args({1 << 20, 10486, 0})
    ->Args({25000000, 25000, 0})
    ->Args({1 << 20, 10486, 1})
    ->Args({25000000, 25000, 1})
    ->Args({25000000, 12500, 0})
    ->Unit(benchmark::kMillisecond);

void BM_TopKNthElementBaselineSparse(benchmark::State& state) {
  const size_t n = state.range(0), k = state.range(1);
  std::vector<float> g = SparseFloats(n, 21), r(n, 0.0f), scratch;
  std::vector<uint32_t> idx(k);
  std::vector<float> val(k);
  for (auto _ : state) {
    BaselineTopK(g.data(), r.data(), n, k, &scratch, idx.data(), val.data());
    benchmark::DoNotOptimize(idx.data());
  }
  state.SetBytesProcessed(state.iterations() * n * 12);
}
BENCHMARK(BM_TopKNthElementBaselineSparse)
    ->ArgNames({"n", "k"})
    ->Args({1 << 20, 10486})
    ->Args({25000000, 25000})
    ->Args({25000000, 12500})
    ->Unit(benchmark::kMillisecond);

// Peer: memcpy of the 12 bytes per element the fused pass touches.
void BM_MemcpyTouchedBytes(benchmark::State& state) {
  const size_t n = state.range(0);
  std::vector<float> src = RandomFloats(3 * n, 3), dst(3 * n);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), 3 * n * sizeof(float));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * 12);
}
BENCHMARK(BM_MemcpyTouchedBytes)->Apply(TopKSizes);

// Peer: the same memory traffic as the fused pass without any selection.
void BM_ResidualAddOnly(benchmark::State& state) {
  const size_t n = state.range(0);
  std::vector<float> g = RandomFloats(n, 1), r = RandomFloats(n, 2);
  for (auto _ : state) {
    float* rp = r.data();
    const float* gp = g.data();
    for (size_t i = 0; i < n; ++i) rp[i] += gp[i];
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * 12);
}
BENCHMARK(BM_ResidualAddOnly)->Apply(TopKSizes);

void BM_TopKNthElementBaseline(benchmark::State& state) {
  const size_t n = state.range(0), k = state.range(1);
  std::vector<float> g = RandomFloats(n, 1), r = RandomFloats(n, 2, 0.5f), scratch;
  std::vector<uint32_t> idx(k);
  std::vector<float> val(k);
  for (auto _ : state) {
    BaselineTopK(g.data(), r.data(), n, k, &scratch, idx.data(), val.data());
    benchmark::DoNotOptimize(idx.data());
  }
  state.SetBytesProcessed(state.iterations() * n * 12);
}
BENCHMARK(BM_TopKNthElementBaseline)->Apply(TopKSizes);

void BM_ScatterAdd(benchmark::State& state) {
  const size_t n = state.range(0), m = state.range(1);
  std::mt19937 rng(5);
  std::vector<uint32_t> idx(m);
  for (uint32_t& i : idx) i = rng() % n;
  std::sort(idx.begin(), idx.end());
  std::vector<float> val = RandomFloats(m, 6), dense(n, 0.0f);
  for (auto _ : state) {
    Status s = K().ScatterAdd(idx.data(), val.data(), m, dense.data(), n, nullptr);
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * m * 8);
}
BENCHMARK(BM_ScatterAdd)->Apply(TopKSizes);

// G (m x n) += U^T V with `rows` = 32 gathered factor rows (batch x ranks).
void BM_SufficientFactorGemm(benchmark::State& state) {
  const size_t rows = 32, m = state.range(0), n = state.range(1);
  std::vector<float> u = RandomFloats(rows * m, 7), v = RandomFloats(rows * n, 8), g(m * n);
  for (auto _ : state) {
    Status s = K().SufficientFactorGemm(u.data(), v.data(), rows, m, n, 1.0f, 0.0f, g.data(),
                                        nullptr);
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * (rows * (m + n) + m * n) * 4);
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * rows * m * n * state.iterations() / 1e9,
                                                 benchmark::Counter::kIsRate);
}
BENCHMARK(BM_SufficientFactorGemm)
    ->Args({1024, 1024})    // 1M floats
    ->Args({5000, 5000})    // 25M floats
    ->Unit(benchmark::kMillisecond);

// The runtime's bulk half casts (runtime/half_cast.h: the MPI backend's float32 accumulation
// of float16 / bfloat16), to half and back.
void BM_HalfCast(benchmark::State& state, DType dtype, bool narrow) {
  const size_t n = state.range(0);
  std::vector<float> f = RandomFloats(n, 9);
  std::vector<uint16_t> h(n);
  NarrowFromFloat32(dtype, f.data(), h.data(), n);  // the half side from ordinary values
  for (auto _ : state) {
    if (narrow) {
      NarrowFromFloat32(dtype, f.data(), h.data(), n);
    } else {
      WidenToFloat32(dtype, h.data(), f.data(), n);
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * 6);
}
BENCHMARK_CAPTURE(BM_HalfCast, f32_to_f16, DType::kFloat16, true)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_HalfCast, f16_to_f32, DType::kFloat16, false)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_HalfCast, f32_to_bf16, DType::kBFloat16, true)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_HalfCast, bf16_to_f32, DType::kBFloat16, false)->Apply(Sizes);

// 64 equal parts into one fusion buffer and back.
void BM_PackUnpack(benchmark::State& state) {
  const size_t n = state.range(0), parts = 64, each = n / parts;
  std::vector<std::vector<float>> bufs(parts, std::vector<float>(each, 1.0f));
  std::vector<float> fused(each * parts);
  std::vector<ConstByteRange> in;
  std::vector<ByteRange> out;
  for (auto& b : bufs) {
    in.push_back({b.data(), each * 4});
    out.push_back({b.data(), each * 4});
  }
  for (auto _ : state) {
    Status s = K().Pack(in, fused.data(), nullptr);
    Status t = K().Unpack(fused.data(), out, nullptr);
    if (!s.ok() || !t.ok()) state.SkipWithError("pack / unpack failed");
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * each * parts * 4 * 2);
}
BENCHMARK(BM_PackUnpack)->Apply(Sizes);

constexpr int kPieces = 4;

void BM_SgdStep(benchmark::State& state) {
  const size_t n = state.range(0);
  std::vector<float> grads = RandomFloats(kPieces * n, 10), p = RandomFloats(n, 11), v(n, 0.0f);
  SgdParams sp;
  sp.weight_decay = 1e-4f;
  for (auto _ : state) {
    Status s = K().SgdStep(p.data(), grads.data(), kPieces, n, 0.25f, v.data(), n, sp, nullptr);
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * 4 * (kPieces + 4));
}
BENCHMARK(BM_SgdStep)->Apply(Sizes);

// One summed gradient, plain momentum: the step the engine's fused exchange takes from the
// window's sum (a single pass, optimizer.cc).
void BM_SgdStepOneGradient(benchmark::State& state) {
  const size_t n = state.range(0);
  std::vector<float> grad = RandomFloats(n, 14), p = RandomFloats(n, 15), v(n, 0.0f);
  SgdParams sp;
  sp.momentum = 0.9f;
  for (auto _ : state) {
    Status s = K().SgdStep(p.data(), grad.data(), 1, n, 0.25f, v.data(), n, sp, nullptr);
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * 4 * 5);
}
BENCHMARK(BM_SgdStepOneGradient)->Apply(Sizes);

void BM_AdamStep(benchmark::State& state) {
  const size_t n = state.range(0);
  std::vector<float> grads = RandomFloats(kPieces * n, 12), p = RandomFloats(n, 13);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  AdamParams ap;
  for (auto _ : state) {
    Status s = K().AdamStep(p.data(), grads.data(), kPieces, n, 0.25f, m.data(), v.data(), n, ap,
                            nullptr);
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * 4 * (kPieces + 6));
}
BENCHMARK(BM_AdamStep)->Apply(Sizes);

// Console output as usual, plus the mean real time per run name for the closing ratios.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (!run.error_occurred && run.run_type == Run::RT_Iteration) {
        seconds_[run.benchmark_name()] = run.real_accumulated_time / run.iterations;
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }
  void PrintRatios() const {
    std::printf("\nTop-k targets (one thread; time ratios, lower is better for the first):\n");
    for (const char* args : {"1048576/10486", "25000000/25000"}) {
      const std::string a = args;
      double topk = Get("BM_TopKFused/" + a), copy = Get("BM_MemcpyTouchedBytes/" + a);
      double add = Get("BM_ResidualAddOnly/" + a), base = Get("BM_TopKNthElementBaseline/" + a);
      if (topk <= 0) continue;
      std::printf("  n/k = %-16s fused top-k %8.2f ms | / memcpy of touched bytes %5.2fx "
                  "(target <= 2) | / residual-add-only %5.2fx | nth_element baseline / fused "
                  "%5.2fx (target >= 5)\n",
                  args, topk * 1e3, copy > 0 ? topk / copy : 0.0, add > 0 ? topk / add : 0.0,
                  base > 0 ? base / topk : 0.0);
    }
    std::printf("Sparse gradients (99.9%% zeros, no momentum):\n");
    for (const char* args : {"n:1048576/k:10486", "n:25000000/k:25000", "n:25000000/k:12500"}) {
      const std::string a = args;
      double topk = Get("BM_TopKFusedSparse/" + a + "/mom:0");
      double base = Get("BM_TopKNthElementBaselineSparse/" + a);
      if (topk <= 0) continue;
      std::printf("  %-20s fused top-k %8.2f ms | nth_element baseline / fused %5.2fx\n", args,
                  topk * 1e3, base > 0 ? base / topk : 0.0);
    }
  }

 private:
  double Get(const std::string& name) const {
    auto it = seconds_.find(name);
    return it == seconds_.end() ? -1.0 : it->second;
  }
  std::map<std::string, double> seconds_;
};

}  // namespace
}  // namespace poseidon

int main(int argc, char** argv) {
  openblas_set_num_threads(1);  // single-thread figures, comparable with the other kernels
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  const auto preamble = poseidon::bench::Preamble::Gather(
      "kernels_cpu_bench", "the CPU kernels, each beside its peer, one thread");
  for (const auto& [key, value] : preamble.BenchmarkContext()) {
    benchmark::AddCustomContext(key, value);
  }
  poseidon::RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.PrintRatios();
  benchmark::Shutdown();
  return 0;
}
