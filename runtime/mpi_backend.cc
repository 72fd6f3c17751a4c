#include "runtime/mpi_backend.h"


#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <utility>

#include "runtime/arg_check.h"
#include "runtime/hier_allreduce.h"
#include "runtime/mpi_internal.h"
#include "runtime/settings.h"
#include "runtime/shm_collectives.h"
#include "runtime/shm_regions.h"

namespace poseidon {

MPI_Datatype ToMpiType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return MPI_FLOAT;
    case DType::kFloat64: return MPI_DOUBLE;
    case DType::kFloat16: return MPI_UINT16_T;
    case DType::kBFloat16: return MPI_UINT16_T;
    case DType::kInt32: return MPI_INT32_T;
    case DType::kInt64: return MPI_INT64_T;
  }
  return MPI_DATATYPE_NULL;
}

namespace mpi_internal {

char g_empty[16];

const void* OutOfPlaceSend(Scratch* scratch, const void* buf, size_t bytes) {
  const auto* b = static_cast<const unsigned char*>(buf);
  scratch->send.assign(b, b + bytes);
  return scratch->send.empty() ? static_cast<const void*>(g_empty) : scratch->send.data();
}

std::vector<int> ToInts(const std::vector<size_t>& v) {
  std::vector<int> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<int>(v[i]);
  return out;
}
std::vector<int> Displacements(const std::vector<size_t>& counts) {
  std::vector<int> d(counts.size());
  size_t off = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    d[i] = static_cast<int>(off);
    off += counts[i];
  }
  return d;
}

}  // namespace mpi_internal

using mpi_internal::Displacements;
using mpi_internal::g_empty;
using mpi_internal::OutOfPlaceSend;
using mpi_internal::Scratch;
using mpi_internal::ToInts;

MpiBackend::MpiBackend(MPI_Comm comm) : comm_(comm) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

MpiBackend::~MpiBackend() {
  // AllocShared's memory lives as long as the backend (the node-shared regions go with
  // regions_, collectively).
  for (void* p : private_shared_) std::free(p);
}

namespace {

// What a collective creation returned: the object, kept in *slot; or nullptr with *unavailable
// set when it said kUnavailable (on every rank alike); or its error.
template <typename T>
Result<T*> Adopt(Result<std::unique_ptr<T>> created, std::unique_ptr<T>* slot, bool* unavailable) {
  if (!created.ok() && created.status().code() == StatusCode::kUnavailable) {
    *unavailable = true;
    return static_cast<T*>(nullptr);
  }
  PSD_CHECK(created.status());
  *slot = std::move(created).value();
  return slot->get();
}

}  // namespace

Status MpiBackend::MeetBeforeBlocking(const MpiWait& how) {
  if (how.interrupt == nullptr) return Status::Ok();
  return RunMpi(how, "MPI_Barrier", nullptr, [&](MPI_Request* r) {
    return r ? MPI_Ibarrier(comm_, r) : MPI_Barrier(comm_);
  });
}

// AllReduce, AllGather and Broadcast send the common small call straight to the window: one
// through it is a few hundred instructions, and the checked path's layers (Checked*, the Do*
// hook, Checked) added about a third to it, which showed against Open MPI's linear broadcast
// at 4-256 B. The straight path is taken only where every check the checked path makes passes
// (the predicates below restate them: dtype, memory, MPI's element limit, the buffers, the
// root), no earlier call gave up, the window exists at the current settings and carries the
// size (Direct); the window checks the call against the peers' in its first step, as on the
// checked path. Anything else takes the checked path, which builds the errors. A rank alone in
// its communicator has no peer to check the call against or to move data to: a valid call's
// result is its own input (Alone), without the window's steps (np 1: a 4 B allreduce took 0.09
// us that way against Open MPI's 0.04 us, a 4 KiB broadcast 0.15 us against 0.03 us).
PSD_CHECKED_BACKEND_DIRECT_COUNTED_CALLS(MpiBackend)

