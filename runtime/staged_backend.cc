#include "runtime/staged_backend.h"

#include <cuda_runtime.h>

#include <cmath>
#include <utility>

#include "runtime/arg_check.h"
#include "runtime/settings.h"

namespace poseidon {

using device::Backoff;
using device::Deadline;

// A pinned buffer that a copy from or to it may still use.
struct StagedBackend::InFlight {
  CudaEvent done;
  PinnedPool::Buffer buf;
};

// A non-blocking allreduce from its start to its completion. The request owns it; the backend's
// queue shares it until its host collective is posted. Fields are written under post_mu_
// until `posted` or `error` is set, then by the request only.
struct StagedBackend::Op {
  const char* call = "";
  DType dtype = DType::kFloat32;
  size_t count = 0;
  CallOptions host;            // the host collective's options
  PinnedPool::Buffer buf;      // the input, summed in place
  size_t bytes = 0;
  void* dev_out = nullptr;
  cudaStream_t stream = nullptr;
  CudaEvent staged;  // recorded after the copy of the input to buf
  std::unique_ptr<Request> host_req;
  bool posted = false;
  Status error;  // set when the call can never complete
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

unsigned char* At(void* base, size_t bytes) { return static_cast<unsigned char*>(base) + bytes; }

// A pinned buffer that a host collective which gave up may still write (MPI cannot cancel a
// posted collective), or that a copy may still use when no event can tell when it ends: it
// must never return to the pool, so it is leaked on purpose.
void LeakForever(PinnedPool::Buffer buf) { (void)new PinnedPool::Buffer(std::move(buf)); }

// Waits for `ev` by polling, within the deadline and the interrupt (a host wait for the
// device: a blocked stream must not block the host for ever).
Status WaitEvent(const CudaEvent& ev, double timeout_s, const Interrupt* interrupt,
                 const char* call, const char* what) {
  Deadline deadline = Deadline::After(timeout_s);
  Backoff backoff;
  while (true) {
    PSD_ASSIGN_OR_RETURN(bool done, ev.Query());
    if (done) return Status::Ok();
    if (interrupt != nullptr) {
      Status s = interrupt->Check();
      if (!s.ok()) return s.WithPrefix(StrCat("StagedBackend: ", call, ": "));
    }
    if (deadline.Expired()) {
      return device::DeadlineError(StrCat("StagedBackend: ", call, ": ", what), timeout_s,
                                   ": the device did not run it (is the stream blocked?)");
    }
    backoff.Pause();
  }
}

// A request for a call with nothing to move (zero elements).
class DoneRequest : public Request {
 public:
  Result<bool> Test() override { return true; }
  using Request::Wait;
  Status Wait(const Interrupt*) override { return Status::Ok(); }
};

}  // namespace

std::shared_ptr<StagedBackend::Op> StagedBackend::NewOp(const char* call, DType dtype,
                                                        const CallOptions& opts, void* dev_out,
                                                        size_t bytes) {
  auto op = std::make_shared<Op>();
  op->call = call;
  op->dtype = dtype;
  op->host = HostCall(opts);
  op->bytes = bytes;
  op->dev_out = dev_out;
  op->stream = ToStream(opts);
  return op;
}

// Posts its call's host collective (through the backend's queue, in call order), then copies
// the result back once the host collective completes.
class StagedBackend::StagedRequest : public Request {
 public:
  StagedRequest(StagedBackend* backend, std::shared_ptr<Op> op)
      : backend_(backend), op_(std::move(op)) {}

  ~StagedRequest() override {
    if (done_) return;
    // The peers post this collective: it must be posted here too, in its turn, and its host
    // request's destructor then waits for it as before. The copy back is not wanted any more.
    if (backend_->Post(op_.get(), true, nullptr).ok()) op_->host_req.reset();
  }

