// Multi-rank tests of the device backends (run at np 1, 2, 4).
//
// Without a GPU (CI, this machine) they check the failure path, which must be clean on every
// rank: Communicator::backend(kDevice), NcclBackend::Create and StagedBackend::Create return
// kUnavailable with the CUDA error, nobody hangs. With a GPU they check every collective of the
// backend the communicator picks (NCCL at P = 1 with one GPU, MPI-staged when ranks share a
// GPU, P = 2 and 4) and of the staged backend directly, against exact values: rank r
// contributes (r + 1) * f(i) with small integers f(i), so sums are exact in every dtype. More
// GPU cases: half-precision sums accumulate in float32 (values whose half-precision sum in any
// order differs from the float32 one, at P = 3, 4, 5), ReduceScatter with any counts, repeated
// calls in steady state (no device allocation at P = 1), and deadlines at P = 1 (a stream held
// by a host function is a peer that never arrives).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "runtime/build_config.h"
#include "runtime/half.h"
#include "runtime/shard.h"
#include "runtime/staged_backend.h"
#include "test/gpu/gpu_test_util.h"
#include "test/mpi_test_main.h"
#if POSEIDON_NCCL_ENABLED
#include "runtime/nccl_backend.h"
#endif

namespace poseidon {
namespace {

using testing::DeviceBuffer;
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

TEST(DeviceBackendNoGpu, CommunicatorReportsUnavailableOnEveryRank) {
  if (!AnyRankWithoutGpu()) GTEST_SKIP() << "every rank has a GPU: this checks the no-GPU path";
  auto b = World()->backend(MemoryKind::kDevice);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kUnavailable) << b.status().ToString();
  EXPECT_NE(b.status().message().find("Communicator::backend(device)"), std::string::npos)
      << b.status().message();
  // The answer is kept: a second call gives the same error without another collective.
  auto again = World()->backend(MemoryKind::kDevice);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().message(), b.status().message());
  // Host memory still works.
  auto host = World()->backend(MemoryKind::kHost);
  ASSERT_TRUE(host.ok());
  int one = 1, sum = 0;
  ASSERT_TRUE((*host)->AllReduce(&one, &sum, 1, DType::kInt32).ok());
  EXPECT_EQ(sum, World()->size());
}

TEST(DeviceBackendNoGpu, BackendsRefuseCreationCleanly) {
  if (!AnyRankWithoutGpu()) GTEST_SKIP() << "every rank has a GPU: this checks the no-GPU path";
  auto* mpi = static_cast<MpiBackend*>(&World()->host_backend());
  auto staged = StagedBackend::Create(mpi);
  ASSERT_FALSE(staged.ok());
  EXPECT_EQ(staged.status().code(), StatusCode::kUnavailable) << staged.status().ToString();
  EXPECT_NE(staged.status().message().find("cudaGetDeviceCount"), std::string::npos)
      << staged.status().message();
#if POSEIDON_NCCL_ENABLED
  auto nccl = NcclBackend::Create(World()->mpi_comm());
  ASSERT_FALSE(nccl.ok());
  EXPECT_EQ(nccl.status().code(), StatusCode::kUnavailable) << nccl.status().ToString();
  EXPECT_NE(nccl.status().message().find("NcclBackend::Create"), std::string::npos)
      << nccl.status().message();
#endif
}

TEST(DeviceBackendArgs, UnknownMemoryKindIsAnError) {
  auto b = World()->backend(static_cast<MemoryKind>(7));
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
}

// ---- With a GPU on every rank. ----

float F(size_t i) { return static_cast<float>(i % 7 + 1); }

std::vector<float> Contribution(size_t n, int rank, size_t offset = 0) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(rank + 1) * F(offset + i);
  return v;
}

float Triangle(int p) { return p * (p + 1) / 2.0f; }

const size_t kCounts[] = {0, 1, 7, 1001, (1u << 18) + 3};

