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

const std::string& Status::message() const {
  static const std::string kNone;
  return rep_ ? rep_->message : kNone;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return StrCat(StatusCodeName(rep_->code), ": ", rep_->message);
}

Status Status::WithPrefix(const std::string& prefix) const {
  if (ok()) return *this;
  return Status(rep_->code, prefix + rep_->message);
}

Status Status::WithLocation(const char* file, int line) const {
  if (ok()) return *this;
  // Keep only the first location: the place where the error was born is the useful one.
  if (rep_->message.find(" [at ") != std::string::npos) return *this;
  const char* base = std::strrchr(file, '/');
  return Status(rep_->code, StrCat(rep_->message, " [at ", base ? base + 1 : file, ":", line, "]"));
}

}  // namespace poseidon
