#include "runtime/cuda_util.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <utility>

#include "runtime/device_backend_logic.h"

namespace poseidon {

Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  // The one place a reported failure is cleared: a non-sticky error left in the last-error
  // state would make the next cudaGetLastError check fail with this old error.
  (void)cudaGetLastError();
  return BackendError(what, " failed: ", cudaGetErrorName(err), " (", static_cast<int>(err),
                      "): ", cudaGetErrorString(err));
}

Result<int> CudaDeviceCount() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    // The runtime keeps this error sticky for the process only for some codes; clear what can
    // be cleared so a later probe does not report a stale failure.
    (void)cudaGetLastError();
    return UnavailableError("no usable GPU: cudaGetDeviceCount returned ", cudaGetErrorName(err),
                            " (", static_cast<int>(err), "): ", cudaGetErrorString(err));
  }
  if (count == 0) return UnavailableError("no usable GPU: cudaGetDeviceCount found 0 devices");
  return count;
}

namespace {
std::string VersionText(int v) { return StrCat(v / 1000, ".", (v % 1000) / 10); }
}  // namespace

std::string DescribeCudaDevices() {
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaError_t derr = cudaDriverGetVersion(&driver);
  std::string versions =
      StrCat("runtime ", VersionText(runtime), ", driver ",
             (derr == cudaSuccess && driver > 0) ? VersionText(driver) : std::string("none"));
  auto count = CudaDeviceCount();
  if (!count.ok()) return StrCat(count.status().message(), " (", versions, ")");
  std::string out = StrCat(*count, " GPU(s):");
  for (int d = 0; d < *count; ++d) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) {
      out += StrCat(" [", d, "] (properties unavailable)");
      continue;
    }
    out += StrCat(" [", d, "] ", prop.name, " (sm_", prop.major, prop.minor, ", ",
                  prop.totalGlobalMem >> 20, " MiB)");
  }
  return StrCat(out, "; ", versions);
}

Status CheckDevicePointer(const char* call, const char* which, const void* p, size_t bytes) {
  if (bytes == 0) return Status::Ok();
  PSD_REQUIRE_ARG(p != nullptr, call, ": ", which, " buffer is null with ", bytes,
                  " bytes; expected a device pointer");
  cudaPointerAttributes attr{};
  cudaError_t err = cudaPointerGetAttributes(&attr, p);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return CudaStatus(err, StrCat(call, ": cudaPointerGetAttributes(", which, ")").c_str());
  }
  if (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) {
    return Status::Ok();
  }
  const char* what = attr.type == cudaMemoryTypeHost ? "pinned host memory" : "host memory";
  return InvalidArgument(call, ": ", which, " buffer ", p, " is ", what,
                         "; expected device (or managed) memory for MemoryKind::kDevice");
}

Result<CudaEvent> CudaEvent::Create() {
  CudaEvent e;
  PSD_CUDA_CHECK(cudaEventCreateWithFlags(&e.ev_, cudaEventDisableTiming));
  return e;
}

CudaEvent& CudaEvent::operator=(CudaEvent&& o) noexcept {
  if (this != &o) {
    if (ev_ != nullptr) cudaEventDestroy(ev_);
    ev_ = o.ev_;
    o.ev_ = nullptr;
  }
  return *this;
}

CudaEvent::~CudaEvent() {
  if (ev_ != nullptr) cudaEventDestroy(ev_);
}

Status CudaEvent::Record(cudaStream_t stream) {
  return CudaStatus(cudaEventRecord(ev_, stream), "cudaEventRecord");
}

Result<bool> CudaEvent::Query() const {
  cudaError_t err = cudaEventQuery(ev_);
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) return false;
  return CudaStatus(err, "cudaEventQuery");
}

Status CudaEvent::Synchronize() const {
  return CudaStatus(cudaEventSynchronize(ev_), "cudaEventSynchronize");
}

PinnedPool::Buffer::Buffer(Buffer&& o) noexcept
    : pool_(std::move(o.pool_)), data_(o.data_), capacity_(o.capacity_) {
  o.data_ = nullptr;
  o.capacity_ = 0;
}

PinnedPool::Buffer& PinnedPool::Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    Release();
    pool_ = std::move(o.pool_);
    data_ = o.data_;
    capacity_ = o.capacity_;
    o.data_ = nullptr;
    o.capacity_ = 0;
  }
  return *this;
}

PinnedPool::Buffer::~Buffer() { Release(); }

void PinnedPool::Buffer::Release() {
  if (pool_ && data_ != nullptr) pool_->Return(data_, capacity_);
  pool_.reset();
  data_ = nullptr;
  capacity_ = 0;
}

PinnedPool::~PinnedPool() {
  for (auto& [p, cap] : free_) cudaFreeHost(p);
}

Result<PinnedPool::Buffer> PinnedPool::Acquire(size_t bytes) {
  if (bytes == 0) bytes = 1;
  Buffer b;
  size_t largest_free = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Smallest free buffer that fits, so large buffers stay available for large calls.
    size_t best = free_.size();
    for (size_t i = 0; i < free_.size(); ++i) {
      bool fits = free_[i].second >= bytes;
      if (fits && (best == free_.size() || free_[i].second < free_[best].second)) {
        best = i;
      }
    }
    if (best < free_.size()) {
      b.data_ = free_[best].first;
      b.capacity_ = free_[best].second;
      free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
    } else {
      // None fits: the free ones stay for smaller calls (never freed before the pool is: see
      // the header) and the new one is at least twice the largest of them.
      for (const auto& f : free_) largest_free = std::max(largest_free, f.second);
    }
  }
  if (b.data_ == nullptr) {
    size_t cap = device::GrowCapacity(largest_free, bytes);
    void* p = nullptr;
    PSD_CHECK(
        CudaStatus(cudaMallocHost(&p, cap), StrCat("cudaMallocHost(", cap, " bytes)").c_str()));
    b.data_ = p;
    b.capacity_ = cap;
  }
  b.pool_ = shared_from_this();
  return b;
}

void PinnedPool::Return(void* data, size_t capacity) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.emplace_back(data, capacity);
}

}  // namespace poseidon
