#include "runtime/nccl_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <utility>

#include "runtime/arg_check.h"
#include "runtime/log.h"
#include "runtime/mpi_wait.h"
#include "runtime/settings.h"
#include "runtime/shard.h"

namespace poseidon {

ncclDataType_t ToNcclType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat64:
      return ncclFloat64;
    case DType::kFloat16:
      return ncclFloat16;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
  }
  return ncclFloat32;
}

namespace {

using device::Backoff;
using device::Clock;
using device::Deadline;

// What a deadline error says about its likely cause.
constexpr const char* kPeerCauses =
    ": a peer died, stopped, or called a different collective; the NCCL communicator was "
    "aborted";

cudaStream_t ToStream(const CallOptions& opts) { return static_cast<cudaStream_t>(opts.stream); }

Status CheckCommon(const char* call, DType dtype, const CallOptions& opts) {
  PSD_CHECK(CheckDType(call, dtype));
  PSD_REQUIRE_ARG(opts.memory == MemoryKind::kDevice, call, ": the NCCL backend was given ",
                  MemoryKindName(opts.memory),
                  " memory; expected device memory (use the host backend for host memory)");
  return Status::Ok();
}

const unsigned char* At(const void* p, size_t bytes) {
  return static_cast<const unsigned char*>(p) + bytes;
}
unsigned char* At(void* p, size_t bytes) { return static_cast<unsigned char*>(p) + bytes; }

std::string LastError(ncclComm_t comm) {
  const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  return (last != nullptr && last[0] != '\0') ? StrCat(" (", last, ")") : std::string();
}

// A pending NCCL operation: the event recorded after it on the caller's stream.
class NcclRequest : public Request {
 public:
  NcclRequest(NcclBackend* backend, CudaEvent done) : backend_(backend), done_(std::move(done)) {}

  // The event is queried before the health check: an abort lets stuck kernels (and so the
  // event) finish, and that completion must not pass for success.
  Result<bool> Test() override {
    if (finished_) return true;
    Result<bool> done = done_.Query();
    PSD_CHECK(backend_->CheckAsyncError());
    PSD_ASSIGN_OR_RETURN(finished_, std::move(done));
    return finished_;
  }

  // Polls rather than cudaEventSynchronize: an operation waiting for a dead peer never
  // finishes, and only the watchdog's abort (within the deadline) or the caller's interrupt
  // ends it.
  using Request::Wait;
  Status Wait(const Interrupt* interrupt) override {
    Backoff backoff;
    while (true) {
      PSD_ASSIGN_OR_RETURN(bool done, Test());
      if (done) return Status::Ok();
      if (interrupt != nullptr) {
        Status s = interrupt->Check();
        if (!s.ok()) return s.WithPrefix("NcclBackend request: ");
      }
      backoff.Pause();
    }
  }

 private:
  NcclBackend* backend_;
  CudaEvent done_;
  bool finished_ = false;
};

}  // namespace

