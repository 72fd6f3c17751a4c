// The Backend seam: moves bytes between ranks. Strategies and the engine see only this
// interface, never MPI or NCCL directly.
//
// Contract shared by every backend:
//  - Collectives are sums (the only reduction gradient exchange needs). float16 / bfloat16 are
//    accumulated in float32 and rounded once at the end.
//  - Blocking calls with POSEIDON_CHECK_ARGS on (the default) first agree across ranks: every
//    rank's arguments are checked locally, then one small allreduce compares count, dtype, root
//    and the shard layout. Any bad argument or disagreement fails the call on *every* rank with
//    an error naming the call, the value and the ranks involved, so no rank is left waiting.
//    CallOptions::agreed skips the allreduce when the caller has verified agreement itself.
//  - The non-blocking IAllReduce skips that check: the engine verifies agreement itself.
//  - Every backend derives from CheckedBackend (checked_backend.h), where these local checks
//    and the agreement are written once; a backend writes only how it moves the bytes.
//  - send == recv means in place where the call allows it (AllReduce).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/status.h"

namespace poseidon {

// Polled by every wait of a call while it waits for its peers (MPI_Test loops, the
// shared-memory collectives' synchronization). A non-OK status abandons the call at once with
// that status. Implementations must be cheap and thread-safe. MPI cannot cancel a posted
// collective: an abandoned call leaves its request (and the buffers it writes) to MPI, so the
// caller must treat the communicator as dead afterwards (the engine ends the job).
class Interrupt {
 public:
  virtual ~Interrupt() = default;
  virtual Status Check() const = 0;
};

struct CallOptions {
  MemoryKind memory = MemoryKind::kHost;
  void* stream = nullptr;  // cudaStream_t for device memory; the call is ordered on it
  // True when the caller has already verified, across ranks, that every rank makes this call
  // with the same arguments (the engine's negotiation does): blocking calls then skip their
  // argument-agreement allreduce (one latency per call). Local checks still run; since the
  // arguments agree, a local failure is the same on every rank.
  bool agreed = false;
  // Non-null: every wait inside the call polls it (see Interrupt), so the call never blocks
  // past the moment it reports a lost peer or a deadline. Null: MPI's own blocking waits.
  // Every rank must pass one, or none: the polled form uses MPI's non-blocking collectives,
  // which never match a peer's blocking one.
  const Interrupt* interrupt = nullptr;
  // The caller's own terms of the call beyond its buffers, as text (e.g. "op Average, prescale
  // 1, postscale 1" when the caller turns a sum into an average itself), or null / "" for none.
  // Blocking calls compare it across ranks like the count and dtype: when it differs, every
  // rank fails with kMismatch naming each rank's text (at least its first 231 bytes; the whole
  // text is compared). Not compared when `agreed` is set, nor where the arguments are not
  // checked (POSEIDON_CHECK_ARGS=0 with the shared-memory window off).
  const char* detail = nullptr;
};

// A pending non-blocking collective. Owns whatever scratch the call needs until it completes.
class Request {
 public:
  virtual ~Request() = default;
  // True when complete (and then its result is final); never blocks.
  virtual Result<bool> Test() = 0;
  // Blocks until complete or, when interrupt is not null, until interrupt->Check() turns
  // non-OK: Wait then returns that status (naming the call) and the request is abandoned (see
  // Interrupt): it never completes here, its backend fails every later call with kAborted, and
  // MPI may still write its output buffers, which the caller must therefore never reuse.
  virtual Status Wait(const Interrupt* interrupt) = 0;
  // Blocks until complete (MPI's own wait: no interrupt).
  Status Wait() { return Wait(nullptr); }
};

// Takes a piece's sum range by range (SumPiece::sink): elements [offset, offset + count) of
// the piece, summed over ranks, readable only during the call. Called after the commit, once
// for every element of the piece, ranges in no set order; it must not fail (a caller with work
// that can fail prepares it before the collective).
using SumSink = std::function<void(size_t offset, size_t count, const void* sum)>;

// One piece of a piecewise sum (Backend::AllReducePieces): `count` elements read from `in`,
// their sum over ranks written to `out` (which may equal `in`); or, with a sink (never on the
// first piece, which the commit reads), handed to the sink instead, `out` then being scratch
// that may or may not be written.
struct SumPiece {
  const void* in = nullptr;
  void* out = nullptr;
  size_t count = 0;
  const SumSink* sink = nullptr;
};

// Called with the sum of a piecewise sum's first piece before any other piece's output is
// written; false declines the rest (no other output is written, every input keeps its value).
// Every rank sees the same sum, so every rank must decide alike from it.
using SumCommit = std::function<bool(const void* first_sum)>;

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;
  virtual bool SupportsMemory(MemoryKind memory) const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // recv[i] = sum over ranks of send[i], for i < count. Same count and dtype on every rank.
  virtual Status AllReduce(const void* send, void* recv, size_t count, DType dtype,
                           const CallOptions& opts = {}) = 0;
  // send holds sum(counts) elements, rank r's slice at offset sum(counts[0..r)); recv gets
  // counts[rank] elements, the sum over ranks of this rank's slice. counts (one per rank, any
  // values, zeros allowed) must be the same on every rank.
  virtual Status ReduceScatter(const void* send, void* recv, const std::vector<size_t>& counts,
                               DType dtype, const CallOptions& opts = {}) = 0;
  // recv gets count elements from every rank, in rank order (size() * count elements).
  virtual Status AllGather(const void* send, void* recv, size_t count, DType dtype,
                           const CallOptions& opts = {}) = 0;
  // send holds counts[rank] elements; recv gets every rank's elements in rank order.
  virtual Status AllGatherV(const void* send, void* recv, const std::vector<size_t>& counts,
                            DType dtype, const CallOptions& opts = {}) = 0;
  // buf on every rank gets root's count elements. Same count, dtype and root on every rank.
  // On the host backend with every rank on one node, a broadcast of 512 KiB or less returns on
  // its root, and on the ranks whose arguments match the root's, without waiting for the other
  // ranks (runtime/shm_collectives.h, "Broadcast"; ReduceScatter does the same on ranks that
  // receive nothing): a failure that those ranks find then fails the next call on every rank,
  // naming it.
  virtual Status Broadcast(void* buf, size_t count, DType dtype, int root,
                           const CallOptions& opts = {}) = 0;
  virtual Status Barrier() = 0;