ShmCollectives* MpiBackend::Direct(size_t bytes, DType dtype, const CallOptions& opts) const {
  // knobs_ is current where the window's version is (see Checked).
  ShmCollectives* shm = shm_.get();
  const bool direct = shm != nullptr && window_version_ == Settings::version() &&
                      IsValidDType(dtype) && opts.memory == MemoryKind::kHost &&
                      !sticky_->failed() && bytes >= static_cast<size_t>(knobs_.shm_threshold);
  return direct ? shm : nullptr;
}

Status MpiBackend::Alone(const void* send, void* recv, size_t bytes) {
  if (bytes > 0 && send != recv) std::memmove(recv, send, bytes);
  return Status::Ok();
}

Status MpiBackend::AllReduce(const void* send, void* recv, size_t count, DType dtype,
                             const CallOptions& opts) {
  ShmCollectives* shm = Direct(count * DTypeSize(dtype), dtype, opts);
  if (shm != nullptr && count <= static_cast<size_t>(INT_MAX) &&
      ((send != nullptr && recv != nullptr) || count == 0)) {
    if (size_ == 1) return Alone(send, recv, count * DTypeSize(dtype));
    const CollectiveArgs args{"AllReduce", static_cast<int64_t>(count),
                              static_cast<int64_t>(dtype), -1, 0, Status::Ok(), opts.detail};
    return ShmResult(*shm, shm->AllReduce(send, recv, count, dtype, opts.interrupt, &args));
  }
  return CheckedAllReduce(*this, send, recv, count, dtype, opts);
}

Status MpiBackend::AllGather(const void* send, void* recv, size_t count, DType dtype,
                             const CallOptions& opts) {
  const size_t all = count * static_cast<size_t>(size_);  // checked below before it is used
  ShmCollectives* shm = Direct(all * DTypeSize(dtype), dtype, opts);
  if (shm != nullptr && count <= static_cast<size_t>(INT_MAX / size_) &&
      ((send != nullptr && recv != nullptr) || count == 0)) {
    if (size_ == 1) return Alone(send, recv, count * DTypeSize(dtype));
    const CollectiveArgs args{"AllGather", static_cast<int64_t>(count),
                              static_cast<int64_t>(dtype), -1, 0, Status::Ok(), opts.detail};
    return ShmResult(*shm, shm->AllGather(send, recv, count, dtype, opts.interrupt, &args));
  }
  return CheckedAllGather(*this, send, recv, count, dtype, opts);
}

Status MpiBackend::Broadcast(void* buf, size_t count, DType dtype, int root,
                             const CallOptions& opts) {
  ShmCollectives* shm = Direct(count * DTypeSize(dtype), dtype, opts);
  if (shm != nullptr && root >= 0 && root < size_ && count <= static_cast<size_t>(INT_MAX) &&
      (buf != nullptr || count == 0)) {
    if (size_ == 1) return Status::Ok();  // the root's buffer is the result
    const CollectiveArgs args{"Broadcast", static_cast<int64_t>(count),
                              static_cast<int64_t>(dtype), root, 0, Status::Ok(), opts.detail};
    return ShmResult(*shm, shm->Broadcast(buf, count, dtype, root, opts.interrupt, &args));
  }
  return CheckedBroadcast(*this, buf, count, dtype, root, opts);
}

