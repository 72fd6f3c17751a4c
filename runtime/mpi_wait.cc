#include "runtime/mpi_wait.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace poseidon {

Status MpiError(const char* what, int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return BackendError(what, " failed: ", std::string(buf, static_cast<size_t>(len)));
}

namespace {

// How long a waiter only yields between polls before it starts sleeping: a collective whose
// peers are on their way (the common case in a healthy job) completes within it and costs no
// sleep, as Open MPI's own blocking wait (which yields with mpi_yield_when_idle) would; a
// longer wait (a peer busy computing) sleeps instead of burning a shared core. Measured on the
// main job at np 2: with 32 yielding polls before the first sleep, a 67 KiB fused allreduce
// step took 2.5x as long as the blocking MPI_Allreduce.
constexpr std::chrono::microseconds kYieldFor{5000};
constexpr std::chrono::microseconds kFirstSleep{8};
constexpr std::chrono::microseconds kMaxSleep{200};

struct Abandoned {
  MPI_Request request;
  std::shared_ptr<void> keep;
};

// Never destroyed: MPI may still write into the kept scratch while static destructors run.
std::mutex& AbandonedMutex() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::vector<Abandoned>& AbandonedList() {  // guarded by AbandonedMutex()
  static auto* list = new std::vector<Abandoned>;
  return *list;
}

// Frees the entries whose request completed; the caller holds AbandonedMutex().
size_t ReapLocked() {
  std::vector<Abandoned>& list = AbandonedList();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return list.size();  // MPI_Test is illegal now; keep everything
  size_t kept = 0;
  for (Abandoned& a : list) {
    int flag = 0;
    int rc = MPI_Test(&a.request, &flag, MPI_STATUS_IGNORE);
    // On an MPI error the request's state is unknown: keep its scratch for good.
    if (rc == MPI_SUCCESS && flag) continue;
    list[kept++] = std::move(a);
  }
  list.resize(kept);
  return kept;
}

}  // namespace

Status WaitMpi(MPI_Request* request, const Interrupt* interrupt, const char* call) {
  if (interrupt == nullptr) {
    int rc = MPI_Wait(request, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return MpiError(StrCat(call, ": MPI_Wait").c_str(), rc);
    return Status::Ok();
  }
  auto pause = kFirstSleep;
  const auto start = std::chrono::steady_clock::now();
  for (int poll = 0;; ++poll) {
    int flag = 0;
    int rc = MPI_Test(request, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return MpiError(StrCat(call, ": MPI_Test").c_str(), rc);
    if (flag) return Status::Ok();
    Status s = interrupt->Check();
    if (!s.ok()) return s.WithPrefix(StrCat(call, ": "));
    if (std::chrono::steady_clock::now() - start < kYieldFor) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, kMaxSleep);
    }
  }
}

void AbandonMpi(MPI_Request request, std::shared_ptr<void> keep) {
  if (request == MPI_REQUEST_NULL) return;
  std::lock_guard<std::mutex> lock(AbandonedMutex());
  AbandonedList().push_back({request, std::move(keep)});
  (void)ReapLocked();
}

size_t ReapAbandonedMpi() {
  std::lock_guard<std::mutex> lock(AbandonedMutex());
  return ReapLocked();
}

Status StickyError::Failed(const char* call) const {
  std::lock_guard<std::mutex> lock(mu_);
  return AbortedError(call, ": unusable since an earlier call gave up waiting for its peers (",
                      first_.ToString(),
                      "): the collective it left may still run (MPI cannot cancel one), so later "
                      "calls could pair with it; create a new communicator");
}

void StickyError::Record(const Status& failure) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_.load(std::memory_order_relaxed)) return;
  first_ = failure.ok() ? InternalError("StickyError::Record: recorded an OK status") : failure;
  failed_.store(true, std::memory_order_release);
}

Status WaitOrAbandon(MPI_Request* request, std::shared_ptr<void> keep, const MpiWait& how) {
  Status s = WaitMpi(request, how.interrupt, how.call);
  if (s.ok() || *request == MPI_REQUEST_NULL) return s;
  AbandonMpi(*request, std::move(keep));
  *request = MPI_REQUEST_NULL;
  if (how.sticky != nullptr) how.sticky->Record(s);
  return s;
}

}  // namespace poseidon
