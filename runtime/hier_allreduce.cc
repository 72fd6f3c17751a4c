#include "runtime/hier_allreduce.h"

#include <utility>

#include "runtime/mpi_backend.h"
#include "runtime/shard.h"
#include "runtime/shm_collectives.h"

namespace poseidon {
namespace {

bool MpiFinalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

}  // namespace

Result<std::unique_ptr<HierAllReduce>> HierAllReduce::Create(MPI_Comm comm, size_t chunk_bytes,
                                                             double timeout_s, int node,
                                                             size_t single_copy_bytes) {
  int size = 1, rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  std::unique_ptr<HierAllReduce> h(new HierAllReduce());
  int rc = node >= 0
               ? MPI_Comm_split(comm, node, rank, &h->node_)
               : MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &h->node_);
  if (rc != MPI_SUCCESS) return MpiError("HierAllReduce: splitting the nodes", rc);
  MPI_Comm_rank(h->node_, &h->local_rank_);
  MPI_Comm_size(h->node_, &h->local_size_);
  // The smallest and the largest node size, chunk and single-copy setting, in one allreduce
  // (the minimum of x and of -x for each). The single-copy setting as -1 when automatic
  // (kSingleCopyAuto does not fit).
  enum { kNodeSize, kChunkBytes, kSingleCopy, kBounded };
  const long long single = single_copy_bytes == ShmCollectives::kSingleCopyAuto
                               ? -1
                               : static_cast<long long>(single_copy_bytes);
  const long long mine[kBounded] = {h->local_size_, static_cast<long long>(chunk_bytes), single};
  long long bounds[2 * kBounded];
  for (int k = 0; k < kBounded; ++k) {
    bounds[2 * k] = mine[k];
    bounds[2 * k + 1] = -mine[k];
  }
  rc = MPI_Allreduce(MPI_IN_PLACE, bounds, 2 * kBounded, MPI_LONG_LONG, MPI_MIN, comm);
  if (rc != MPI_SUCCESS) return MpiError("HierAllReduce: MPI_Allreduce(node sizes)", rc);
  auto lowest = [&](int k) { return bounds[2 * k]; };
  auto highest = [&](int k) { return -bounds[2 * k + 1]; };
  const long long smallest = lowest(kNodeSize), largest = highest(kNodeSize);
  // Every rank sees the same bounds and size, so all return the same way.
  if (largest == size) {
    return UnavailableError("HierAllReduce: every rank shares one node");
  }
  if (smallest != largest) {
    return UnavailableError("HierAllReduce: nodes hold between ", smallest, " and ", largest,
                            " ranks; two levels need the same number on every node");
  }
  if (largest == 1) return UnavailableError("HierAllReduce: one rank per node");
  // Each node's window checks its own ranks' settings; ranks on different nodes must agree
  // too, or one node's window would fail while the others went on to the cross allreduce.
  if (lowest(kChunkBytes) != highest(kChunkBytes)) {
    return MismatchError("HierAllReduce: POSEIDON_SHM_CHUNK_BYTES differs across ranks (between ",
                         lowest(kChunkBytes), " and ", highest(kChunkBytes),
                         "); expected the same on every rank");
  }
  if (lowest(kSingleCopy) != highest(kSingleCopy)) {
    return MismatchError("HierAllReduce: POSEIDON_SHM_SINGLE_COPY_BYTES differs across ranks ",
                         "(between ", lowest(kSingleCopy), " and ", highest(kSingleCopy),
                         ", -1: automatic); expected the same on every rank");
  }
  h->nodes_ = static_cast<int>(size / largest);
  rc = MPI_Comm_split(comm, h->local_rank_, rank, &h->cross_);
  if (rc != MPI_SUCCESS) return MpiError("HierAllReduce: MPI_Comm_split", rc);
  auto window = ShmCollectives::Create(h->node_, chunk_bytes, timeout_s, single_copy_bytes);
  // Every node's ranks agree on their window's outcome; the nodes agree on theirs here, so
  // that a window that failed on one node (its probe or timing ran out of time, say) fails
  // every rank with the same code instead of leaving the others in the cross allreduce: an
  // error's code where any node has one, else kUnavailable where any node's window is
  // unavailable (then every rank's caller takes the flat path).
  const StatusCode own = window.ok() ? StatusCode::kOk : window.status().code();
  int outcome[2] = {own == StatusCode::kUnavailable ? 0 : static_cast<int>(own),
                    own == StatusCode::kUnavailable ? 1 : 0};
  rc = MPI_Allreduce(MPI_IN_PLACE, outcome, 2, MPI_INT, MPI_MAX, comm);
  if (rc != MPI_SUCCESS) return MpiError("HierAllReduce: MPI_Allreduce(window outcome)", rc);
  if (outcome[0] != 0 || outcome[1] != 0) {
    const StatusCode agreed =
        outcome[0] != 0 ? static_cast<StatusCode>(outcome[0]) : StatusCode::kUnavailable;
    return Status(agreed, !window.ok() ? window.status().message()
                                       : "HierAllReduce: the shared-memory window of another "
                                         "node could not be created (its ranks' errors say "
                                         "why); every rank fails alike");
  }
  h->shm_ = std::move(window).value();
  return h;
}

