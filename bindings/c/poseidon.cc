// The C API entry points (bindings/c/poseidon.h) over the C++ runtime.
//
// Every entry point:
//   1. checks its pointers and enum values (the C caller may pass anything),
//   2. looks the communicator up in the registry (a dead handle is refused, never touched),
//   3. runs the C++ call and turns its Status into a psdResult_t, recording the message on the
//      communicator and the thread; any C++ exception becomes psdInternalError.
// psdSubmit / psdWait / psdTest / psdHandleFree live in engine_bridge.cc, the layer and plan
// entry points (psdLayerConfigInit .. psdPrintPlan) in layers.cc.
#include <mpi.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "bindings/c/engine_bridge.h"
#include "bindings/c/entry_common.h"
#include "bindings/c/registry.h"
#include "runtime/arg_check.h"
#include "runtime/mpi_backend.h"
#include "runtime/settings.h"

using poseidon::capi::CommState;
using poseidon::capi::Fail;
using poseidon::capi::Guard;
using poseidon::capi::Registry;
using poseidon::capi::WithComm;

namespace poseidon::capi {
namespace {

// Whether psdInit started MPI (then psdFinalize ends it); guarded by g_mpi_mu.
std::mutex g_mpi_mu;
bool g_we_initialized_mpi = false;

Status CheckMpiUsable(const char* what) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  PSD_REQUIRE(!finalized, StatusCode::kUnavailable, what,
              ": MPI is already finalized; MPI cannot be started again in this process");
  PSD_REQUIRE_ARG(initialized, what,
                  ": MPI is not initialized; call psdInit (or MPI_Init_thread) first");
  return Status::Ok();
}

Status InitMpiOnce() {
  std::lock_guard<std::mutex> lock(g_mpi_mu);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  PSD_REQUIRE(!finalized, StatusCode::kUnavailable,
              "MPI is already finalized; MPI cannot be started again in this process");
  if (initialized) return Status::Ok();
  PSD_ASSIGN_OR_RETURN(int level, InitMpi(nullptr, nullptr));
  (void)level;  // a lower level is fine for single-threaded callers; the engine checks its own
  g_we_initialized_mpi = true;
  return Status::Ok();
}

Status CheckDTypeArg(const psdDataType_t& dtype) {
  int d = EnumInt(dtype);
  PSD_REQUIRE_ARG(d >= 0 && d < kNumDTypes, "dtype ", d,
                  " is unknown; expected psdFloat32 (0), psdFloat64 (1), psdFloat16 (2), "
                  "psdBFloat16 (3), psdInt32 (4) or psdInt64 (5)");
  return Status::Ok();
}

Result<MemoryKind> CheckMemoryArg(const psdMemory_t& memory) {
  int m = EnumInt(memory);
  PSD_REQUIRE_ARG(m == psdMemHost || m == psdMemDevice, "memory ", m,
                  " is unknown; expected psdMemHost (0) or psdMemDevice (1)");
  return static_cast<MemoryKind>(m);
}

// Local checks only: the backend lookup that follows may be collective (the first device
// call makes the device backend), so it must come after the ranks have agreed to go on.
Result<CallOptions> CallOptionsFor(const psdMemory_t& memory, void* stream) {
  PSD_ASSIGN_OR_RETURN(MemoryKind kind, CheckMemoryArg(memory));
  PSD_REQUIRE_ARG(kind == MemoryKind::kDevice || stream == nullptr, "stream ", stream,
                  " was given for host memory; expected NULL");
  CallOptions opts;
  opts.memory = kind;
  opts.stream = stream;
  return opts;
}

// Element counts times the element size must fit size_t; the backend checks its own limits.
Status CheckBufferArg(const char* name, const void* p, size_t count, psdDataType_t dtype) {
  PSD_REQUIRE_ARG(p != nullptr || count == 0, name, " is NULL for ", count,
                  " elements; expected a buffer");
  size_t elem = DTypeSize(static_cast<DType>(dtype));
  PSD_REQUIRE_ARG(count <= std::numeric_limits<size_t>::max() / elem, "count ", count,
                  " elements overflows the address space");
  return Status::Ok();
}

// A blocking collective's arguments are checked here before the backend sees them. An error
// found on one rank alone must not leave the peers waiting in the backend's argument agreement
// (bindings/c/poseidon.h promises that a bad argument on one rank fails the call on all ranks):
// this rank joins that agreement with its error (Backend::FailTogether), so every peer fails
// too and its message names this rank and the cause. Host memory (and a memory argument that
// is itself bad) joins the host backend's agreement, device memory the device backend's (made
// here if this is the first device call: the peers' call makes it too; the host backend's when
// there is none).
Status FailCollectiveTogether(CommState& s, const char* backend_call, const Status& local,
                              const psdMemory_t& memory = psdMemHost) {
  if (local.ok()) return local;
  Backend* backend = &s.comm->host_backend();
  if (EnumInt(memory) == psdMemDevice) {
    // Made on first use, collectively: the peers' device call makes it too.
    Result<Backend*> device = s.comm->backend(MemoryKind::kDevice);
    if (device.ok()) backend = *device;
  }
  Status ignored =
      backend->FailTogether(backend_call, local.WithPrefix(StrCat("psd", backend_call, ": ")),
                            nullptr);
  (void)ignored;  // this rank reports its own error, not the agreement's
  return local;
}

std::string SettingName(const char* name) {
  std::string n(name);
  if (n.rfind("POSEIDON_", 0) != 0) n = "POSEIDON_" + n;
  return n;
}

// Frees everything; the engine's own failure (if any) was reported through its handles and
// the sticky asynchronous error, so it does not fail the destroy.
Status DestroyState(CommState& s) {
  if (s.engine) {
    (void)s.engine->Stop();
    s.engine.reset();
  }
  s.hybrid.reset();
  s.exchange_comm.reset();
  s.comm.reset();
  return Status::Ok();
}

}  // namespace

