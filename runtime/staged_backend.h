// StagedBackend: device-memory collectives run by a host backend (MPI), staged through pinned
// host buffers. It is how several ranks share one GPU (NCCL cannot put two ranks on one
// device) and the fallback when NCCL is not built.
//
// Each call, on the caller's stream (CallOptions::stream):
//  1. checks the arguments locally (device pointers, counts) and, with POSEIDON_CHECK_ARGS on,
//     agrees on them across ranks, so a bad argument fails every rank instead of hanging one;
//  2. copies the device input into a pinned host buffer (cudaMemcpyAsync on the stream) and
//     synchronizes the stream, the only host synchronization: the host collective needs the
//     bytes;
//  3. runs the host collective (MpiBackend, host memory; float16 / bfloat16 are summed there in
//     float32 and rounded once);
//  4. copies the result back with cudaMemcpyAsync on the same stream and returns: later work on
//     that stream sees the result; the host must synchronize the stream before reading it.
// Pinned buffers come from a pool (grown, reused); a buffer returns to the pool only after the
// copy back from it has finished (an event), so concurrent requests never share bytes.
// Non-blocking forms do steps 1 (local checks only) and 2 at the call, start the host
// collective, and enqueue the copy back when Test / Wait sees it complete.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/backend.h"
#include "runtime/cuda_util.h"
#include "runtime/mpi_backend.h"

namespace poseidon {

class StagedBackend : public Backend {
 public:
  // host must outlive this backend. Fails with kUnavailable when no GPU is present.
  static Result<std::unique_ptr<StagedBackend>> Create(MpiBackend* host);
  // Waits for the copies still running out of pinned buffers.
  ~StagedBackend() override;

  std::string name() const override { return "mpi-staged"; }
  bool SupportsMemory(MemoryKind memory) const override { return memory == MemoryKind::kDevice; }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }

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

 private:
  struct InFlight;
  explicit StagedBackend(MpiBackend* host);

  // Agreement across ranks on a blocking call's arguments and on this rank's local status
  // (which includes the staging copy), when POSEIDON_CHECK_ARGS is on.
  Status Agree(const char* call, int64_t count, DType dtype, int64_t root, uint64_t layout_hash,
               Status local, const Interrupt* interrupt);
  // A blocking host call's status; when the call gave up with its collective still running
  // (the host backend is then broken), the pinned buffer MPI may still write is leaked on
  // purpose instead of returning to the pool. Leaves `buf` alone otherwise.
  Status HostResult(Status status, PinnedPool::Buffer& buf);
  // Copies device -> pinned host on the stream and waits for it.
  Status StageIn(const void* dev, void* host, size_t bytes, cudaStream_t stream);
  // Copies pinned host -> device on the stream and keeps `buf` alive until that copy is done.
  Status StageOut(void* dev, const void* host, size_t bytes, cudaStream_t stream,
                  PinnedPool::Buffer buf);
  // Returns buffers whose copy back has finished to the pool.
  void Reap();

  MpiBackend* host_;
  std::shared_ptr<PinnedPool> pool_;
  std::mutex mu_;
  std::vector<std::unique_ptr<InFlight>> in_flight_;  // guarded by mu_
};

}  // namespace poseidon
