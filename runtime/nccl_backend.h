// NcclBackend: device-memory collectives over NCCL, one GPU per rank.
//
// Bootstrap (collective over the MPI communicator, every rank calls Create):
//  1. every rank checks it has a usable GPU; the ranks exchange that, so a rank without one
//     makes Create fail with kUnavailable on *every* rank instead of leaving the others in
//     ncclCommInitRank;
//  2. rank 0 calls ncclGetUniqueId and broadcasts it with MPI_Bcast;
//  3. every rank calls ncclCommInitRank on its current CUDA device, and the ranks agree that
//     all of them succeeded (the ranks whose init worked abort their communicator otherwise).
//
// Calls are enqueued on CallOptions::stream (a cudaStream_t; null is the legacy default
// stream) and return once enqueued: the result is ready for later work on that stream, and the
// host must synchronize the stream before reading it. Blocking forms first agree on their
// arguments across ranks over MPI (POSEIDON_CHECK_ARGS); non-blocking forms return a Request
// backed by a CUDA event recorded after the operation.
//
// NCCL reports failures of running operations (a peer died, a network error) asynchronously:
// every call and every Request::Test polls ncclCommGetAsyncError; an error aborts the NCCL
// communicator (ncclCommAbort, which also unblocks kernels stuck waiting for a dead peer) and
// makes this and every later call fail with the stored error (sticky, like NCCL's own).
//
// Shapes NCCL does not have:
//  - ReduceScatter with uneven shards: NCCL's reduce-scatter gives every rank the same count.
//    The send buffer is re-laid out into a padded scratch (P slots of max(counts) elements,
//    one device-to-device copy per rank's slice), reduce-scattered, and this rank's first
//    counts[rank] elements copied out (directly into recv when its shard is the largest).
//    With Poseidon's shards (sizes differ by at most one) the padding costs at most P elements,
//    and the ring stays bandwidth-optimal, unlike P grouped ncclReduce calls whose roots would
//    each receive a whole shard's traffic.
//  - AllGatherV with uneven counts: P grouped ncclBroadcast calls (root r sends its counts[r]
//    elements straight into place in every rank's recv), no scratch and no copies.
//
// Precision: float16 / bfloat16 are summed by NCCL in the element type itself (a ring
// reduction rounds at each of its P-1 steps), not in float32 as the host backend does; the
// difference is within a few half-precision ulps at the rank counts we run.
//
// Thread safety: one thread at a time (the engine thread owns the backend). Requests must not
// outlive the backend.
#pragma once

#include <mpi.h>
#include <nccl.h>

#include <memory>
#include <string>
#include <vector>

#include "runtime/backend.h"
#include "runtime/cuda_util.h"

namespace poseidon {

class NcclBackend : public Backend {
 public:
  // Collective over comm (which must outlive the backend). kUnavailable when any rank has no
  // usable GPU; kBackendError when NCCL fails to initialize.
  static Result<std::unique_ptr<NcclBackend>> Create(MPI_Comm comm);
  ~NcclBackend() override;

  std::string name() const override { return "nccl"; }
  bool SupportsMemory(MemoryKind memory) const override { return memory == MemoryKind::kDevice; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // The CUDA device the NCCL communicator was created on.
  int device() const { return device_; }

  Status AllReduce(const void* send, void* recv, size_t count, DType dtype,
                   const CallOptions& opts = {}) override;
  Status ReduceScatter(const void* send, void* recv, const std::vector<size_t>& counts, DType dtype,
                       const CallOptions& opts = {}) override;
  Status AllGather(const void* send, void* recv, size_t count, DType dtype,
                   const CallOptions& opts = {}) override;
  Status AllGatherV(const void* send, void* recv, const std::vector<size_t>& counts, DType dtype,
                    const CallOptions& opts = {}) override;
  Status Broadcast(void* buf, size_t count, DType dtype, int root,
                   const CallOptions& opts = {}) override;
  // An NCCL allreduce of one word on an internal stream, waited for (polling async errors).
  Status Barrier() override;
  Status FailTogether(const char* call, const Status& local, const Interrupt* interrupt) override;

  Result<std::unique_ptr<Request>> IAllReduce(const void* send, void* recv, size_t count,
                                              DType dtype, const CallOptions& opts = {}) override;
  Result<std::unique_ptr<Request>> IReduceScatter(const void* send, void* recv,
                                                  const std::vector<size_t>& counts, DType dtype,
                                                  const CallOptions& opts = {}) override;
  Result<std::unique_ptr<Request>> IAllGatherV(const void* send, void* recv,
                                               const std::vector<size_t>& counts, DType dtype,
                                               const CallOptions& opts = {}) override;

  // OK while healthy; the sticky error once NCCL reported one (polls ncclCommGetAsyncError).
  Status CheckAsyncError();

 private:
  NcclBackend() = default;

  Status Agree(const char* call, int64_t count, DType dtype, int64_t root, uint64_t layout_hash,
               Status local);
  Status LaunchAllReduce(const void* send, void* recv, size_t count, DType dtype,
                         cudaStream_t stream);
  Status LaunchReduceScatter(const void* send, void* recv, const std::vector<size_t>& counts,
                             DType dtype, cudaStream_t stream);
  Status LaunchAllGatherV(const void* send, void* recv, const std::vector<size_t>& counts,
                          DType dtype, cudaStream_t stream);
  Result<std::unique_ptr<Request>> MakeRequest(const char* call, cudaStream_t stream);
  // Turns a failed NCCL call into a Status; an asynchronous or internal failure aborts.
  Status NcclStatus(ncclResult_t r, const char* what);

  MPI_Comm mpi_comm_ = MPI_COMM_NULL;
  ncclComm_t comm_ = nullptr;
  int rank_ = 0, size_ = 1, device_ = 0;
  cudaStream_t barrier_stream_ = nullptr;
  int* barrier_word_ = nullptr;  // device memory, one int
  bool aborted_ = false;
  Status sticky_;
};

// ncclDataType_t for a Poseidon dtype.
ncclDataType_t ToNcclType(DType dtype);

}  // namespace poseidon
