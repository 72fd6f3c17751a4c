#include "runtime/staged_backend.h"

#include <cuda_runtime.h>

#include <utility>

#include "runtime/arg_check.h"
#include "runtime/settings.h"

namespace poseidon {

// A pinned buffer whose copy back to the device may still be running.
struct StagedBackend::InFlight {
  CudaEvent done;
  PinnedPool::Buffer buf;
};

namespace {

// The host collective a staged call runs: this backend has already agreed on the arguments
// across ranks (or its caller has), so the host backend skips its own agreement round; the
// caller's interrupt bounds the host backend's waits.
CallOptions HostCall(const CallOptions& opts) {
  CallOptions host;
  host.memory = MemoryKind::kHost;
  host.agreed = true;
  host.interrupt = opts.interrupt;
  return host;
}

cudaStream_t ToStream(const CallOptions& opts) { return static_cast<cudaStream_t>(opts.stream); }

Status CheckCommon(const char* call, DType dtype, const CallOptions& opts) {
  PSD_CHECK(CheckDType(call, dtype));
  PSD_REQUIRE_ARG(opts.memory == MemoryKind::kDevice, call, ": the staged backend was given ",
                  MemoryKindName(opts.memory),
                  " memory; expected device memory (use the host backend for host memory)");
  return Status::Ok();
}


unsigned char* At(void* base, size_t bytes) { return static_cast<unsigned char*>(base) + bytes; }

// A pinned buffer that a host collective which gave up may still write (MPI cannot cancel a
// posted collective): it must never return to the pool, so it is leaked on purpose.
void LeakForever(PinnedPool::Buffer buf) { (void)new PinnedPool::Buffer(std::move(buf)); }

// Completes a host request, then enqueues the copy of its result back to the device.
class StagedRequest : public Request {
 public:
  StagedRequest(std::unique_ptr<Request> host, PinnedPool::Buffer buf, void* dev, size_t offset,
                size_t bytes, cudaStream_t stream, CudaEvent done)
      : host_(std::move(host)),
        buf_(std::move(buf)),
        dev_(dev),
        offset_(offset),
        bytes_(bytes),
        stream_(stream),
        done_(std::move(done)) {}

  ~StagedRequest() override {
    // The host request's own destructor waits for MPI; the pinned buffer may go back to the
    // pool only after the device copy out of it has finished.
    if (copied_) (void)done_.Synchronize();
  }

  Result<bool> Test() override {
    if (copied_) return true;
    PSD_CHECK(error_);
    PSD_ASSIGN_OR_RETURN(bool host_done, host_->Test());
    if (!host_done) return false;
    PSD_CHECK(CopyBack());
    return true;
  }

  using Request::Wait;
  Status Wait(const Interrupt* interrupt) override {
    if (copied_) return Status::Ok();
    PSD_CHECK(error_);
    Status waited = host_->Wait(interrupt);
    if (!waited.ok()) {
      // The host request may be abandoned with MPI still writing into the buffer.
      error_ = waited;
      LeakForever(std::move(buf_));
      return waited;
    }
    return CopyBack();
  }

 private:
  Status CopyBack() {
    if (bytes_ > 0) {
      error_ = CudaStatus(
          cudaMemcpyAsync(dev_, At(buf_.data(), offset_), bytes_, cudaMemcpyHostToDevice, stream_),
          "StagedBackend: cudaMemcpyAsync(host -> device)");
      if (error_.ok()) error_ = done_.Record(stream_);
      PSD_CHECK(error_);
    }
    copied_ = true;
    return Status::Ok();
  }

  std::unique_ptr<Request> host_;
  PinnedPool::Buffer buf_;
  void* dev_;
  size_t offset_;
  size_t bytes_;
  cudaStream_t stream_;
  CudaEvent done_;
  bool copied_ = false;
  Status error_;
};

// A request for a call with nothing to move (zero elements).
class DoneRequest : public Request {
 public:
  Result<bool> Test() override { return true; }
  using Request::Wait;
  Status Wait(const Interrupt*) override { return Status::Ok(); }
};

}  // namespace

Result<std::unique_ptr<StagedBackend>> StagedBackend::Create(MpiBackend* host) {
  PSD_REQUIRE_ARG(host != nullptr, "StagedBackend::Create: host backend is null");
  auto count = CudaDeviceCount();
  if (!count.ok()) return count.status().WithPrefix("StagedBackend::Create");
  return std::unique_ptr<StagedBackend>(new StagedBackend(host));
}

StagedBackend::StagedBackend(MpiBackend* host) : host_(host), pool_(PinnedPool::Make()) {}

StagedBackend::~StagedBackend() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& f : in_flight_) (void)f->done.Synchronize();
  in_flight_.clear();
}