psdResult_t FailBlockingCollective(psdComm_t handle, const char* c_call, const char* backend_call,
                                   const std::string& message) {
  return WithComm(c_call, handle, [&](CommState& s) -> Status {
    return FailCollectiveTogether(s, backend_call, InvalidArgument(message));
  });
}

namespace {
// A blocking collective's common start: this rank's own checks (the dtype, then `checks`, then
// the memory and stream), joining the peers' agreement with a refusal where one fails
// (FailCollectiveTogether); then the call's options, with the caller's detail, and the backend
// for its memory.
// The enums are taken by reference, as CheckDTypeArg and CallOptionsFor take them: a value
// outside the enum (a C caller's bad argument) is never loaded as the enum type.
// `checks` is any callable returning Status (a template, not std::function: no allocation
// per call).
template <typename Checks>
Result<Backend*> StartCollective(CommState& s, const char* backend_call,
                                 const psdDataType_t& dtype, const psdMemory_t& memory,
                                 void* stream, const char* detail, const Checks& checks,
                                 CallOptions* opts) {
  PSD_CHECK(FailCollectiveTogether(s, backend_call, [&]() -> Status {
    PSD_CHECK(CheckDTypeArg(dtype));
    PSD_CHECK(checks());
    PSD_ASSIGN_OR_RETURN(*opts, CallOptionsFor(memory, stream));
    return Status::Ok();
  }(), memory));
  opts->detail = detail;
  return s.comm->backend(opts->memory);
}
}  // namespace

psdResult_t AllReduce(psdComm_t comm, const void* send, void* recv, size_t count,
                      psdDataType_t dtype, psdMemory_t memory, void* stream, const char* detail) {
  return WithComm("psdAllReduce", comm, [&](CommState& s) -> Status {
    CallOptions opts;
    PSD_ASSIGN_OR_RETURN(Backend* be,
                         StartCollective(s, "AllReduce", dtype, memory, stream, detail,
                                         [&]() -> Status {
                                           PSD_CHECK(CheckBufferArg("send", send, count, dtype));
                                           return CheckBufferArg("recv", recv, count, dtype);
                                         },
                                         &opts));
    return be->AllReduce(send, recv, count, static_cast<DType>(dtype), opts);
  });
}

