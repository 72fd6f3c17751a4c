// osu_allgather: Backend::AllGather against MPI_Allgather in the same run. size is the full
// output (nccl-tests' convention): each rank sends size / P bytes (sizes round down to a
// multiple of P elements). Rank r sends (r + 1) * F(i); block r of the output must equal it.
#include <mpi.h>

#include <vector>

#include "bench/osu/harness.h"
#include "runtime/mpi_backend.h"

namespace poseidon::osu {
namespace {

class AllGatherBench : public Collective {
 public:
  std::string program() const override { return "osu_allgather"; }
  std::string ours_name() const override { return "Backend::AllGather"; }
  std::string peer_name() const override { return "MPI_Allgather"; }
  std::string factor_text() const override { return "(P-1)/P"; }
  double BusFactor(int world) const override { return 1.0 * (world - 1) / world; }
  size_t CountFor(size_t bytes, DType dtype, int world) const override {
    size_t per = bytes / DTypeSize(dtype) / static_cast<size_t>(world);
    return per * static_cast<size_t>(world);
  }

  Status Prepare(const Context& ctx, size_t count) override {
    ctx_ = ctx;
    per_ = count / static_cast<size_t>(ctx.world);
    const size_t es = DTypeSize(ctx.dtype);
    std::vector<unsigned char> host(per_ * es);
    FillFormula(ctx.dtype, ctx.rank + 1.0, 0, per_, host.data());
    PSD_CHECK(send_.Allocate(ctx.memory, per_ * es));
    PSD_CHECK(send_.Upload(host.data(), per_ * es));
    PSD_CHECK(recv_.Allocate(ctx.memory, count * es));
    want_.resize(count * es);
    for (int r = 0; r < ctx.world; ++r) {
      FillFormula(ctx.dtype, r + 1.0, 0, per_, want_.data() + static_cast<size_t>(r) * per_ * es);
    }
    if (ctx.memory != MemoryKind::kHost) got_.resize(count * es);
    return Status::Ok();
  }
  Status RunOurs() override {
    CallOptions o;
    o.memory = ctx_.memory;
    return ctx_.backend->AllGather(send_.data(), recv_.data(), per_, ctx_.dtype, o);
  }
  Status RunPeer() override {
    MPI_Datatype t = ToMpiType(ctx_.dtype);
    int n = static_cast<int>(per_);
    int rc = MPI_Allgather(send_.data(), n, t, recv_.data(), n, t, ctx_.comm->mpi_comm());
    if (rc != MPI_SUCCESS) return MpiError("MPI_Allgather", rc);
    return Status::Ok();
  }
  // A gather moves bytes, so the peer works for every dtype.
  bool PeerSupported(const Context& ctx) const override {
    return ctx.memory == MemoryKind::kHost;
  }
  Status PoisonOutput() override { return recv_.Poison(); }
  Result<size_t> CountWrong() override {
    const void* got = recv_.data();
    if (ctx_.memory != MemoryKind::kHost) {
      PSD_CHECK(recv_.Download(got_.data(), got_.size()));
      got = got_.data();
    }
    return CountMismatches(ctx_.dtype, got, want_.data(), per_ * static_cast<size_t>(ctx_.world));
  }
  void Release() override {
    send_.Free();
    recv_.Free();
    want_ = {};
    got_ = {};
  }

 private:
  Context ctx_;
  size_t per_ = 0;
  Buffer send_, recv_;
  std::vector<unsigned char> want_, got_;
};

}  // namespace
}  // namespace poseidon::osu

int main(int argc, char** argv) {
  poseidon::osu::AllGatherBench bench;
  return poseidon::osu::RunMain(argc, argv, bench);
}