void StagedBackend::Reap() {
  std::lock_guard<std::mutex> lock(mu_);
  size_t kept = 0;
  for (auto& f : in_flight_) {
    auto done = f->done.Query();
    if (done.ok() && *done) continue;  // finished: the buffer goes back to the pool
    if (!done.ok())
      (void)f->done.Synchronize();  // a failed stream: wait it out, then free
    else
      in_flight_[kept++] = std::move(f);
  }
  in_flight_.resize(kept);
}

Status StagedBackend::FailTogether(const char* call, const Status& local,
                                  const Interrupt* interrupt) {
  return host_->FailTogether(call, local, interrupt);
}

Status StagedBackend::Agree(const char* call, int64_t count, DType dtype, int64_t root,
                            uint64_t layout_hash, Status local, const Interrupt* interrupt) {
  // The host backend decides: its shared-memory window always checks (at no cost), plain MPI
  // only under POSEIDON_CHECK_ARGS.
  return host_->Agree(
      {call, count, static_cast<int64_t>(dtype), root, layout_hash, std::move(local)}, interrupt);
}

Status StagedBackend::HostResult(Status status, PinnedPool::Buffer& buf) {
  if (!status.ok() && host_->broken()) LeakForever(std::move(buf));
  return status;
}

Status StagedBackend::StageIn(const void* dev, void* host, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return Status::Ok();
  PSD_CUDA_CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, stream));
  // The host collective reads these bytes: the one point where the host waits for the stream.
  PSD_CUDA_CHECK(cudaStreamSynchronize(stream));
  return Status::Ok();
}

Status StagedBackend::StageOut(void* dev, const void* host, size_t bytes, cudaStream_t stream,
                               PinnedPool::Buffer buf) {
  if (bytes == 0) return Status::Ok();
  PSD_CUDA_CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream));
  auto f = std::make_unique<InFlight>();
  PSD_ASSIGN_OR_RETURN(f->done, CudaEvent::Create());
  PSD_CHECK(f->done.Record(stream));
  f->buf = std::move(buf);
  std::lock_guard<std::mutex> lock(mu_);
  in_flight_.push_back(std::move(f));
  return Status::Ok();
}

Status StagedBackend::AllReduce(const void* send, void* recv, size_t count, DType dtype,
                                const CallOptions& opts) {
  const char* call = "AllReduce";
  Reap();
  Status local = CheckCommon(call, dtype, opts);
  size_t bytes = count * DTypeSize(dtype);
  if (local.ok()) local = CheckDevicePointer(call, "send", send, bytes);
  if (local.ok()) local = CheckDevicePointer(call, "recv", recv, bytes);
  PinnedPool::Buffer buf;
  if (local.ok() && bytes > 0) {
    auto b = pool_->Acquire(bytes);
    local = b.status();
    if (local.ok()) buf = std::move(*b);
  }
  if (local.ok()) local = StageIn(send, buf.data(), bytes, ToStream(opts));
  PSD_CHECK(opts.agreed ? local
                        : Agree(call, static_cast<int64_t>(count), dtype, -1, 0, std::move(local),
                                opts.interrupt));
  if (count == 0) return Status::Ok();
  PSD_CHECK(
      HostResult(host_->AllReduce(buf.data(), buf.data(), count, dtype, HostCall(opts)), buf));
  void* h = buf.data();
  return StageOut(recv, h, bytes, ToStream(opts), std::move(buf));
}

Status StagedBackend::ReduceScatter(const void* send, void* recv, const std::vector<size_t>& counts,
                                    DType dtype, const CallOptions& opts) {
  const char* call = "ReduceScatter";
  Reap();
  Status local = CheckCommon(call, dtype, opts);
  if (local.ok()) local = CheckCountsPerRank(call, counts, size());
  size_t es = DTypeSize(dtype);
  size_t total = local.ok() ? SumCounts(counts) : 0;
  size_t mine = local.ok() ? counts[static_cast<size_t>(rank())] : 0;
  if (local.ok()) local = CheckDevicePointer(call, "send", send, total * es);
  if (local.ok()) local = CheckDevicePointer(call, "recv", recv, mine * es);
  PinnedPool::Buffer buf;
  if (local.ok() && total > 0) {
    auto b = pool_->Acquire((total + mine) * es);
    local = b.status();
    if (local.ok()) buf = std::move(*b);
  }
  if (local.ok()) local = StageIn(send, buf.data(), total * es, ToStream(opts));
  PSD_CHECK(opts.agreed
                ? local
                : Agree(call, static_cast<int64_t>(total), dtype, -1,
                        local.ok() ? HashCounts(counts) : 0, std::move(local), opts.interrupt));
  if (total == 0) return Status::Ok();
  void* h_out = At(buf.data(), total * es);
  PSD_CHECK(
      HostResult(host_->ReduceScatter(buf.data(), h_out, counts, dtype, HostCall(opts)), buf));
  return StageOut(recv, h_out, mine * es, ToStream(opts), std::move(buf));
}

