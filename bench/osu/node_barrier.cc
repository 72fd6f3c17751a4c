#include "bench/osu/node_barrier.h"

#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "runtime/mpi_wait.h"

namespace poseidon::osu {
namespace {

constexpr MPI_Aint kLineBytes = 64;
constexpr double kSpinSeconds = 2e-6;

inline void Relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

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
  // Spinning holds a core: only where every rank of the node can have one.
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  b->spin_ = cores > 0 && b->size_ <= cores;
  b->counts_.resize(static_cast<size_t>(b->size_));
  for (int r = 0; r < b->size_; ++r) {
    MPI_Aint bytes = 0;
    int unit = 0;
    void* at = nullptr;
    rc = MPI_Win_shared_query(b->win_, r, &bytes, &unit, &at);
    if (rc != MPI_SUCCESS) return MpiError("MPI_Win_shared_query", rc);
    b->counts_[static_cast<size_t>(r)] = static_cast<uint64_t*>(at);
  }
  rc = MPI_Win_lock_all(MPI_MODE_NOCHECK, b->win_);
  if (rc != MPI_SUCCESS) return MpiError("MPI_Win_lock_all", rc);
  b->locked_ = true;
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
      if (spin_ && Since(start) < kSpinSeconds) {
        Relax();
        continue;
      }
      sched_yield();
      if (Since(start) > timeout_s_) {
        std::string missing;
        for (int q = 0; q < size_; ++q) {
          if (q != rank_ && !arrived(q)) missing += (missing.empty() ? "" : ", ") + std::to_string(q);
        }
        return TimeoutError("node barrier (--barrier node): rank ", rank_, " waited ",
                            timeout_s_, " s at barrier ", target, " for node rank(s) ", missing,
                            "; a rank stopped, is stuck or died");
      }
    }
  }
  return Status::Ok();
}

}  // namespace poseidon::osu
