#include "engine/handle.h"

#include <chrono>
#include <cmath>
#include <exception>

#include "runtime/log.h"

namespace poseidon {

Handle::Handle(int layer, int64_t step, std::string layer_name)
    : layer_(layer), step_(step), layer_name_(std::move(layer_name)) {}

Status Handle::Wait(double timeout_s) const {
  // Counted while blocked, so the engine closes its fusion window early (nothing more is
  // coming from a thread that waits).
  struct WaitCount {
    std::atomic<int>* n;
    explicit WaitCount(std::atomic<int>* c) : n(c) {
      if (n) n->fetch_add(1, std::memory_order_relaxed);
    }
    ~WaitCount() {
      if (n) n->fetch_sub(1, std::memory_order_relaxed);
    }
  } count(done_.load(std::memory_order_acquire) ? nullptr : engine_waiters_.get());
  std::unique_lock<std::mutex> lock(mu_);
  auto done = [&] { return done_.load(std::memory_order_acquire); };
  // A timeout past ~30 years (or infinite, or NaN) is "forever": converting it to a clock
  // duration would overflow and time out at once.
  constexpr double kForeverS = 1e9;
  if (timeout_s < 0 || !(timeout_s < kForeverS)) {
    cv_.wait(lock, done);
  } else if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), done)) {
    return TimeoutError("Handle::Wait: layer ", layer_, " (", layer_name_, ") step ", step_,
                        " is not complete after ", timeout_s,
                        " s; the exchange goes on (wait again, or raise the timeout)");
  }
  return status_;
}

Status Handle::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!done_.load(std::memory_order_acquire)) {
    return UnavailableError("Handle::status: layer ", layer_, " (", layer_name_, ") step ", step_,
                            " is still pending; expected Test() to be true first");
  }
  return status_;
}

void* Handle::cuda_event() const {
  if (!done_.load(std::memory_order_acquire) || done_event_ == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  return status_.ok() ? done_event_->get() : nullptr;
}

Status Handle::WaitOnStream(void* stream, double timeout_s) const {
  PSD_CHECK(Wait(timeout_s));
  if (done_event_ == nullptr) return Status::Ok();  // host memory: the data is there
  Status s = done_event_->OrderStream(stream);
  if (!s.ok()) {
    return s.WithPrefix(
        StrCat("Handle::WaitOnStream: layer ", layer_, " (", layer_name_, ") step ", step_, ": "));
  }
  return Status::Ok();
}

void Handle::Complete(const Status& s) {
  DoneCallback cb;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_.load(std::memory_order_relaxed)) return;
    status_ = s;
    cb = std::move(callback_);
    callback_ = nullptr;
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
  // Only the first completer gets here, so the callback runs exactly once. It runs on an
  // engine-owned thread: an exception must not unwind through it.
  if (cb) {
    try {
      cb(s);
    } catch (const std::exception& e) {
      PSD_LOG(kError, "Engine: the completion callback of layer ", layer_, " (", layer_name_,
              ") step ", step_, " threw: ", e.what(), " (ignored; callbacks must not throw)");
    } catch (...) {
      PSD_LOG(kError, "Engine: the completion callback of layer ", layer_, " (", layer_name_,
              ") step ", step_, " threw a non-standard exception (ignored)");
    }
  }
}

}  // namespace poseidon