Result<std::unique_ptr<NcclBackend>> NcclBackend::Create(MPI_Comm comm, double timeout_s) {
  const char* call = "NcclBackend::Create";
  PSD_REQUIRE_ARG(comm != MPI_COMM_NULL, call, ": comm is MPI_COMM_NULL");
  if (timeout_s < 0) timeout_s = settings::PeerTimeoutS();
  PSD_REQUIRE_ARG(std::isfinite(timeout_s) && timeout_s >= 0, call, ": the deadline is ",
                  timeout_s, " s; expected a finite value >= 0 (POSEIDON_PEER_TIMEOUT_S)");
  std::unique_ptr<NcclBackend> b(new NcclBackend());
  b->mpi_comm_ = comm;
  b->timeout_s_ = timeout_s;
  b->watch_ = device::ProgressWatch(timeout_s);
  MPI_Comm_rank(comm, &b->rank_);
  MPI_Comm_size(comm, &b->size_);
  const size_t p = static_cast<size_t>(b->size_);
  // Each MPI step gets its own deadline; without one (timeout 0) the blocking forms run.
  auto bounded = [&](const char* step, const std::shared_ptr<void>& keep, auto&& op) {
    device::DeadlineInterrupt in(step, Deadline::After(timeout_s),
                                 ": a rank did not reach it (it failed or stopped)");
    MpiWait how{timeout_s > 0 ? &in : nullptr, call, nullptr};
    return RunMpi(how, step, keep, op);
  };

  // Step 1: every rank needs a GPU; all ranks learn who has none.
  Status local = CudaDeviceCount().status();
  if (local.ok()) local = CudaStatus(cudaGetDevice(&b->device_), "cudaGetDevice");
  auto gpus = std::make_shared<std::vector<int>>(p + 1);  // [0]: mine; [1 + r]: rank r's
  (*gpus)[0] = local.ok() ? 1 : 0;
  PSD_CHECK(bounded("MPI_Allgather(GPU check)", gpus, [&](MPI_Request* req) {
    int* g = gpus->data();
    return req == nullptr ? MPI_Allgather(g, 1, MPI_INT, g + 1, 1, MPI_INT, comm)
                          : MPI_Iallgather(g, 1, MPI_INT, g + 1, 1, MPI_INT, comm, req);
  }));
  if (!local.ok()) {
    return Status(local.code(), StrCat(call, ": rank ", b->rank_, ": ", local.message()));
  }
  for (size_t r = 0; r < p; ++r) {
    if ((*gpus)[1 + r] == 0) {
      return UnavailableError(call, ": rank ", r,
                              " has no usable GPU, so no NCCL communicator can span the ranks");
    }
  }

  // Step 2: the unique id travels with rank 0's status, so a failure there reaches everyone.
  struct Boot {
    int ok;
    ncclUniqueId id;
  };
  auto boot = std::make_shared<Boot>();
  std::memset(boot.get(), 0, sizeof(Boot));
  if (b->rank_ == 0) {
    ncclResult_t r = ncclGetUniqueId(&boot->id);
    boot->ok = r == ncclSuccess ? 1 : 0;
    if (r != ncclSuccess)
      local = BackendError(call, ": ncclGetUniqueId failed: ", ncclGetErrorString(r));
  }
  PSD_CHECK(bounded("MPI_Bcast(NCCL unique id)", boot, [&](MPI_Request* req) {
    const int n = static_cast<int>(sizeof(Boot));
    return req == nullptr ? MPI_Bcast(boot.get(), n, MPI_BYTE, 0, comm)
                          : MPI_Ibcast(boot.get(), n, MPI_BYTE, 0, comm, req);
  }));
  if (!boot->ok) {
    return local.ok() ? BackendError(call, ": ncclGetUniqueId failed on rank 0") : local;
  }

  // Step 3: non-blocking init, polled within the deadline, then agree that it worked.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const std::string init = StrCat("ncclCommInitRankConfig(rank ", b->rank_, " of ", b->size_,
                                  ", device ", b->device_, ")");
  ncclResult_t r = ncclCommInitRankConfig(&b->comm_, b->size_, boot->id, b->rank_, &config);
  ncclResult_t state = r;
  Deadline deadline = Deadline::After(timeout_s);
  Backoff backoff;
  while (r == ncclSuccess || r == ncclInProgress) {
    r = ncclCommGetAsyncError(b->comm_, &state);
    if (r != ncclSuccess || state != ncclInProgress) break;
    if (deadline.Expired()) break;
    backoff.Pause();
  }
  if (r != ncclSuccess) {
    local = BackendError(call, ": ", init, " failed: ", ncclGetErrorString(r), LastError(b->comm_));
  } else if (state == ncclInProgress) {
    local = device::DeadlineError(StrCat(call, ": ", init), timeout_s,
                                  ": a rank did not join the NCCL bootstrap (it failed or stopped "
                                  "before it); the communicator was aborted");
  } else if (state != ncclSuccess) {
    local = BackendError(call, ": ", init, " failed: ", ncclGetErrorString(state),
                         LastError(b->comm_));
  }
  if (!local.ok() && b->comm_ != nullptr) {
    ncclCommAbort(b->comm_);
    b->comm_ = nullptr;
  }
  auto agree = std::make_shared<std::vector<int>>(2);  // [0]: mine, [1]: the minimum
  (*agree)[0] = local.ok() ? 1 : 0;
  Status agreed = bounded("MPI_Allreduce(NCCL init check)", agree, [&](MPI_Request* req) {
    int* a = agree->data();
    return req == nullptr ? MPI_Allreduce(a, a + 1, 1, MPI_INT, MPI_MIN, comm)
                          : MPI_Iallreduce(a, a + 1, 1, MPI_INT, MPI_MIN, comm, req);
  });
  if (!local.ok()) return local;
  if (!agreed.ok() || (*agree)[1] == 0) {
    // The destructor aborts: a peer's init failed, so this communicator can never be used.
    b->aborted_ = true;
    ncclCommAbort(b->comm_);
    b->comm_ = nullptr;
    if (!agreed.ok()) return agreed;
    return BackendError(call, ": the NCCL init failed on another rank (its error names it)");
  }

  PSD_CUDA_CHECK(cudaStreamCreateWithFlags(&b->barrier_stream_, cudaStreamNonBlocking));
  PSD_CUDA_CHECK(cudaMalloc(&b->barrier_word_, sizeof(int)));
  PSD_CUDA_CHECK(cudaMemsetAsync(b->barrier_word_, 0, sizeof(int), b->barrier_stream_));
  PSD_CUDA_CHECK(cudaStreamSynchronize(b->barrier_stream_));
  PSD_ASSIGN_OR_RETURN(b->scratch_done_, CudaEvent::Create());
  if (timeout_s > 0) b->watchdog_ = std::thread([nb = b.get()] { nb->Watch(); });
  return b;
}

