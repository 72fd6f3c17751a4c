// Handle: the shared completion state of one Engine::Submit.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/stream_sync.h"
#include "runtime/status.h"

namespace poseidon {

// Completion callback: runs exactly once, with the final status, on the engine thread (on a
// user thread that ran the exchange in Wait, engine.h "the waiter runs"; on the liveness
// thread when a lost peer fails the handle; on the calling thread when Submit fails at once).
// Keep it short; it may call Submit, but must not call Shutdown or Wait on a handle of the same
// engine. An exception it throws is caught and logged: it never reaches the engine.
using DoneCallback = std::function<void(const Status&)>;

class Handle;

// What a handle shares with its engine (and keeps while it outlives it): the count of user
// threads blocked in Wait, and the engine's offer to let such a thread run a ready exchange
// itself instead of sleeping until the engine thread has run it (engine.h, "the waiter runs").
struct EngineLink {
  std::atomic<int> waiters{0};
  std::atomic<bool> waited{false};  // a thread called Wait without a timeout (the engine clears it)
  std::mutex mu;  // held while a waiter runs exchanges; the engine takes it to withdraw `run`
  std::function<void(const Handle&)> run;  // guarded by mu; empty once the engine has stopped
  // Guarded by mu, empty once the engine has stopped: a thread is about to sleep in Wait on an
  // incomplete handle (the engine thread, asleep between ticks, learns at once that nothing
  // more comes from that thread).
  std::function<void()> blocked;
  // The engine's layer names by id, for the handles' messages: set before the first handle
  // exists, read-only after. LayerName: "?" outside 0..layer_names.size()-1.
  std::vector<std::string> layer_names;
  const std::string& LayerName(int layer) const;
  // Set on a thread while it runs engine work (the engine thread, a waiter running an
  // exchange): a Wait from there (a completion callback) never tries to run more.
  static thread_local bool busy;
};

// Thread-safe: any thread may Test, Wait or read status. Lock order: mu_ is a leaf (never held
// while calling out).
class Handle {
 public:
  // The name of `layer` comes from link->layer_names (no copy per submission).
  Handle(int layer, int64_t step, std::shared_ptr<EngineLink> link);

  int layer() const { return layer_; }
  int64_t step() const { return step_; }
  // True once complete, successfully or not. Never blocks.
  bool Test() const { return done_.load(std::memory_order_acquire); }
  // Waits until complete and returns the final status. timeout_s < 0, infinite, or beyond
  // about 30 years waits until completion, which the engine bounds (a lost peer fails every
  // handle within POSEIDON_PEER_TIMEOUT_S, a stall within POSEIDON_STALL_ABORT_S). On timeout
  // returns kTimeout (the exchange goes on; wait again later). Without a timeout, the calling
  // thread may run the exchange itself (engine.h, "the waiter runs").
  Status Wait(double timeout_s = -1) const;
  // The final status once Test() is true; while pending, kUnavailable saying so.
  Status status() const;

  // Device memory: the cudaEvent_t recorded on the engine's stream after this exchange, once
  // Test() is true and the exchange succeeded; null otherwise (pending, failed, host memory).
  // Valid while the handle lives.
  void* cuda_event() const;
  // Device memory: waits (host) until the exchange is queued, then orders `stream` (a
  // cudaStream_t, null: the default stream) after its completion on the device, so work
  // queued there later sees the result; the host never waits for the transfer itself. Host
  // memory: the same as Wait(timeout_s).
  Status WaitOnStream(void* stream, double timeout_s = -1) const;

 private:
  friend class Engine;
  // Sets the final status (first call wins), wakes waiters, then runs the callback.
  void Complete(const Status& s);
  const std::string& layer_name() const;

  const int layer_;
  const int64_t step_;
  DoneCallback callback_;  // set before the handle is shared; run once by Complete
  // Device memory: recorded on the engine's stream before Complete (set before sharing).
  std::unique_ptr<engine::Event> done_event_;
  // Its waiters count: an engine holding its fusion window open stops waiting for more layers
  // once somebody waits for a result.
  const std::shared_ptr<EngineLink> link_;
  std::atomic<bool> done_{false};
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  Status status_;  // guarded by mu_; once done_ is set, final and read without mu_
  mutable int waiting_ = 0;  // guarded by mu_: threads in Wait counted in link_->waiters
};
using HandlePtr = std::shared_ptr<Handle>;

}  // namespace poseidon