  Result<bool> Test() override {
    if (done_) return true;
    PSD_CHECK(backend_->Post(op_.get(), false, nullptr));
    if (!op_->posted) return false;
    PSD_ASSIGN_OR_RETURN(bool host_done, op_->host_req->Test());
    if (!host_done) return false;
    PSD_CHECK(CopyBack());
    return true;
  }

  using Request::Wait;
  Status Wait(const Interrupt* interrupt) override {
    if (done_) return Status::Ok();
    PSD_CHECK(backend_->Post(op_.get(), true, interrupt));
    PSD_CHECK(op_->error);
    Status waited = op_->host_req->Wait(interrupt);
    if (!waited.ok()) {
      // The host request may be abandoned with MPI still writing into the buffer.
      op_->error = waited;
      LeakForever(std::move(op_->buf));
      return waited;
    }
    return CopyBack();
  }

 private:
  Status CopyBack() {
    PSD_CHECK(op_->error);
    if (op_->bytes > 0) {
      op_->error = CudaStatus(cudaMemcpyAsync(op_->dev_out, op_->buf.data(), op_->bytes,
                                              cudaMemcpyHostToDevice, op_->stream),
                              "StagedBackend: cudaMemcpyAsync(host -> device)");
      // The buffer stays out of the pool until that copy has run (a failed enqueue: no copy).
      if (op_->error.ok()) backend_->RetireAfter(std::move(op_->buf), op_->stream);
      PSD_CHECK(op_->error);
    }
    done_ = true;
    return Status::Ok();
  }