Result<ShmCollectives*> MpiBackend::Node(const MpiWait& how) {
  const Knobs& k = knobs();
  const long long chunk = k.shm_chunk;
  const size_t single = static_cast<size_t>(k.shm_single_copy);
  const ShmCollectives::Knobs wanted{k.shm_threshold, chunk, k.shm_single_copy};
  const bool same_window = shm_ && static_cast<long long>(shm_->chunk_bytes()) == chunk &&
                           shm_->single_copy_requested() == single;
  if (shm_ && shm_->knobs() != wanted) {
    // This rank's settings moved since the window last carried them. Every later call through
    // the window publishes the new ones, so a rank that moved them alone fails its next call
    // there together with its peers. Leaving the window for Open MPI, or rebuilding it (MPI
    // calls on every rank), would not reach the window: that is checked through it first, and
    // until it passes the window keeps the old ones (so every call checks again).
    const ShmCollectives::Knobs before = shm_->knobs();
    shm_->set_knobs(wanted);
    if (k.shm_threshold <= 0 || !same_window) {
      Status agreed = ShmResult(*shm_, shm_->Agree({how.call, -1, 0, -1, 0, Status::Ok()},
                                                   how.interrupt));
      if (!agreed.ok()) {
        if (shm_) shm_->set_knobs(before);
        return agreed;
      }
    }
  }
  if (k.shm_threshold <= 0 || shm_multi_node_) return static_cast<ShmCollectives*>(nullptr);
  if (same_window) {
    window_version_ = k.version;
    return shm_.get();
  }
  // Freeing and creating the window (MPI_Win_free, MPI_Comm_split_type,
  // MPI_Win_allocate_shared) only block.
  PSD_CHECK(MeetBeforeBlocking(how));
  shm_.reset();  // collective: every rank reaches this point with the same settings
  const size_t chunk_bytes = chunk < 0 ? 0 : static_cast<size_t>(chunk);
  PSD_ASSIGN_OR_RETURN(ShmCollectives * created,
                       Adopt(ShmCollectives::Create(comm_, chunk_bytes, k.shm_timeout_s, single),
                             &shm_, &shm_multi_node_));
  if (created != nullptr) {
    created->set_knobs(wanted);
    created->set_regions(regions_.get());
  }
  return created;
}

Result<void*> MpiBackend::AllocShared(size_t bytes, const CallOptions& opts) {
  const MpiWait how = WaitFor("MpiBackend::AllocShared", opts);
  PSD_CHECK(sticky_->Check("MpiBackend::AllocShared"));
  PSD_ASSIGN_OR_RETURN(ShmCollectives * window, Node(how));
  if (window == nullptr) {
    // No node-shared path: plain memory, which every collective takes as any other.
    PSD_REQUIRE_ARG(bytes > 0, "AllocShared: bytes is 0; expected at least 1");
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (p == nullptr) return BackendError("AllocShared: aligned_alloc of ", bytes, " bytes failed");
    private_shared_.push_back(p);
    return p;
  }
  // The regions' MPI calls (MPI_Comm_dup, MPI_Win_allocate_shared) only block.
  PSD_CHECK(MeetBeforeBlocking(how));
  if (!regions_) {
    PSD_ASSIGN_OR_RETURN(regions_, SharedRegions::Create(comm_));
    window->set_regions(regions_.get());
  }
  return regions_->Allocate(bytes);
}

Status MpiBackend::FreeShared(void* p, const CallOptions& opts) {
  auto it = std::find(private_shared_.begin(), private_shared_.end(), p);
  if (it != private_shared_.end()) {
    std::free(p);
    private_shared_.erase(it);
    return Status::Ok();
  }
  if (!regions_) {
    // No rank has node-shared memory (the regions are created on every rank alike): nothing to
    // agree on with the peers.
    if (p == nullptr) return Status::Ok();
    return InvalidArgument("FreeShared: ", p,
                           " is not memory that AllocShared returned on this rank and that is not "
                           "freed yet");
  }
  // The regions' free (an agreement round, then MPI_Win_free) only blocks; a bad pointer on one
  // rank fails it on every rank.
  PSD_CHECK(MeetBeforeBlocking(WaitFor("MpiBackend::FreeShared", opts)));
  return regions_->Free(p);
}

const MpiBackend::Knobs& MpiBackend::ReadKnobs() {
  knobs_.version = Settings::version();
  knobs_.shm_threshold = settings::ShmThresholdBytes();
  knobs_.shm_chunk = settings::ShmChunkBytes();
  // Negative: chosen at the window's creation (-1 for all), by measuring where every rank has
  // a core and by the count of ranks per core where they outnumber the cores (ShmCollectives).
  const long long single = settings::ShmSingleCopyBytes();
  knobs_.shm_single_copy = single < 0 ? -1 : single;
  knobs_.shm_timeout_s = settings::ShmTimeoutS();
  knobs_.check_args = settings::CheckArgs();
  knobs_.hier_bytes = settings::HierAllReduceBytes();
  return knobs_;
}

