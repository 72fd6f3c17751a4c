// Multi-rank tests of the device backends (run at np 1, 2, 4).
//
// Without a GPU (CI, this machine) they check the failure path, which must be clean on every
// rank: Communicator::backend(kDevice), NcclBackend::Create and StagedBackend::Create return
// kUnavailable with the CUDA error, nobody hangs. With a GPU they check every collective of the
// backend the communicator picks (NCCL at P = 1 with one GPU, MPI-staged when ranks share a
// GPU, P = 2 and 4) and of the staged backend directly, against exact values: rank r
// contributes (r + 1) * f(i) with small integers f(i), so sums are exact in every dtype.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
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

    // Non-blocking forms.
    DeviceBuffer<float> s2(Contribution(n, r)), r2(n), sh2(mine), ag2(n);
    auto q1 = be.IAllReduce(s2.get(), r2.get(), n, DType::kFloat32, dev);
    ASSERT_TRUE(q1.ok()) << q1.status().ToString();
    ASSERT_TRUE((*q1)->Wait().ok());
    got = r2.Download();
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], Triangle(p) * F(i));
    auto q2 = be.IReduceScatter(s2.get(), sh2.get(), counts, DType::kFloat32, dev);
    ASSERT_TRUE(q2.ok()) << q2.status().ToString();
    ASSERT_TRUE((*q2)->Wait().ok());
    got = sh2.Download();
    for (size_t i = 0; i < mine; ++i) ASSERT_EQ(got[i], Triangle(p) * F(off + i));
    auto q3 = be.IAllGatherV(piece.get(), ag2.get(), counts, DType::kFloat32, dev);
    ASSERT_TRUE(q3.ok()) << q3.status().ToString();
    ASSERT_TRUE((*q3)->Wait().ok());
    ASSERT_EQ(ag2.Download(), all.Download());
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
