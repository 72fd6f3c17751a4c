// Communicator: Poseidon's view of a group of ranks. Made from MPI_COMM_WORLD or any MPI
// communicator the user passes; Poseidon works on its own duplicate, so its traffic never
// matches the user's messages.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "runtime/backend.h"
#include "runtime/status.h"

namespace poseidon {

class Liveness;

// Calls MPI_Init_thread (asking for MPI_THREAD_MULTIPLE) unless MPI is already initialized.
// Returns the thread level MPI provides.
Result<int> InitMpi(int* argc, char*** argv);

class Communicator {
 public:
  // MPI must be initialized. Collective over comm. Duplicates comm; the duplicate is freed by
  // the destructor, which must run before MPI_Finalize. Fails on every rank with kMismatch when
  // ranks hold different values of an Agreed setting (settings.def; see runtime/agreement.h),
  // and on a rank whose POSEIDON_* value does not parse with that kInvalidArgument (the other
  // ranks then get kMismatch naming it). Settings changed after Create are not checked again.
  static Result<std::shared_ptr<Communicator>> Create(MPI_Comm comm = MPI_COMM_WORLD);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Rank and rank count among the ranks that share this node (MPI_COMM_TYPE_SHARED).
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  int num_nodes() const { return num_nodes_; }
  // A key naming the world size and the sorted set of host names, e.g. "P4-hosts1-9f3a2c1b";
  // the cost model's cache is keyed by it.
  const std::string& host_key() const { return host_key_; }
  int mpi_thread_level() const { return thread_level_; }

  MPI_Comm mpi_comm() const { return comm_; }

  // The backend for host memory (MPI).
  Backend& host_backend() { return *host_backend_; }
  // The backend for a memory kind: host -> MPI; device -> NCCL when built and usable, else MPI
  // staging when CUDA is built, else kUnavailable.
  // The device backend is made on the first backend(kDevice) call, which is collective (every
  // rank must make it, on the CUDA device it will use): NCCL when it is built and every rank
  // has its own GPU (distinct current devices among the ranks of each node; NCCL cannot put
  // two ranks on one GPU), else the MPI backend staged through pinned host buffers.
  // POSEIDON_DEVICE_BACKEND=nccl|staged forces one. kUnavailable (on every rank) when any rank
  // has no usable GPU or this build has no CUDA; the answer is kept for later calls.
  Result<Backend*> backend(MemoryKind memory);

  // The peer watch started with the communicator (POSEIDON_PEER_TIMEOUT_S and friends;
  // runtime/liveness.h): inert when off, at one rank, or below MPI_THREAD_MULTIPLE. An engine
  // uses it when its options match.
  Liveness& liveness() const { return *liveness_; }

 private:
  Communicator() = default;

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm local_comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1, num_nodes_ = 1;
  int thread_level_ = MPI_THREAD_SINGLE;
  std::string host_key_;
  std::unique_ptr<Backend> host_backend_;
  // Made by the first backend(kDevice) call; device_status_ holds why there is none.
  Result<std::unique_ptr<Backend>> MakeDeviceBackend();
  bool device_probed_ = false;
  std::unique_ptr<Backend> device_backend_;
  Status device_status_;
  std::unique_ptr<Liveness> liveness_;
};

}  // namespace poseidon