void CheckCollectives(Backend& be) {
  const int p = be.size(), r = be.rank();
  CallOptions dev{MemoryKind::kDevice, nullptr};
  for (size_t n : kCounts) {
    SCOPED_TRACE(::testing::Message() << be.name() << " n=" << n);
    // AllReduce, out of place then in place.
    DeviceBuffer<float> send(Contribution(n, r)), recv(n);
    ASSERT_TRUE(be.AllReduce(send.get(), recv.get(), n, DType::kFloat32, dev).ok());
    std::vector<float> got = recv.Download();
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], Triangle(p) * F(i)) << i;
    ASSERT_TRUE(be.AllReduce(send.get(), send.get(), n, DType::kFloat32, dev).ok());
    ASSERT_EQ(send.Download(), got);

    // ReduceScatter with Poseidon's uneven shards.
    std::vector<size_t> counts = ShardCounts(n, p);
    size_t mine = counts[static_cast<size_t>(r)], off = ShardOffset(n, p, r);
    DeviceBuffer<float> full(Contribution(n, r)), shard(mine);
    ASSERT_TRUE(be.ReduceScatter(full.get(), shard.get(), counts, DType::kFloat32, dev).ok());
    got = shard.Download();
    for (size_t i = 0; i < mine; ++i) ASSERT_EQ(got[i], Triangle(p) * F(off + i)) << i;

    // AllGatherV of each rank's shard, then AllGather of equal pieces.
    DeviceBuffer<float> piece(Contribution(mine, r, off)), all(n);
    ASSERT_TRUE(be.AllGatherV(piece.get(), all.get(), counts, DType::kFloat32, dev).ok());
    got = all.Download();
    for (int q = 0; q < p; ++q) {
      size_t o = ShardOffset(n, p, q);
      for (size_t i = 0; i < counts[static_cast<size_t>(q)]; ++i) {
        ASSERT_EQ(got[o + i], static_cast<float>(q + 1) * F(o + i)) << "rank " << q;
      }
    }
    DeviceBuffer<float> eq(Contribution(n, r)), gathered(n * static_cast<size_t>(p));
    ASSERT_TRUE(be.AllGather(eq.get(), gathered.get(), n, DType::kFloat32, dev).ok());
    got = gathered.Download();
    for (int q = 0; q < p; ++q) {
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(got[static_cast<size_t>(q) * n + i], static_cast<float>(q + 1) * F(i));
      }
    }

    // Broadcast from the last rank.
    DeviceBuffer<float> bc(Contribution(n, r));
    ASSERT_TRUE(be.Broadcast(bc.get(), n, DType::kFloat32, p - 1, dev).ok());
    ASSERT_EQ(bc.Download(), Contribution(n, p - 1));

    // The non-blocking allreduce.
    DeviceBuffer<float> s2(Contribution(n, r)), r2(n);
    auto q1 = be.IAllReduce(s2.get(), r2.get(), n, DType::kFloat32, dev);
    ASSERT_TRUE(q1.ok()) << q1.status().ToString();
    ASSERT_TRUE((*q1)->Wait().ok());
    got = r2.Download();
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], Triangle(p) * F(i));
  }
  // float16: sums of small integers are exact.
  const size_t n = 999;
  std::vector<uint16_t> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = FloatToHalf(static_cast<float>(r + 1) * F(i));
  DeviceBuffer<uint16_t> dh(h);
  ASSERT_TRUE(be.AllReduce(dh.get(), dh.get(), n, DType::kFloat16, dev).ok());
  std::vector<uint16_t> hs = dh.Download();
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(HalfToFloat(hs[i]), Triangle(p) * F(i)) << i;
  ASSERT_TRUE(be.Barrier().ok());
}

TEST(DeviceBackendGpu, CommunicatorBackendCollectives) {
  PSD_SKIP_UNLESS_ALL_HAVE_GPU();
  auto b = World()->backend(MemoryKind::kDevice);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_TRUE((*b)->SupportsMemory(MemoryKind::kDevice));
  CheckCollectives(**b);
}

TEST(DeviceBackendGpu, StagedBackendCollectives) {
  PSD_SKIP_UNLESS_ALL_HAVE_GPU();
  auto staged = StagedBackend::Create(static_cast<MpiBackend*>(&World()->host_backend()));
  ASSERT_TRUE(staged.ok()) << staged.status().ToString();
  CheckCollectives(**staged);
}