Result<HierAllReduce*> MpiBackend::Hierarchy(size_t bytes, DType dtype, const MpiWait& how) {
  const long long from = hier_bytes_override_ >= 0 ? hier_bytes_override_ : knobs().hier_bytes;
  if (from <= 0 || bytes < static_cast<size_t>(from) || !HierAllReduce::Takes(dtype)) {
    return static_cast<HierAllReduce*>(nullptr);
  }
  return BuildHierarchy(how);
}

Result<HierAllReduce*> MpiBackend::BuildHierarchy(const MpiWait& how) {
  if (hier_) return hier_.get();
  // Only across nodes (learned collectively by Node(), which every call runs first).
  if (!shm_multi_node_ || hier_unavailable_) return static_cast<HierAllReduce*>(nullptr);
  PSD_CHECK(MeetBeforeBlocking(how));  // the creation's MPI calls only block
  const Knobs& k = knobs();
  const size_t chunk = k.shm_chunk < 0 ? 0 : static_cast<size_t>(k.shm_chunk);
  // The node windows take the chunk and single-copy settings of the first two-level call
  // (-1, automatic, becomes kSingleCopyAuto); later changes of them are not followed.
  const size_t single = static_cast<size_t>(k.shm_single_copy);
  return Adopt(HierAllReduce::Create(comm_, chunk, k.shm_timeout_s, -1, single), &hier_,
               &hier_unavailable_);
}

Result<bool> MpiBackend::HasHierarchy() {
  const MpiWait how{nullptr, "MpiBackend::HasHierarchy", sticky_.get()};
  PSD_CHECK(sticky_->Check(how.call));
  PSD_CHECK(Node(how).status());
  PSD_ASSIGN_OR_RETURN(HierAllReduce* h, BuildHierarchy(how));
  return h != nullptr;
}

template <typename Run>
std::optional<Status> MpiBackend::Checked(const CollectiveArgs& args, const MpiWait& how,
                                          bool agreed, size_t bytes, Run run) {
  // The common case first: the window exists and the settings have not moved since Node last
  // vouched for it, without Node's checks and Result. Either way knobs_ is current below (Node
  // read it at this version), so it is read without knobs()'s recheck.
  ShmCollectives* shm = shm_.get();
  if (shm == nullptr || window_version_ != Settings::version()) {
    Result<ShmCollectives*> node = Node(how);
    if (!node.ok()) return node.status();
    shm = *node;
  }
  Status checked;
  if (shm == nullptr) {
    checked = knobs_.check_args && !agreed ? AgreeOnArgs(comm_, args, how) : args.local;
  } else if (!args.local.ok() || bytes >= static_cast<size_t>(knobs_.shm_threshold)) {
    return ShmResult(*shm, run(*shm));
  } else {
    checked = ShmResult(*shm, shm->Agree(args, how.interrupt));
  }
  if (!checked.ok()) return checked;
  return std::nullopt;
}

Status MpiBackend::Agree(const CollectiveArgs& args, const Interrupt* interrupt) {
  const MpiWait how{interrupt, args.call, sticky_.get()};
  PSD_CHECK(sticky_->Check(args.call));
  // Moves no data: the window, where there is one, runs only its agreement (a bad local status
  // fails there too, together with the peers).
  auto agree_only = [&](ShmCollectives& shm) { return shm.Agree(args, interrupt); };
  std::optional<Status> done = Checked(args, how, /*agreed=*/false, SIZE_MAX, agree_only);
  return done ? *done : Status::Ok();
}

Status MpiBackend::ShmFailure(const ShmCollectives& shm, Status status) {
  return RecordIfBroken(std::move(status), shm.broken());
}

