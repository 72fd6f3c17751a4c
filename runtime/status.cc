#include "runtime/status.h"

#include <cstring>

namespace poseidon {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kMismatch: return "Mismatch";
    case StatusCode::kBackendError: return "BackendError";
    case StatusCode::kTimeout: return "Timeout";
    case StatusCode::kAborted: return "Aborted";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kInternal: return "Internal";
    case StatusCode::kUnimplemented: return "Unimplemented";
    case StatusCode::kPeerLost: return "PeerLost";
  }
  return "Unknown";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return StrCat(StatusCodeName(code_), ": ", message_);
}

Status Status::WithPrefix(const std::string& prefix) const {
  if (ok()) return *this;
  return Status(code_, prefix + message_);
}

Status Status::WithLocation(const char* file, int line) const {
  if (ok()) return *this;
  // Keep only the first location: the place where the error was born is the useful one.
  if (message_.find(" [at ") != std::string::npos) return *this;
  const char* base = std::strrchr(file, '/');
  return Status(code_, StrCat(message_, " [at ", base ? base + 1 : file, ":", line, "]"));
}

}  // namespace poseidon