// ---- Half precision accumulates in float32 (the Backend contract). ----

// One contribution per rank (by world size) whose sum, rounded once, no order or association of
// half-precision additions reaches (every order was tried when they were chosen), so a backend
// summing in the element type fails these. At P <= 2 no such values exist (one addition rounds
// once); other sizes use exact small integers.
const std::map<int, std::vector<float>> kFloat16Case = {{3, {2600, 223.5f, 2422}},
                                                       {4, {3102, 2658, 2530, -407.5f}}};
const std::map<int, std::vector<float>> kBFloat16Case = {
    {3, {-490, 23.75f, 101}}, {4, {-12.25f, 230, -69, 178}}, {5, {430, 384, 158, -326, 15.75f}}};

uint16_t ToHalf(DType d, float f) {
  return d == DType::kFloat16 ? FloatToHalf(f) : FloatToBFloat16(f);
}
float FromHalf(DType d, uint16_t h) {
  return d == DType::kFloat16 ? HalfToFloat(h) : BFloat16ToFloat(h);
}

void CheckHalfSums(Backend& be, DType d) {
  const int p = be.size(), r = be.rank();
  const auto& table = d == DType::kFloat16 ? kFloat16Case : kBFloat16Case;
  auto it = table.find(p);
  std::vector<float> per_rank(static_cast<size_t>(p));
  for (int q = 0; q < p; ++q) {
    per_rank[static_cast<size_t>(q)] = it != table.end() ? it->second[static_cast<size_t>(q)]
                                                         : static_cast<float>(q + 1);
  }
  float sum = 0;  // exact in float32: multiples of 1/4 far below 2^24
  for (float v : per_rank) sum += v;
  const float want = FromHalf(d, ToHalf(d, sum));  // rounded once
  SCOPED_TRACE(::testing::Message() << be.name() << " " << DTypeName(d) << " P=" << p
                                    << " sum " << sum << " -> " << want);
  CallOptions dev{MemoryKind::kDevice, nullptr};
  const size_t n = 4099;  // several NCCL chunks: each may start its ring at another rank
  const uint16_t mine = ToHalf(d, per_rank[static_cast<size_t>(r)]);
  DeviceBuffer<uint16_t> send(std::vector<uint16_t>(n, mine)), recv(n);
  ASSERT_TRUE(be.AllReduce(send.get(), recv.get(), n, d, dev).ok());
  for (uint16_t h : recv.Download()) ASSERT_EQ(FromHalf(d, h), want);
  auto q = be.IAllReduce(send.get(), send.get(), n, d, dev);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  ASSERT_TRUE((*q)->Wait().ok());
  for (uint16_t h : send.Download()) ASSERT_EQ(FromHalf(d, h), want);
  // ReduceScatter, uneven (Poseidon's shards) and even.
  for (size_t total : {n, static_cast<size_t>(p) * 1000}) {
    std::vector<size_t> counts = ShardCounts(total, p);
    DeviceBuffer<uint16_t> full(std::vector<uint16_t>(total, mine));
    DeviceBuffer<uint16_t> shard(counts[static_cast<size_t>(r)]);
    ASSERT_TRUE(be.ReduceScatter(full.get(), shard.get(), counts, d, dev).ok());
    for (uint16_t h : shard.Download()) ASSERT_EQ(FromHalf(d, h), want);
  }
}

TEST(DeviceBackendGpu, HalfSumsAccumulateInFloat32) {
  PSD_SKIP_UNLESS_ALL_HAVE_GPU();
  auto b = World()->backend(MemoryKind::kDevice);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto staged = StagedBackend::Create(static_cast<MpiBackend*>(&World()->host_backend()));
  ASSERT_TRUE(staged.ok()) << staged.status().ToString();
  for (DType d : {DType::kFloat16, DType::kBFloat16}) {
    CheckHalfSums(**b, d);
    CheckHalfSums(**staged, d);
  }
}

// ---- ReduceScatter with any counts. ----