psdResult_t ReduceScatter(psdComm_t comm, const void* send, void* recv, size_t recv_count,
                          psdDataType_t dtype, psdMemory_t memory, void* stream,
                          const char* detail) {
  return WithComm("psdReduceScatter", comm, [&](CommState& s) -> Status {
    const size_t world = static_cast<size_t>(s.comm->size());
    CallOptions opts;
    PSD_ASSIGN_OR_RETURN(
        Backend* be,
        StartCollective(s, "ReduceScatter", dtype, memory, stream, detail, [&]() -> Status {
          PSD_REQUIRE_ARG(recv_count <= std::numeric_limits<size_t>::max() / world, "recv_count ",
                          recv_count, " times ", world, " ranks overflows");
          PSD_CHECK(CheckBufferArg("send", send, recv_count * world, dtype));
          return CheckBufferArg("recv", recv, recv_count, dtype);
        }, &opts));
    std::vector<size_t> counts(world, recv_count);
    return be->ReduceScatter(send, recv, counts, static_cast<DType>(dtype), opts);
  });
}

psdResult_t AllGather(psdComm_t comm, const void* send, void* recv, size_t send_count,
                      psdDataType_t dtype, psdMemory_t memory, void* stream, const char* detail) {
  return WithComm("psdAllGather", comm, [&](CommState& s) -> Status {
    const size_t world = static_cast<size_t>(s.comm->size());
    CallOptions opts;
    PSD_ASSIGN_OR_RETURN(
        Backend* be,
        StartCollective(s, "AllGather", dtype, memory, stream, detail, [&]() -> Status {
          PSD_REQUIRE_ARG(send_count <= std::numeric_limits<size_t>::max() / world, "send_count ",
                          send_count, " times ", world, " ranks overflows");
          PSD_CHECK(CheckBufferArg("send", send, send_count, dtype));
          return CheckBufferArg("recv", recv, send_count * world, dtype);
        }, &opts));
    return be->AllGather(send, recv, send_count, static_cast<DType>(dtype), opts);
  });
}

psdResult_t Broadcast(psdComm_t comm, void* buf, size_t count, psdDataType_t dtype, int root,
                      psdMemory_t memory, void* stream, const char* detail) {
  return WithComm("psdBroadcast", comm, [&](CommState& s) -> Status {
    // The root is checked by the backend's cross-rank agreement (every rank learns of a bad
    // root on any rank).
    CallOptions opts;
    PSD_ASSIGN_OR_RETURN(
        Backend* be,
        StartCollective(s, "Broadcast", dtype, memory, stream, detail,
                        [&]() { return CheckBufferArg("buf", buf, count, dtype); }, &opts));
    return be->Broadcast(buf, count, static_cast<DType>(dtype), root, opts);
  });
}

}  // namespace poseidon::capi

using namespace poseidon;  // NOLINT: the entry points below name many core types

