// The OSU-style benchmarks' buffers (see buffers.h).
#include "bench/osu/buffers.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "bench/osu/verify.h"
#include "runtime/build_config.h"

#if POSEIDON_CUDA_ENABLED
#include <cuda_runtime_api.h>
#endif

namespace poseidon::osu {

// ---- Buffer ----

Buffer::~Buffer() { Free(); }

void Buffer::Free() {
  if (data_ != nullptr && shared_ != nullptr) {
    Status freed = shared_->FreeShared(data_);
    if (!freed.ok()) std::fprintf(stderr, "Buffer: %s\n", freed.ToString().c_str());
  } else if (data_ != nullptr) {
#if POSEIDON_CUDA_ENABLED
    if (memory_ == MemoryKind::kDevice) {
      cudaFree(data_);
    } else {
      std::free(data_);
    }
#else
    std::free(data_);
#endif
  }
  data_ = nullptr;
  shared_ = nullptr;
  bytes_ = 0;
}

Status Buffer::Allocate(MemoryKind memory, size_t bytes, Backend* shared) {
  Free();
  memory_ = memory;
  bytes_ = bytes;
  size_t n = std::max<size_t>(bytes, 64);
#if POSEIDON_CUDA_ENABLED
  if (memory == MemoryKind::kDevice) {
    cudaError_t e = cudaMalloc(&data_, n);
    if (e != cudaSuccess) {
      data_ = nullptr;
      return BackendError("cudaMalloc of ", n, " bytes failed: ", cudaGetErrorString(e));
    }
    return Status::Ok();
  }
#endif
  if (shared != nullptr && memory == MemoryKind::kHost) {
    PSD_ASSIGN_OR_RETURN(data_, shared->AllocShared(n));
    shared_ = shared;
    std::memset(data_, 0, n);
    return Status::Ok();
  }
  data_ = std::aligned_alloc(64, (n + 63) / 64 * 64);
  if (data_ == nullptr) return BackendError("aligned_alloc of ", n, " bytes failed");
  std::memset(data_, 0, n);  // touch every page outside the timed runs
  return Status::Ok();
}

Status Buffer::Upload(const void* host, size_t bytes) {
  if (bytes == 0) return Status::Ok();
#if POSEIDON_CUDA_ENABLED
  if (memory_ == MemoryKind::kDevice) {
    cudaError_t e = cudaMemcpy(data_, host, bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) return BackendError("cudaMemcpy (upload): ", cudaGetErrorString(e));
    return Status::Ok();
  }
#endif
  std::memcpy(data_, host, bytes);
  return Status::Ok();
}

Status Buffer::Download(void* host, size_t bytes) const {
  if (bytes == 0) return Status::Ok();
#if POSEIDON_CUDA_ENABLED
  if (memory_ == MemoryKind::kDevice) {
    cudaError_t e = cudaMemcpy(host, data_, bytes, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) return BackendError("cudaMemcpy (download): ", cudaGetErrorString(e));
    return Status::Ok();
  }
#endif
  std::memcpy(host, data_, bytes);
  return Status::Ok();
}

Status Buffer::Poison() {
  if (bytes_ == 0) return Status::Ok();
#if POSEIDON_CUDA_ENABLED
  if (memory_ == MemoryKind::kDevice) {
    cudaError_t e = cudaMemset(data_, 0xFF, bytes_);
    if (e != cudaSuccess) return BackendError("cudaMemset: ", cudaGetErrorString(e));
    return Status::Ok();
  }
#endif
  std::memset(data_, 0xFF, bytes_);
  return Status::Ok();
}

// ---- BufferCollective ----

Status BufferCollective::PrepareBuffers(const Context& ctx, size_t send_count, size_t recv_count) {
  ctx_ = ctx;
  recv_count_ = recv_count;
  const size_t es = DTypeSize(ctx.dtype);
  std::vector<unsigned char> host(send_count * es);
  FillFormula(ctx.dtype, ctx.rank + 1.0, 0, send_count, host.data());
  Backend* shared = ctx.registered ? ctx.backend : nullptr;
  PSD_CHECK(send_.Allocate(ctx.memory, send_count * es, shared));
  PSD_CHECK(send_.Upload(host.data(), send_count * es));
  PSD_CHECK(recv_.Allocate(ctx.memory, recv_count * es, shared));
  want_.resize(recv_count * es);
  if (ctx.memory != MemoryKind::kHost) got_.resize(recv_count * es);
  return Status::Ok();
}

Result<size_t> BufferCollective::CountWrong() {
  const void* got = recv_.data();
  if (ctx_.memory != MemoryKind::kHost) {
    PSD_CHECK(recv_.Download(got_.data(), got_.size()));
    got = got_.data();
  }
  return CountMismatches(ctx_.dtype, got, want_.data(), recv_count_);
}

void BufferCollective::Release() {
  send_.Free();
  recv_.Free();
  want_ = {};
  got_ = {};
}

CallOptions BufferCollective::call_options() const {
  CallOptions o;
  o.memory = ctx_.memory;
  return o;
}

// ---- InPlaceBuffers ----

Status InPlaceBuffers::Allocate(MemoryKind memory, std::vector<float> input) {
  memory_ = memory;
  input_ = std::move(input);
  const size_t bytes = input_.size() * sizeof(float);
  PSD_CHECK(grad.Allocate(memory, bytes));
  PSD_CHECK(peer_send.Allocate(memory, bytes));
  PSD_CHECK(peer_send.Upload(input_.data(), bytes));
  PSD_CHECK(peer_recv.Allocate(memory, bytes));
  if (memory != MemoryKind::kHost) got_.resize(input_.size());
  restored_ = false;
  return Status::Ok();
}

Status InPlaceBuffers::BeginOurs() {
  if (!restored_) PSD_CHECK(Restore());  // a warm-up run: untimed
  restored_ = false;
  last_peer_ = false;
  return Status::Ok();
}

Status InPlaceBuffers::PoisonOutput() {
  PSD_CHECK(Restore());
  restored_ = true;
  return peer_recv.Poison();
}

Result<const float*> InPlaceBuffers::Output() {
  const Buffer& out = last_peer_ ? peer_recv : grad;
  if (memory_ == MemoryKind::kHost) return static_cast<const float*>(out.data());
  PSD_CHECK(out.Download(got_.data(), got_.size() * sizeof(float)));
  return static_cast<const float*>(got_.data());
}

void InPlaceBuffers::Free() {
  grad.Free();
  peer_send.Free();
  peer_recv.Free();
  input_ = {};
  got_ = {};
}

}  // namespace poseidon::osu
