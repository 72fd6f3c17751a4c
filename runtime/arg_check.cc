#include "runtime/arg_check.h"

#include <array>
#include <cstring>
#include <memory>
#include <string>

#include "runtime/hash.h"

namespace poseidon {

uint64_t HashCounts(const std::vector<size_t>& counts) {
  uint64_t h = Fnv1a(counts.data(), counts.size() * sizeof(size_t));
  h ^= counts.size();
  return h == 0 ? 1 : h;
}

Status CheckCountsPerRank(const char* call, const std::vector<size_t>& counts, int world) {
  PSD_REQUIRE_ARG(counts.size() == static_cast<size_t>(world), call, ": counts has ",
                  counts.size(), " entries; expected one per rank (", world, ")");
  return Status::Ok();
}

size_t SumCounts(const std::vector<size_t>& counts) {
  size_t total = 0;
  for (size_t c : counts) total += c;
  return total;
}

namespace {
constexpr int kFields = 5;  // count, dtype, root, hash (as int64), bad
constexpr int kMsgLen = 240;

std::string RanksWith(const std::vector<std::array<int64_t, kFields>>& all, int field,
                      const char* what, bool as_dtype) {
  std::string out;
  int shown = 0;
  for (size_t r = 0; r < all.size() && shown < 8; ++r) {
    // Show every rank whose value differs from rank 0's, and rank 0 itself.
    if (r != 0 && all[r][field] == all[0][field]) continue;
    if (!out.empty()) out += ", ";
    out += StrCat("rank ", r, ": ");
    if (as_dtype) {
      out += DTypeName(static_cast<DType>(all[r][field]));
    } else {
      out += std::to_string(all[r][field]);
    }
    ++shown;
  }
  return StrCat(what, " differs across ranks (", out, ")");
}
}  // namespace

Status AgreeOnArgs(MPI_Comm comm, const CollectiveArgs& args, const MpiWait& wait) {
  MpiWait how = wait;
  if (how.call == nullptr || how.call[0] == '\0') how.call = args.call;
  int size = 1;
  MPI_Comm_size(comm, &size);
  // Everything MPI reads or writes lives here, on the heap: an interrupted exchange leaves its
  // request to MPI, which may still write these bytes after this function has returned.
  struct Exchange {
    std::array<int64_t, kFields> mine;
    std::array<int64_t, 2 * kFields> both;
    std::vector<std::array<int64_t, kFields>> all;
    char msg[kMsgLen] = {0};
    std::vector<char> msgs;
  };
  auto x = std::make_shared<Exchange>();
  std::array<int64_t, kFields>& mine = x->mine;
  std::array<int64_t, 2 * kFields>& both = x->both;
  mine = {args.count, args.dtype, args.root, static_cast<int64_t>(args.layout_hash),
          args.local.ok() ? 0 : 1};
  for (int i = 0; i < kFields; ++i) {
    both[i] = mine[i];
    both[kFields + i] = mine[i] == INT64_MIN ? INT64_MAX : -mine[i];
  }
  Status exchanged = RunMpi(how, "MPI_Allreduce", x, [&](MPI_Request* r) {
    return r ? MPI_Iallreduce(MPI_IN_PLACE, both.data(), 2 * kFields, MPI_INT64_T, MPI_MAX, comm, r)
             : MPI_Allreduce(MPI_IN_PLACE, both.data(), 2 * kFields, MPI_INT64_T, MPI_MAX, comm);
  });
  if (exchanged.code() == StatusCode::kBackendError) {
    return BackendError(args.call, ": the argument check failed: ", exchanged.message());
  }
  PSD_CHECK(exchanged);
  bool agree = true;
  for (int i = 0; i < 4; ++i) agree = agree && (both[i] == -both[kFields + i]);
  bool any_bad = both[4] != 0;
  if (agree && !any_bad) return Status::Ok();

  // Error path: gather every rank's values and messages so all ranks report the same cause.
  std::vector<std::array<int64_t, kFields>>& all = x->all;
  all.resize(static_cast<size_t>(size));
  PSD_CHECK(RunMpi(how, "MPI_Allgather", x, [&](MPI_Request* r) {
    return r ? MPI_Iallgather(mine.data(), kFields, MPI_INT64_T, all.data(), kFields, MPI_INT64_T,
                              comm, r)
             : MPI_Allgather(mine.data(), kFields, MPI_INT64_T, all.data(), kFields, MPI_INT64_T,
                             comm);
  }));
  if (any_bad) {
    char* msg = x->msg;
    std::strncpy(msg, args.local.message().c_str(), kMsgLen - 1);
    std::vector<char>& msgs = x->msgs;
    msgs.resize(static_cast<size_t>(size) * kMsgLen);
    PSD_CHECK(RunMpi(how, "MPI_Allgather", x, [&](MPI_Request* r) {
      return r ? MPI_Iallgather(msg, kMsgLen, MPI_CHAR, msgs.data(), kMsgLen, MPI_CHAR, comm, r)
               : MPI_Allgather(msg, kMsgLen, MPI_CHAR, msgs.data(), kMsgLen, MPI_CHAR, comm);
    }));
    if (!args.local.ok()) return args.local;
    for (int r = 0; r < size; ++r) {
      if (all[static_cast<size_t>(r)][4] != 0) {
        return InvalidArgument(args.call, ": rank ", r, " passed an invalid argument: ",
                               std::string(&msgs[static_cast<size_t>(r) * kMsgLen]));
      }
    }
  }
  if (both[0] != -both[kFields + 0]) {
    return MismatchError(args.call, ": ", RanksWith(all, 0, "element count", false),
                         "; expected the same count on every rank");
  }
  if (both[1] != -both[kFields + 1]) {
    return MismatchError(args.call, ": ", RanksWith(all, 1, "dtype", true),
                         "; expected the same dtype on every rank");
  }
  if (both[2] != -both[kFields + 2]) {
    return MismatchError(args.call, ": ", RanksWith(all, 2, "root", false),
                         "; expected the same root on every rank");
  }
  return MismatchError(args.call,
                       ": the counts vector (shard layout) differs across ranks; expected the "
                       "same counts on every rank");
}

}  // namespace poseidon
