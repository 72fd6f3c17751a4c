// CUDA runtime calls for the engine's stream ordering (see stream_sync.h); without CUDA in the
// build, every entry point reports kUnavailable.
#include "engine/stream_sync.h"

#include "runtime/build_config.h"
#if POSEIDON_CUDA_ENABLED
#include <cuda_runtime_api.h>

#include "runtime/cuda_util.h"
#endif

namespace poseidon::engine {

#if POSEIDON_CUDA_ENABLED

namespace {
cudaStream_t AsStream(void* s) { return static_cast<cudaStream_t>(s); }
}  // namespace

Result<int> CurrentDevice() {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return Status(StatusCode::kUnavailable, CudaStatus(err, "Engine: cudaGetDevice").message());
  }
  return device;
}

Status UseDevice(int device) {
  return CudaStatus(cudaSetDevice(device), StrCat("Engine: cudaSetDevice(", device, ")").c_str());
}

Result<std::unique_ptr<Stream>> Stream::Create() {
  std::unique_ptr<Stream> s(new Stream());
  cudaStream_t st = nullptr;
  PSD_CHECK(CudaStatus(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking),
                       "Engine: cudaStreamCreateWithFlags"));
  s->stream_ = st;
  return s;
}

Stream::~Stream() {
  if (stream_ != nullptr) {
    (void)cudaStreamSynchronize(AsStream(stream_));
    (void)cudaStreamDestroy(AsStream(stream_));
  }
}

Status Stream::Synchronize() const {
  return CudaStatus(cudaStreamSynchronize(AsStream(stream_)), "Engine: cudaStreamSynchronize");
}

struct Event::Impl {
  CudaEvent event;
};

Event::Event() : impl_(new Impl()) {}
// Safe while captured work is pending: the runtime releases the event once it completes.
Event::~Event() = default;

Result<std::unique_ptr<Event>> Event::Create() {
  std::unique_ptr<Event> e(new Event());
  auto ev = CudaEvent::Create();
  if (!ev.ok()) return ev.status().WithPrefix("Engine: ");
  e->impl_->event = std::move(*ev);
  return e;
}

void* Event::get() const { return impl_->event.get(); }

Status Event::Record(void* stream) {
  Status s = impl_->event.Record(AsStream(stream));
  return s.ok() ? s : s.WithPrefix("Engine: ");
}

Status Event::OrderStream(void* stream) const {
  return CudaStatus(cudaStreamWaitEvent(AsStream(stream), impl_->event.get(), 0),
                    "Engine: cudaStreamWaitEvent");
}

Status Event::Synchronize() const {
  Status s = impl_->event.Synchronize();
  return s.ok() ? s : s.WithPrefix("Engine: ");
}

#else  // no CUDA in this build

namespace {
Status NoCuda(const char* what) {
  return UnavailableError("Engine: ", what,
                          ": this build has no CUDA (POSEIDON_WITH_CUDA=OFF); expected host "
                          "memory, or a build with CUDA for device memory");
}
}  // namespace

Result<int> CurrentDevice() { return NoCuda("the current CUDA device"); }
Status UseDevice(int) { return NoCuda("selecting a CUDA device"); }

Result<std::unique_ptr<Stream>> Stream::Create() { return NoCuda("a CUDA stream"); }
Stream::~Stream() = default;
Status Stream::Synchronize() const { return NoCuda("synchronizing a CUDA stream"); }

struct Event::Impl {};
Event::Event() = default;
Event::~Event() = default;
Result<std::unique_ptr<Event>> Event::Create() { return NoCuda("a CUDA event"); }
void* Event::get() const { return nullptr; }
Status Event::Record(void*) { return NoCuda("recording a CUDA event"); }
Status Event::OrderStream(void*) const { return NoCuda("ordering a stream after an event"); }
Status Event::Synchronize() const { return NoCuda("synchronizing a CUDA event"); }

#endif

}  // namespace poseidon::engine
