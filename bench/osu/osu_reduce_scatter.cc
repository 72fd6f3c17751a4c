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

class ReduceScatterBench : public Collective {
 public:
  std::string program() const override { return "osu_reduce_scatter"; }
  std::string ours_name() const override { return "Backend::ReduceScatter"; }
  std::string peer_name() const override { return "MPI_Reduce_scatter"; }
  std::string factor_text() const override { return "(P-1)/P"; }
  double BusFactor(int world) const override { return 1.0 * (world - 1) / world; }

  Status Prepare(const Context& ctx, size_t count) override {
    ctx_ = ctx;
    counts_ = ShardCounts(count, ctx.world);
    int_counts_.assign(counts_.begin(), counts_.end());
    mine_ = counts_[static_cast<size_t>(ctx.rank)];
    const size_t es = DTypeSize(ctx.dtype);
    std::vector<unsigned char> host(count * es);
    FillFormula(ctx.dtype, ctx.rank + 1.0, 0, count, host.data());
    PSD_CHECK(send_.Allocate(ctx.memory, count * es));
    PSD_CHECK(send_.Upload(host.data(), count * es));
    PSD_CHECK(recv_.Allocate(ctx.memory, mine_ * es));
    want_.resize(mine_ * es);
    FillFormula(ctx.dtype, ctx.world * (ctx.world + 1) / 2.0,
                ShardOffset(count, ctx.world, ctx.rank), mine_, want_.data());
    if (ctx.memory != MemoryKind::kHost) got_.resize(mine_ * es);
    return Status::Ok();
  }
  Status RunOurs() override {
    CallOptions o;
    o.memory = ctx_.memory;
    return ctx_.backend->ReduceScatter(send_.data(), mine_ ? recv_.data() : nullptr, counts_,
                                       ctx_.dtype, o);
  }
  Status RunPeer() override {
    int rc = MPI_Reduce_scatter(send_.data(), recv_.data(), int_counts_.data(),
                                ToMpiType(ctx_.dtype), MPI_SUM, ctx_.comm->mpi_comm());
    if (rc != MPI_SUCCESS) return MpiError("MPI_Reduce_scatter", rc);
    return Status::Ok();
  }
  Status PoisonOutput() override { return recv_.Poison(); }
  Result<size_t> CountWrong() override {
    const void* got = recv_.data();
    if (ctx_.memory != MemoryKind::kHost) {
      PSD_CHECK(recv_.Download(got_.data(), got_.size()));
      got = got_.data();
    }
    return CountMismatches(ctx_.dtype, got, want_.data(), mine_);
  }
  void Release() override {
    send_.Free();
    recv_.Free();
    want_ = {};
    got_ = {};
  }

 private:
  Context ctx_;
  std::vector<size_t> counts_;
  std::vector<int> int_counts_;
  size_t mine_ = 0;
  Buffer send_, recv_;
  std::vector<unsigned char> want_, got_;
};

}  // namespace
}  // namespace poseidon::osu

int main(int argc, char** argv) {
  poseidon::osu::ReduceScatterBench bench;
  return poseidon::osu::RunMain(argc, argv, bench);
}