NcclBackend::~NcclBackend() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  {
    // The tracked work must finish before the communicator goes (ncclCommDestroy would wait
    // for it without bound) and before the buffers it uses are freed: wait for it within the
    // deadline, abort when it cannot finish. Then flush with ncclCommFinalize, within the
    // deadline too (it waits for the peers), and destroy.
    std::unique_lock<std::mutex> lock(mu_);
    Deadline deadline = Deadline::After(timeout_s_);
    Backoff backoff;
    while (comm_ != nullptr && !aborted_) {
      ReapLocked();
      Status s = PollAsyncLocked();
      if (!s.ok() || watch_.pending() == 0) break;
      if (deadline.Expired()) {
        (void)AbortLocked(device::DeadlineError("NcclBackend: the work pending at destruction",
                                                timeout_s_, kPeerCauses));
        break;
      }
      lock.unlock();
      backoff.Pause();
      lock.lock();
    }
    if (comm_ != nullptr && !aborted_) {
      ncclResult_t r = ncclCommFinalize(comm_);
      Status s = SettleLocked(lock, r, "ncclCommFinalize");
      if (s.ok() && !aborted_) ncclCommDestroy(comm_);
      if (!s.ok() && !aborted_) (void)AbortLocked(s);
    }
    comm_ = nullptr;
    // After an abort the kernels end at once; the work left behind them (casts) is short.
    for (const Tracked& t : pending_) {
      cudaEventSynchronize(t.event);
      cudaEventDestroy(t.event);
    }
    pending_.clear();
    for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
    spare_events_.clear();
  }
  (void)scratch_done_.Synchronize();
  if (barrier_stream_ != nullptr) cudaStreamSynchronize(barrier_stream_);
  if (scratch_ != nullptr) cudaFree(scratch_);
  for (void* p : retired_) cudaFree(p);
  if (barrier_word_ != nullptr) cudaFree(barrier_word_);
  if (barrier_stream_ != nullptr) cudaStreamDestroy(barrier_stream_);
}

