// NcclBackend: device-memory collectives over NCCL, one GPU per rank.
//
// Bootstrap (collective over the MPI communicator, every rank calls Create):
//  1. every rank checks it has a usable GPU; the ranks exchange that, so a rank without one
//     makes Create fail with kUnavailable on *every* rank instead of leaving the others in
//     the NCCL init;
//  2. rank 0 calls ncclGetUniqueId and broadcasts it with MPI;
//  3. every rank calls ncclCommInitRankConfig in NCCL's non-blocking mode (config.blocking = 0)
//     on its current CUDA device and polls ncclCommGetAsyncError until the init is done, then
//     the ranks agree that all of them succeeded (the ranks whose init worked abort their
//     communicator otherwise).
// Every wait of these steps is bounded by the deadline (POSEIDON_PEER_TIMEOUT_S unless given):
// the MPI exchanges use the non-blocking forms polled against it (runtime/mpi_wait.h), and an
// init still running at the deadline (a rank failed or stopped before joining the NCCL
// bootstrap) is aborted (ncclCommAbort) and Create fails with kTimeout naming the call and the
// bound, instead of waiting for ever.
//
// Calls are enqueued on CallOptions::stream (a cudaStream_t; null is the legacy default
// stream) and return once enqueued: the result is ready for later work on that stream, and the
// host must synchronize the stream before reading it. Blocking forms first agree on their
// arguments across ranks over MPI (POSEIDON_CHECK_ARGS); non-blocking forms return a Request
// backed by a CUDA event recorded after the operation.
//
// Deadlines and failures. In non-blocking mode no NCCL call blocks its caller: an enqueue that
// answers ncclInProgress is polled until NCCL has queued it, within the deadline. A watchdog
// thread (when the deadline is not 0) follows every enqueued operation through a CUDA event
// recorded after it and polls ncclCommGetAsyncError. It aborts the communicator (ncclCommAbort,
// which also ends kernels stuck waiting for a peer) when NCCL reports an error, or when
// operations are pending and none has completed for the deadline (device::ProgressWatch): a
// peer died (over the network, NVLink or shared memory alike), stopped, or called another
// collective. It needs no caller thread, so a thread blocked in cudaStreamSynchronize behind
// such an operation is released too. A Request then fails with that cause (kTimeout naming the
// call and the bound, or kBackendError with NCCL's error), and every later call fails at once
// with kAborted naming it. Request::Wait also polls its interrupt. The bound covers NCCL work
// only, and a rank joining a collective more than the deadline after its peers counts as lost
// (unlike the host backend's heartbeats, this cannot tell a slow peer from a dead one).
// Deadline 0: no watchdog and no bound (a dead peer then hangs the NCCL kernels for good).
//
// Precision: float16 / bfloat16 accumulate in float32, as the Backend contract says: the input
// is widened into a float32 scratch, summed by NCCL in float32 and rounded once into the output
// (the casts are runtime/cuda_util.cu's kernels). This moves twice the bytes of a sum in the
// element type.
//
// Shapes NCCL does not have (device::PlanReduceScatter, device::ReducePiece):
//  - ReduceScatter with uneven shards: one ncclReduce per rank with a non-empty shard, rooted at
//    it and reading its slice of the send buffer in place, in one ncclGroupStart / End (one
//    launch). No re-layout copy, no scratch; over NCCL's ring each rank but the root sends the
//    slice once, the bytes of a padded ring reduce-scatter.
//  - AllGatherV with uneven counts: P grouped ncclBroadcast calls (root r sends its counts[r]
//    elements straight into place in every rank's recv), no scratch and no copies.
//
// Memory: nothing is allocated or freed in steady state (cudaFree synchronizes the device,
// which can deadlock against NCCL kernels waiting for peers). The float32 scratch grows
// (device::GrowCapacity) when a call needs more; a buffer it outgrew is kept, since work queued
// on it may still run, and every buffer is freed at destruction, after the communicator is
// destroyed or aborted and the tracked work has finished. Uses of the scratch on different
// streams are ordered by an event.
//
// Thread safety: one calling thread at a time (the engine thread owns the backend); the
// watchdog shares the communicator with it under an internal lock. Requests must not outlive
// the backend.
#pragma once

#include <mpi.h>
#include <nccl.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/checked_backend.h"
#include "runtime/cuda_util.h"
#include "runtime/device_backend_logic.h"

namespace poseidon {

class NcclBackend final : public CheckedBackend {
 public:
  // Collective over comm (which must outlive the backend). timeout_s bounds every wait on
  // NCCL (see above): < 0 takes POSEIDON_PEER_TIMEOUT_S, 0 disables; the same on every rank.
  // kUnavailable when any rank has no usable GPU; kTimeout when a step did not finish within
  // the deadline; kBackendError when NCCL fails to initialize.
  static Result<std::unique_ptr<NcclBackend>> Create(MPI_Comm comm, double timeout_s = -1);
  // Waits (within the deadline) for the work it tracks, then destroys the communicator, or
  // aborts it when that work cannot finish; then frees its buffers.
  ~NcclBackend() override;

