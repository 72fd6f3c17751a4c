#include "bench/osu/node_barrier.h"

#include <sched.h>

#include <chrono>
#include <string>

#include "runtime/mpi_wait.h"
#include "runtime/spin.h"

namespace poseidon::osu {
namespace {

constexpr MPI_Aint kLineBytes = 64;
constexpr double kSpinSeconds = 2e-6;

}  // namespace

Result<std::unique_ptr<NodeBarrier>> NodeBarrier::Create(MPI_Comm comm, double timeout_s) {
  std::unique_ptr<NodeBarrier> b(new NodeBarrier());
  b->timeout_s_ = timeout_s;
  int world = 0;
  MPI_Comm_size(comm, &world);
  int rc = MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &b->node_);
  if (rc != MPI_SUCCESS) return MpiError("MPI_Comm_split_type", rc);
  MPI_Comm_rank(b->node_, &b->rank_);
  MPI_Comm_size(b->node_, &b->size_);
  // Every rank sees whether all share one node (the smallest node's size is the world's).
  int smallest = 0;
  MPI_Allreduce(&b->size_, &smallest, 1, MPI_INT, MPI_MIN, comm);
  if (smallest != world) {
    return InvalidArgument("option --barrier node: the ", world, " ranks are not all on one node "
                           "(this rank's node holds ", b->size_, "); expected one node, or use "
                           "--barrier mpi");
  }
  void* mine = nullptr;
  rc = MPI_Win_allocate_shared(kLineBytes, 1, MPI_INFO_NULL, b->node_, &mine, &b->win_);
  if (rc != MPI_SUCCESS) return MpiError("MPI_Win_allocate_shared", rc);
  int* model = nullptr;
  int found = 0;
  MPI_Win_get_attr(b->win_, MPI_WIN_MODEL, &model, &found);
  if (!found || *model != MPI_WIN_UNIFIED) {
    return UnavailableError("option --barrier node: MPI's shared-memory window is not in the "
                            "unified memory model; use --barrier mpi");
  }
  // Spinning holds a core: only where every rank of the node can have one (of the cores this
  // process may run on).
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  const int cores = sched_getaffinity(0, sizeof(allowed), &allowed) == 0 ? CPU_COUNT(&allowed) : 0;
  b->spin_ = cores > 0 && b->size_ <= cores;
  // Every rank takes the same way out (a failure on one rank alone would leave the others in
  // the barrier below while it frees the window in its destructor).
  b->counts_.resize(static_cast<size_t>(b->size_));
  Status st;
  for (int r = 0; r < b->size_ && st.ok(); ++r) {
    MPI_Aint bytes = 0;
    int unit = 0;
    void* at = nullptr;
    rc = MPI_Win_shared_query(b->win_, r, &bytes, &unit, &at);
    if (rc != MPI_SUCCESS) st = MpiError("MPI_Win_shared_query", rc);
    b->counts_[static_cast<size_t>(r)] = static_cast<uint64_t*>(at);
  }
  if (st.ok()) {
    rc = MPI_Win_lock_all(MPI_MODE_NOCHECK, b->win_);
    if (rc != MPI_SUCCESS) st = MpiError("MPI_Win_lock_all", rc);
    b->locked_ = rc == MPI_SUCCESS;
  }
  int ok = st.ok() ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, b->node_);
  if (!st.ok()) return st;
  if (!all_ok) return InternalError("option --barrier node: another rank failed to set up its window");
  __atomic_store_n(static_cast<uint64_t*>(mine), 0, __ATOMIC_RELEASE);
  MPI_Barrier(b->node_);  // every count is 0 before anyone waits on one
  return b;
}

NodeBarrier::~NodeBarrier() {
  if (locked_) MPI_Win_unlock_all(win_);
  if (win_ != MPI_WIN_NULL) MPI_Win_free(&win_);
  if (node_ != MPI_COMM_NULL) MPI_Comm_free(&node_);
}

Status NodeBarrier::Wait() {
  const uint64_t target = ++entered_;
  __atomic_store_n(counts_[static_cast<size_t>(rank_)], target, __ATOMIC_RELEASE);
  auto arrived = [&](int r) {
    return __atomic_load_n(counts_[static_cast<size_t>(r)], __ATOMIC_ACQUIRE) >= target;
  };
  std::chrono::steady_clock::time_point start;
  bool started = false;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_ || arrived(r)) continue;
    if (!started) {
      start = std::chrono::steady_clock::now();
      started = true;
    }
    while (!arrived(r)) {
      if (spin_ && SecondsSince(start) < kSpinSeconds) {
        CpuRelax();
        continue;
      }
      sched_yield();
      if (SecondsSince(start) > timeout_s_) {
        std::string missing;
        for (int q = 0; q < size_; ++q) {
          if (q != rank_ && !arrived(q)) missing += (missing.empty() ? "" : ", ") + std::to_string(q);
        }
        if (missing.empty()) break;  // the last one came during the yield
        return TimeoutError("node barrier (--barrier node): rank ", rank_, " waited ",
                            timeout_s_, " s at barrier ", target, " for node rank(s) ", missing,
                            "; a rank stopped, is stuck or died");
      }
    }
  }
  return Status::Ok();
}

}  // namespace poseidon::osu