HierAllReduce::~HierAllReduce() {
  if (MpiFinalized()) return;
  shm_.reset();
  if (cross_ != MPI_COMM_NULL) MPI_Comm_free(&cross_);
  if (node_ != MPI_COMM_NULL) MPI_Comm_free(&node_);
}

bool HierAllReduce::broken() const { return cross_failed_ || (shm_ && shm_->broken()); }

Status HierAllReduce::AllReduce(const void* send, void* recv, size_t count, DType dtype,
                                const MpiWait& how) {
  if (count == 0) return Status::Ok();
  const size_t es = DTypeSize(dtype);
  const std::vector<size_t> counts = ShardCounts(count, local_size_);
  const size_t mine = counts[static_cast<size_t>(local_rank_)];
  unsigned char* out =
      static_cast<unsigned char*>(recv) + ShardOffset(count, local_size_, local_rank_) * es;
  if (shard_.use_count() > 1) {
    // A request abandoned earlier still holds the old buffer: never reuse it.
    shard_ = std::make_shared<std::vector<unsigned char>>();
  }
  if (shard_->size() < mine * es) shard_->resize(mine * es);
  unsigned char* shard = shard_->data();

  Status s = shm_->ReduceScatter(send, shard, counts, dtype, how.interrupt);
  if (!s.ok()) return s.WithPrefix("HierAllReduce (within the node): ");
  if (mine > 0) {
    const MPI_Datatype type = ToMpiType(dtype);
    const int n = static_cast<int>(mine);
    // From 4 nodes on, the non-blocking form even for a blocking call: Open MPI 4.1 runs it as
    // a ring there (libnbc), where its blocking allreduce takes recursive halving
    // (Rabenseifner), 1.1-1.25x slower at 4-64 MiB with two ranks per node on the emulated cluster
    // (bench/RESULTS.md, "Two-level allreduce"). Below 4, libnbc takes reduce + broadcast.
    const bool ring = nodes_ >= 4;
    s = RunMpi(how, "MPI_Allreduce (across nodes)", shard_, [&](MPI_Request* r) {
      if (r != nullptr) return MPI_Iallreduce(shard, out, n, type, MPI_SUM, cross_, r);
      if (!ring) return MPI_Allreduce(shard, out, n, type, MPI_SUM, cross_);
      MPI_Request own = MPI_REQUEST_NULL;
      int rc = MPI_Iallreduce(shard, out, n, type, MPI_SUM, cross_, &own);
      return rc == MPI_SUCCESS ? MPI_Wait(&own, MPI_STATUS_IGNORE) : rc;
    });
    if (!s.ok()) {
      // The node peers wait in step 3 for a shard that never comes; a request given up on may
      // still write `out`.
      cross_failed_ = true;
      return s;
    }
  }
  s = shm_->AllGatherV(out, recv, counts, dtype, how.interrupt);
  if (!s.ok()) return s.WithPrefix("HierAllReduce (within the node): ");
  return Status::Ok();
}

}  // namespace poseidon
