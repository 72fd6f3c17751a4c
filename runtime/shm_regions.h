// Node-shared memory for collective buffers (Backend::AllocShared): memory that every rank of
// the node maps, so that a collective whose buffers all lie in it reads its peers' inputs and
// writes their outputs directly, with no copy through the window and no kernel copy. The host
// counterpart of NCCL's ncclMemAlloc with window registration and of MPI_Alloc_mem.
//
// Each Allocate is one MPI shared window (MPI_Win_allocate_shared over the node) of the asked
// size per rank; regions are numbered in the order they were allocated, which is the same on
// every rank because Allocate and Free are collective. A place in a region is passed between
// ranks as a code (Encode): the region's number and the offset into it; a peer maps the same
// code to its own mapping of that rank's region (Address).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/status.h"

namespace poseidon {

class SharedRegions {
 public:
  // comm: ranks that all share this node (the caller checked), numbered as in comm. Keeps a
  // duplicate of it; collective.
  static Result<std::unique_ptr<SharedRegions>> Create(MPI_Comm comm);
  // Frees every region still allocated: collective (MPI_Win_free), like Free.
  ~SharedRegions();
  SharedRegions(const SharedRegions&) = delete;
  SharedRegions& operator=(const SharedRegions&) = delete;

  // bytes (> 0) of memory on this rank that every rank maps, 64-byte aligned. Collective: every
  // rank calls it, in the same order relative to Free; the sizes may differ between ranks.
  Result<void*> Allocate(size_t bytes);
  // Frees the region that Allocate returned as p on this rank. Collective: every rank frees its
  // region of the same allocation at the same point. kInvalidArgument on every rank, and nothing
  // freed, when p is not the start of a live region on some rank or the ranks name different
  // allocations (an agreement round comes first). NULL frees nothing: OK where every rank passes
  // it, kInvalidArgument on every rank where some ranks free an allocation meanwhile.
  Status Free(void* p);
  // Whether p is the start of a live region of this rank.
  bool Owns(const void* p) const;

  // The code of [p, p + bytes) on this rank when it lies inside one live region of this rank,
  // else 0 (bytes > 0).
  uint64_t Encode(const void* p, size_t bytes) const;
  // The place that rank encoded as `code`, in this process's mapping of its region, or nullptr
  // when the code names no live region or lies outside rank's part of it.
  unsigned char* Address(uint64_t code, int rank) const;
  size_t live() const;  // regions allocated and not freed

 private:
  SharedRegions() = default;
  int Find(const void* p) const;  // the live region that starts at p on this rank, or -1
  struct Region {
    MPI_Win win = MPI_WIN_NULL;
    std::vector<unsigned char*> bases;  // every rank's part, mapped here
    std::vector<size_t> sizes;          // every rank's part's size
    unsigned char* start = nullptr;     // what Allocate returned here (64-byte aligned)
    size_t asked = 0;                   // the bytes asked for here
  };
  // Codes: (number + 1) << kOffsetBits | offset.
  static constexpr int kOffsetBits = 40;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::vector<Region> regions_;  // by number; a freed one keeps its place with win null
};

}  // namespace poseidon
