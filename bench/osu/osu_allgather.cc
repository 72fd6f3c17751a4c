// osu_allgather: Backend::AllGather against MPI_Allgather in the same run. size is the full
// output (nccl-tests' convention): each rank sends size / P bytes (sizes round down to a
// multiple of P elements). Rank r sends (r + 1) * F(i); block r of the output must equal it.
#include <mpi.h>

#include "bench/osu/harness.h"
#include "runtime/mpi_backend.h"

namespace poseidon::osu {
namespace {

class AllGatherBench : public BufferCollective {
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
    per_ = count / static_cast<size_t>(ctx.world);
    PSD_CHECK(PrepareBuffers(ctx, per_, count));
    for (int r = 0; r < ctx.world; ++r) {
      FillFormula(ctx.dtype, r + 1.0, 0, per_, want_at(static_cast<size_t>(r) * per_));
    }
    return Status::Ok();
  }
  Status RunOurs() override {
    return ctx_.backend->AllGather(send_.data(), recv_.data(), per_, ctx_.dtype,
                                   call_options());
  }
  Status RunPeer() override {
    MPI_Datatype t = ToMpiType(ctx_.dtype);
    int n = static_cast<int>(per_);
    return PeerCall("MPI_Allgather", MPI_Allgather(send_.data(), n, t, recv_.data(), n, t,
                                                   ctx_.comm->mpi_comm()));
  }
  // A gather moves bytes, so the peer works for every dtype.
  bool PeerSupported(const Context& ctx) const override {
    return ctx.memory == MemoryKind::kHost;
  }

 private:
  size_t per_ = 0;
};

}  // namespace
}  // namespace poseidon::osu

int main(int argc, char** argv) {
  poseidon::osu::AllGatherBench bench;
  return poseidon::osu::RunMain(argc, argv, bench);
}