  StagedBackend* backend_;
  std::shared_ptr<Op> op_;
  bool done_ = false;
};

Result<std::unique_ptr<StagedBackend>> StagedBackend::Create(MpiBackend* host, double timeout_s) {
  PSD_REQUIRE_ARG(host != nullptr, "StagedBackend::Create: host backend is null");
  if (timeout_s < 0) timeout_s = settings::PeerTimeoutS();
  PSD_REQUIRE_ARG(std::isfinite(timeout_s) && timeout_s >= 0,
                  "StagedBackend::Create: the deadline is ", timeout_s,
                  " s; expected a finite value >= 0 (POSEIDON_PEER_TIMEOUT_S)");
  auto count = CudaDeviceCount();
  if (!count.ok()) return count.status().WithPrefix("StagedBackend::Create");
  return std::unique_ptr<StagedBackend>(new StagedBackend(host, timeout_s));
}

StagedBackend::StagedBackend(MpiBackend* host, double timeout_s)
    : host_(host), timeout_s_(timeout_s), pool_(PinnedPool::Make()) {}

StagedBackend::~StagedBackend() {
  {
    std::lock_guard<std::mutex> lock(post_mu_);
    BreakLocked(AbortedError("StagedBackend: destroyed with the call queued"));
  }
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

void StagedBackend::Retire(PinnedPool::Buffer buf, CudaEvent done) {
  if (buf.data() == nullptr) return;
  auto f = std::make_unique<InFlight>();
  f->done = std::move(done);
  f->buf = std::move(buf);
  std::lock_guard<std::mutex> lock(mu_);
  in_flight_.push_back(std::move(f));
}

void StagedBackend::RetireAfter(PinnedPool::Buffer buf, cudaStream_t stream) {
  if (buf.data() == nullptr) return;
  auto ev = CudaEvent::Create();
  if (ev.ok() && ev->Record(stream).ok()) {
    Retire(std::move(buf), std::move(*ev));
    return;
  }
  // No event: the copy may run for a while; only a finished stream frees the buffer.
  if (cudaStreamSynchronize(stream) != cudaSuccess) {
    (void)cudaGetLastError();
    LeakForever(std::move(buf));
  }
}

Status StagedBackend::Usable(const char* call) {
  std::lock_guard<std::mutex> lock(post_mu_);
  if (broken_.ok()) return Status::Ok();
  return AbortedError(call, ": the staged backend is unusable: a non-blocking call could not "
                      "post its host collective in order (", broken_.ToString(), ")");
}

void StagedBackend::BreakLocked(const Status& cause) {
  if (broken_.ok()) broken_ = cause;
  for (auto& op : queued_) {
    op->error = AbortedError(op->call, ": never posted: ", cause.ToString());
    // Its copy to the buffer may still run.
    Retire(std::move(op->buf), std::move(op->staged));
  }
  queued_.clear();
}

Status StagedBackend::PostOne(Op& op) {
  void* in = op.buf.data();
  Result<std::unique_ptr<Request>> r = host_->IAllReduce(in, in, op.count, op.dtype, op.host);
  op.posted = true;
  if (!r.ok()) return r.status();
  op.host_req = std::move(*r);
  return Status::Ok();
}

Status StagedBackend::Post(const Op* until, bool wait, const Interrupt* interrupt) {
  std::lock_guard<std::mutex> lock(post_mu_);
  Deadline deadline = Deadline::After(timeout_s_);
  Backoff backoff;
  // Waiting applies up to `until`; the queued calls after it are posted only if ready.
  bool waiting = wait && (until == nullptr || (!until->posted && until->error.ok()));
  while (!queued_.empty()) {
    std::shared_ptr<Op> op = queued_.front();
    Result<bool> ready = op->staged.Query();
    if (ready.ok() && !*ready) {
      if (!waiting) break;
      Status s = interrupt != nullptr ? interrupt->Check() : Status::Ok();
      if (!s.ok()) s = s.WithPrefix(StrCat("StagedBackend: ", op->call, ": "));
      if (s.ok() && deadline.Expired()) {
        s = device::DeadlineError(
            StrCat("StagedBackend: ", op->call, ": the copy of the input to host memory"),
            timeout_s_, ": the device did not run it (is the stream blocked?)");
      }
      if (!s.ok()) {
        BreakLocked(s);
        return s;
      }
      backoff.Pause();
      continue;
    }
    queued_.pop_front();
    Status s = ready.ok() ? PostOne(*op) : ready.status();
    if (!s.ok()) {
      op->error = s;
      if (!ready.ok()) Retire(std::move(op->buf), std::move(op->staged));
      BreakLocked(s);
      return until == nullptr || until == op.get() ? s : until->error;
    }
    if (op.get() == until) waiting = false;
  }
  return until != nullptr ? until->error : Status::Ok();
}

Status StagedBackend::CheckBuffer(const char* call, const char* which, const void* p,
                                  size_t count, size_t bytes) const {
  (void)count;
  return CheckDevicePointer(call, which, p, bytes);
}

Status StagedBackend::Agree(const CollectiveArgs& args, const Interrupt* interrupt) {
  // The queued calls' collectives come first (MPI pairs collectives by order), also when this
  // rank's own checks failed and its peers' did not.
  (void)Post(nullptr, true, interrupt);
  // The host backend decides: its shared-memory window always checks (at no cost), plain MPI
  // only under POSEIDON_CHECK_ARGS.
  return host_->Agree(args, interrupt);
}

Status StagedBackend::HostResult(Status status, PinnedPool::Buffer& buf) {
  if (!status.ok() && host_->broken()) LeakForever(std::move(buf));
  return status;
}

Status StagedBackend::StageIn(const char* call, const void* dev, size_t bytes, size_t buf_bytes,
                              cudaStream_t stream, const Interrupt* interrupt,
                              PinnedPool::Buffer* buf) {
  // Earlier non-blocking calls post their collectives first (MPI pairs them by order).
  PSD_CHECK(Usable(call));
  PSD_CHECK(Post(nullptr, true, interrupt));
  if (buf_bytes == 0) return Status::Ok();
  PSD_ASSIGN_OR_RETURN(*buf, pool_->Acquire(buf_bytes));
  if (bytes == 0) return Status::Ok();
  PSD_ASSIGN_OR_RETURN(CudaEvent copied, CudaEvent::Create());
  PSD_CUDA_CHECK(cudaMemcpyAsync(buf->data(), dev, bytes, cudaMemcpyDeviceToHost, stream));
  Status s = copied.Record(stream);
  if (!s.ok()) {
    RetireAfter(std::move(*buf), stream);
    return s;
  }
  // The host collective reads these bytes: the one point where a blocking call waits for the
  // device, within the deadline.
  s = WaitEvent(copied, timeout_s_, interrupt, call, "the copy of the input to host memory");
  if (!s.ok()) Retire(std::move(*buf), std::move(copied));  // the copy may still run
  return s;
}

Status StagedBackend::StageOut(void* dev, const void* host, size_t bytes, cudaStream_t stream,
                               PinnedPool::Buffer buf) {
  if (bytes == 0) return Status::Ok();
  PSD_CUDA_CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream));
  RetireAfter(std::move(buf), stream);
  return Status::Ok();
}

