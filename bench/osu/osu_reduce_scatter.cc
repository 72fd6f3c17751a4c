// osu_reduce_scatter: Backend::ReduceScatter against MPI_Reduce_scatter in the same run.
// size is the full input (nccl-tests' convention); rank q gets ShardCount(count, P, q)
// elements, so sizes that do not divide by P give uneven shards. Rank r sends (r + 1) * F(i);
// rank q's output element j must equal P(P+1)/2 * F(offset_q + j) exactly.
#include <mpi.h>

#include <vector>

#include "bench/osu/harness.h"
#include "runtime/mpi_backend.h"
#include "runtime/shard.h"

namespace poseidon::osu {
namespace {

class ReduceScatterBench : public BufferCollective {
 public:
  std::string program() const override { return "osu_reduce_scatter"; }
  std::string ours_name() const override { return "Backend::ReduceScatter"; }
  std::string peer_name() const override { return "MPI_Reduce_scatter"; }
  std::string factor_text() const override { return "(P-1)/P"; }
  double BusFactor(int world) const override { return 1.0 * (world - 1) / world; }

  Status Prepare(const Context& ctx, size_t count) override {
    counts_ = ShardCounts(count, ctx.world);
    int_counts_.assign(counts_.begin(), counts_.end());
    mine_ = counts_[static_cast<size_t>(ctx.rank)];
    PSD_CHECK(PrepareBuffers(ctx, count, mine_));
    FillFormula(ctx.dtype, ctx.world * (ctx.world + 1) / 2.0,
                ShardOffset(count, ctx.world, ctx.rank), mine_, want_at(0));
    return Status::Ok();
  }
  Status RunOurs() override {
    return ctx_.backend->ReduceScatter(send_.data(), mine_ ? recv_.data() : nullptr, counts_,
                                       ctx_.dtype, call_options());
  }
  Status RunPeer() override {
    return PeerCall("MPI_Reduce_scatter",
                    MPI_Reduce_scatter(send_.data(), recv_.data(), int_counts_.data(),
                                       ToMpiType(ctx_.dtype), MPI_SUM, ctx_.comm->mpi_comm()));
  }

 private:
  std::vector<size_t> counts_;
  std::vector<int> int_counts_;
  size_t mine_ = 0;
};

}  // namespace
}  // namespace poseidon::osu

int main(int argc, char** argv) {
  poseidon::osu::ReduceScatterBench bench;
  return poseidon::osu::RunMain(argc, argv, bench);
}