Status NcclBackend::FailLocked(ncclResult_t r, const char* what, bool async) {
  Status s = BackendError(what, async ? " reported an asynchronous error: " : " failed: ",
                          ncclGetErrorString(r), LastError(comm_));
  // The communicator cannot be trusted after these (nor after any asynchronous error).
  if (async || r == ncclSystemError || r == ncclInternalError || r == ncclRemoteError ||
      r == ncclUnhandledCudaError) {
    return AbortLocked(Status(s.code(), StrCat(s.message(), "; the NCCL communicator was "
                                               "aborted")));
  }
  return s;
}

Status NcclBackend::AbortLocked(Status cause) {
  if (aborted_) return cause_;
  if (comm_ != nullptr) ncclCommAbort(comm_);
  comm_ = nullptr;
  aborted_ = true;
  cause_ = std::move(cause);
  PSD_LOG(kError, "NcclBackend: ", cause_.ToString());
  return cause_;
}

Status NcclBackend::PollAsyncLocked() {
  if (aborted_) return cause_;
  ncclResult_t state = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
  if (r != ncclSuccess) return FailLocked(r, "ncclCommGetAsyncError", false);
  if (state == ncclSuccess || state == ncclInProgress) return Status::Ok();
  return FailLocked(state, "NCCL", true);
}

Status NcclBackend::CheckAsyncError() {
  std::lock_guard<std::mutex> lock(mu_);
  return PollAsyncLocked();
}

Status NcclBackend::CheckUsable(const char* call) {
  Status s = CheckAsyncError();
  if (s.ok()) return s;
  return AbortedError(call, ": the NCCL communicator is unusable: it was aborted after ",
                      s.ToString());
}

Status NcclBackend::SettleLocked(std::unique_lock<std::mutex>& lock, ncclResult_t r,
                                 const char* what) {
  if (aborted_) return cause_;
  if (r == ncclSuccess) return Status::Ok();
  if (r != ncclInProgress) return FailLocked(r, what, false);
  // Non-blocking mode: the work is queued once the communicator's state leaves ncclInProgress
  // (a first collective may wait there for its peers to connect).
  Deadline deadline = Deadline::After(timeout_s_);
  Backoff backoff;
  while (true) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
    if (q != ncclSuccess) return FailLocked(q, "ncclCommGetAsyncError", false);
    if (state == ncclSuccess) return Status::Ok();
    if (state != ncclInProgress) return FailLocked(state, what, true);
    if (deadline.Expired()) {
      return AbortLocked(
          device::DeadlineError(StrCat("NcclBackend: ", what), timeout_s_, kPeerCauses));
    }
    lock.unlock();
    backoff.Pause();
    lock.lock();
    if (aborted_) return cause_;  // the watchdog aborted meanwhile
  }
}

Status NcclBackend::Enqueue(const char* what, const std::function<ncclResult_t()>& enqueue) {
  std::unique_lock<std::mutex> lock(mu_);
  if (aborted_) return cause_;
  return SettleLocked(lock, enqueue(), what);
}

void NcclBackend::ReapLocked() {
  size_t done = 0;
  for (auto it = pending_.begin(); it != pending_.end();) {
    cudaError_t e = cudaEventQuery(it->event);
    if (e == cudaErrorNotReady) {
      ++it;
      continue;
    }
    // Done, or an error (a broken context fails every later call on its own): forget it.
    if (e != cudaSuccess) (void)cudaGetLastError();
    spare_events_.push_back(it->event);
    it = pending_.erase(it);
    ++done;
  }
  watch_.Completed(done, Clock::now());
}

Status NcclBackend::Track(const char* call, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  ReapLocked();
  cudaEvent_t ev = nullptr;
  if (!spare_events_.empty()) {
    ev = spare_events_.back();
    spare_events_.pop_back();
  } else {
    PSD_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  }
  Status s = CudaStatus(cudaEventRecord(ev, stream), "cudaEventRecord(NCCL watchdog)");
  if (!s.ok()) {
    spare_events_.push_back(ev);
    return s;
  }
  pending_.push_back({ev, call});
  watch_.Enqueued(Clock::now());
  return Status::Ok();
}

