// Internals of the C API: the registry of live handles and the error plumbing every entry
// point goes through. Not installed; included by bindings/c/*.cc only (what the Python module
// shares with the C layer is in binding_support.h).
//
// Why a registry: a C caller may pass a handle it already destroyed. Handles are therefore
// numbers (never addresses) mapped to shared state; a number not in the map is refused with a
// message instead of being dereferenced, and numbers are never reused, so a stale handle can
// never reach a newer object. The shared_ptr a lookup returns keeps the state alive while a
// call runs, even if another thread destroys the handle meanwhile.
//
// Lock order: Registry::mu (held only to look up / insert / erase, never during work), then
// CommState::call_mu (serializes calls on one communicator), then CommState::error_mu.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bindings/c/binding_support.h"
#include "bindings/c/poseidon.h"
#include "collectives/hybrid.h"
#include "runtime/communicator.h"
#include "runtime/status.h"

namespace poseidon::capi {

class EngineBridge;  // bindings/c/engine_bridge.cc: psdSubmit / psdWait over the engine
struct HandleState;

struct CommState {
  uint64_t id = 0;
  std::mutex call_mu;  // serializes the calls on this communicator (see the lock order)
  // Blocking collectives run on `comm`; the hybrid collective and the engine run on their own
  // duplicate (made at the first psdBuildPlan) so the engine thread's traffic can never
  // interleave with a blocking collective issued by a user thread on the same MPI communicator.
  std::shared_ptr<Communicator> comm;
  std::shared_ptr<Communicator> exchange_comm;
  std::unique_ptr<HybridCollective> hybrid;  // layers; owned by the engine once it runs
  std::vector<LayerSpec> layers;             // what was registered (resolved)
  std::string plan_text;                 // the last plan's table ("" before a plan)
  std::vector<StrategyKind> strategies;  // the last plan's choice per layer
  std::unique_ptr<EngineBridge> engine;

  std::mutex error_mu;
  std::string last_error;                    // guarded by error_mu
  std::atomic<int> async_error{psdSuccess};  // sticky: the first asynchronous failure

  void SetError(const std::string& message);
  std::string LastError();
  void SetAsyncError(const Status& status);
};

psdResult_t ToResult(StatusCode code);
StatusCode ToStatusCode(psdResult_t result);

class Registry {
 public:
  static Registry& Get();

  uint64_t NextId() { return next_id_.fetch_add(1); }
  void AddComm(std::shared_ptr<CommState> state);
  std::shared_ptr<CommState> FindComm(psdComm_t handle);
  std::shared_ptr<CommState> RemoveComm(psdComm_t handle);
  std::vector<std::shared_ptr<CommState>> RemoveAllComms();

  void AddHandle(uint64_t id, std::shared_ptr<HandleState> state);
  std::shared_ptr<HandleState> FindHandle(psdHandle_t handle);
  std::shared_ptr<HandleState> RemoveHandle(psdHandle_t handle);

 private:
  Registry() = default;
  std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<CommState>> comms_;      // guarded by mu_
  std::map<uint64_t, std::shared_ptr<HandleState>> handles_;  // guarded by mu_
  // Starts well away from 0 and small integers so that a zeroed or made-up handle never
  // matches; odd steps keep comm and pending-handle numbers disjoint from plain pointers.
  std::atomic<uint64_t> next_id_{0x5D0000001ull};
};

inline uint64_t IdOf(const void* handle) { return reinterpret_cast<uintptr_t>(handle); }
template <typename H>
H HandleOf(uint64_t id) {
  return reinterpret_cast<H>(static_cast<uintptr_t>(id));
}

// Records a failure (thread-local message, and the communicator's when given) and returns its
// code. The message reads "<call>: <core message>".
psdResult_t Fail(const char* call, CommState* comm, const Status& status);
void SetThreadError(const std::string& message);
std::string ThreadError();

// Runs body() for an entry point that needs no communicator, turning any exception into
// psdInternalError.
psdResult_t Guard(const char* call, const std::function<Status()>& body);

// Looks up `handle`, holds its call lock, and runs body(state); errors are recorded on the
// communicator and the thread. A handle that is not live is refused before anything else.
psdResult_t WithComm(const char* call, psdComm_t handle,
                     const std::function<Status(CommState&)>& body);

}  // namespace poseidon::capi
