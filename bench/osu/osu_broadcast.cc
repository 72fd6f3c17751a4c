// osu_broadcast: Backend::Broadcast against MPI_Bcast in the same run, from root 0 or -r ROOT.
// size is the broadcast buffer (nccl-tests' convention; busbw = algbw x 1). The root holds
// (root + 1) * F(i); after the call every rank's buffer, the root's included, must equal it.
// Before each timed run the other ranks' buffers are poisoned and the root's input is written
// again (untimed), so a run that loses or corrupts data, even at the root, shows in #wrong.
//
// Options: -r ROOT (default 0, must be below the number of ranks), then the harness's.
#include <mpi.h>

#include <string>
#include <vector>

#include "bench/osu/harness.h"
#include "runtime/mpi_backend.h"

namespace poseidon::osu {
namespace {

class BroadcastBench : public BufferCollective {
 public:
  std::string program() const override { return "osu_broadcast"; }
  std::string ours_name() const override {
    return StrCat("Backend::Broadcast (root ", root_, ")");
  }
  std::string peer_name() const override { return "MPI_Bcast"; }
  std::string factor_text() const override { return "1"; }
  double BusFactor(int world) const override { return 1.0; }
  void AddFlags(cli::Flags& flags) override {
    flags.Int("-r,--root", &root_, 0, 1000000, "ROOT",
              "the broadcasting rank, below the number of ranks (default 0)");
  }

  Status Prepare(const Context& ctx, size_t count) override {
    PSD_REQUIRE_ARG(root_ < ctx.world, "option -r ", root_, ": only ", ctx.world,
                    " ranks; expected a root in 0..", ctx.world - 1);
    count_ = count;
    // The buffer is recv_ on every rank (send_ stays empty: a broadcast works in place).
    PSD_CHECK(PrepareBuffers(ctx, 0, count));
    const size_t bytes = count * DTypeSize(ctx.dtype);
    FillFormula(ctx.dtype, root_ + 1.0, 0, count, want_at(0));
    input_.assign(want_at(0), want_at(0) + bytes);
    // The warm-up runs need the root's input in place too (no PoisonOutput before them).
    if (ctx.rank == root_) PSD_CHECK(recv_.Upload(input_.data(), bytes));
    return Status::Ok();
  }
  Status PoisonOutput() override {
    if (ctx_.rank == root_) return recv_.Upload(input_.data(), input_.size());
    return recv_.Poison();
  }
  Status RunOurs() override {
    return ctx_.backend->Broadcast(recv_.data(), count_, ctx_.dtype, root_, call_options());
  }
  Status RunPeer() override {
    return PeerCall("MPI_Bcast", MPI_Bcast(recv_.data(), static_cast<int>(count_),
                                           ToMpiType(ctx_.dtype), root_,
                                           ctx_.comm->mpi_comm()));
  }
  // A broadcast moves bytes, so the peer works for every dtype.
  bool PeerSupported(const Context& ctx) const override {
    return ctx.memory == MemoryKind::kHost;
  }
  std::string ExtraJson() const override { return StrCat(", \"root\": ", root_); }
  void Release() override {
    BufferCollective::Release();
    input_ = {};
  }

 private:
  int root_ = 0;
  size_t count_ = 0;
  std::vector<unsigned char> input_;  // the root's input, rewritten before each timed run
};

}  // namespace
}  // namespace poseidon::osu

int main(int argc, char** argv) {
  poseidon::osu::BroadcastBench bench;
  return poseidon::osu::RunMain(argc, argv, bench);
}
