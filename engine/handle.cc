#include "engine/handle.h"

#include <chrono>
#include <cmath>
#include <exception>

#include "runtime/log.h"

namespace poseidon {

thread_local bool EngineLink::busy = false;

Handle::Handle(int layer, int64_t step, std::shared_ptr<EngineLink> link)
    : layer_(layer), step_(step), link_(std::move(link)) {}

namespace {
const std::string& UnknownLayerName() {
  static const std::string* const unknown = new std::string("?");
  return *unknown;
}
}  // namespace

const std::string& EngineLink::LayerName(int layer) const {
  if (layer < 0 || static_cast<size_t>(layer) >= layer_names.size()) return UnknownLayerName();
  return layer_names[static_cast<size_t>(layer)];
}

const std::string& Handle::layer_name() const {
  return link_ != nullptr ? link_->LayerName(layer_) : UnknownLayerName();
}

Status Handle::Wait(double timeout_s) const {
  // A timeout past ~30 years (or infinite, or NaN) is "forever": converting it to a clock
  // duration would overflow and time out at once.
  constexpr double kForeverS = 1e9;
  const bool forever = timeout_s < 0 || !(timeout_s < kForeverS);
  if (forever && link_ && !link_->waited.load(std::memory_order_relaxed)) {
    link_->waited.store(true, std::memory_order_relaxed);
  }
  // Complete: status_ is final (written before done_ was released), no lock needed.
  if (done_.load(std::memory_order_acquire)) return status_;
  // Counted in the engine's waiters while this handle is incomplete, so the engine closes its
  // fusion window early and knows a thread waits (nothing more is coming from it). Complete
  // takes the count back at once: a woken thread not yet scheduled is no longer waiting.
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_.load(std::memory_order_acquire)) return status_;
    if (link_) {
      ++waiting_;
      link_->waiters.fetch_add(1, std::memory_order_seq_cst);
    }
  }
  if (link_ && !EngineLink::busy) {
    // Not taken while another waiter runs exchanges (that one completes work anyway).
    std::unique_lock<std::mutex> helping(link_->mu, std::try_to_lock);
    // Run the exchange here if it is ready and the engine thread has not started it: this
    // thread would only sleep until it is done. Not under a timeout: the exchange lasts until
    // every rank joins, which the caller's bound does not cover.
    if (helping && forever && link_->run) link_->run(*this);
    // About to sleep: tell the engine thread.
    if (helping && link_->blocked && !done_.load(std::memory_order_acquire)) link_->blocked();
  }
  // Run here, or completed meanwhile (Complete took this thread's count back).
  if (done_.load(std::memory_order_acquire)) return status_;
  std::unique_lock<std::mutex> lock(mu_);
  auto done = [&] { return done_.load(std::memory_order_acquire); };
  if (forever) {
    cv_.wait(lock, done);
  } else if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), done)) {
    if (link_) {
      --waiting_;
      link_->waiters.fetch_sub(1, std::memory_order_seq_cst);
    }
    return TimeoutError("Handle::Wait: layer ", layer_, " (", layer_name(), ") step ", step_,
                        " is not complete after ", timeout_s,
                        " s; the exchange goes on (wait again, or raise the timeout)");
  }
  return status_;
}

Status Handle::status() const {
  if (done_.load(std::memory_order_acquire)) return status_;
  return UnavailableError("Handle::status: layer ", layer_, " (", layer_name(), ") step ", step_,
                          " is still pending; expected Test() to be true first");
}

void* Handle::cuda_event() const {
  if (!done_.load(std::memory_order_acquire) || done_event_ == nullptr) return nullptr;
  return status_.ok() ? done_event_->get() : nullptr;
}

Status Handle::WaitOnStream(void* stream, double timeout_s) const {
  PSD_CHECK(Wait(timeout_s));
  if (done_event_ == nullptr) return Status::Ok();  // host memory: the data is there
  Status s = done_event_->OrderStream(stream);
  if (!s.ok()) {
    return s.WithPrefix(
        StrCat("Handle::WaitOnStream: layer ", layer_, " (", layer_name(), ") step ", step_, ": "));
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
    if (link_ && waiting_ > 0) {
      link_->waiters.fetch_sub(waiting_, std::memory_order_seq_cst);
      waiting_ = 0;
    }
  }
  cv_.notify_all();
  // Only the first completer gets here, so the callback runs exactly once. It runs on an
  // engine-owned thread: an exception must not unwind through it.
  if (cb) {
    try {
      cb(s);
    } catch (const std::exception& e) {
      PSD_LOG(kError, "Engine: the completion callback of layer ", layer_, " (", layer_name(),
              ") step ", step_, " threw: ", e.what(), " (ignored; callbacks must not throw)");
    } catch (...) {
      PSD_LOG(kError, "Engine: the completion callback of layer ", layer_, " (", layer_name(),
              ") step ", step_, " threw a non-standard exception (ignored)");
    }
  }
}

}  // namespace poseidon