  // Fails a collective on every rank at once: joins, moving no data, the cross-rank argument
  // agreement that the peers run inside their matching call with this rank's own error
  // (`local`, not OK), so their call fails with a message naming this rank and the cause
  // instead of waiting for it. Returns `local`. `call` names the call ("AllReduce").
  virtual Status FailTogether(const char* call, const Status& local,
                              const Interrupt* interrupt) = 0;

  // Optional: the allreduce of several pieces as if they were one buffer, their concatenation
  // in order, with no packing copy (the engine's fused groups). commit (may be null) sees the
  // first piece's sum first (see SumCommit); *committed says whether the rest was written.
  // Returns kUnimplemented, on every rank alike, when this backend has no such path for the
  // call (the caller then packs into one buffer and calls AllReduce); the default.
  virtual Status AllReducePieces(const std::vector<SumPiece>& pieces, DType dtype,
                                 const CallOptions& opts, const SumCommit& commit,
                                 bool* committed) {
    (void)pieces, (void)dtype, (void)opts, (void)commit, (void)committed;
    return Status(StatusCode::kUnimplemented, "AllReducePieces: not offered by this backend");
  }

  // Optional: `bytes` of host memory for collective buffers that this backend's collectives
  // can read and write on every rank directly (the host backend with every rank on one node:
  // node-shared memory, runtime/shm_regions.h), like ncclMemAlloc or MPI_Alloc_mem. Collective:
  // every rank calls it, and FreeShared, in the same order (the sizes may differ). An allreduce
  // whose send and recv lie in such memory on every rank skips the copies through the window,
  // and so does a reduce-scatter or allgather whose input lies there on every rank.
  // Where the backend has no shared path (across nodes, the window off), plain memory that
  // FreeShared still takes. The memory lives until FreeShared or the backend's destruction
  // (collective), whichever comes first. kUnimplemented by default.
  virtual Result<void*> AllocShared(size_t bytes, const CallOptions& opts = {}) {
    (void)bytes, (void)opts;
    return Status(StatusCode::kUnimplemented, "AllocShared: not offered by this backend");
  }
  // Frees memory that AllocShared returned on this rank; collective like it.
  virtual Status FreeShared(void* p, const CallOptions& opts = {}) {
    (void)p, (void)opts;
    return Status(StatusCode::kUnimplemented, "FreeShared: not offered by this backend");
  }

  // The non-blocking allreduce (the engine's chunk pipeline). The buffers must stay valid and
  // untouched until the request completes.
  virtual Result<std::unique_ptr<Request>> IAllReduce(const void* send, void* recv, size_t count,
                                                      DType dtype,
                                                      const CallOptions& opts = {}) = 0;
};

}  // namespace poseidon