void NcclBackend::Watch() {
  (void)cudaSetDevice(device_);  // the events and the communicator live on this device
  const auto tick = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(std::clamp(timeout_s_ / 10, 0.01, 1.0)));
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_ && !aborted_) {
    wake_.wait_for(lock, tick, [this] { return stop_; });
    if (stop_ || watch_.pending() == 0) continue;
    ReapLocked();
    if (!PollAsyncLocked().ok()) break;  // aborted on NCCL's error
    const auto now = Clock::now();
    if (!watch_.Overdue(now)) continue;
    const size_t more = watch_.pending() - 1;
    (void)AbortLocked(TimeoutError(
        "NcclBackend: ", pending_.front().call,
        more > 0 ? StrCat(" (and ", more, " operation(s) queued after it)") : std::string(),
        " did not finish within ", device::BoundText(timeout_s_),
        " (no NCCL operation of this communicator finished for ",
        std::round(watch_.StalledS(now) * 10) / 10, " s)", kPeerCauses));
  }
}

Result<float*> NcclBackend::Scratch(size_t elems, cudaStream_t stream) {
  const size_t bytes = elems * sizeof(float);
  if (bytes > scratch_bytes_) {
    const size_t cap = device::GrowCapacity(scratch_bytes_, bytes);
    void* p = nullptr;
    PSD_CHECK(CudaStatus(cudaMalloc(&p, cap),
                         StrCat("NcclBackend: cudaMalloc(", cap, " bytes of float32 scratch)")
                             .c_str()));
    if (scratch_ != nullptr) retired_.push_back(scratch_);
    scratch_ = static_cast<float*>(p);
    scratch_bytes_ = cap;
  }
  PSD_CUDA_CHECK(cudaStreamWaitEvent(stream, scratch_done_.get(), 0));
  return scratch_;
}

Status NcclBackend::ScratchUsed(cudaStream_t stream) { return scratch_done_.Record(stream); }

Status NcclBackend::Agree(const char* call, int64_t count, DType dtype, int64_t root,
                          uint64_t layout_hash, Status local) {
  // A sticky error on one rank must fail the call everywhere, not leave peers in NCCL.
  if (local.ok()) local = CheckUsable(call);
  if (!settings::CheckArgs()) return local;
  return AgreeOnArgs(
      mpi_comm_, {call, count, static_cast<int64_t>(dtype), root, layout_hash, std::move(local)});
}

Status NcclBackend::FailTogether(const char* call, const Status& local,
                                 const Interrupt* interrupt) {
  (void)interrupt;  // the argument agreement runs over MPI (AgreeOnArgs)
  Status ignored = Agree(call, -1, DType::kFloat32, -1, 0, local);
  (void)ignored;  // this rank reports its own error, not the agreement's
  return local;
}

Status NcclBackend::LaunchAllReduce(const char* call, const void* send, void* recv, size_t count,
                                    DType dtype, cudaStream_t stream) {
  if (count == 0) return Status::Ok();
  if (!IsHalfDType(dtype)) {
    PSD_CHECK(Enqueue("ncclAllReduce", [&] {
      return ncclAllReduce(send, recv, count, ToNcclType(dtype), ncclSum, comm_, stream);
    }));
    return Track(call, stream);
  }
  // Half precision: widen, sum in float32 in place, round once into recv.
  PSD_ASSIGN_OR_RETURN(float* wide, Scratch(count, stream));
  Status s = LaunchWidenToFloat32(dtype, send, wide, count, stream);
  if (s.ok()) {
    s = Enqueue("ncclAllReduce(float32)", [&] {
      return ncclAllReduce(wide, wide, count, ncclFloat32, ncclSum, comm_, stream);
    });
  }
  if (s.ok()) s = LaunchNarrowFromFloat32(dtype, wide, recv, count, stream);
  Status used = ScratchUsed(stream);
  PSD_CHECK(s);
  PSD_CHECK(used);
  return Track(call, stream);
}

