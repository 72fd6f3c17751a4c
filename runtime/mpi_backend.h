// MpiBackend: collectives over an MPI communicator on host memory.
//
// Sums run in MPI for float32/64 and the integer types. float16 / bfloat16 are widened to a
// float32 scratch buffer, reduced in float32 and rounded once, so a P-rank sum of halves loses
// no more than one rounding. Device memory is staged through pinned host buffers when CUDA is
// built (the GPU path); otherwise device buffers are refused with kUnavailable.
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "runtime/backend.h"

namespace poseidon {

class ShmCollectives;

class MpiBackend : public Backend {
 public:
  // Uses comm as given (the Communicator passes its private duplicate). Does not free it.
  explicit MpiBackend(MPI_Comm comm);
  ~MpiBackend() override;

  std::string name() const override { return "mpi"; }
  bool SupportsMemory(MemoryKind memory) const override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status AllReduce(const void* send, void* recv, size_t count, DType dtype,
                   const CallOptions& opts = {}) override;
  Status ReduceScatter(const void* send, void* recv, const std::vector<size_t>& counts,
                       DType dtype, const CallOptions& opts = {}) override;
  Status AllGather(const void* send, void* recv, size_t count, DType dtype,
                   const CallOptions& opts = {}) override;
  Status AllGatherV(const void* send, void* recv, const std::vector<size_t>& counts, DType dtype,
                    const CallOptions& opts = {}) override;
  Status Broadcast(void* buf, size_t count, DType dtype, int root,
                   const CallOptions& opts = {}) override;
  Status Barrier() override;

  Result<std::unique_ptr<Request>> IAllReduce(const void* send, void* recv, size_t count,
                                              DType dtype, const CallOptions& opts = {}) override;
  Result<std::unique_ptr<Request>> IReduceScatter(const void* send, void* recv,
                                                  const std::vector<size_t>& counts, DType dtype,
                                                  const CallOptions& opts = {}) override;
  Result<std::unique_ptr<Request>> IAllGatherV(const void* send, void* recv,
                                               const std::vector<size_t>& counts, DType dtype,
                                               const CallOptions& opts = {}) override;

  MPI_Comm comm() const { return comm_; }

 private:
  Status CheckMemory(const char* call, const CallOptions& opts) const;
  Status ReduceScatterUnchecked(const void* send, void* recv, const std::vector<size_t>& counts,
                                DType dtype);
  Status AllReduceUnchecked(const void* send, void* recv, size_t count, DType dtype);
  // The shared-memory collectives for a call moving `bytes` (the full buffer: count * dtype size
  // after the argument check, so every rank decides alike), or nullptr for plain MPI: below
  // POSEIDON_SHM_THRESHOLD_BYTES, or when the ranks span several nodes. Creates the window at
  // the first large call (collectively), and again when POSEIDON_SHM_CHUNK_BYTES changes; the
  // destructor frees it (collectively). Like every POSEIDON_* knob, the threshold and chunk
  // must be set alike on every rank, or ranks would take different paths.
  Result<ShmCollectives*> ShmFor(size_t bytes);

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  std::unique_ptr<ShmCollectives> shm_;
  bool shm_multi_node_ = false;  // learned collectively at the first large call
};

// MPI datatype for a Poseidon dtype (half types map to 2-byte opaque units).
MPI_Datatype ToMpiType(DType dtype);
// "MPI_Allreduce failed: <MPI's error string>".
Status MpiError(const char* what, int code);

}  // namespace poseidon