// Counts per rank with zeros and very different sizes (the same on every rank).
std::vector<size_t> OddCounts(int p, size_t scale) {
  std::vector<size_t> c(static_cast<size_t>(p));
  for (int q = 0; q < p; ++q) c[static_cast<size_t>(q)] = (q % 3 == 1) ? 0 : scale * (q + 1) + 3;
  return c;
}

template <typename T>
void CheckUnevenReduceScatter(Backend& be, DType d, const std::vector<size_t>& counts) {
  const int p = be.size(), r = be.rank();
  CallOptions dev{MemoryKind::kDevice, nullptr};
  std::vector<size_t> off = PrefixOffsets(counts);
  const size_t total = off.back(), mine = counts[static_cast<size_t>(r)];
  SCOPED_TRACE(::testing::Message() << be.name() << " " << DTypeName(d) << " total " << total);
  auto value = [](int q, size_t i) { return static_cast<float>((q + 1) * (i % 5)); };
  auto encode = [&](float f) -> T {
    if constexpr (sizeof(T) == 2) return ToHalf(d, f);
    else return static_cast<T>(f);
  };
  auto decode = [&](T v) -> float {
    if constexpr (sizeof(T) == 2) return FromHalf(d, v);
    else return static_cast<float>(v);
  };
  std::vector<T> in(total);
  for (size_t i = 0; i < total; ++i) in[i] = encode(value(r, i));
  DeviceBuffer<T> send(in), out(mine);
  ASSERT_TRUE(be.ReduceScatter(send.get(), out.get(), counts, d, dev).ok());
  std::vector<T> got = out.Download();
  for (size_t i = 0; i < mine; ++i) {
    const size_t at = off[static_cast<size_t>(r)] + i;
    const float want = Triangle(p) * static_cast<float>(at % 5);
    ASSERT_EQ(decode(got[i]), want) << i;
  }
  ASSERT_EQ(send.Download(), in);  // the send buffer is read only
}

TEST(DeviceBackendGpu, UnevenReduceScatter) {
  PSD_SKIP_UNLESS_ALL_HAVE_GPU();
  auto b = World()->backend(MemoryKind::kDevice);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  const int p = World()->size();
  for (size_t scale : {size_t{1}, size_t{777}, size_t{70001}}) {
    std::vector<size_t> counts = OddCounts(p, scale);
    CheckUnevenReduceScatter<float>(**b, DType::kFloat32, counts);
    CheckUnevenReduceScatter<int32_t>(**b, DType::kInt32, counts);
    CheckUnevenReduceScatter<double>(**b, DType::kFloat64, counts);
    CheckUnevenReduceScatter<uint16_t>(**b, DType::kFloat16, counts);
    CheckUnevenReduceScatter<uint16_t>(**b, DType::kBFloat16, counts);
  }
  // Only one rank holds elements; every count zero.
  std::vector<size_t> one(static_cast<size_t>(p), 0);
  one.back() = 5;
  CheckUnevenReduceScatter<float>(**b, DType::kFloat32, one);
  CheckUnevenReduceScatter<float>(**b, DType::kFloat32, std::vector<size_t>(p, 0));
}

// ---- Steady state. ----

// Free device memory as the driver reports it (the allocations of this process, at P = 1).
size_t FreeDeviceBytes() {
  size_t free_bytes = 0, total = 0;
  EXPECT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  return free_bytes;
}