Status NcclBackend::LaunchReduceScatter(const char* call, const void* send, void* recv,
                                        const std::vector<size_t>& counts, DType dtype,
                                        cudaStream_t stream) {
  using Kind = device::ReduceScatterPlan::Kind;
  const device::ReduceScatterPlan plan = device::PlanReduceScatter(counts, rank_);
  if (plan.kind == Kind::kNothing) return Status::Ok();
  const bool half = IsHalfDType(dtype);
  // Half precision runs the same plan in float32 on a widened copy, in place (this rank's
  // shard of the scratch receives its sum), and rounds that shard once into recv.
  float* wide = nullptr;
  if (half) {
    PSD_ASSIGN_OR_RETURN(wide, Scratch(plan.total, stream));
  }
  const ncclDataType_t t = half ? ncclFloat32 : ToNcclType(dtype);
  const size_t es = half ? sizeof(float) : DTypeSize(dtype);
  const void* in = half ? static_cast<const void*>(wide) : send;
  void* out = half ? static_cast<void*>(wide + plan.mine_offset) : recv;
  Status s = half ? LaunchWidenToFloat32(dtype, send, wide, plan.total, stream) : Status::Ok();
  if (s.ok() && plan.kind == Kind::kEven) {
    s = Enqueue(half ? "ncclReduceScatter(float32)" : "ncclReduceScatter", [&] {
      return ncclReduceScatter(in, out, plan.even, t, ncclSum, comm_, stream);
    });
  } else if (s.ok()) {
    // One reduce per owner, rooted at it (see device::PlanReduceScatter). recvbuff is used on
    // the root only; in place there when summing in the scratch.
    s = Enqueue("ncclReduce(reduce-scatter)", [&] {
      ncclResult_t first = ncclGroupStart();
      if (first != ncclSuccess) return first;
      for (const device::ReducePiece& piece : plan.pieces) {
        void* dst = piece.root == rank_ ? out : nullptr;
        ncclResult_t r = ncclReduce(At(in, piece.offset * es), dst, piece.count, t, ncclSum,
                                    piece.root, comm_, stream);
        if (r != ncclSuccess && first == ncclSuccess) first = r;
        if (first != ncclSuccess) break;
      }
      ncclResult_t end = ncclGroupEnd();  // closed even after a failed enqueue
      return first != ncclSuccess ? first : end;
    });
  }
  if (half) {
    if (s.ok()) s = LaunchNarrowFromFloat32(dtype, wide + plan.mine_offset, recv, plan.mine,
                                            stream);
    Status used = ScratchUsed(stream);
    if (s.ok()) s = used;
  }
  PSD_CHECK(s);
  return Track(call, stream);
}

Status NcclBackend::LaunchAllGatherV(const char* call, const void* send, void* recv,
                                     const std::vector<size_t>& counts, DType dtype,
                                     cudaStream_t stream) {
  size_t total = SumCounts(counts);
  if (total == 0) return Status::Ok();
  ncclDataType_t t = ToNcclType(dtype);
  if (std::all_of(counts.begin(), counts.end(), [&](size_t c) { return c == counts[0]; })) {
    PSD_CHECK(Enqueue("ncclAllGather",
                      [&] { return ncclAllGather(send, recv, counts[0], t, comm_, stream); }));
    return Track(call, stream);
  }
  size_t es = DTypeSize(dtype);
  std::vector<size_t> off = PrefixOffsets(counts);
  PSD_CHECK(Enqueue("ncclBroadcast(allgatherv)", [&] {
    ncclResult_t first = ncclGroupStart();
    if (first != ncclSuccess) return first;
    for (int r = 0; r < size_ && first == ncclSuccess; ++r) {
      size_t c = counts[static_cast<size_t>(r)];
      if (c == 0) continue;
      void* dst = At(recv, off[static_cast<size_t>(r)] * es);
      const void* src = r == rank_ ? send : dst;  // only the root's send buffer is read
      first = ncclBroadcast(src, dst, c, t, r, comm_, stream);
    }
    ncclResult_t end = ncclGroupEnd();  // closed even after a failed enqueue
    return first != ncclSuccess ? first : end;
  }));
  return Track(call, stream);
}