extern "C" {

const char* psdGetErrorString(psdResult_t result) {
  switch (capi::EnumInt(result)) {
    case psdSuccess:
      return "success";
    case psdInvalidArgument:
      return "invalid argument";
    case psdMismatch:
      return "ranks disagree about a collective";
    case psdBackendError:
      return "communication backend error (MPI / NCCL / CUDA)";
    case psdTimeout:
      return "timed out";
    case psdAborted:
      return "communicator aborted by an earlier failure or shutdown";
    case psdUnavailable:
      return "not available in this build or on this machine";
    case psdInternalError:
      return "internal error";
    case psdUnimplemented:
      return "not implemented";
    case psdPeerLost:
      return "a peer stopped answering (frozen, dead or cut off); the job is ending";
    case psdNumResults:
      break;
  }
  return "unknown result code";
}

const char* psdGetLastError(psdComm_t comm) {
  // One buffer per thread: the returned pointer stays valid however other threads fail.
  static thread_local std::string copy;
  try {
    std::shared_ptr<CommState> state = comm == nullptr ? nullptr : Registry::Get().FindComm(comm);
    copy = state ? state->LastError() : capi::ThreadError();
  } catch (...) {
    copy = "psdGetLastError: out of memory while copying the message";
  }
  return copy.c_str();
}

psdResult_t psdGetVersion(int* version) {
  return Guard("psdGetVersion", [&]() -> Status {
    PSD_REQUIRE_ARG(version != nullptr, "version is NULL; expected a pointer to an int");
    *version = PSD_VERSION_CODE;
    return Status::Ok();
  });
}

psdResult_t psdInit(void) {
  return Guard("psdInit", [&]() { return capi::InitMpiOnce(); });
}

psdResult_t psdFinalize(void) {
  return Guard("psdFinalize", [&]() -> Status {
    Status first;
    for (auto& state : Registry::Get().RemoveAllComms()) {
      std::lock_guard<std::mutex> lock(state->call_mu);
      Status s = capi::DestroyState(*state);
      if (first.ok() && !s.ok()) first = s;
    }
    std::lock_guard<std::mutex> lock(capi::g_mpi_mu);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (capi::g_we_initialized_mpi && !finalized) {
      int rc = MPI_Finalize();
      capi::g_we_initialized_mpi = false;
      if (rc != MPI_SUCCESS) return MpiError("MPI_Finalize", rc);
    }
    return first;
  });
}

psdResult_t psdCommInitFromMpi(MPI_Comm mpi_comm, psdComm_t* comm) {
  return Guard("psdCommInitFromMpi", [&]() -> Status {
    PSD_REQUIRE_ARG(comm != nullptr, "comm is NULL; expected a pointer to a psdComm_t");
    *comm = nullptr;
    PSD_CHECK(capi::CheckMpiUsable("psdCommInitFromMpi"));
    PSD_REQUIRE_ARG(mpi_comm != MPI_COMM_NULL,
                    "mpi_comm is MPI_COMM_NULL; expected a valid "
                    "MPI communicator");
    auto state = std::make_shared<CommState>();
    PSD_ASSIGN_OR_RETURN(state->comm, Communicator::Create(mpi_comm));
    state->id = Registry::Get().NextId();
    *comm = capi::HandleOf<psdComm_t>(state->id);
    Registry::Get().AddComm(std::move(state));
    return Status::Ok();
  });
}

psdResult_t psdCommInitWorld(psdComm_t* comm) {
  if (comm != nullptr) *comm = nullptr;
  psdResult_t r = psdInit();
  if (r != psdSuccess) return r;
  return psdCommInitFromMpi(MPI_COMM_WORLD, comm);
}

psdResult_t psdCommDestroy(psdComm_t comm) {
  const char* call = "psdCommDestroy";
  try {
    if (comm == nullptr) {
      return Fail(call, nullptr, InvalidArgument("comm is NULL; expected a live communicator"));
    }
    std::shared_ptr<CommState> state = Registry::Get().RemoveComm(comm);
    if (state == nullptr) {
      return Fail(call, nullptr,
                  InvalidArgument("comm ", static_cast<const void*>(comm),
                                  " is not a live communicator (destroyed twice, or never "
                                  "returned by psdCommInit*)"));
    }
    // Calls already running on other threads hold call_mu; wait for them, then tear down.
    std::lock_guard<std::mutex> lock(state->call_mu);
    return Fail(call, nullptr, capi::DestroyState(*state));
  } catch (const std::exception& e) {
    return Fail(call, nullptr, InternalError("unexpected C++ exception: ", e.what()));
  } catch (...) {
    return Fail(call, nullptr, InternalError("unexpected non-standard C++ exception"));
  }
}

#define PSD_COMM_GETTER(fn, field)                                                 \
  psdResult_t fn(psdComm_t comm, int* out) {                                       \
    return WithComm(#fn, comm, [&](CommState& s) -> Status {                       \
      PSD_REQUIRE_ARG(out != nullptr, "output pointer is NULL; expected an int*"); \
      *out = s.comm->field();                                                      \
      return Status::Ok();                                                         \
    });                                                                            \
  }
PSD_COMM_GETTER(psdCommRank, rank)
PSD_COMM_GETTER(psdCommSize, size)
PSD_COMM_GETTER(psdCommLocalRank, local_rank)
PSD_COMM_GETTER(psdCommLocalSize, local_size)
#undef PSD_COMM_GETTER

