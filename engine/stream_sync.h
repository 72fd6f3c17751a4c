// The engine's CUDA stream ordering, behind a small seam so engine.cc has no #if blocks: a
// stream the engine thread owns, and events that order one stream after another without the
// host waiting.
//
// How the engine uses it for device memory:
//   1. Submit (user thread): record a "ready" event on the caller's stream (the gradient is
//      complete once the work queued there so far has run).
//   2. Engine thread: make its own stream wait on that event (cudaStreamWaitEvent), then queue
//      the exchange on its stream.
//   3. Record the handle's "done" event on the engine's stream after the exchange; the caller
//      orders its stream after it (cudaStreamWaitEvent), so the next forward pass waits on the
//      device, not on the host.
// Built without CUDA, every Create and call returns kUnavailable saying so (the engine then
// refuses device memory at Create; host memory never calls these).
#pragma once

#include <memory>

#include "runtime/status.h"

namespace poseidon::engine {

// The calling thread's current CUDA device, and making it current on another thread (the
// engine thread must use the device its creator uses).
Result<int> CurrentDevice();
Status UseDevice(int device);

// A non-blocking CUDA stream (no implicit ordering with the legacy default stream), destroyed
// with the object after the work queued on it has finished.
class Stream {
 public:
  static Result<std::unique_ptr<Stream>> Create();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  void* get() const { return stream_; }  // the cudaStream_t
  Status Synchronize() const;

 private:
  Stream() = default;
  void* stream_ = nullptr;
};

// A CUDA event without timing: the runtime's CudaEvent (runtime/cuda_util.h), behind this seam
// so that the engine's headers name no CUDA type.
class Event {
 public:
  static Result<std::unique_ptr<Event>> Create();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void* get() const;  // the cudaEvent_t
  // Captures the work queued on `stream` so far (null: the default stream).
  Status Record(void* stream);
  // Makes `stream` wait (on the device) for the captured work; the host does not wait.
  Status OrderStream(void* stream) const;
  // Blocks the host until the captured work has finished.
  Status Synchronize() const;

 private:
  struct Impl;  // holds the CudaEvent (defined in stream_sync.cc, with CUDA only)
  Event();
  std::unique_ptr<Impl> impl_;
};

}  // namespace poseidon::engine
