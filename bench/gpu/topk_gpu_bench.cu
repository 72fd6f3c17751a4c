// GPU top-k benchmarks (Google Benchmark, CUDA-event timing, manual time, medians of 5
// repetitions), with the peers in the same run:
//   BM_FusedTopK/n/density_bp       CudaKernels().FusedResidualTopK (no momentum): one streaming
//                                   pass + refine and emit on the candidates; density in
//                                   basis points (100 = 1%, 10 = 0.1%, 1 = 0.01%); the counter
//                                   cand_path is the share of calls the candidates decided
//   BM_RadixSortPairs/n             the exact baseline: cub::DeviceRadixSort::SortPairsDescending
//                                   of the magnitude keys with their indices (a full sort)
//   BM_CopyTouchedBytes/n           cudaMemcpyAsync device -> device moving the fused pass's
//                                   traffic (grad + residual read, residual written: 12n bytes,
//                                   i.e. a copy of 6n bytes), the bandwidth ceiling
// The closing table prints, per n and density, the fused time, sort / fused, and the fused
// pass's effective bandwidth as a fraction of the copy's. Exits 0 with "no GPU: skipped"
// where no GPU is usable.
//   build-cuda/bench/topk_gpu_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cub/device/device_radix_sort.cuh>
#include <map>
#include <string>
#include <vector>

#include "bench/common/preamble.h"
#include "kernels/cuda/cuda_kernels.h"
#include "runtime/cuda_util.h"

namespace poseidon {
namespace {

const int64_t kSizes[] = {1 << 20, 25000000, 100000000};
const int64_t kDensityBp[] = {100, 10, 1};

#define BENCH_CUDA(expr)                                                                 \
  do {                                                                                   \
    cudaError_t e_ = (expr);                                                             \
    if (e_ != cudaSuccess) {                                                             \
      state.SkipWithError((std::string(#expr) + ": " + cudaGetErrorString(e_)).c_str()); \
      return;                                                                            \
    }                                                                                    \
  } while (0)

// Deterministic pseudo-normal values (hash -> two uniforms -> Box-Muller), never zero.
__global__ void FillNormal(float* x, size_t n, uint32_t seed) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    uint32_t g = h * 0x846ca68bu;
    g ^= g >> 16;
    float u1 = (static_cast<float>(h >> 8) + 1.0f) / 16777217.0f;
    float u2 = static_cast<float>(g >> 8) / 16777216.0f;
    float v = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
    x[i] = v == 0.0f ? 1e-7f : v;
  }
}

__global__ void MagnitudeKeys(const float* x, uint32_t* keys, uint32_t* idx, size_t n) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    keys[i] = __float_as_uint(x[i]) & 0x7fffffffu;
    idx[i] = static_cast<uint32_t>(i);
  }
}

// Device memory freed at scope exit.
struct DevMem {
  void* p = nullptr;
  ~DevMem() {
    if (p != nullptr) cudaFree(p);
  }
};

// Event pair timing one iteration on the stream.
struct EventTimer {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventTimer() {
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
  }
  ~EventTimer() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  double Seconds() {
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    return ms / 1e3;
  }
};

void BM_FusedTopK(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const size_t k = std::max<size_t>(1, n * static_cast<size_t>(state.range(1)) / 10000);
  DevMem grad, grad2, residual, idx, val;
  BENCH_CUDA(cudaMalloc(&grad.p, n * 4));
  BENCH_CUDA(cudaMalloc(&grad2.p, n * 4));
  BENCH_CUDA(cudaMalloc(&residual.p, n * 4));
  BENCH_CUDA(cudaMalloc(&idx.p, k * 4));
  BENCH_CUDA(cudaMalloc(&val.p, k * 4));
  FillNormal<<<1024, 256>>>(static_cast<float*>(grad.p), n, 1);
  FillNormal<<<1024, 256>>>(static_cast<float*>(grad2.p), n, 3);
  FillNormal<<<1024, 256>>>(static_cast<float*>(residual.p), n, 2);
  const Kernels& kern = CudaKernels();
  auto ws = kern.NewWorkspace();
  int64_t calls = 0;
  // Two gradients in turn, so the residual moves like a training run's rather than growing
  // along one direction.
  auto step = [&] {
    const void* g = (calls++ % 2 == 0) ? grad.p : grad2.p;
    return kern.FusedResidualTopK(static_cast<const float*>(g), static_cast<float*>(residual.p),
                                  nullptr, 0.0f, n, k, static_cast<uint32_t*>(idx.p),
                                  static_cast<float*>(val.p), ws.get(), nullptr);
  };
  // Warm-up outside the timing: sizes the workspace (its one cudaMalloc) and gives the
  // threshold guess its history (the first two calls take the full path).
  for (int w = 0; w < 3; ++w) {
    Status warm = step();
    if (!warm.ok()) {
      state.SkipWithError(warm.ToString().c_str());
      return;
    }
  }
  EventTimer t;
  int64_t timed = 0, candidate_path = 0;
  for (auto _ : state) {
    cudaEventRecord(t.start);
    Status s = step();
    cudaEventRecord(t.stop);
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
    state.SetIterationTime(t.Seconds());  // waits for the stop event, so the outcome is in
    Result<CudaTopKCall> call = LastCudaTopKCall(*ws);
    ++timed;
    candidate_path += call.ok() && call->used_candidates ? 1 : 0;
  }
  // The share of timed calls the candidate buffer decided (the rest re-read the residual).
  state.counters["cand_path"] = timed > 0 ? static_cast<double>(candidate_path) / timed : 0.0;
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n) * 12);
  state.counters["k"] = static_cast<double>(k);
}

