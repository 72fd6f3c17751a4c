#include "runtime/arg_check.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "runtime/agreement.h"
#include "runtime/hash.h"
#include "runtime/or_agreement.h"

namespace poseidon {

uint64_t HashCounts(const std::vector<size_t>& counts) {
  // Word-wise: byte-wise FNV-1a was a chain of eight multiplies per rank on the path of every
  // small reduce-scatter and allgatherv (101 of the 1176 instructions per call of a 4-byte
  // reduce-scatter's empty rank at P = 2 under callgrind; 39 this way).
  static_assert(sizeof(size_t) == sizeof(uint64_t), "counts hashed as 64-bit words");
  uint64_t h = Mix64(HashWords(reinterpret_cast<const uint64_t*>(counts.data()), counts.size()) ^
                     counts.size());
  return h == 0 ? 1 : h;
}

Status CheckCountsPerRank(const char* call, const std::vector<size_t>& counts, int world) {
  PSD_REQUIRE_ARG(counts.size() == static_cast<size_t>(world), call, ": counts has ",
                  counts.size(), " entries; expected one per rank (", world, ")");
  size_t total = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    PSD_REQUIRE_ARG(counts[i] <= SIZE_MAX - total, call, ": counts add up to more than 2^64-1 "
                    "elements (past it at entry ", i, ", ", counts[i],
                    "); expected counts the buffers can hold");
    total += counts[i];
  }
  return Status::Ok();
}

uint64_t HashDetail(const char* detail) {
  if (detail == nullptr || detail[0] == '\0') return 0;
  uint64_t h = Fnv1a(detail, std::strlen(detail));
  return h == 0 ? 1 : h;
}

size_t SumCounts(const std::vector<size_t>& counts) {
  size_t total = 0;
  for (size_t c : counts) {
    if (c > SIZE_MAX - total) return SIZE_MAX;
    total += c;
  }
  return total;
}

namespace {
constexpr int kFields = 6;  // ArgRecord's fields, in order
constexpr int kDetailField = 4;  // detail_hash's place among them
constexpr int kMsgLen = 240;

std::array<int64_t, kFields> Fields(const ArgRecord& r) {
  return {r.count, r.dtype, r.root, r.layout_hash, r.detail_hash, r.bad};
}
ArgRecord FromFields(const std::array<int64_t, kFields>& f) {
  ArgRecord r;
  r.count = f[0];
  r.dtype = f[1];
  r.root = f[2];
  r.layout_hash = f[3];
  r.detail_hash = f[4];
  r.bad = f[5];
  return r;
}

// "element count differs across ranks (ranks 0-2: 10; rank 3: 12)".
std::string RanksWith(const std::vector<ArgRecord>& all, int64_t ArgRecord::*field,
                      const char* what, bool as_dtype) {
  std::vector<std::optional<std::string>> values;
  for (const ArgRecord& r : all) {
    values.push_back(as_dtype ? std::string(DTypeName(static_cast<DType>(r.*field)))
                              : std::to_string(r.*field));
  }
  return StrCat(what, " differs across ranks (", GroupRanksByValue(values), ")");
}

bool Differs(const std::vector<ArgRecord>& all, int64_t ArgRecord::*field) {
  for (const ArgRecord& r : all) {
    if (r.*field != all[0].*field) return true;
  }
  return false;
}
}  // namespace

Status ArgsVerdict(const CollectiveArgs& mine, const std::vector<ArgRecord>& all,
                   const std::function<std::string(int)>& message_of) {
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].bad == 0) continue;
    if (!mine.local.ok()) return mine.local;
    // A mismatch that rank carries from an earlier call (a broadcast its peers refused, say)
    // reaches every rank as one; any other bad status as an invalid argument (a peer's own
    // kUnimplemented or kPeerLost would mean something else here: callers branch on those).
    if (static_cast<StatusCode>(all[r].bad) != StatusCode::kMismatch) {
      return InvalidArgument(mine.call, ": rank ", r,
                             " passed an invalid argument: ", message_of(static_cast<int>(r)));
    }
    return MismatchError(mine.call, ": rank ", r, " failed the call: ",
                         message_of(static_cast<int>(r)));
  }
  if (all.empty()) return Status::Ok();
  if (Differs(all, &ArgRecord::count)) {
    return MismatchError(mine.call, ": ", RanksWith(all, &ArgRecord::count, "element count", false),
                         "; expected the same count on every rank");
  }
  if (Differs(all, &ArgRecord::dtype)) {
    return MismatchError(mine.call, ": ", RanksWith(all, &ArgRecord::dtype, "dtype", true),
                         "; expected the same dtype on every rank");
  }
  if (Differs(all, &ArgRecord::root)) {
    return MismatchError(mine.call, ": ", RanksWith(all, &ArgRecord::root, "root", false),
                         "; expected the same root on every rank");
  }
  if (Differs(all, &ArgRecord::layout_hash)) {
    return MismatchError(mine.call,
                         ": the counts vector (shard layout) differs across ranks; expected the "
                         "same counts on every rank");
  }
  if (Differs(all, &ArgRecord::detail_hash)) {
    std::vector<std::optional<std::string>> details;
    for (size_t r = 0; r < all.size(); ++r) {
      details.push_back(all[r].detail_hash == 0 ? std::string("(none)")
                                                : message_of(static_cast<int>(r)));
    }
    // The texts travel cut to the message's size: ones that differ only past it look alike.
    const bool alike = std::all_of(details.begin(), details.end(),
                                   [&](const auto& d) { return d == details[0]; });
    return MismatchError(mine.call, ": the caller's terms of the call differ across ranks (",
                         GroupRanksByValue(details), alike ? ", differing past the part shown" : "",
                         "); expected the same on every rank");
  }
  return Status::Ok();
}

