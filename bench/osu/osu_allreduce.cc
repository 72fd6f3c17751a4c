// osu_allreduce: Backend::AllReduce (MpiBackend: shared memory at or above
// POSEIDON_SHM_THRESHOLD_BYTES on one node, else MPI) against MPI_Allreduce in the same run.
// Rank r sends (r + 1) * F(i); every output element must equal P(P+1)/2 * F(i) exactly.
#include <mpi.h>

#include <vector>

#include "bench/osu/harness.h"
#include "runtime/mpi_backend.h"

namespace poseidon::osu {
namespace {

class AllReduceBench : public Collective {
 public:
  std::string program() const override { return "osu_allreduce"; }
  std::string ours_name() const override { return "Backend::AllReduce"; }
  std::string peer_name() const override { return "MPI_Allreduce"; }
  std::string factor_text() const override { return "2(P-1)/P"; }
  double BusFactor(int world) const override { return 2.0 * (world - 1) / world; }

  Status Prepare(const Context& ctx, size_t count) override {
    ctx_ = ctx;
    count_ = count;
    size_t bytes = count * DTypeSize(ctx.dtype);
    std::vector<unsigned char> host(bytes);
    FillFormula(ctx.dtype, ctx.rank + 1.0, 0, count, host.data());
    PSD_CHECK(send_.Allocate(ctx.memory, bytes));
    PSD_CHECK(send_.Upload(host.data(), bytes));
    PSD_CHECK(recv_.Allocate(ctx.memory, bytes));
    want_.resize(bytes);
    FillFormula(ctx.dtype, ctx.world * (ctx.world + 1) / 2.0, 0, count, want_.data());
    if (ctx.memory != MemoryKind::kHost) got_.resize(bytes);
    return Status::Ok();
  }
  Status RunOurs() override {
    CallOptions o;
    o.memory = ctx_.memory;
    return ctx_.backend->AllReduce(send_.data(), recv_.data(), count_, ctx_.dtype, o);
  }
  Status RunPeer() override {
    int rc = MPI_Allreduce(send_.data(), recv_.data(), static_cast<int>(count_),
                           ToMpiType(ctx_.dtype), MPI_SUM, ctx_.comm->mpi_comm());
    if (rc != MPI_SUCCESS) return MpiError("MPI_Allreduce", rc);
    return Status::Ok();
  }
  Status PoisonOutput() override { return recv_.Poison(); }
  Result<size_t> CountWrong() override {
    const void* got = recv_.data();
    if (ctx_.memory != MemoryKind::kHost) {
      PSD_CHECK(recv_.Download(got_.data(), got_.size()));
      got = got_.data();
    }
    return CountMismatches(ctx_.dtype, got, want_.data(), count_);
  }
  void Release() override {
    send_.Free();
    recv_.Free();
    want_ = {};
    got_ = {};
  }

 private:
  Context ctx_;
  size_t count_ = 0;
  Buffer send_, recv_;
  std::vector<unsigned char> want_, got_;
};

}  // namespace
}  // namespace poseidon::osu

int main(int argc, char** argv) {
  poseidon::osu::AllReduceBench bench;
  return poseidon::osu::RunMain(argc, argv, bench);
}
