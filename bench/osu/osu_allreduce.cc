// osu_allreduce: Backend::AllReduce (MpiBackend: shared memory at or above
// POSEIDON_SHM_THRESHOLD_BYTES on one node, else MPI) against MPI_Allreduce in the same run.
// Rank r sends (r + 1) * F(i); every output element must equal P(P+1)/2 * F(i) exactly.
#include <mpi.h>

#include "bench/osu/harness.h"
#include "runtime/mpi_backend.h"

namespace poseidon::osu {
namespace {

class AllReduceBench : public BufferCollective {
 public:
  std::string program() const override { return "osu_allreduce"; }
  std::string ours_name() const override { return "Backend::AllReduce"; }
  std::string peer_name() const override { return "MPI_Allreduce"; }
  std::string factor_text() const override { return "2(P-1)/P"; }
  double BusFactor(int world) const override { return 2.0 * (world - 1) / world; }

  Status Prepare(const Context& ctx, size_t count) override {
    count_ = count;
    PSD_CHECK(PrepareBuffers(ctx, count, count));
    FillFormula(ctx.dtype, ctx.world * (ctx.world + 1) / 2.0, 0, count, want_at(0));
    return Status::Ok();
  }
  Status RunOurs() override {
    return ctx_.backend->AllReduce(send_.data(), recv_.data(), count_, ctx_.dtype,
                                   call_options());
  }
  Status RunPeer() override {
    return PeerCall("MPI_Allreduce",
                    MPI_Allreduce(send_.data(), recv_.data(), static_cast<int>(count_),
                                  ToMpiType(ctx_.dtype), MPI_SUM, ctx_.comm->mpi_comm()));
  }

 private:
  size_t count_ = 0;
};

}  // namespace
}  // namespace poseidon::osu

int main(int argc, char** argv) {
  poseidon::osu::AllReduceBench bench;
  return poseidon::osu::RunMain(argc, argv, bench);
}