psdResult_t psdCommGetAsyncError(psdComm_t comm, psdResult_t* async_error) {
  // No call lock: it must answer while another thread is blocked in a collective.
  return Guard("psdCommGetAsyncError", [&]() -> Status {
    PSD_REQUIRE_ARG(async_error != nullptr, "async_error is NULL; expected a psdResult_t*");
    std::shared_ptr<CommState> state = comm == nullptr ? nullptr : Registry::Get().FindComm(comm);
    PSD_REQUIRE_ARG(state != nullptr, "comm ", static_cast<const void*>(comm),
                    " is not a live communicator");
    // The engine may have failed with no handle left to report it (e.g. another rank's bad
    // submission). Ask it when no other call holds the communicator; never wait for one.
    std::unique_lock<std::mutex> lock(state->call_mu, std::try_to_lock);
    if (lock.owns_lock() && state->engine) state->SetAsyncError(state->engine->Health());
    *async_error = static_cast<psdResult_t>(state->async_error.load());
    return Status::Ok();
  });
}

psdResult_t psdSetSetting(const char* name, const char* value) {
  return Guard("psdSetSetting", [&]() -> Status {
    PSD_REQUIRE_ARG(name != nullptr, "name is NULL; expected a setting name");
    PSD_REQUIRE_ARG(value != nullptr, "value is NULL for ", name, "; expected text");
    return Settings::Global().Set(capi::SettingName(name), value);
  });
}

psdResult_t psdGetSetting(const char* name, char* buf, size_t* size) {
  return Guard("psdGetSetting", [&]() -> Status {
    PSD_REQUIRE_ARG(name != nullptr, "name is NULL; expected a setting name");
    std::string full = capi::SettingName(name);
    for (const SettingValue& v : Settings::Global().Snapshot()) {
      if (v.info.name == full) return capi::CopyOut(v.value, buf, size);
    }
    return InvalidArgument("unknown setting '", name, "'; run poseidon-info for the list");
  });
}

psdResult_t psdAllReduce(psdComm_t comm, const void* send, void* recv, size_t count,
                         psdDataType_t dtype, psdMemory_t memory, void* stream) {
  return capi::AllReduce(comm, send, recv, count, dtype, memory, stream, nullptr);
}

psdResult_t psdReduceScatter(psdComm_t comm, const void* send, void* recv, size_t recv_count,
                             psdDataType_t dtype, psdMemory_t memory, void* stream) {
  return capi::ReduceScatter(comm, send, recv, recv_count, dtype, memory, stream, nullptr);
}

psdResult_t psdAllGather(psdComm_t comm, const void* send, void* recv, size_t send_count,
                         psdDataType_t dtype, psdMemory_t memory, void* stream) {
  return capi::AllGather(comm, send, recv, send_count, dtype, memory, stream, nullptr);
}

psdResult_t psdBroadcast(psdComm_t comm, void* buf, size_t count, psdDataType_t dtype, int root,
                         psdMemory_t memory, void* stream) {
  return capi::Broadcast(comm, buf, count, dtype, root, memory, stream, nullptr);
}

psdResult_t psdMemAlloc(psdComm_t comm, size_t bytes, void** ptr) {
  return WithComm("psdMemAlloc", comm, [&](CommState& s) -> Status {
    if (ptr == nullptr) {
      // Join the allocation's size check with a size it refuses, so the peers fail with this
      // rank instead of waiting for it.
      (void)s.comm->host_backend().AllocShared(0);
      return InvalidArgument("ptr is NULL; expected where to store the memory's address");
    }
    *ptr = nullptr;
    PSD_ASSIGN_OR_RETURN(*ptr, s.comm->host_backend().AllocShared(bytes));
    return Status::Ok();
  });
}

psdResult_t psdMemFree(psdComm_t comm, void* ptr) {
  return WithComm("psdMemFree", comm, [&](CommState& s) -> Status {
    // NULL joins the free's agreement too: a peer that frees memory meanwhile fails, naming
    // this rank's NULL, instead of waiting for it.
    return s.comm->host_backend().FreeShared(ptr);
  });
}

psdResult_t psdBarrier(psdComm_t comm) {
  return WithComm("psdBarrier", comm,
                  [&](CommState& s) -> Status { return s.comm->host_backend().Barrier(); });
}

}  // extern "C"
