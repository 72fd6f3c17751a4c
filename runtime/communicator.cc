#include "runtime/communicator.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <vector>

#include "runtime/log.h"
#include "runtime/mpi_backend.h"
#include "runtime/settings.h"

namespace poseidon {

Result<int> InitMpi(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (initialized) {
    MPI_Query_thread(&provided);
    return provided;
  }
  int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  if (rc != MPI_SUCCESS) return MpiError("MPI_Init_thread", rc);
  return provided;
}

Result<std::shared_ptr<Communicator>> Communicator::Create(MPI_Comm comm) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  PSD_REQUIRE(initialized && !finalized, StatusCode::kInvalidArgument,
              "Communicator::Create: MPI is ", finalized ? "already finalized" : "not initialized",
              "; call MPI_Init_thread (or poseidon::InitMpi) first");
  PSD_REQUIRE_ARG(comm != MPI_COMM_NULL, "Communicator::Create: comm is MPI_COMM_NULL");
  PSD_CHECK(Settings::Global().Validate());

  std::shared_ptr<Communicator> c(new Communicator());
  int rc = MPI_Comm_dup(comm, &c->comm_);
  if (rc != MPI_SUCCESS) return MpiError("MPI_Comm_dup", rc);
  // Errors come back as codes, so they become Status values instead of aborting the job.
  MPI_Comm_set_errhandler(c->comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(c->comm_, &c->rank_);
  MPI_Comm_size(c->comm_, &c->size_);
  MPI_Query_thread(&c->thread_level_);
  SetLogRank(c->rank_);

  rc = MPI_Comm_split_type(c->comm_, MPI_COMM_TYPE_SHARED, c->rank_, MPI_INFO_NULL,
                           &c->local_comm_);
  if (rc != MPI_SUCCESS) return MpiError("MPI_Comm_split_type", rc);
  MPI_Comm_rank(c->local_comm_, &c->local_rank_);
  MPI_Comm_size(c->local_comm_, &c->local_size_);

  // Host names of every rank: number of nodes and the host-set key.
  char name[MPI_MAX_PROCESSOR_NAME] = {0};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::vector<char> all(static_cast<size_t>(c->size_) * MPI_MAX_PROCESSOR_NAME);
  rc = MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME,
                     MPI_CHAR, c->comm_);
  if (rc != MPI_SUCCESS) return MpiError("MPI_Allgather(host names)", rc);
  std::set<std::string> hosts;
  for (int r = 0; r < c->size_; ++r) {
    hosts.insert(std::string(&all[static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME]));
  }
  c->num_nodes_ = static_cast<int>(hosts.size());
  uint64_t h = 1469598103934665603ull;
  for (const auto& s : hosts) {
    for (char ch : s) {
      h ^= static_cast<unsigned char>(ch);
      h *= 1099511628211ull;
    }
    h ^= 0xff;
    h *= 1099511628211ull;
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%08x", static_cast<unsigned>(h ^ (h >> 32)));
  c->host_key_ = StrCat("P", c->size_, "-hosts", c->num_nodes_, "-", hex);

  c->host_backend_ = std::make_unique<MpiBackend>(c->comm_);
  return c;
}

Communicator::~Communicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;  // too late to free; MPI_Finalize released them
  host_backend_.reset();
  if (local_comm_ != MPI_COMM_NULL) MPI_Comm_free(&local_comm_);
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

Result<Backend*> Communicator::backend(MemoryKind memory) {
  if (memory == MemoryKind::kHost) return host_backend_.get();
  return UnavailableError("Communicator::backend: no backend for ", MemoryKindName(memory),
                          " memory in this build");
}

}  // namespace poseidon
