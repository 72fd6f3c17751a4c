// MpiBackend: collectives over an MPI communicator on host memory.
//
// Sums run in MPI for float32/64 and the integer types. float16 / bfloat16 are widened to a
// float32 scratch buffer, reduced in float32 and rounded once, so a P-rank sum of halves loses
// no more than one rounding. Across nodes with the same number (> 1) of ranks on each, an
// allreduce of at least POSEIDON_HIER_ALLREDUCE_BYTES runs in two levels (hier_allreduce.h:
// shared memory within the node, MPI across). Host memory only: device buffers are refused
// (kInvalidArgument); the staged backend (staged_backend.h) carries them through this one. The
// argument checks and the failing together are CheckedBackend's (checked_backend.h).
//
// Deadlines: with CallOptions::interrupt set, every wait inside a call (the argument agreement,
// the collective, the shared-memory steps) polls the interrupt: the call posts the non-blocking
// MPI form and waits in WaitMpi (runtime/mpi_wait.h) instead of blocking in MPI. Every rank
// must pass an interrupt or none alike (MPI never matches a blocking collective with a
// non-blocking one). An interrupted call returns the interrupt's status
// ("MpiBackend::AllGather: <message>") and leaves its collective to MPI, which may still write
// the call's output buffer later: the backend then fails every later call at once with
// kAborted naming that first failure. Without an interrupt, calls use MPI's blocking forms.
#pragma once

#include <mpi.h>

#include <climits>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "runtime/checked_backend.h"
#include "runtime/mpi_wait.h"
#include "runtime/settings.h"

namespace poseidon {

class HierAllReduce;
class ShmCollectives;
class SharedRegions;

class MpiBackend final : public CheckedBackend {
 public:
  // The five blocking collectives, their checks and hooks called directly (checked_backend.h).
  PSD_CHECKED_BACKEND_DIRECT
  // Uses comm as given (the Communicator passes its private duplicate). Does not free it.
  explicit MpiBackend(MPI_Comm comm);
  ~MpiBackend() override;