Status MpiBackend::RecordIfBroken(Status status, bool broken) {
  if (status.ok() || !broken) return status;
  // The peers are in an unknown state (one may still be inside this collective): nothing on
  // this communicator can be trusted any more.
  Status failed = status.WithPrefix("MpiBackend::");
  sticky_->Record(failed);
  return failed;
}

Status MpiBackend::NullBuffer(const char* call, const char* which, size_t count) {
  return InvalidArgument(call, ": ", which, " buffer is null with count ", count,
                         "; expected a valid pointer when count > 0");
}

Status MpiBackend::TooMany(const char* call, size_t elements) {
  return InvalidArgument(call, ": count ", elements,
                         " exceeds the MPI limit of 2^31-1 elements per call");
}

Status MpiBackend::AllReduceUnchecked(const void* send, void* recv, size_t count, DType dtype,
                                      const MpiWait& how) {
  if (count == 0) return Status::Ok();
  const int n = static_cast<int>(count);
  if (IsHalfDType(dtype)) {
    auto scratch = std::make_shared<Scratch>();
    scratch->wide.resize(count);
    float* wide = scratch->wide.data();
    WidenToFloat32(dtype, send, wide, count);
    if (how.interrupt != nullptr && UseRecursiveDoubling(count * sizeof(float), size_)) {
      // The widened buffer is scratch only this call owns: a round given up on keeps it.
      PSD_CHECK(AllReduceRecursiveDoubling(wide, count, MPI_FLOAT, sizeof(float), how, scratch));
    } else {
      PSD_CHECK(RunMpi(how, "MPI_Allreduce", scratch, [&](MPI_Request* r) {
        if (r == nullptr) return MPI_Allreduce(MPI_IN_PLACE, wide, n, MPI_FLOAT, MPI_SUM, comm_);
        const void* copy = OutOfPlaceSend(scratch.get(), wide, count * sizeof(float));
        return MPI_Iallreduce(copy, wide, n, MPI_FLOAT, MPI_SUM, comm_, r);
      }));
    }
    NarrowFromFloat32(dtype, wide, recv, count);
    return Status::Ok();
  }
  const void* src = (send == recv) ? MPI_IN_PLACE : send;
  const MPI_Datatype type = ToMpiType(dtype);
  if (how.interrupt != nullptr && UseRecursiveDoubling(count * DTypeSize(dtype), size_)) {
    if (send != recv) std::memcpy(recv, send, count * DTypeSize(dtype));
    return AllReduceRecursiveDoubling(recv, count, type, DTypeSize(dtype), how, nullptr);
  }
  std::shared_ptr<Scratch> scratch;
  if (how.interrupt != nullptr && src == MPI_IN_PLACE) {
    scratch = std::make_shared<Scratch>();
    src = OutOfPlaceSend(scratch.get(), recv, count * DTypeSize(dtype));
  }
  return RunMpi(how, "MPI_Allreduce", scratch, [&](MPI_Request* r) {
    return r ? MPI_Iallreduce(src, recv, n, type, MPI_SUM, comm_, r)
             : MPI_Allreduce(src, recv, n, type, MPI_SUM, comm_);
  });
}

bool MpiBackend::UseRecursiveDoubling(size_t bytes, int world) {
  if (world < 2 || (world & (world - 1)) != 0) return false;
  int rounds = 0;
  for (int m = 1; m < world; m <<= 1) ++rounds;
  // Each rank sends the whole buffer once per round: latency-bound sizes only (above this a
  // ring or reduce-scatter + allgather moves fewer bytes).
  constexpr size_t kMaxSentBytes = 512 * 1024;
  return bytes * static_cast<size_t>(rounds) <= kMaxSentBytes;
}

