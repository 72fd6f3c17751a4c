// Cross-rank agreement on a collective's arguments, so that one rank's bad argument or a
// disagreement fails the call on every rank instead of leaving the others waiting.
//
// One bitwise-OR allreduce of eleven words (runtime/or_agreement.h: count, dtype, root, a hash
// of the shard layout and a hash of the caller's detail as values, a "my arguments are bad"
// flag) compares the call's arguments.
// Only on failure does a second exchange gather every rank's values and messages, so the error
// names the ranks and values that differ. Ranks that share a node check the same descriptor
// through the shared-memory window instead (ShmCollectives), folded into the collective's first
// step; both reach their verdict through ArgsVerdict, so the messages are the same.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/mpi_wait.h"
#include "runtime/status.h"

namespace poseidon {

struct CollectiveArgs {
  const char* call = "";     // "AllReduce", ...
  int64_t count = 0;         // elements that must match across ranks (or -1: not compared)
  int64_t dtype = 0;
  int64_t root = 0;          // -1 when the call has no root
  uint64_t layout_hash = 0;  // hash of a counts vector (0 when none)
  Status local;              // this rank's own validation result
  const char* detail = nullptr;  // CallOptions::detail (null or "": none)
};

// Returns OK on every rank, or an error on every rank: a rank whose own arguments are bad gets
// its own message; the others get "rank r passed an invalid argument: <that message>" (or, for a
// rank whose own status is a kMismatch, a kMismatch "rank r failed the call: <message>"), or the
// mismatch, naming the ranks and values that differ.
// With wait.interrupt set, every exchange is a non-blocking collective polled under it
// (RunMpi): an interrupt returns its status ("<wait.call>: <message>"), abandons the exchange
// and records it in wait.sticky. Every rank must pass an interrupt or none alike.
Status AgreeOnArgs(MPI_Comm comm, const CollectiveArgs& args, const MpiWait& wait = {});

uint64_t HashCounts(const std::vector<size_t>& counts);
// 0 for a null or empty detail, else a nonzero hash of its text.
uint64_t HashDetail(const char* detail);

// What ranks compare of one call: the fields of CollectiveArgs as integers, and whether the
// rank's own validation failed.
struct ArgRecord {
  int64_t count = 0;
  int64_t dtype = 0;
  int64_t root = 0;
  int64_t layout_hash = 0;
  int64_t detail_hash = 0;  // HashDetail(args.detail)
  int64_t bad = 0;  // 0, or the StatusCode of this rank's own failed checks (args.local)
};
// Inline: every call records its own (the detail is hashed only where there is one).
inline ArgRecord RecordOf(const CollectiveArgs& args) {
  ArgRecord r;
  r.count = args.count;
  r.dtype = args.dtype;
  r.root = args.root;
  r.layout_hash = static_cast<int64_t>(args.layout_hash);
  const bool detail = args.detail != nullptr && args.detail[0] != '\0';
  r.detail_hash = detail ? static_cast<int64_t>(HashDetail(args.detail)) : 0;
  r.bad = static_cast<int64_t>(args.local.code());
  return r;
}

// The verdict every rank reaches alike from every rank's record (all[r] for rank r): OK when
// the records agree and none is bad; else this rank's own error if its arguments are bad, else
// "rank r passed an invalid argument: <message_of(r)>" for the first bad rank (a kMismatch
// "rank r failed the call: ..." where its own status was a kMismatch), else the first
// field that differs, naming the ranks and values. message_of(r) is called for bad ranks (it
// returns rank r's error) and, when no rank is bad and the details differ, for every rank (it
// returns rank r's detail).
Status ArgsVerdict(const CollectiveArgs& mine, const std::vector<ArgRecord>& all,
                   const std::function<std::string(int)>& message_of);

// A counts vector (reduce-scatter / allgatherv shard layout) must hold one entry per rank, and
// its sum must fit a size_t (a sum that wrapped would look small to every later check).
Status CheckCountsPerRank(const char* call, const std::vector<size_t>& counts, int world);
// Sum of a counts vector; SIZE_MAX where it would wrap.
size_t SumCounts(const std::vector<size_t>& counts);

}  // namespace poseidon