Status AgreeOnArgs(MPI_Comm comm, const CollectiveArgs& args, const MpiWait& wait) {
  MpiWait how = wait;
  if (how.call == nullptr || how.call[0] == '\0') how.call = args.call;
  int size = 1;
  MPI_Comm_size(comm, &size);
  // Everything MPI reads or writes lives here, on the heap: an interrupted exchange leaves its
  // request to MPI, which may still write these bytes after this function has returned.
  // Round 1 (runtime/or_agreement.h): the five compared fields as values, "my arguments are
  // bad" as a flag, in one bitwise-OR allreduce.
  constexpr int kCompared = kFields - 1;
  struct Exchange {
    std::array<int64_t, kFields> mine;
    std::array<uint64_t, 2 * kCompared + 1> words;
    std::vector<std::array<int64_t, kFields>> all;
    char msg[kMsgLen] = {0};
    std::vector<char> msgs;
  };
  auto x = std::make_shared<Exchange>();
  std::array<int64_t, kFields>& mine = x->mine;
  std::array<uint64_t, 2 * kCompared + 1>& words = x->words;
  mine = Fields(RecordOf(args));
  for (int i = 0; i < kCompared; ++i) {
    or_agreement::PutValue(&words[2 * i], static_cast<uint64_t>(mine[i]));
  }
  words[2 * kCompared] = static_cast<uint64_t>(mine[kCompared]);  // bad
  Status exchanged = or_agreement::OrAllReduce(comm, words.data(), words.size(), how, x);
  if (exchanged.code() == StatusCode::kBackendError) {
    return BackendError(args.call, ": the argument check failed: ", exchanged.message());
  }
  PSD_CHECK(exchanged);
  bool agree = true;
  for (int i = 0; i < kCompared; ++i) agree = agree && or_agreement::AllSame(&words[2 * i]);
  const bool any_bad = words[2 * kCompared] != 0;
  if (agree && !any_bad) return Status::Ok();
  static_assert(kDetailField == kCompared - 1, "the detail is the last compared field");
  const bool details_differ = !or_agreement::AllSame(&words[2 * kDetailField]);

  // Error path: gather every rank's values and messages so all ranks report the same cause.
  std::vector<std::array<int64_t, kFields>>& all = x->all;
  all.resize(static_cast<size_t>(size));
  PSD_CHECK(RunMpi(how, "MPI_Allgather", x, [&](MPI_Request* r) {
    return r ? MPI_Iallgather(mine.data(), kFields, MPI_INT64_T, all.data(), kFields, MPI_INT64_T,
                              comm, r)
             : MPI_Allgather(mine.data(), kFields, MPI_INT64_T, all.data(), kFields, MPI_INT64_T,
                             comm);
  }));
  if (any_bad || details_differ) {
    // Each rank's error when it is bad, else its detail (the verdict names one or the other).
    char* msg = x->msg;
    std::strncpy(msg, !args.local.ok() ? args.local.message().c_str()
                      : args.detail != nullptr ? args.detail : "",
                 kMsgLen - 1);
    std::vector<char>& msgs = x->msgs;
    msgs.resize(static_cast<size_t>(size) * kMsgLen);
    PSD_CHECK(RunMpi(how, "MPI_Allgather", x, [&](MPI_Request* r) {
      return r ? MPI_Iallgather(msg, kMsgLen, MPI_CHAR, msgs.data(), kMsgLen, MPI_CHAR, comm, r)
               : MPI_Allgather(msg, kMsgLen, MPI_CHAR, msgs.data(), kMsgLen, MPI_CHAR, comm);
    }));
  }
  std::vector<ArgRecord> records;
  records.reserve(all.size());
  for (const auto& f : all) records.push_back(FromFields(f));
  return ArgsVerdict(args, records, [&](int r) {
    return std::string(&x->msgs[static_cast<size_t>(r) * kMsgLen]);
  });
}

}  // namespace poseidon