Status StagedBackend::AllGather(const void* send, void* recv, size_t count, DType dtype,
                                const CallOptions& opts) {
  const char* call = "AllGather";
  Reap();
  Status local = CheckCommon(call, dtype, opts);
  size_t es = DTypeSize(dtype);
  size_t bytes = count * es;
  size_t all = bytes * static_cast<size_t>(size());
  if (local.ok()) local = CheckDevicePointer(call, "send", send, bytes);
  if (local.ok()) local = CheckDevicePointer(call, "recv", recv, all);
  PinnedPool::Buffer buf;
  if (local.ok() && bytes > 0) {
    auto b = pool_->Acquire(bytes + all);
    local = b.status();
    if (local.ok()) buf = std::move(*b);
  }
  if (local.ok()) local = StageIn(send, buf.data(), bytes, ToStream(opts));
  PSD_CHECK(opts.agreed ? local
                        : Agree(call, static_cast<int64_t>(count), dtype, -1, 0, std::move(local),
                                opts.interrupt));
  if (count == 0) return Status::Ok();
  void* h_out = At(buf.data(), bytes);
  PSD_CHECK(HostResult(host_->AllGather(buf.data(), h_out, count, dtype, HostCall(opts)), buf));
  return StageOut(recv, h_out, all, ToStream(opts), std::move(buf));
}

Status StagedBackend::AllGatherV(const void* send, void* recv, const std::vector<size_t>& counts,
                                 DType dtype, const CallOptions& opts) {
  const char* call = "AllGatherV";
  Reap();
  Status local = CheckCommon(call, dtype, opts);
  if (local.ok()) local = CheckCountsPerRank(call, counts, size());
  size_t es = DTypeSize(dtype);
  size_t total = local.ok() ? SumCounts(counts) : 0;
  size_t mine = local.ok() ? counts[static_cast<size_t>(rank())] : 0;
  if (local.ok()) local = CheckDevicePointer(call, "send", send, mine * es);
  if (local.ok()) local = CheckDevicePointer(call, "recv", recv, total * es);
  PinnedPool::Buffer buf;
  if (local.ok() && total > 0) {
    auto b = pool_->Acquire((mine + total) * es);
    local = b.status();
    if (local.ok()) buf = std::move(*b);
  }
  if (local.ok()) local = StageIn(send, buf.data(), mine * es, ToStream(opts));
  PSD_CHECK(opts.agreed
                ? local
                : Agree(call, static_cast<int64_t>(total), dtype, -1,
                        local.ok() ? HashCounts(counts) : 0, std::move(local), opts.interrupt));
  if (total == 0) return Status::Ok();
  void* h_out = At(buf.data(), mine * es);
  PSD_CHECK(HostResult(host_->AllGatherV(buf.data(), h_out, counts, dtype, HostCall(opts)), buf));
  return StageOut(recv, h_out, total * es, ToStream(opts), std::move(buf));
}

Status StagedBackend::Broadcast(void* buf, size_t count, DType dtype, int root,
                                const CallOptions& opts) {
  const char* call = "Broadcast";
  Reap();
  Status local = CheckCommon(call, dtype, opts);
  if (local.ok() && (root < 0 || root >= size())) {
    local = InvalidArgument(call, ": root ", root, " is outside 0..", size() - 1);
  }
  size_t bytes = count * DTypeSize(dtype);
  if (local.ok()) local = CheckDevicePointer(call, "buf", buf, bytes);
  PinnedPool::Buffer h;
  if (local.ok() && bytes > 0) {
    auto b = pool_->Acquire(bytes);
    local = b.status();
    if (local.ok()) h = std::move(*b);
  }
  if (local.ok() && rank() == root) local = StageIn(buf, h.data(), bytes, ToStream(opts));
  PSD_CHECK(opts.agreed ? local
                        : Agree(call, static_cast<int64_t>(count), dtype, root, 0, std::move(local),
                                opts.interrupt));
  if (count == 0) return Status::Ok();
  PSD_CHECK(HostResult(host_->Broadcast(h.data(), count, dtype, root, HostCall(opts)), h));
  if (rank() == root) return Status::Ok();  // the root's device buffer already holds the data
  void* p = h.data();
  return StageOut(buf, p, bytes, ToStream(opts), std::move(h));
}