Status MpiBackend::AllReduceRecursiveDoubling(void* buf, size_t count, MPI_Datatype type,
                                              size_t elem_bytes, const MpiWait& how,
                                              std::shared_ptr<void> keep_buf) {
  // The peer's buffer of each round; kept alive with any request given up on, and so is
  // keep_buf (what owns `buf` when it is scratch).
  // The peer buffer is reused from call to call (a fresh 64 KiB zero-filled allocation per
  // call cost ~3% of the main job's step); a call given up on keeps its buffer, and the next
  // call makes a new one.
  if (rd_peer_ == nullptr || rd_peer_.use_count() > 1) {
    rd_peer_ = std::make_shared<std::vector<unsigned char>>();
  }
  if (rd_peer_->size() < count * elem_bytes) rd_peer_->resize(count * elem_bytes);
  struct Keep {
    std::shared_ptr<std::vector<unsigned char>> peer;
    std::shared_ptr<void> buf;
  };
  auto keep = std::make_shared<Keep>();
  keep->peer = rd_peer_;
  keep->buf = std::move(keep_buf);
  unsigned char* const peer_buf = keep->peer->data();
  const int n = static_cast<int>(count);
  // A tag of its own: only this backend's calls use point-to-point on its communicator, one
  // call at a time, and messages between two ranks on one tag arrive in order.
  constexpr int kTag = 0x5053;
  // Each round sums into the buffer the peer's data just arrived in (written from this core,
  // so the stores do not fight the peer, which has just read the other one), then sends from
  // there; the two buffers trade places every round.
  unsigned char* sum = static_cast<unsigned char*>(buf);
  unsigned char* in = peer_buf;
  for (int mask = 1; mask < size_; mask <<= 1) {
    const int peer = rank_ ^ mask;
    MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    int rc = MPI_Irecv(in, n, type, peer, kTag, comm_, &req[0]);
    if (rc == MPI_SUCCESS) rc = MPI_Isend(sum, n, type, peer, kTag, comm_, &req[1]);
    if (rc != MPI_SUCCESS) {
      for (MPI_Request& r : req) AbandonMpi(r, keep);
      Status e = MpiError(StrCat(how.call, ": MPI_Isend/MPI_Irecv (allreduce round)").c_str(), rc);
      if (how.sticky != nullptr) how.sticky->Record(e);
      return e;
    }
    for (int i = 0; i < 2; ++i) {
      Status s = WaitOrAbandon(&req[i], keep, how);
      if (!s.ok()) {
        for (int j = i + 1; j < 2; ++j) AbandonMpi(req[j], keep);
        return s;
      }
    }
    // in = sum + in: the same two operands on both ranks of the pair (addition commutes).
    rc = MPI_Reduce_local(sum, in, n, type, MPI_SUM);
    if (rc != MPI_SUCCESS) return MpiError("MPI_Reduce_local (allreduce round)", rc);
    std::swap(sum, in);
  }
  if (sum != buf) std::memcpy(buf, sum, count * elem_bytes);
  return Status::Ok();
}

Status MpiBackend::DoAllReduce(const void* send, void* recv, size_t count, DType dtype,
                               const CallOptions& opts, const CollectiveArgs& args) {
  const MpiWait how = WaitFor("MpiBackend::AllReduce", opts);
  PSD_CHECK(sticky_->Check(how.call));
  const size_t bytes = count * DTypeSize(dtype);
  if (auto done = Checked(args, how, opts.agreed, bytes, [&](ShmCollectives& w) {
        return w.AllReduce(send, recv, count, dtype, opts.interrupt, &args);
      })) {
    return std::move(*done);
  }
  PSD_ASSIGN_OR_RETURN(HierAllReduce* hier, Hierarchy(bytes, dtype, how));
  if (hier != nullptr) {
    return RecordIfBroken(hier->AllReduce(send, recv, count, dtype, how), hier->broken());
  }
  return AllReduceUnchecked(send, recv, count, dtype, how);
}

