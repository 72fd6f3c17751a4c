// The registry of live C handles and the error plumbing of the C API (see registry.h).
#include "bindings/c/registry.h"

#include <exception>

#include "bindings/c/engine_bridge.h"

namespace poseidon::capi {

namespace {
// The thread's last failure, for calls without a usable communicator.
thread_local std::string t_last_error;
}  // namespace

void CommState::SetError(const std::string& message) {
  std::lock_guard<std::mutex> lock(error_mu);
  last_error = message;
}

std::string CommState::LastError() {
  std::lock_guard<std::mutex> lock(error_mu);
  return last_error;
}

void CommState::SetAsyncError(const Status& status) {
  if (status.ok()) return;
  int expected = psdSuccess;
  // Only the first asynchronous failure sticks; later ones are usually its consequences.
  if (async_error.compare_exchange_strong(expected, ToResult(status.code()))) {
    SetError("asynchronous error: " + status.ToString());
  }
}

psdResult_t ToResult(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return psdSuccess;
    case StatusCode::kInvalidArgument:
      return psdInvalidArgument;
    case StatusCode::kMismatch:
      return psdMismatch;
    case StatusCode::kBackendError:
      return psdBackendError;
    case StatusCode::kTimeout:
      return psdTimeout;
    case StatusCode::kAborted:
      return psdAborted;
    case StatusCode::kUnavailable:
      return psdUnavailable;
    case StatusCode::kInternal:
      return psdInternalError;
    case StatusCode::kUnimplemented:
      return psdUnimplemented;
    case StatusCode::kPeerLost:
      return psdPeerLost;
  }
  return psdInternalError;
}

StatusCode ToStatusCode(psdResult_t result) {
  switch (result) {
    case psdSuccess:
      return StatusCode::kOk;
    case psdInvalidArgument:
      return StatusCode::kInvalidArgument;
    case psdMismatch:
      return StatusCode::kMismatch;
    case psdBackendError:
      return StatusCode::kBackendError;
    case psdTimeout:
      return StatusCode::kTimeout;
    case psdAborted:
      return StatusCode::kAborted;
    case psdUnavailable:
      return StatusCode::kUnavailable;
    case psdUnimplemented:
      return StatusCode::kUnimplemented;
    case psdPeerLost:
      return StatusCode::kPeerLost;
    default:
      return StatusCode::kInternal;
  }
}

Registry& Registry::Get() {
  // Never destroyed: handles may still be looked up from atexit handlers and other static
  // destructors after this translation unit's statics are gone.
  static Registry* registry = new Registry();
  return *registry;
}

void Registry::AddComm(std::shared_ptr<CommState> state) {
  std::lock_guard<std::mutex> lock(mu_);
  comms_[state->id] = std::move(state);
}

std::shared_ptr<CommState> Registry::FindComm(psdComm_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = comms_.find(IdOf(handle));
  return it == comms_.end() ? nullptr : it->second;
}

std::shared_ptr<CommState> Registry::RemoveComm(psdComm_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = comms_.find(IdOf(handle));
  if (it == comms_.end()) return nullptr;
  auto state = std::move(it->second);
  comms_.erase(it);
  return state;
}

std::vector<std::shared_ptr<CommState>> Registry::RemoveAllComms() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<CommState>> all;
  for (auto& [id, state] : comms_) all.push_back(std::move(state));
  comms_.clear();
  return all;
}

void Registry::AddHandle(uint64_t id, std::shared_ptr<HandleState> state) {
  std::lock_guard<std::mutex> lock(mu_);
  handles_[id] = std::move(state);
}

std::shared_ptr<HandleState> Registry::FindHandle(psdHandle_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = handles_.find(IdOf(handle));
  return it == handles_.end() ? nullptr : it->second;
}

std::shared_ptr<HandleState> Registry::RemoveHandle(psdHandle_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = handles_.find(IdOf(handle));
  if (it == handles_.end()) return nullptr;
  auto state = std::move(it->second);
  handles_.erase(it);
  return state;
}

void SetThreadError(const std::string& message) { t_last_error = message; }
std::string ThreadError() { return t_last_error; }

psdResult_t Fail(const char* call, CommState* comm, const Status& status) {
  if (status.ok()) return psdSuccess;
  std::string message = StrCat(call, ": ", status.message());
  SetThreadError(message);
  if (comm != nullptr) comm->SetError(message);
  return ToResult(status.code());
}

psdResult_t Guard(const char* call, const std::function<Status()>& body) {
  try {
    return Fail(call, nullptr, body());
  } catch (const std::exception& e) {
    return Fail(call, nullptr, InternalError("unexpected C++ exception: ", e.what()));
  } catch (...) {
    return Fail(call, nullptr, InternalError("unexpected non-standard C++ exception"));
  }
}

psdResult_t WithComm(const char* call, psdComm_t handle,
                     const std::function<Status(CommState&)>& body) {
  std::shared_ptr<CommState> state;  // outlives the catch blocks that still use it
  CommState* raw = nullptr;
  try {
    if (handle == nullptr) {
      return Fail(call, nullptr,
                  InvalidArgument("comm is NULL; expected a communicator from "
                                  "psdCommInitWorld / psdCommInitFromMpi"));
    }
    state = Registry::Get().FindComm(handle);
    if (state == nullptr) {
      return Fail(call, nullptr,
                  InvalidArgument("comm ", static_cast<const void*>(handle),
                                  " is not a live communicator (destroyed, or never returned by "
                                  "psdCommInit*)"));
    }
    raw = state.get();
    std::lock_guard<std::mutex> lock(state->call_mu);
    return Fail(call, raw, body(*state));
  } catch (const std::exception& e) {
    return Fail(call, raw, InternalError("unexpected C++ exception: ", e.what()));
  } catch (...) {
    return Fail(call, raw, InternalError("unexpected non-standard C++ exception"));
  }
}

}  // namespace poseidon::capi