Status StagedBackend::DoAllReduce(const void* send, void* recv, size_t count, DType dtype,
                                  const CallOptions& opts, const CollectiveArgs& args) {
  Reap();
  const size_t bytes = count * DTypeSize(dtype);
  CollectiveArgs staged = args;
  PinnedPool::Buffer buf;
  if (staged.local.ok()) {
    staged.local = StageIn(args.call, send, bytes, bytes, ToStream(opts), opts.interrupt, &buf);
  }
  PSD_CHECK(Agreed(staged, opts));
  if (count == 0) return Status::Ok();
  PSD_CHECK(
      HostResult(host_->AllReduce(buf.data(), buf.data(), count, dtype, HostCall(opts)), buf));
  void* h = buf.data();
  return StageOut(recv, h, bytes, ToStream(opts), std::move(buf));
}

Status StagedBackend::DoReduceScatter(const void* send, void* recv,
                                      const std::vector<size_t>& counts, DType dtype,
                                      const CallOptions& opts, const CollectiveArgs& args) {
  Reap();
  CollectiveArgs staged = args;
  const size_t es = DTypeSize(dtype);
  const size_t total = staged.local.ok() ? SumCounts(counts) : 0;
  const size_t mine = staged.local.ok() ? counts[static_cast<size_t>(rank())] : 0;
  PinnedPool::Buffer buf;
  if (staged.local.ok()) {
    staged.local = StageIn(args.call, send, total * es, total > 0 ? (total + mine) * es : 0,
                           ToStream(opts), opts.interrupt, &buf);
  }
  PSD_CHECK(Agreed(staged, opts));
  if (total == 0) return Status::Ok();
  void* h_out = At(buf.data(), total * es);
  PSD_CHECK(
      HostResult(host_->ReduceScatter(buf.data(), h_out, counts, dtype, HostCall(opts)), buf));
  return StageOut(recv, h_out, mine * es, ToStream(opts), std::move(buf));
}

Status StagedBackend::DoAllGather(const void* send, void* recv, size_t count, DType dtype,
                                  const CallOptions& opts, const CollectiveArgs& args) {
  Reap();
  CollectiveArgs staged = args;
  const size_t bytes = count * DTypeSize(dtype);
  const size_t all = bytes * static_cast<size_t>(size());
  PinnedPool::Buffer buf;
  if (staged.local.ok()) {
    staged.local = StageIn(args.call, send, bytes, bytes > 0 ? bytes + all : 0, ToStream(opts),
                           opts.interrupt, &buf);
  }
  PSD_CHECK(Agreed(staged, opts));
  if (count == 0) return Status::Ok();
  void* h_out = At(buf.data(), bytes);
  PSD_CHECK(HostResult(host_->AllGather(buf.data(), h_out, count, dtype, HostCall(opts)), buf));
  return StageOut(recv, h_out, all, ToStream(opts), std::move(buf));
}