Status MpiBackend::ReduceScatterUnchecked(const void* send, void* recv,
                                          const std::vector<size_t>& counts, DType dtype,
                                          const MpiWait& how) {
  size_t total = SumCounts(counts);
  if (total == 0) return Status::Ok();
  auto scratch = std::make_shared<Scratch>();
  scratch->counts = ToInts(counts);
  const int* c = scratch->counts.data();
  size_t mine = counts[static_cast<size_t>(rank_)];
  if (IsHalfDType(dtype)) {
    // [0, total): the widened input; [total, total + mine): the output.
    scratch->wide.resize(total + mine);
    float* wide = scratch->wide.data();
    WidenToFloat32(dtype, send, wide, total);
    PSD_CHECK(RunMpi(how, "MPI_Reduce_scatter", scratch, [&](MPI_Request* r) {
      return r ? MPI_Ireduce_scatter(wide, wide + total, c, MPI_FLOAT, MPI_SUM, comm_, r)
               : MPI_Reduce_scatter(wide, wide + total, c, MPI_FLOAT, MPI_SUM, comm_);
    }));
    NarrowFromFloat32(dtype, wide + total, recv, mine);
    return Status::Ok();
  }
  // Open MPI wants a valid receive pointer even for an empty shard.
  void* out = (recv == nullptr) ? g_empty : recv;
  const MPI_Datatype type = ToMpiType(dtype);
  return RunMpi(how, "MPI_Reduce_scatter", scratch, [&](MPI_Request* r) {
    return r ? MPI_Ireduce_scatter(send, out, c, type, MPI_SUM, comm_, r)
             : MPI_Reduce_scatter(send, out, c, type, MPI_SUM, comm_);
  });
}

Status MpiBackend::DoReduceScatter(const void* send, void* recv,
                                   const std::vector<size_t>& counts, DType dtype,
                                   const CallOptions& opts, const CollectiveArgs& args) {
  const MpiWait how = WaitFor("MpiBackend::ReduceScatter", opts);
  PSD_CHECK(sticky_->Check(how.call));
  const size_t bytes = static_cast<size_t>(args.count) * DTypeSize(dtype);  // the counts' sum
  if (auto done = Checked(args, how, opts.agreed, bytes, [&](ShmCollectives& w) {
        return w.ReduceScatter(send, recv, counts, dtype, opts.interrupt, &args);
      })) {
    return std::move(*done);
  }
  return ReduceScatterUnchecked(send, recv, counts, dtype, how);
}

Status MpiBackend::DoAllGather(const void* send, void* recv, size_t count, DType dtype,
                               const CallOptions& opts, const CollectiveArgs& args) {
  const MpiWait how = WaitFor("MpiBackend::AllGather", opts);
  PSD_CHECK(sticky_->Check(how.call));
  const size_t bytes = count * static_cast<size_t>(size_) * DTypeSize(dtype);
  if (auto done = Checked(args, how, opts.agreed, bytes, [&](ShmCollectives& w) {
        return w.AllGather(send, recv, count, dtype, opts.interrupt, &args);
      })) {
    return std::move(*done);
  }
  if (count == 0) return Status::Ok();
  const int n = static_cast<int>(count);
  const MPI_Datatype type = ToMpiType(dtype);
  return RunMpi(how, "MPI_Allgather", nullptr, [&](MPI_Request* r) {
    return r ? MPI_Iallgather(send, n, type, recv, n, type, comm_, r)
             : MPI_Allgather(send, n, type, recv, n, type, comm_);
  });
}

Status MpiBackend::DoAllGatherV(const void* send, void* recv, const std::vector<size_t>& counts,
                                DType dtype, const CallOptions& opts, const CollectiveArgs& args) {
  const MpiWait how = WaitFor("MpiBackend::AllGatherV", opts);
  PSD_CHECK(sticky_->Check(how.call));
  const size_t total = static_cast<size_t>(args.count);  // the counts' sum (DescribeCounted)
  const size_t bytes = total * DTypeSize(dtype);
  if (auto done = Checked(args, how, opts.agreed, bytes, [&](ShmCollectives& w) {
        return w.AllGatherV(send, recv, counts, dtype, opts.interrupt, &args);
      })) {
    return std::move(*done);
  }
  if (total == 0) return Status::Ok();
  auto scratch = std::make_shared<Scratch>();
  scratch->counts = ToInts(counts);
  scratch->displs = Displacements(counts);
  const int* c = scratch->counts.data();
  const int* d = scratch->displs.data();
  const int mine = c[rank_];
  const void* in = send == nullptr ? g_empty : send;
  const MPI_Datatype type = ToMpiType(dtype);
  return RunMpi(how, "MPI_Allgatherv", scratch, [&](MPI_Request* r) {
    return r ? MPI_Iallgatherv(in, mine, type, recv, c, d, type, comm_, r)
             : MPI_Allgatherv(in, mine, type, recv, c, d, type, comm_);
  });
}