void BM_RadixSortPairs(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  DevMem x, keys_in, keys_out, vals_in, vals_out, temp;
  BENCH_CUDA(cudaMalloc(&x.p, n * 4));
  BENCH_CUDA(cudaMalloc(&keys_in.p, n * 4));
  BENCH_CUDA(cudaMalloc(&keys_out.p, n * 4));
  BENCH_CUDA(cudaMalloc(&vals_in.p, n * 4));
  BENCH_CUDA(cudaMalloc(&vals_out.p, n * 4));
  FillNormal<<<1024, 256>>>(static_cast<float*>(x.p), n, 2);
  MagnitudeKeys<<<1024, 256>>>(static_cast<float*>(x.p), static_cast<uint32_t*>(keys_in.p),
                               static_cast<uint32_t*>(vals_in.p), n);
  auto* ki = static_cast<uint32_t*>(keys_in.p);
  auto* ko = static_cast<uint32_t*>(keys_out.p);
  auto* vi = static_cast<uint32_t*>(vals_in.p);
  auto* vo = static_cast<uint32_t*>(vals_out.p);
  size_t temp_bytes = 0;
  BENCH_CUDA(cub::DeviceRadixSort::SortPairsDescending(nullptr, temp_bytes, ki, ko, vi, vo,
                                                       static_cast<int64_t>(n)));
  BENCH_CUDA(cudaMalloc(&temp.p, temp_bytes));
  EventTimer t;
  for (auto _ : state) {
    cudaEventRecord(t.start);
    // Keys 0..30 only: bit 31 (the sign) is always clear in a magnitude.
    BENCH_CUDA(cub::DeviceRadixSort::SortPairsDescending(temp.p, temp_bytes, ki, ko, vi, vo,
                                                         static_cast<int64_t>(n), 0, 31));
    cudaEventRecord(t.stop);
    state.SetIterationTime(t.Seconds());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n) * 8);
}

void BM_CopyTouchedBytes(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const size_t bytes = n * 6;  // read 6n + write 6n = the fused pass's 12n bytes of traffic
  DevMem a, b;
  BENCH_CUDA(cudaMalloc(&a.p, bytes));
  BENCH_CUDA(cudaMalloc(&b.p, bytes));
  BENCH_CUDA(cudaMemset(a.p, 1, bytes));
  EventTimer t;
  for (auto _ : state) {
    cudaEventRecord(t.start);
    BENCH_CUDA(cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice));
    cudaEventRecord(t.stop);
    state.SetIterationTime(t.Seconds());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes) *
                          2);
}

void TopKArgs(benchmark::internal::Benchmark* b) {
  for (int64_t n : kSizes) {
    for (int64_t d : kDensityBp) b->Args({n, d});
  }
}
void SizeArgs(benchmark::internal::Benchmark* b) {
  for (int64_t n : kSizes) b->Arg(n);
}

BENCHMARK(BM_FusedTopK)
    ->Apply(TopKArgs)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK(BM_RadixSortPairs)
    ->Apply(SizeArgs)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK(BM_CopyTouchedBytes)
    ->Apply(SizeArgs)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);

// Console output as usual, plus the median time per benchmark for the closing ratios.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (!run.error_occurred && run.run_type == Run::RT_Aggregate &&
          run.aggregate_name == "median" && run.iterations > 0) {
        // Keyed by function and arguments ("BM_FusedTopK/1048576/100"), without the
        // repetition and time-type suffixes.
        seconds_[run.run_name.function_name + "/" + run.run_name.args] =
            run.real_accumulated_time / run.iterations;
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }

  void PrintRatios() const {
    std::printf(
        "\nFused top-k vs peers (medians; sort/fused > 1 means the fused select is "
        "faster; bandwidth as a fraction of a device copy of the same traffic):\n");
    std::printf("  %-11s %-8s %10s %12s %10s %10s %10s\n", "n", "density", "fused ms", "sort ms",
                "sort/fused", "fused GB/s", "of copy");
    for (int64_t n : kSizes) {
      double sort = Get(StrCat("BM_RadixSortPairs/", n));
      double copy = Get(StrCat("BM_CopyTouchedBytes/", n));
      for (int64_t d : kDensityBp) {
        double fused = Get(StrCat("BM_FusedTopK/", n, "/", d));
        if (fused <= 0) continue;
        double gbs = 12.0 * static_cast<double>(n) / fused / 1e9;
        double copy_gbs = copy > 0 ? 12.0 * static_cast<double>(n) / copy / 1e9 : 0;
        std::printf("  %-11lld %6.2f%% %10.3f %12.3f %10.2f %10.1f %9.0f%%\n",
                    static_cast<long long>(n), static_cast<double>(d) / 100.0, fused * 1e3,
                    sort > 0 ? sort * 1e3 : 0.0, sort > 0 ? sort / fused : 0.0, gbs,
                    copy_gbs > 0 ? 100.0 * gbs / copy_gbs : 0.0);
      }
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
  auto count = poseidon::CudaDeviceCount();
  if (!count.ok()) {
    std::printf("topk_gpu_bench: no GPU: skipped (%s)\n", count.status().message().c_str());
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  // The preamble every benchmark prints, in Google Benchmark's context (as kernels_cpu_bench).
  const auto preamble = poseidon::bench::Preamble::Gather(
      "topk_gpu_bench", "the fused GPU top-k select beside a full radix sort and a device copy");
  for (const auto& [key, value] : preamble.BenchmarkContext()) {
    benchmark::AddCustomContext(key, value);
  }
  benchmark::AddCustomContext("gpu", poseidon::DescribeCudaDevices());
  poseidon::RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.PrintRatios();
  benchmark::Shutdown();
  return 0;
}
