// SharedRegions (shm_regions.h): node-shared memory for collective buffers.
#include "runtime/shm_regions.h"

#include <algorithm>

#include "runtime/mpi_wait.h"
#include "runtime/or_agreement.h"

namespace poseidon {

Result<std::unique_ptr<SharedRegions>> SharedRegions::Create(MPI_Comm comm) {
  std::unique_ptr<SharedRegions> s(new SharedRegions());
  int rc = MPI_Comm_dup(comm, &s->comm_);
  if (rc != MPI_SUCCESS) return MpiError("SharedRegions: MPI_Comm_dup", rc);
  MPI_Comm_set_errhandler(s->comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(s->comm_, &s->rank_);
  MPI_Comm_size(s->comm_, &s->size_);
  return s;
}

SharedRegions::~SharedRegions() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (Region& r : regions_) {
    if (r.win == MPI_WIN_NULL) continue;
    MPI_Win_unlock_all(r.win);
    MPI_Win_free(&r.win);
  }
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

Result<void*> SharedRegions::Allocate(size_t bytes) {
  const size_t limit = size_t{1} << kOffsetBits;
  // Every rank joins the allocation's check whatever its own size, so that a bad size on one
  // rank fails the call on all of them instead of leaving them in MPI_Win_allocate_shared.
  const bool bad = bytes == 0 || bytes > limit;
  PSD_ASSIGN_OR_RETURN(bool any_bad, or_agreement::RaisedAnywhere(
                                         comm_, bad, "AllocShared: the size check"));
  if (bad) {
    return InvalidArgument("AllocShared: bytes is ", bytes, "; expected 1 to ", limit);
  }
  if (any_bad) {
    return InvalidArgument("AllocShared: another rank asked for 0 bytes or more than ", limit,
                           " (this rank asked for ", bytes, "); nothing was allocated");
  }
  Region region;
  MPI_Info info;
  MPI_Info_create(&info);
  // Each rank's part starts on its own page.
  MPI_Info_set(info, "alloc_shared_noncontig", "true");
  void* base = nullptr;
  // Room to start the memory on a 64-byte boundary (the window's parts need not be).
  const size_t rounded = (bytes + 63) / 64 * 64 + 64;
  int rc = MPI_Win_allocate_shared(static_cast<MPI_Aint>(rounded), 1, info, comm_, &base,
                                   &region.win);
  MPI_Info_free(&info);
  PSD_ASSIGN_OR_RETURN(bool failed, or_agreement::RaisedAnywhere(
                                        comm_, rc != MPI_SUCCESS,
                                        "AllocShared: the allocation check"));
  if (failed) {
    if (rc == MPI_SUCCESS) MPI_Win_free(&region.win);
    if (rc != MPI_SUCCESS) return MpiError("AllocShared: MPI_Win_allocate_shared", rc);
    return BackendError("AllocShared: MPI_Win_allocate_shared of ", rounded,
                        " bytes failed on another rank");
  }
  MPI_Win_set_errhandler(region.win, MPI_ERRORS_RETURN);
  region.bases.resize(static_cast<size_t>(size_));
  region.sizes.resize(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    MPI_Aint part = 0;
    int disp = 0;
    void* ptr = nullptr;
    rc = MPI_Win_shared_query(region.win, r, &part, &disp, &ptr);
    if (rc != MPI_SUCCESS) {
      MPI_Win_free(&region.win);
      return MpiError("AllocShared: MPI_Win_shared_query", rc);
    }
    region.bases[static_cast<size_t>(r)] = static_cast<unsigned char*>(ptr);
    region.sizes[static_cast<size_t>(r)] = static_cast<size_t>(part);
  }
  // A passive-target epoch for the region's lifetime makes direct loads and stores legal.
  rc = MPI_Win_lock_all(MPI_MODE_NOCHECK, region.win);
  if (rc != MPI_SUCCESS) {
    MPI_Win_free(&region.win);
    return MpiError("AllocShared: MPI_Win_lock_all", rc);
  }
  const uintptr_t at = reinterpret_cast<uintptr_t>(base);
  region.start = static_cast<unsigned char*>(base) + ((64 - at % 64) % 64);
  region.asked = bytes;
  regions_.push_back(std::move(region));
  return static_cast<void*>(regions_.back().start);
}

int SharedRegions::Find(const void* p) const {
  for (size_t i = 0; i < regions_.size(); ++i) {
    if (regions_[i].win != MPI_WIN_NULL && regions_[i].start == p) return static_cast<int>(i);
  }
  return -1;
}

bool SharedRegions::Owns(const void* p) const { return Find(p) >= 0; }

Status SharedRegions::Free(void* p) {
  // Every rank says which region it frees before any rank frees one (MPI_Win_free waits for
  // every rank of its window): a bad pointer, or another allocation, on one rank fails the call
  // on every rank instead of leaving its peers in MPI_Win_free.
  // -2: NULL (frees nothing; OK where every rank passes it), -1: not an allocation's start.
  const int number = p == nullptr ? -2 : Find(p);
  uint64_t words[2];
  or_agreement::PutValue(words, static_cast<uint64_t>(static_cast<int64_t>(number)));
  PSD_CHECK(or_agreement::OrAllReduce(comm_, words, 2, MpiWait{nullptr, "FreeShared", nullptr},
                                      nullptr));
  if (number == -2 && or_agreement::AllSame(words)) return Status::Ok();
  if (number == -2) {
    return InvalidArgument("FreeShared: this rank passed NULL while another rank freed an "
                           "allocation; expected every rank to free alike; nothing was freed");
  }
  if (number < 0) {
    return InvalidArgument("FreeShared: ", p,
                           " is not memory that AllocShared returned on this rank (the start of "
                           "an allocation) and that is not freed yet");
  }
  if (!or_agreement::AllSame(words)) {
    return InvalidArgument("FreeShared: the ranks did not free the same allocation (this rank "
                           "freed its number ", number,
                           "); expected every rank to free alike, in the same order; nothing "
                           "was freed");
  }
  Region& r = regions_[static_cast<size_t>(number)];
  MPI_Win_unlock_all(r.win);
  int rc = MPI_Win_free(&r.win);
  r = Region{};
  if (rc != MPI_SUCCESS) return MpiError("FreeShared: MPI_Win_free", rc);
  return Status::Ok();
}

size_t SharedRegions::live() const {
  return static_cast<size_t>(std::count_if(regions_.begin(), regions_.end(), [](const Region& r) {
    return r.win != MPI_WIN_NULL;
  }));
}

uint64_t SharedRegions::Encode(const void* p, size_t bytes) const {
  const auto* at = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < regions_.size(); ++i) {
    const Region& r = regions_[i];
    if (r.win == MPI_WIN_NULL) continue;
    if (at < r.start || at >= r.start + r.asked) continue;
    if (bytes > r.asked - static_cast<size_t>(at - r.start)) return 0;
    const size_t offset = static_cast<size_t>(at - r.bases[static_cast<size_t>(rank_)]);
    return (static_cast<uint64_t>(i + 1) << kOffsetBits) | offset;
  }
  return 0;
}

unsigned char* SharedRegions::Address(uint64_t code, int rank) const {
  const uint64_t number = code >> kOffsetBits;
  const uint64_t offset = code & ((uint64_t{1} << kOffsetBits) - 1);
  if (number == 0 || number > regions_.size() || rank < 0 || rank >= size_) return nullptr;
  const Region& r = regions_[number - 1];
  if (r.win == MPI_WIN_NULL || offset >= r.sizes[static_cast<size_t>(rank)]) return nullptr;
  return r.bases[static_cast<size_t>(rank)] + offset;
}

}  // namespace poseidon
