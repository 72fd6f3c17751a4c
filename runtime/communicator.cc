#include "runtime/communicator.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <vector>

#include "runtime/agreement.h"
#include "runtime/build_config.h"
#include "runtime/hash.h"
#include "runtime/liveness.h"
#include "runtime/log.h"
#include "runtime/mpi_backend.h"
#include "runtime/or_agreement.h"
#include "runtime/settings.h"
#if POSEIDON_CUDA_ENABLED
#include "runtime/cuda_util.h"
#include "runtime/staged_backend.h"
#endif
#if POSEIDON_NCCL_ENABLED
#include "runtime/nccl_backend.h"
#endif

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
  // A value that does not parse is this rank's error (returned first, below); the rank still
  // takes part in every collective of the setup, and its failed check travels with the agreed
  // settings, so that the other ranks fail with it instead of waiting for it in a collective.
  const Status valid = Settings::Global().Validate();

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
  PSD_ASSIGN_OR_RETURN(std::vector<std::string> names,
                       GatherHostNames(c->comm_, "Communicator::Create"));
  const std::set<std::string> hosts(names.begin(), names.end());
  c->num_nodes_ = static_cast<int>(hosts.size());
  uint64_t h = kFnv1aOffset;
  for (const auto& s : hosts) h = Fnv1a(s.c_str(), s.size() + 1, h);  // the NUL separates names
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%08x", static_cast<unsigned>(h ^ (h >> 32)));
  c->host_key_ = StrCat("P", c->size_, "-hosts", c->num_nodes_, "-", hex);

  c->host_backend_ = std::make_unique<MpiBackend>(c->comm_);

  // Settings that shape the collectives must match on every rank, or the first collective that
  // differs hangs or corrupts memory far from the cause.
  std::vector<AgreedValue> agreed = AgreedSettings();
  std::string validity = valid.ok() ? "ok" : valid.message();
  validity = validity.substr(0, validity.find(" [at "));  // the other ranks need no location
  agreed.push_back(AgreedValue{"Settings::Validate", validity});
  Status agreement = AgreeOnValues(c->comm_, agreed, "Communicator::Create");
  PSD_CHECK(valid);
  PSD_CHECK(agreement);

  // Heartbeats from here on (the settings agree, so every rank creates it alike): a peer that
  // freezes during set-up (the cost-model probe, planning, Engine::Create) or between engines
  // is named and ends the job within the peer timeout, before any engine watches it.
  LivenessOptions lo;
  lo.peer_timeout_s = settings::PeerTimeoutS();
  lo.abort_on_loss = settings::PeerLostAbort();
  lo.grace_s = settings::PeerLostGraceS();
  PSD_ASSIGN_OR_RETURN(c->liveness_, Liveness::Create(c->comm_, lo, nullptr));
  return c;
}

Communicator::~Communicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;  // too late to free; MPI_Finalize released them
  liveness_.reset();  // leaves: the peers stop watching this rank
  device_backend_.reset();  // the staged backend refers to the host backend
  host_backend_.reset();
  if (local_comm_ != MPI_COMM_NULL) MPI_Comm_free(&local_comm_);
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

Result<Backend*> Communicator::backend(MemoryKind memory) {
  if (memory == MemoryKind::kHost) return host_backend_.get();
  PSD_REQUIRE_ARG(memory == MemoryKind::kDevice, "Communicator::backend: unknown memory kind ",
                  static_cast<int>(memory), "; expected kHost (0) or kDevice (1)");
  if (!device_probed_) {
    device_probed_ = true;
    auto made = MakeDeviceBackend();
    if (made.ok()) {
      device_backend_ = std::move(made).value();
    } else {
      device_status_ = made.status();
    }
  }
  if (device_backend_) return device_backend_.get();
  return device_status_;
}

Result<std::unique_ptr<Backend>> Communicator::MakeDeviceBackend() {
  const char* call = "Communicator::backend(device)";
#if POSEIDON_CUDA_ENABLED
  // Every rank must reach the same decision (and fail together), so the local facts are
  // exchanged before anything is chosen.
  std::string mode = settings::DeviceBackend();
  Status local;
  if (mode != "auto" && mode != "nccl" && mode != "staged") {
    local = InvalidArgument(call, ": POSEIDON_DEVICE_BACKEND is '", mode,
                            "'; expected auto, nccl or staged");
  }
  auto count = CudaDeviceCount();
  int device = -1;
  if (local.ok()) local = count.status();
  if (local.ok()) local = CudaStatus(cudaGetDevice(&device), "cudaGetDevice");
  PSD_ASSIGN_OR_RETURN(bool any_bad,
                       or_agreement::RaisedAnywhere(comm_, !local.ok(), "GPU check"));
  if (!local.ok()) {
    return Status(local.code(), StrCat(call, ": rank ", rank_, ": ", local.message()));
  }
  if (any_bad) {
    return UnavailableError(call, ": another rank has no usable GPU (or a bad "
                            "POSEIDON_DEVICE_BACKEND), so no device backend can span the ranks");
  }
  // Distinct devices among the ranks of this node, then on every node.
  std::vector<int> local_devices(static_cast<size_t>(local_size_));
  int rc = MPI_Allgather(&device, 1, MPI_INT, local_devices.data(), 1, MPI_INT, local_comm_);
  if (rc != MPI_SUCCESS) return MpiError("MPI_Allgather(local devices)", rc);
  std::set<int> distinct(local_devices.begin(), local_devices.end());
  PSD_ASSIGN_OR_RETURN(bool shared_somewhere,
                       or_agreement::RaisedAnywhere(comm_, distinct.size() != local_devices.size(),
                                                    "device check"));
  const bool all_distinct = !shared_somewhere;

#if POSEIDON_NCCL_ENABLED
  bool use_nccl = mode == "nccl" || (mode == "auto" && all_distinct);
#else
  PSD_REQUIRE(mode != "nccl", StatusCode::kUnavailable, call,
              ": POSEIDON_DEVICE_BACKEND=nccl but this build has no NCCL");
  bool use_nccl = false;
#endif
  if (use_nccl) {
    PSD_REQUIRE(all_distinct, StatusCode::kUnavailable, call,
                ": POSEIDON_DEVICE_BACKEND=nccl but ranks of one node share a GPU (", *count,
                " GPU(s), ", local_size_, " local ranks); NCCL needs one GPU per rank: call "
                "cudaSetDevice(local_rank) before the first device collective");
#if POSEIDON_NCCL_ENABLED
    PSD_ASSIGN_OR_RETURN(auto nccl, NcclBackend::Create(comm_));
    PSD_LOG(kInfo, "device backend: nccl on GPU ", device);
    return std::unique_ptr<Backend>(std::move(nccl));
#endif
  }
  if (!all_distinct) {
    PSD_LOG(kInfo, "device backend: mpi-staged (", local_size_, " local ranks share ", *count,
            " GPU(s))");
  }
  PSD_ASSIGN_OR_RETURN(auto staged,
                       StagedBackend::Create(static_cast<MpiBackend*>(host_backend_.get())));
  return std::unique_ptr<Backend>(std::move(staged));
#else
  return UnavailableError(call, ": this build has no CUDA (configure with POSEIDON_WITH_CUDA)");
#endif
}

}  // namespace poseidon
