// NcclBackend's lifecycle and watchdog: the bounded init (every MPI step and the NCCL
// bootstrap under the peer deadline), the bounded teardown, the sticky error state (fail,
// abort, poll, settle a non-blocking call) and the thread that aborts overdue work.
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

namespace poseidon {

namespace {

using device::Backoff;
using device::Clock;
using device::Deadline;

// What a deadline error says about its likely cause.
constexpr const char* kPeerCauses =
    ": a peer died, stopped, or called a different collective; the NCCL communicator was "
    "aborted";

std::string LastError(ncclComm_t comm) {
  const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  return (last != nullptr && last[0] != '\0') ? StrCat(" (", last, ")") : std::string();
}

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
  // A flag word (runtime/or_agreement.h): raised where the init failed.
  auto failed = std::make_shared<uint64_t>(local.ok() ? 0 : 1);
  Status agreed = bounded("MPI_Allreduce(NCCL init check)", failed, [&](MPI_Request* req) {
    uint64_t* f = failed.get();
    return req == nullptr ? MPI_Allreduce(MPI_IN_PLACE, f, 1, MPI_UINT64_T, MPI_BOR, comm)
                          : MPI_Iallreduce(MPI_IN_PLACE, f, 1, MPI_UINT64_T, MPI_BOR, comm, req);
  });
  if (!local.ok()) return local;
  if (!agreed.ok() || *failed != 0) {
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

}  // namespace poseidon