Status StagedBackend::DoAllGatherV(const void* send, void* recv,
                                   const std::vector<size_t>& counts, DType dtype,
                                   const CallOptions& opts, const CollectiveArgs& args) {
  Reap();
  CollectiveArgs staged = args;
  const size_t es = DTypeSize(dtype);
  const size_t total = staged.local.ok() ? SumCounts(counts) : 0;
  const size_t mine = staged.local.ok() ? counts[static_cast<size_t>(rank())] : 0;
  PinnedPool::Buffer buf;
  if (staged.local.ok()) {
    staged.local = StageIn(args.call, send, mine * es, total > 0 ? (mine + total) * es : 0,
                           ToStream(opts), opts.interrupt, &buf);
  }
  PSD_CHECK(Agreed(staged, opts));
  if (total == 0) return Status::Ok();
  void* h_out = At(buf.data(), mine * es);
  PSD_CHECK(HostResult(host_->AllGatherV(buf.data(), h_out, counts, dtype, HostCall(opts)), buf));
  return StageOut(recv, h_out, total * es, ToStream(opts), std::move(buf));
}

Status StagedBackend::DoBroadcast(void* buf, size_t count, DType dtype, int root,
                                  const CallOptions& opts, const CollectiveArgs& args) {
  Reap();
  CollectiveArgs staged = args;
  const size_t bytes = count * DTypeSize(dtype);
  PinnedPool::Buffer h;
  if (staged.local.ok()) {
    // Only the root has bytes to copy in; every rank needs the buffer.
    staged.local = StageIn(args.call, buf, rank() == root ? bytes : 0, bytes, ToStream(opts),
                           opts.interrupt, &h);
  }
  PSD_CHECK(Agreed(staged, opts));
  if (count == 0) return Status::Ok();
  PSD_CHECK(HostResult(host_->Broadcast(h.data(), count, dtype, root, HostCall(opts)), h));
  if (rank() == root) return Status::Ok();  // the root's device buffer already holds the data
  void* p = h.data();
  return StageOut(buf, p, bytes, ToStream(opts), std::move(h));
}

Status StagedBackend::Barrier() {
  PSD_CHECK(Usable("Barrier"));
  PSD_CHECK(Post(nullptr, true, nullptr));  // the queued calls' collectives come first
  return host_->Barrier();
}

Result<std::unique_ptr<Request>> StagedBackend::Start(std::shared_ptr<Op> op, const void* dev) {
  PSD_CHECK(Usable(op->call));
  PSD_ASSIGN_OR_RETURN(op->staged, CudaEvent::Create());
  PSD_ASSIGN_OR_RETURN(op->buf, pool_->Acquire(op->bytes));
  PSD_CUDA_CHECK(cudaMemcpyAsync(op->buf.data(), dev, op->bytes, cudaMemcpyDeviceToHost,
                                 op->stream));
  Status s = op->staged.Record(op->stream);
  if (!s.ok()) {
    RetireAfter(std::move(op->buf), op->stream);
    return s;
  }
  {
    std::lock_guard<std::mutex> lock(post_mu_);
    queued_.push_back(op);
  }
  // Posted at once when the copy is already done, else by the next call that finds it done.
  PSD_CHECK(Post(nullptr, false, nullptr));
  return std::unique_ptr<Request>(new StagedRequest(this, std::move(op)));
}

Result<std::unique_ptr<Request>> StagedBackend::DoIAllReduce(const void* send, void* recv,
                                                             size_t count, DType dtype,
                                                             const CallOptions& opts) {
  Reap();
  const size_t bytes = count * DTypeSize(dtype);
  if (count == 0) return std::unique_ptr<Request>(new DoneRequest());
  auto op = NewOp("IAllReduce", dtype, opts, recv, bytes);
  op->count = count;
  return Start(std::move(op), send);
}

}  // namespace poseidon