Status NcclBackend::AllReduce(const void* send, void* recv, size_t count, DType dtype,
                              const CallOptions& opts) {
  const char* call = "AllReduce";
  Status local = CheckCommon(call, dtype, opts);
  size_t bytes = count * DTypeSize(dtype);
  if (local.ok()) local = CheckDevicePointer(call, "send", send, bytes);
  if (local.ok()) local = CheckDevicePointer(call, "recv", recv, bytes);
  PSD_CHECK(opts.agreed ? (local.ok() ? CheckUsable(call) : local)
                        : Agree(call, static_cast<int64_t>(count), dtype, -1, 0, std::move(local)));
  return LaunchAllReduce(call, send, recv, count, dtype, ToStream(opts));
}

Status NcclBackend::ReduceScatter(const void* send, void* recv, const std::vector<size_t>& counts,
                                  DType dtype, const CallOptions& opts) {
  const char* call = "ReduceScatter";
  Status local = CheckCommon(call, dtype, opts);
  if (local.ok()) local = CheckCountsPerRank(call, counts, size_);
  size_t es = DTypeSize(dtype);
  size_t total = local.ok() ? SumCounts(counts) : 0;
  if (local.ok()) local = CheckDevicePointer(call, "send", send, total * es);
  if (local.ok()) {
    local = CheckDevicePointer(call, "recv", recv, counts[static_cast<size_t>(rank_)] * es);
  }
  PSD_CHECK(opts.agreed ? (local.ok() ? CheckUsable(call) : local)
                        : Agree(call, static_cast<int64_t>(total), dtype, -1,
                                local.ok() ? HashCounts(counts) : 0, std::move(local)));
  return LaunchReduceScatter(call, send, recv, counts, dtype, ToStream(opts));
}

Status NcclBackend::AllGather(const void* send, void* recv, size_t count, DType dtype,
                              const CallOptions& opts) {
  const char* call = "AllGather";
  Status local = CheckCommon(call, dtype, opts);
  size_t bytes = count * DTypeSize(dtype);
  if (local.ok()) local = CheckDevicePointer(call, "send", send, bytes);
  if (local.ok()) {
    local = CheckDevicePointer(call, "recv", recv, bytes * static_cast<size_t>(size_));
  }
  PSD_CHECK(opts.agreed ? (local.ok() ? CheckUsable(call) : local)
                        : Agree(call, static_cast<int64_t>(count), dtype, -1, 0, std::move(local)));
  if (count == 0) return Status::Ok();
  cudaStream_t stream = ToStream(opts);
  PSD_CHECK(Enqueue("ncclAllGather", [&] {
    return ncclAllGather(send, recv, count, ToNcclType(dtype), comm_, stream);
  }));
  return Track(call, stream);
}

Status NcclBackend::AllGatherV(const void* send, void* recv, const std::vector<size_t>& counts,
                               DType dtype, const CallOptions& opts) {
  const char* call = "AllGatherV";
  Status local = CheckCommon(call, dtype, opts);
  if (local.ok()) local = CheckCountsPerRank(call, counts, size_);
  size_t es = DTypeSize(dtype);
  size_t total = local.ok() ? SumCounts(counts) : 0;
  if (local.ok()) {
    local = CheckDevicePointer(call, "send", send, counts[static_cast<size_t>(rank_)] * es);
  }
  if (local.ok()) local = CheckDevicePointer(call, "recv", recv, total * es);
  PSD_CHECK(opts.agreed ? (local.ok() ? CheckUsable(call) : local)
                        : Agree(call, static_cast<int64_t>(total), dtype, -1,
                                local.ok() ? HashCounts(counts) : 0, std::move(local)));
  return LaunchAllGatherV(call, send, recv, counts, dtype, ToStream(opts));
}