  std::string name() const override { return "mpi"; }
  bool SupportsMemory(MemoryKind memory) const override { return memory == MemoryKind::kHost; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status Barrier() override;
  // Through the shared-memory window when the ranks share one node and the whole sum is at
  // least POSEIDON_SHM_THRESHOLD_BYTES; kUnimplemented otherwise (every rank alike).
  Status AllReducePieces(const std::vector<SumPiece>& pieces, DType dtype,
                         const CallOptions& opts, const SumCommit& commit,
                         bool* committed) override;

  // Node-shared memory where every rank of the communicator is on one node and the window is
  // on (POSEIDON_SHM_THRESHOLD_BYTES > 0), else 64-byte aligned private memory. Under
  // opts.interrupt, a barrier polled under it first (the allocation's MPI calls only block).
  Result<void*> AllocShared(size_t bytes, const CallOptions& opts = {}) override;
  Status FreeShared(void* p, const CallOptions& opts = {}) override;

  MPI_Comm comm() const { return comm_; }
  // The smallest allreduce, in bytes, that takes the two-level path across nodes (0: never),
  // instead of POSEIDON_HIER_ALLREDUCE_BYTES; -1 goes back to the setting. Every rank must set
  // the same value at the same point between calls (the planner does, from its cost model).
  void SetHierAllReduceBytes(long long bytes) { hier_bytes_override_ = bytes; }
  // Whether this communicator spans nodes with the same number (> 1) of ranks on each: the
  // two-level allreduce can run. Collective at its first call (it may build the window).
  Result<bool> HasHierarchy();
  // True once a call gave up while its collective still ran: every later call fails at once.
  bool broken() const { return sticky_->failed(); }

  // The argument agreement of a blocking call on this communicator, for backends that stage
  // through this one and for callers whose own checks failed on this rank (they join it with
  // args.local set, so the peers fail too): through the shared-memory window when there is
  // one (always), else AgreeOnArgs when POSEIDON_CHECK_ARGS is on, else args.local. Under an
  // interrupt, a call abandoned here makes this backend unusable like any abandoned call.
  Status Agree(const CollectiveArgs& args, const Interrupt* interrupt) override;

 protected:
  // Inline OK paths, out-of-line messages: every call runs both checks.
  Status CheckBuffer(const char* call, const char* which, const void* p, size_t count,
                     size_t bytes) const override {
    return p != nullptr || count == 0 ? Status::Ok() : NullBuffer(call, which, count);
  }
  // MPI counts are int: at most 2^31 - 1 elements per call.
  Status CheckElements(const char* call, size_t elements) const override {
    return elements <= static_cast<size_t>(INT_MAX) ? Status::Ok() : TooMany(call, elements);
  }
  static Status NullBuffer(const char* call, const char* which, size_t count);
  static Status TooMany(const char* call, size_t elements);
  // A valid allreduce or allgather on a communicator of one rank: recv gets send's bytes.
  static Status Alone(const void* send, void* recv, size_t bytes);
  // Each first refuses at once when an earlier call gave up (the communicator is then dead:
  // even the agreement cannot run), then agrees through Checked.
  PSD_CHECKED_BACKEND_HOOKS

 private:
  // The window, where a call moving `bytes` of `dtype` in memory `opts.memory` can go straight
  // to it (see AllReduce in the .cc file); else nullptr.
  ShmCollectives* Direct(size_t bytes, DType dtype, const CallOptions& opts) const;
  // How the call named `call` ("MpiBackend::AllReduce") waits, given its options.
  MpiWait WaitFor(const char* call, const CallOptions& opts) const {
    return MpiWait{opts.interrupt, call, sticky_.get()};
  }
  Status ReduceScatterUnchecked(const void* send, void* recv, const std::vector<size_t>& counts,
                                DType dtype, const MpiWait& how);
  Status AllReduceUnchecked(const void* send, void* recv, size_t count, DType dtype,
                            const MpiWait& how);
  // Under an interrupt, small sums at a power-of-two world size: recursive doubling from
  // point-to-point messages (log2 P exchanges of the whole buffer, each rank adding the same
  // two operands in each pair, so every rank ends with the same bits). Open MPI's
  // non-blocking allreduce picks reduce + broadcast at P < 4 or in place, 1.6x slower than its
  // blocking one at 64 KiB, P = 2 (bench/RESULTS.md, "Engine v2"); this matches the blocking
  // one. Whether it applies depends only on (bytes, P), so every rank decides alike.
  static bool UseRecursiveDoubling(size_t bytes, int world);
  Status AllReduceRecursiveDoubling(void* buf, size_t count, MPI_Datatype type, size_t elem_bytes,
                                    const MpiWait& how, std::shared_ptr<void> keep_buf);
  // The result of a shared-memory call: a failure that left the window unusable (its peers are
  // in an unknown state) also makes this backend unusable.
  Status ShmResult(const ShmCollectives& shm, Status status) {
    return status.ok() ? std::move(status) : ShmFailure(shm, std::move(status));
  }
  Status ShmFailure(const ShmCollectives& shm, Status status);
  // A failed call's status; when `broken` (the failure left peers mid-collective), prefixed
  // "MpiBackend::" and recorded as this backend's sticky error.
  Status RecordIfBroken(Status status, bool broken);
  // The shared-memory window when every rank of the communicator shares this node and
  // POSEIDON_SHM_THRESHOLD_BYTES > 0, else nullptr (plain MPI). Every call on such a
  // communicator goes through the window: its descriptor is checked there (ShmCollectives,
  // "Agreement"), at no extra round, and its data moves there when ShmCarries says so (a
  // decision made only after the check, so every rank decides alike). Creates the window at the
  // first call (collectively), and again when POSEIDON_SHM_CHUNK_BYTES changes; the destructor
  // frees it (collectively). Like every POSEIDON_* knob, the threshold and chunk are agreed at
  // Communicator creation. Under how.interrupt, a barrier polled under it runs first, so that
  // the window's blocking creation starts only once every rank has arrived.
  Result<ShmCollectives*> Node(const MpiWait& how);
  // Under how.interrupt, a barrier polled under it, so that MPI calls that only block (creating
  // or freeing a window or a communicator) start once every rank has arrived: ranks then wait
  // only for peers already on their way. Without an interrupt, nothing.
  Status MeetBeforeBlocking(const MpiWait& how);
  // The two-level allreduce (runtime/hier_allreduce.h) for an agreed call of `bytes` in dtype,
  // or nullptr for the flat one: when the communicator spans nodes (Node() said so), the
  // threshold (POSEIDON_HIER_ALLREDUCE_BYTES, or SetHierAllReduceBytes) is > 0 and <= bytes,
  // HierAllReduce::Takes(dtype), and the nodes allow it. Built at the first such call
  // (collectively, after MeetBeforeBlocking); kept.
  Result<HierAllReduce*> Hierarchy(size_t bytes, DType dtype, const MpiWait& how);
  // The hierarchy whatever the size (built at the first call, see Hierarchy), or nullptr on one
  // node, with the window off, or when the nodes do not allow it.
  Result<HierAllReduce*> BuildHierarchy(const MpiWait& how);
  // Whether a call moving `bytes` (the full buffer) moves them through the window.
  bool ShmCarries(size_t bytes) {
    return bytes >= static_cast<size_t>(knobs().shm_threshold);
  }
  // The argument check of a blocking call, and the call itself where the window carries it.
  // With the window: run(window) when this rank's arguments are bad or ShmCarries(bytes) (the
  // window checks args in the call's first step), else the window's agreement alone. Across
  // nodes: AgreeOnArgs (unless POSEIDON_CHECK_ARGS=0 or `agreed`: then only args.local).
  // Returns the call's status when it ended here, nullopt when the check passed and the data
  // must now move through Open MPI.
  template <typename Run>
  std::optional<Status> Checked(const CollectiveArgs& args, const MpiWait& how, bool agreed,
                                size_t bytes, Run run);

  // The settings every call reads, re-read only when Settings::version() moves (a settings
  // lookup costs about a microsecond: several per call showed in small collectives).
  struct Knobs {
    uint64_t version = ~uint64_t{0};
    long long shm_threshold = 0;
    long long shm_chunk = 0;
    long long shm_single_copy = 0;  // -1: automatic (ShmCollectives::kSingleCopyAuto)
    double shm_timeout_s = 0;
    bool check_args = true;
    long long hier_bytes = 0;
  };
  const Knobs& knobs() {
    return knobs_.version == Settings::version() ? knobs_ : ReadKnobs();
  }
  const Knobs& ReadKnobs();

  MPI_Comm comm_;
  Knobs knobs_;
  // AllReduceRecursiveDoubling's receive buffer, kept between calls (see there).
  std::shared_ptr<std::vector<unsigned char>> rd_peer_;
  int rank_ = 0;
  int size_ = 1;
  std::unique_ptr<ShmCollectives> shm_;
  bool shm_multi_node_ = false;  // learned collectively at the first large call
  // The settings' version at which Node last found shm_ matching them (see Checked).
  uint64_t window_version_ = ~uint64_t{0};
  std::unique_ptr<HierAllReduce> hier_;
  bool hier_unavailable_ = false;  // learned collectively at the first call that could use it
  long long hier_bytes_override_ = -1;  // SetHierAllReduceBytes; -1: the setting
  // The first abandoned call; shared with the requests this backend hands out.
  std::shared_ptr<StickyError> sticky_ = std::make_shared<StickyError>();
  // AllocShared's memory: node-shared regions (created at the first AllocShared that finds the
  // window; shm_ points to them but never reads them on its way out), and the private blocks
  // handed out where there is no window. Last: the members of every call keep their places.
  std::unique_ptr<SharedRegions> regions_;
  std::vector<void*> private_shared_;
};

// MPI datatype for a Poseidon dtype (half types map to 2-byte opaque units).
MPI_Datatype ToMpiType(DType dtype);

}  // namespace poseidon