  std::string name() const override { return "nccl"; }
  bool SupportsMemory(MemoryKind memory) const override { return memory == MemoryKind::kDevice; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // The CUDA device the NCCL communicator was created on.
  int device() const { return device_; }
  // The deadline in seconds (0: none).
  double timeout_s() const { return timeout_s_; }

  // An NCCL allreduce of one word on an internal stream, waited for (within the deadline).
  Status Barrier() override;

  // OK while healthy (polls ncclCommGetAsyncError; an error it reports aborts the
  // communicator); once aborted, the cause, as the watchdog or the failed call recorded it.
  Status CheckAsyncError();

 protected:
  Status CheckBuffer(const char* call, const char* which, const void* p, size_t count,
                     size_t bytes) const override;  // CheckDevicePointer
  // CheckUsable: a rank whose communicator was aborted fails the call on every rank.
  Status Usable(const char* call) override;
  // AgreeOnArgs over the MPI communicator, under POSEIDON_CHECK_ARGS.
  Status Agree(const CollectiveArgs& args, const Interrupt* interrupt) override;
  PSD_CHECKED_BACKEND_HOOKS

 private:
  // An enqueued operation the watchdog follows: the event recorded after it.
  struct Tracked {
    cudaEvent_t event;
    const char* call;
  };

  NcclBackend() = default;

  // OK while usable; else kAborted naming `call` and the cause of the abort.
  Status CheckUsable(const char* call);
  // Runs `enqueue` (NCCL calls on comm_, returning the first failure) under the lock, then
  // polls until NCCL has queued the work (non-blocking mode), within the deadline.
  Status Enqueue(const char* what, const std::function<ncclResult_t()>& enqueue);
  // Records an event after the work just enqueued on `stream` for the watchdog.
  Status Track(const char* call, cudaStream_t stream);
  // The float32 scratch for `elems` elements, ordered on `stream` after its previous use
  // (ScratchUsed records that use).
  Result<float*> Scratch(size_t elems, cudaStream_t stream);
  Status ScratchUsed(cudaStream_t stream);

  Status LaunchAllReduce(const char* call, const void* send, void* recv, size_t count,
                         DType dtype, cudaStream_t stream);
  Status LaunchReduceScatter(const char* call, const void* send, void* recv,
                             const std::vector<size_t>& counts, DType dtype, cudaStream_t stream);
  Status LaunchAllGatherV(const char* call, const void* send, void* recv,
                          const std::vector<size_t>& counts, DType dtype, cudaStream_t stream);
  Result<std::unique_ptr<Request>> MakeRequest(const char* call, cudaStream_t stream);

  // Callers hold mu_.
  Status SettleLocked(std::unique_lock<std::mutex>& lock, ncclResult_t r, const char* what);
  Status FailLocked(ncclResult_t r, const char* what, bool async);
  Status AbortLocked(Status cause);
  Status PollAsyncLocked();
  void ReapLocked();
  // The watchdog thread's loop.
  void Watch();

  MPI_Comm mpi_comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, device_ = 0;
  double timeout_s_ = 0;
  cudaStream_t barrier_stream_ = nullptr;
  int* barrier_word_ = nullptr;  // device memory, one int, zeroed at Create

  // Calling thread only.
  float* scratch_ = nullptr;  // float32 accumulation scratch (half-precision sums)
  size_t scratch_bytes_ = 0;
  std::vector<void*> retired_;  // outgrown scratch buffers, freed at destruction
  CudaEvent scratch_done_;      // recorded after each use of the scratch

  // mu_ serializes every use of comm_ (the calling thread's enqueues and polls, the
  // watchdog's polls and abort). A leaf lock, held only across NCCL calls that do not block in
  // non-blocking mode, event queries, and ncclCommAbort.
  std::mutex mu_;
  std::condition_variable wake_;  // with mu_: stop_ was set
  ncclComm_t comm_ = nullptr;     // guarded by mu_ once the watchdog runs
  bool aborted_ = false;          // guarded by mu_
  Status cause_;                  // guarded by mu_: why the communicator was aborted
  std::deque<Tracked> pending_;   // guarded by mu_
  std::vector<cudaEvent_t> spare_events_;  // guarded by mu_
  device::ProgressWatch watch_;            // guarded by mu_
  bool stop_ = false;                      // guarded by mu_
  std::thread watchdog_;
};

// ncclDataType_t for a Poseidon dtype.
ncclDataType_t ToNcclType(DType dtype);

}  // namespace poseidon