void RunRepeatedCalls(Backend& be, int iters, cudaStream_t s1, cudaStream_t s2) {
  const int p = be.size(), r = be.rank();
  const size_t n = (1u << 16) + 5;
  std::vector<size_t> counts = ShardCounts(n, p);
  const size_t mine = counts[static_cast<size_t>(r)];
  std::vector<uint16_t> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = FloatToHalf(static_cast<float>(r + 1) * F(i));
  DeviceBuffer<uint16_t> half_in(h), half_out(n), half_shard(mine);
  DeviceBuffer<float> f_in(Contribution(n, r)), f_out(n);
  for (int it = 0; it < iters; ++it) {
    // Alternate streams: the float32 scratch is shared and must be ordered between them.
    CallOptions dev{MemoryKind::kDevice, it % 2 == 0 ? s1 : s2};
    ASSERT_TRUE(be.AllReduce(half_in.get(), half_out.get(), n, DType::kFloat16, dev).ok());
    ASSERT_TRUE(be.ReduceScatter(half_in.get(), half_shard.get(), counts, DType::kFloat16, dev)
                    .ok());
    auto q = be.IAllReduce(f_in.get(), f_out.get(), n, DType::kFloat32, dev);
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    ASSERT_TRUE((*q)->Wait().ok());
  }
  ASSERT_EQ(cudaStreamSynchronize(s1), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s2), cudaSuccess);
  std::vector<uint16_t> got = half_out.Download();
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(HalfToFloat(got[i]), Triangle(p) * F(i)) << i;
  const size_t off = ShardOffset(n, p, r);
  got = half_shard.Download();
  for (size_t i = 0; i < mine; ++i) ASSERT_EQ(HalfToFloat(got[i]), Triangle(p) * F(off + i)) << i;
  std::vector<float> fs = f_out.Download();
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(fs[i], Triangle(p) * F(i)) << i;
}

TEST(DeviceBackendGpu, RepeatedCallsReachASteadyState) {
  PSD_SKIP_UNLESS_ALL_HAVE_GPU();
  auto b = World()->backend(MemoryKind::kDevice);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  cudaStream_t s1 = nullptr, s2 = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess);
  RunRepeatedCalls(**b, 2, s1, s2);  // warm-up: scratch and NCCL resources
  const size_t before = FreeDeviceBytes();
  RunRepeatedCalls(**b, 40, s1, s2);
  // Other ranks share the GPU at P > 1 and allocate on their own schedule.
  if (World()->size() == 1) {
    EXPECT_EQ(FreeDeviceBytes(), before) << "device memory was allocated in steady state";
  }
  auto staged = StagedBackend::Create(static_cast<MpiBackend*>(&World()->host_backend()));
  ASSERT_TRUE(staged.ok()) << staged.status().ToString();
  RunRepeatedCalls(**staged, 20, s1, s2);
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
}

// ---- Deadlines (P = 1: deterministic). ----

// Holds a stream from the host: work queued behind it cannot run until Release(), as behind a
// collective whose peer never arrives. The flag outlives the gate (the host function owns a
// reference), and the destructor releases it.
class StreamGate {
 public:
  explicit StreamGate(cudaStream_t stream) {
    auto* held = new std::shared_ptr<std::atomic<bool>>(open_);
    EXPECT_EQ(cudaLaunchHostFunc(stream, &Hold, held), cudaSuccess);
  }
  ~StreamGate() { Release(); }
  void Release() { open_->store(true); }