Status NcclBackend::Broadcast(void* buf, size_t count, DType dtype, int root,
                              const CallOptions& opts) {
  const char* call = "Broadcast";
  Status local = CheckCommon(call, dtype, opts);
  if (local.ok() && (root < 0 || root >= size_)) {
    local = InvalidArgument(call, ": root ", root, " is outside 0..", size_ - 1);
  }
  if (local.ok()) local = CheckDevicePointer(call, "buf", buf, count * DTypeSize(dtype));
  PSD_CHECK(opts.agreed
                ? (local.ok() ? CheckUsable(call) : local)
                : Agree(call, static_cast<int64_t>(count), dtype, root, 0, std::move(local)));
  if (count == 0) return Status::Ok();
  cudaStream_t stream = ToStream(opts);
  PSD_CHECK(Enqueue("ncclBroadcast", [&] {
    return ncclBroadcast(buf, buf, count, ToNcclType(dtype), root, comm_, stream);
  }));
  return Track(call, stream);
}

Status NcclBackend::Barrier() {
  const char* call = "Barrier";
  PSD_CHECK(CheckUsable(call));
  PSD_CHECK(Enqueue("ncclAllReduce(barrier)", [&] {
    return ncclAllReduce(barrier_word_, barrier_word_, 1, ncclInt32, ncclSum, comm_,
                         barrier_stream_);
  }));
  PSD_CHECK(Track(call, barrier_stream_));
  PSD_ASSIGN_OR_RETURN(auto req, MakeRequest(call, barrier_stream_));
  return req->Wait();
}

Result<std::unique_ptr<Request>> NcclBackend::MakeRequest(const char* call, cudaStream_t stream) {
  PSD_ASSIGN_OR_RETURN(CudaEvent ev, CudaEvent::Create());
  Status s = ev.Record(stream);
  if (!s.ok()) return s.WithPrefix(call);
  return std::unique_ptr<Request>(new NcclRequest(this, std::move(ev)));
}

Result<std::unique_ptr<Request>> NcclBackend::IAllReduce(const void* send, void* recv, size_t count,
                                                         DType dtype, const CallOptions& opts) {
  const char* call = "IAllReduce";
  PSD_CHECK(CheckCommon(call, dtype, opts));
  size_t bytes = count * DTypeSize(dtype);
  PSD_CHECK(CheckDevicePointer(call, "send", send, bytes));
  PSD_CHECK(CheckDevicePointer(call, "recv", recv, bytes));
  PSD_CHECK(CheckUsable(call));
  PSD_CHECK(LaunchAllReduce(call, send, recv, count, dtype, ToStream(opts)));
  return MakeRequest(call, ToStream(opts));
}

Result<std::unique_ptr<Request>> NcclBackend::IReduceScatter(const void* send, void* recv,
                                                             const std::vector<size_t>& counts,
                                                             DType dtype, const CallOptions& opts) {
  const char* call = "IReduceScatter";
  PSD_CHECK(CheckCommon(call, dtype, opts));
  PSD_CHECK(CheckCountsPerRank(call, counts, size_));
  size_t es = DTypeSize(dtype);
  PSD_CHECK(CheckDevicePointer(call, "send", send, SumCounts(counts) * es));
  PSD_CHECK(CheckDevicePointer(call, "recv", recv, counts[static_cast<size_t>(rank_)] * es));
  PSD_CHECK(CheckUsable(call));
  PSD_CHECK(LaunchReduceScatter(call, send, recv, counts, dtype, ToStream(opts)));
  return MakeRequest(call, ToStream(opts));
}

Result<std::unique_ptr<Request>> NcclBackend::IAllGatherV(const void* send, void* recv,
                                                          const std::vector<size_t>& counts,
                                                          DType dtype, const CallOptions& opts) {
  const char* call = "IAllGatherV";
  PSD_CHECK(CheckCommon(call, dtype, opts));
  PSD_CHECK(CheckCountsPerRank(call, counts, size_));
  size_t es = DTypeSize(dtype);
  PSD_CHECK(CheckDevicePointer(call, "send", send, counts[static_cast<size_t>(rank_)] * es));
  PSD_CHECK(CheckDevicePointer(call, "recv", recv, SumCounts(counts) * es));
  PSD_CHECK(CheckUsable(call));
  PSD_CHECK(LaunchAllGatherV(call, send, recv, counts, dtype, ToStream(opts)));
  return MakeRequest(call, ToStream(opts));
}

}  // namespace poseidon
