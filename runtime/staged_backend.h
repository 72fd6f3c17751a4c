// StagedBackend: device-memory collectives run by a host backend (MPI), staged through pinned
// host buffers. It is how several ranks share one GPU (NCCL cannot put two ranks on one
// device) and the fallback when NCCL is not built.
//
// Each blocking call, on the caller's stream (CallOptions::stream):
//  1. checks the arguments locally (device pointers, counts), posts the host collectives of
//     earlier non-blocking calls still waiting for their input (see below), copies the device
//     input into a pinned host buffer (cudaMemcpyAsync, then an event) and waits for that copy:
//     the host collective needs the bytes. The wait polls the event within the deadline
//     (POSEIDON_PEER_TIMEOUT_S unless given; 0: none) and the caller's interrupt;
//  2. with POSEIDON_CHECK_ARGS on, agrees on the arguments and on step 1's status across ranks,
//     so a bad argument or a failed copy fails every rank instead of hanging one;
//  3. runs the host collective (MpiBackend, host memory; float16 / bfloat16 are summed there in
//     float32 and rounded once, as the Backend contract says);
//  4. copies the result back with cudaMemcpyAsync on the same stream and returns: later work on
//     that stream sees the result; the host must synchronize the stream before reading it.
// Non-blocking calls never wait for the device: they enqueue the copy to the pinned buffer and
// an event after it, and queue the call. The queued calls' host collectives are posted in call
// order (MPI matches collectives by order) as soon as their copies are done, by whichever call
// into this backend or its requests comes next (Test, Wait, any call); Wait waits for them
// within the deadline. A request's result is copied back when Test / Wait sees the host
// collective complete. A queued call that cannot be posted (its copy never ran by the
// deadline, or the post failed) breaks the backend: it and every later call fail with
// kAborted naming the cause, since the peers' collectives would no longer pair with ours.
// The host backend must not be called directly while queued calls are pending (its collectives
// would overtake them).
//
// Pinned buffers come from a pool (grown rarely, never freed before it); a buffer goes back to
// the pool only once every copy from or to it has finished (an event recorded after the copy),
// so concurrent calls never share bytes, and one a host collective that gave up may still
// write is never handed out again.
#pragma once

#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/checked_backend.h"
#include "runtime/cuda_util.h"
#include "runtime/device_backend_logic.h"
#include "runtime/mpi_backend.h"

namespace poseidon {

class StagedBackend final : public CheckedBackend {
 public:
  // host must outlive this backend. timeout_s bounds the host's waits for the device (the
  // copies to pinned memory): < 0 takes POSEIDON_PEER_TIMEOUT_S, 0 disables. Fails with
  // kUnavailable when no GPU is present.
  static Result<std::unique_ptr<StagedBackend>> Create(MpiBackend* host, double timeout_s = -1);
  // Fails the calls still queued, then waits for the copies still running from or to pinned
  // buffers. Requests must not outlive the backend.
  ~StagedBackend() override;

  std::string name() const override { return "mpi-staged"; }
  bool SupportsMemory(MemoryKind memory) const override { return memory == MemoryKind::kDevice; }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }

  Status Barrier() override;

 protected:
  Status CheckBuffer(const char* call, const char* which, const void* p, size_t count,
                     size_t bytes) const override;  // CheckDevicePointer
  // OK while usable; kAborted naming `call` and the cause once broken.
  Status Usable(const char* call) override;
  // Posts the queued calls' host collectives first, then the host backend's agreement.
  Status Agree(const CollectiveArgs& args, const Interrupt* interrupt) override;
  // Each stages its input into pinned memory first: a failed copy joins the local outcome
  // that the ranks agree on.
  PSD_CHECKED_BACKEND_HOOKS

 private:
  struct InFlight;
  struct Op;
  class StagedRequest;
  // A queued non-blocking allreduce: the host collective's options, its `bytes` (summed in place
  // in the pinned buffer, then copied to dev_out) and the caller's stream.
  static std::shared_ptr<Op> NewOp(const char* call, DType dtype, const CallOptions& opts,
                                   void* dev_out, size_t bytes);
  StagedBackend(MpiBackend* host, double timeout_s);

  // A blocking host call's status; when the call gave up with its collective still running
  // (the host backend is then broken), the pinned buffer MPI may still write is leaked on
  // purpose instead of returning to the pool. Leaves `buf` alone otherwise.
  Status HostResult(Status status, PinnedPool::Buffer& buf);
  // Acquires a pinned buffer of `buf_bytes`, copies `bytes` of dev into its start on the stream
  // and waits for that copy (within the deadline and the interrupt). On failure `buf` is empty:
  // a copy that may still run keeps its buffer out of the pool until it ends.
  Status StageIn(const char* call, const void* dev, size_t bytes, size_t buf_bytes,
                 cudaStream_t stream, const Interrupt* interrupt, PinnedPool::Buffer* buf);
  // Copies pinned host -> device on the stream and keeps `buf` out of the pool until that copy
  // is done.
  Status StageOut(void* dev, const void* host, size_t bytes, cudaStream_t stream,
                  PinnedPool::Buffer buf);
  // Keeps `buf` out of the pool until `done` (recorded after the last copy using it) is reached.
  void Retire(PinnedPool::Buffer buf, CudaEvent done);
  // Records an event after the work on `stream` and retires `buf` behind it; when no event can
  // be recorded, synchronizes the stream instead, and leaks the buffer when that fails too.
  void RetireAfter(PinnedPool::Buffer buf, cudaStream_t stream);
  // Returns buffers whose copies have finished to the pool.
  void Reap();
  // A non-blocking call's start: the copy to `op`'s buffer, the event after it, the queue.
  Result<std::unique_ptr<Request>> Start(std::shared_ptr<Op> op, const void* dev);
  // Posts, in call order, the host collectives of queued calls whose copies are done. With
  // `wait`, first waits (within the deadline and the interrupt) until `until` (null: every
  // queued call) is posted. Returns `until`'s error, or the one that broke the backend here.
  Status Post(const Op* until, bool wait, const Interrupt* interrupt);
  Status PostOne(Op& op);
  // Fails every queued call with `cause` and breaks the backend. Caller holds post_mu_.
  void BreakLocked(const Status& cause);

  MpiBackend* host_;
  double timeout_s_ = 0;
  std::shared_ptr<PinnedPool> pool_;
  // Lock order: post_mu_, then mu_.
  std::mutex post_mu_;
  std::deque<std::shared_ptr<Op>> queued_;  // guarded by post_mu_: not yet posted, call order
  Status broken_;                           // guarded by post_mu_
  std::mutex mu_;
  std::vector<std::unique_ptr<InFlight>> in_flight_;  // guarded by mu_
};

}  // namespace poseidon
