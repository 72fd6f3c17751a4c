// Status and Result<T>: the error values that travel through Poseidon.
//
// Every internal call returns a Status (or a Result<T> holding a value or a Status). Messages
// name the call, the bad value and what was expected, e.g.
//   "AllReduce: count differs across ranks (rank 0: 10, rank 3: 12); expected the same count"
// PSD_CHECK(expr) returns early with the error and appends the source location, like NCCL's
// NCCLCHECK; PSD_REQUIRE(cond, code, parts...) builds an error from message parts.
#pragma once

#include <sstream>
#include <string>
#include <utility>
#include <variant>

namespace poseidon {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // a caller passed a bad value
  kMismatch = 2,         // ranks disagree about a collective (count, dtype, layer, order)
  kBackendError = 3,     // MPI / NCCL / CUDA reported an error
  kTimeout = 4,          // a wait ran past its limit (stall abort, handle wait)
  kAborted = 5,          // the communicator failed earlier (sticky) or was shut down
  kUnavailable = 6,      // a feature not built in or not present here (no GPU, no NCCL)
  kInternal = 7,         // a broken invariant inside Poseidon
  kUnimplemented = 8,
  kPeerLost = 9,         // a peer stopped answering (frozen, dead or cut off); names the rank
};

const char* StatusCodeName(StatusCode code);

// An OK status is one null pointer: collectives return and check several per call, so the
// common case costs no string construction, copy or destruction; an error holds its code and
// message on the heap.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message)
      : rep_(code == StatusCode::kOk ? nullptr : new Rep{code, std::move(message)}) {}
  Status(const Status& o) : rep_(o.rep_ ? new Rep(*o.rep_) : nullptr) {}
  Status(Status&& o) noexcept : rep_(o.rep_) { o.rep_ = nullptr; }
  Status& operator=(const Status& o) {
    if (this != &o) {
      Rep* copy = o.rep_ ? new Rep(*o.rep_) : nullptr;
      delete rep_;
      rep_ = copy;
    }
    return *this;
  }
  Status& operator=(Status&& o) noexcept {
    if (this != &o) {
      delete rep_;
      rep_ = o.rep_;
      o.rep_ = nullptr;
    }
    return *this;
  }
  ~Status() { delete rep_; }

  static Status Ok() { return Status(); }
  bool ok() const { return rep_ == nullptr; }
  StatusCode code() const { return rep_ ? rep_->code : StatusCode::kOk; }
  // Empty for OK.
  const std::string& message() const;
  // "InvalidArgument: <message>" or "OK".
  std::string ToString() const;

  // Adds context in front of the message ("while exchanging layer fc1: ...").
  Status WithPrefix(const std::string& prefix) const;
  Status WithLocation(const char* file, int line) const;

 private:
  struct Rep {
    StatusCode code;
    std::string message;
  };
  Rep* rep_ = nullptr;
};

template <typename... Parts>
std::string StrCat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

template <typename... Parts>
Status InvalidArgument(const Parts&... parts) {
  return Status(StatusCode::kInvalidArgument, StrCat(parts...));
}
template <typename... Parts>
Status MismatchError(const Parts&... parts) {
  return Status(StatusCode::kMismatch, StrCat(parts...));
}
template <typename... Parts>
Status BackendError(const Parts&... parts) {
  return Status(StatusCode::kBackendError, StrCat(parts...));
}
template <typename... Parts>
Status InternalError(const Parts&... parts) {
  return Status(StatusCode::kInternal, StrCat(parts...));
}
template <typename... Parts>
Status UnavailableError(const Parts&... parts) {
  return Status(StatusCode::kUnavailable, StrCat(parts...));
}
template <typename... Parts>
Status TimeoutError(const Parts&... parts) {
  return Status(StatusCode::kTimeout, StrCat(parts...));
}
template <typename... Parts>
Status PeerLostError(const Parts&... parts) {
  return Status(StatusCode::kPeerLost, StrCat(parts...));
}
template <typename... Parts>
Status AbortedError(const Parts&... parts) {
  return Status(StatusCode::kAborted, StrCat(parts...));
}

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT: implicit by design
    if (std::get<Status>(v_).ok()) {
      v_ = Status(StatusCode::kInternal, "Result constructed from an OK status without a value");
    }
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

namespace internal {
inline Status ToStatus(const Status& s) { return s; }
template <typename T>
Status ToStatus(const Result<T>& r) {
  return r.status();
}
}  // namespace internal

}  // namespace poseidon

#define PSD_CONCAT_INNER(a, b) a##b
#define PSD_CONCAT(a, b) PSD_CONCAT_INNER(a, b)

// Evaluates a Status- or Result-returning expression; on error returns it from the enclosing
// function with the location appended.
#define PSD_CHECK(expr)                                                          \
  do {                                                                           \
    ::poseidon::Status psd_check_status_ = ::poseidon::internal::ToStatus(expr); \
    if (!psd_check_status_.ok()) {                                               \
      return psd_check_status_.WithLocation(__FILE__, __LINE__);                 \
    }                                                                            \
  } while (0)

// Returns Status(code, message parts...) when cond is false.
#define PSD_REQUIRE(cond, code, ...)                                               \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      return ::poseidon::Status((code), ::poseidon::StrCat(__VA_ARGS__));          \
    }                                                                              \
  } while (0)

#define PSD_REQUIRE_ARG(cond, ...) \
  PSD_REQUIRE(cond, ::poseidon::StatusCode::kInvalidArgument, __VA_ARGS__)

// auto x = expr (a Result<T>); returns its status on error.
#define PSD_ASSIGN_OR_RETURN(lhs, expr)                                       \
  auto PSD_CONCAT(psd_result_, __LINE__) = (expr);                            \
  if (!PSD_CONCAT(psd_result_, __LINE__).ok()) {                              \
    return PSD_CONCAT(psd_result_, __LINE__).status().WithLocation(__FILE__, __LINE__); \
  }                                                                           \
  lhs = std::move(PSD_CONCAT(psd_result_, __LINE__)).value()