Status MpiBackend::DoBroadcast(void* buf, size_t count, DType dtype, int root,
                               const CallOptions& opts, const CollectiveArgs& args) {
  const MpiWait how = WaitFor("MpiBackend::Broadcast", opts);
  PSD_CHECK(sticky_->Check(how.call));
  const size_t bytes = count * DTypeSize(dtype);
  if (auto done = Checked(args, how, opts.agreed, bytes, [&](ShmCollectives& w) {
        return w.Broadcast(buf, count, dtype, root, opts.interrupt, &args);
      })) {
    return std::move(*done);
  }
  if (count == 0) return Status::Ok();
  const int n = static_cast<int>(count);
  const MPI_Datatype type = ToMpiType(dtype);
  return RunMpi(how, "MPI_Bcast", nullptr, [&](MPI_Request* r) {
    return r ? MPI_Ibcast(buf, n, type, root, comm_, r) : MPI_Bcast(buf, n, type, root, comm_);
  });
}

Status MpiBackend::AllReducePieces(const std::vector<SumPiece>& pieces, DType dtype,
                                   const CallOptions& opts, const SumCommit& commit,
                                   bool* committed) {
  const char* call = "AllReducePieces";
  const MpiWait how = WaitFor("MpiBackend::AllReducePieces", opts);
  PSD_CHECK(sticky_->Check(how.call));
  size_t count = 0;
  for (const SumPiece& p : pieces) count += p.count;
  Status local = CheckCall(call, dtype, opts);
  for (size_t i = 0; i < pieces.size() && local.ok(); ++i) {
    const size_t n = pieces[i].count, bytes = n * DTypeSize(dtype);
    local = CheckBuffer(call, "piece input", pieces[i].in, n, bytes);
    if (local.ok()) local = CheckBuffer(call, "piece output", pieces[i].out, n, bytes);
  }
  if (local.ok() && !pieces.empty() && pieces[0].sink != nullptr) {
    local = InvalidArgument(call, ": the first piece has a sink; expected its sum in its output "
                            "(the commit reads it there)");
  }
  PSD_ASSIGN_OR_RETURN(ShmCollectives* shm, Node(how));
  // Whether the window carries the call depends only on agreed values (the settings, the node,
  // the total size, which the caller agreed), so every rank answers kUnimplemented alike (the
  // caller's packed path then meets any local error together with the peers); with the
  // window, a rank with bad arguments joins its agreement, which fails every rank together.
  if (shm == nullptr || (local.ok() && !ShmCarries(count * DTypeSize(dtype)))) {
    return Status(StatusCode::kUnimplemented,
                  "MpiBackend::AllReducePieces: not through the window");
  }
  const CollectiveArgs args{call, static_cast<int64_t>(count), static_cast<int64_t>(dtype), -1, 0,
                            local, opts.detail};
  return ShmResult(*shm, shm->AllReducePieces(pieces, dtype, opts.interrupt, args, commit,
                                              committed));
}

Status MpiBackend::Barrier() {
  PSD_CHECK(sticky_->Check("MpiBackend::Barrier"));
  const MpiWait how = WaitFor("MpiBackend::Barrier", {});
  PSD_ASSIGN_OR_RETURN(ShmCollectives* shm, Node(how));
  if (shm != nullptr) {
    return ShmResult(*shm, shm->Agree({"Barrier", 0, 0, -1, 0, Status::Ok()}, nullptr));
  }
  int rc = MPI_Barrier(comm_);
  if (rc != MPI_SUCCESS) return MpiError("MPI_Barrier", rc);
  return Status::Ok();
}

}  // namespace poseidon