 private:
  static void CUDART_CB Hold(void* arg) {
    std::unique_ptr<std::shared_ptr<std::atomic<bool>>> open(
        static_cast<std::shared_ptr<std::atomic<bool>>*>(arg));
    while (!(*open)->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::shared_ptr<std::atomic<bool>> open_ = std::make_shared<std::atomic<bool>>(false);
};

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(DeviceBackendGpu, StagedWaitsForTheDeviceWithinTheDeadline) {
  PSD_SKIP_UNLESS_ALL_HAVE_GPU();
  if (World()->size() != 1) GTEST_SKIP() << "deterministic at P = 1 only";
  auto staged = StagedBackend::Create(static_cast<MpiBackend*>(&World()->host_backend()), 0.3);
  ASSERT_TRUE(staged.ok()) << staged.status().ToString();
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  CallOptions dev{MemoryKind::kDevice, s};
  DeviceBuffer<float> a(Contribution(1000, 0)), out(1000);
  {
    // A blocking call: its copy to host memory cannot run; it fails in time, not sticky.
    StreamGate gate(s);
    auto t0 = std::chrono::steady_clock::now();
    Status st = (*staged)->AllReduce(a.get(), out.get(), 1000, DType::kFloat32, dev);
    EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.ToString();
    EXPECT_NE(st.message().find("POSEIDON_PEER_TIMEOUT_S = 0.3 s"), std::string::npos)
        << st.message();
    EXPECT_NE(st.message().find("AllReduce"), std::string::npos) << st.message();
    EXPECT_LT(SecondsSince(t0), 5.0);
  }
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ASSERT_TRUE((*staged)->AllReduce(a.get(), out.get(), 1000, DType::kFloat32, dev).ok());
  ASSERT_EQ(out.Download(), Contribution(1000, 0));
  {
    // A non-blocking call never waits at the call; its Wait gives up at the deadline, and the
    // backend then refuses every call, naming the cause.
    StreamGate gate(s);
    auto q = (*staged)->IAllReduce(a.get(), out.get(), 1000, DType::kFloat32, dev);
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    Status st = (*q)->Wait();
    EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.ToString();
    Status later = (*staged)->AllReduce(a.get(), out.get(), 1000, DType::kFloat32, dev);
    EXPECT_EQ(later.code(), StatusCode::kAborted) << later.ToString();
    EXPECT_NE(later.message().find("POSEIDON_PEER_TIMEOUT_S"), std::string::npos)
        << later.message();
  }
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  staged->reset();
  cudaStreamDestroy(s);
}

#if POSEIDON_NCCL_ENABLED
TEST(DeviceBackendGpu, NcclWatchdogAbortsWorkThatMakesNoProgress) {
  PSD_SKIP_UNLESS_ALL_HAVE_GPU();
  if (World()->size() != 1) GTEST_SKIP() << "deterministic at P = 1 only";
  auto nccl = NcclBackend::Create(World()->mpi_comm(), 0.5);
  ASSERT_TRUE(nccl.ok()) << nccl.status().ToString();
  EXPECT_EQ((*nccl)->timeout_s(), 0.5);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  CallOptions dev{MemoryKind::kDevice, s};
  DeviceBuffer<float> a(Contribution(1000, 0)), out(1000);
  // Healthy first: work that completes never trips the watchdog, however long the backend
  // lives.
  ASSERT_TRUE((*nccl)->AllReduce(a.get(), out.get(), 1000, DType::kFloat32, dev).ok());
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  ASSERT_TRUE((*nccl)->CheckAsyncError().ok());
  {
    StreamGate gate(s);
    // Released late by another thread: ncclCommAbort may wait for the held stream.
    std::thread opener([&gate] {
      std::this_thread::sleep_for(std::chrono::seconds(3));
      gate.Release();
    });
    auto t0 = std::chrono::steady_clock::now();
    auto q = (*nccl)->IAllReduce(a.get(), out.get(), 1000, DType::kFloat32, dev);
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    Status st = (*q)->Wait();
    EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.ToString();
    EXPECT_NE(st.message().find("IAllReduce"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("POSEIDON_PEER_TIMEOUT_S = 0.5 s"), std::string::npos)
        << st.message();
    EXPECT_LT(SecondsSince(t0), 10.0);
    Status later = (*nccl)->AllReduce(a.get(), out.get(), 1000, DType::kFloat32, dev);
    EXPECT_EQ(later.code(), StatusCode::kAborted) << later.ToString();
    EXPECT_NE(later.message().find("did not finish within"), std::string::npos)
        << later.message();
    opener.join();
  }
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  nccl->reset();
  cudaStreamDestroy(s);
}
#endif

TEST(DeviceBackendGpu, BadArgumentsFailOnEveryRank) {
  PSD_SKIP_UNLESS_ALL_HAVE_GPU();
  auto b = World()->backend(MemoryKind::kDevice);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  CallOptions dev{MemoryKind::kDevice, nullptr};
  DeviceBuffer<float> d(16);
  std::vector<float> host(16);
  // Rank 0 passes host memory; every rank must fail, none may hang.
  const float* send = World()->rank() == 0 ? host.data() : d.get();
  Status s = (*b)->AllReduce(send, d.get(), 16, DType::kFloat32, dev);
  EXPECT_FALSE(s.ok());
  // Host memory kind on a device backend.
  s = (*b)->AllReduce(d.get(), d.get(), 16, DType::kFloat32, CallOptions{});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
}

}  // namespace
}  // namespace poseidon