Status StagedBackend::Barrier() { return host_->Barrier(); }

Result<std::unique_ptr<Request>> StagedBackend::IAllReduce(const void* send, void* recv,
                                                           size_t count, DType dtype,
                                                           const CallOptions& opts) {
  const char* call = "IAllReduce";
  Reap();
  PSD_CHECK(CheckCommon(call, dtype, opts));
  size_t bytes = count * DTypeSize(dtype);
  PSD_CHECK(CheckDevicePointer(call, "send", send, bytes));
  PSD_CHECK(CheckDevicePointer(call, "recv", recv, bytes));
  if (count == 0) return std::unique_ptr<Request>(new DoneRequest());
  PSD_ASSIGN_OR_RETURN(PinnedPool::Buffer buf, pool_->Acquire(bytes));
  PSD_CHECK(StageIn(send, buf.data(), bytes, ToStream(opts)));
  PSD_ASSIGN_OR_RETURN(auto host_req,
                       host_->IAllReduce(buf.data(), buf.data(), count, dtype, HostCall(opts)));
  PSD_ASSIGN_OR_RETURN(CudaEvent ev, CudaEvent::Create());
  return std::unique_ptr<Request>(new StagedRequest(std::move(host_req), std::move(buf), recv, 0,
                                                    bytes, ToStream(opts), std::move(ev)));
}

Result<std::unique_ptr<Request>> StagedBackend::IReduceScatter(const void* send, void* recv,
                                                               const std::vector<size_t>& counts,
                                                               DType dtype,
                                                               const CallOptions& opts) {
  const char* call = "IReduceScatter";
  Reap();
  PSD_CHECK(CheckCommon(call, dtype, opts));
  PSD_CHECK(CheckCountsPerRank(call, counts, size()));
  size_t es = DTypeSize(dtype);
  size_t total = SumCounts(counts);
  size_t mine = counts[static_cast<size_t>(rank())];
  PSD_CHECK(CheckDevicePointer(call, "send", send, total * es));
  PSD_CHECK(CheckDevicePointer(call, "recv", recv, mine * es));
  if (total == 0) return std::unique_ptr<Request>(new DoneRequest());
  PSD_ASSIGN_OR_RETURN(PinnedPool::Buffer buf, pool_->Acquire((total + mine) * es));
  PSD_CHECK(StageIn(send, buf.data(), total * es, ToStream(opts)));
  PSD_ASSIGN_OR_RETURN(auto host_req, host_->IReduceScatter(buf.data(), At(buf.data(), total * es),
                                                            counts, dtype, HostCall(opts)));
  PSD_ASSIGN_OR_RETURN(CudaEvent ev, CudaEvent::Create());
  return std::unique_ptr<Request>(new StagedRequest(std::move(host_req), std::move(buf), recv,
                                                    total * es, mine * es, ToStream(opts),
                                                    std::move(ev)));
}

Result<std::unique_ptr<Request>> StagedBackend::IAllGatherV(const void* send, void* recv,
                                                            const std::vector<size_t>& counts,
                                                            DType dtype, const CallOptions& opts) {
  const char* call = "IAllGatherV";
  Reap();
  PSD_CHECK(CheckCommon(call, dtype, opts));
  PSD_CHECK(CheckCountsPerRank(call, counts, size()));
  size_t es = DTypeSize(dtype);
  size_t total = SumCounts(counts);
  size_t mine = counts[static_cast<size_t>(rank())];
  PSD_CHECK(CheckDevicePointer(call, "send", send, mine * es));
  PSD_CHECK(CheckDevicePointer(call, "recv", recv, total * es));
  if (total == 0) return std::unique_ptr<Request>(new DoneRequest());
  PSD_ASSIGN_OR_RETURN(PinnedPool::Buffer buf, pool_->Acquire((mine + total) * es));
  PSD_CHECK(StageIn(send, buf.data(), mine * es, ToStream(opts)));
  PSD_ASSIGN_OR_RETURN(auto host_req, host_->IAllGatherV(buf.data(), At(buf.data(), mine * es),
                                                         counts, dtype, HostCall(opts)));
  PSD_ASSIGN_OR_RETURN(CudaEvent ev, CudaEvent::Create());
  return std::unique_ptr<Request>(new StagedRequest(std::move(host_req), std::move(buf), recv,
                                                    mine * es, total * es, ToStream(opts),
                                                    std::move(ev)));
}

}  // namespace poseidon
