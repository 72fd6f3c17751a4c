// Agreement of values across ranks:
//  1. Every rank serializes its list (length, then each name and value, length-prefixed) and
//     hashes it with FNV-1a.
//  2. One MPI_Allgather of (length, hash) per rank: when every rank holds rank 0's pair, the
//     lists agree and the call returns Ok (the common case: one 16-byte-per-rank round).
//  3. Otherwise every rank learned the same thing (some pair differs), so all of them take the
//     second round together: MPI_Allgather of the serialized lengths, MPI_Allgatherv of the
//     lists. Every rank then holds every list and writes the same message: each differing name
//     with its values grouped by value, each group with its ranks.
#include "runtime/agreement.h"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cstring>
#include <optional>

#include "runtime/hash.h"
#include "runtime/mpi_backend.h"
#include "runtime/or_agreement.h"
#include "runtime/settings.h"

namespace poseidon {

namespace {

// Groups beyond this many are summarized, so that a value that differs on every rank of a large
// job (a per-rank path) still gives a message of bounded length.
constexpr size_t kMaxGroupsShown = 8;

void PutU64(std::string* out, uint64_t v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

void PutText(std::string* out, const std::string& s) {
  PutU64(out, s.size());
  out->append(s);
}

std::string Serialize(const std::vector<AgreedValue>& values) {
  std::string out;
  PutU64(&out, values.size());
  for (const auto& v : values) {
    PutText(&out, v.name);
    PutText(&out, v.value);
  }
  return out;
}

// Reads what Serialize wrote (ranks of one job share the byte order and word size).
class Reader {
 public:
  Reader(const char* data, size_t bytes) : p_(data), end_(data + bytes) {}
  bool U64(uint64_t* v) {
    if (static_cast<size_t>(end_ - p_) < sizeof(*v)) return false;
    std::memcpy(v, p_, sizeof(*v));
    p_ += sizeof(*v);
    return true;
  }
  bool Text(std::string* s) {
    uint64_t n = 0;
    if (!U64(&n) || static_cast<uint64_t>(end_ - p_) < n) return false;
    s->assign(p_, static_cast<size_t>(n));
    p_ += n;
    return true;
  }
  bool AtEnd() const { return p_ == end_; }

 private:
  const char* p_;
  const char* end_;
};

bool Deserialize(const char* data, size_t bytes, std::vector<AgreedValue>* values) {
  Reader r(data, bytes);
  uint64_t n = 0;
  if (!r.U64(&n)) return false;
  for (uint64_t i = 0; i < n; ++i) {
    AgreedValue v;
    if (!r.Text(&v.name) || !r.Text(&v.value)) return false;
    values->push_back(std::move(v));
  }
  return r.AtEnd();
}

// The kMismatch every rank returns, written from every rank's list alike.
Status DescribeMismatch(const std::vector<std::vector<AgreedValue>>& lists, const char* call) {
  const int size = static_cast<int>(lists.size());
  std::vector<std::string> parts;
  // Names in order of first appearance (rank 0's order, then what other ranks add).
  std::vector<std::string> names;
  for (const auto& list : lists) {
    for (const auto& v : list) {
      if (std::find(names.begin(), names.end(), v.name) == names.end()) names.push_back(v.name);
    }
  }
  bool length_differs = false;
  std::vector<std::optional<std::string>> lengths;
  for (const auto& list : lists) {
    lengths.push_back(std::to_string(list.size()));
    if (list.size() != lists[0].size()) length_differs = true;
  }
  if (length_differs) {
    parts.push_back(
        StrCat("the number of agreed values differs across ranks (", GroupRanksByValue(lengths),
               ")"));
  }
  std::vector<std::string> settable;  // differing names every rank holds: mpirun -x fixes them
  for (const auto& name : names) {
    std::vector<std::optional<std::string>> per_rank(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) {
      for (const auto& v : lists[r]) {
        if (v.name == name) {
          per_rank[r] = v.value;
          break;  // the first of a repeated name counts
        }
      }
    }
    bool differs = false, everywhere = true;
    for (int r = 0; r < size; ++r) {
      differs = differs || per_rank[r] != per_rank[0];
      everywhere = everywhere && per_rank[r].has_value();
    }
    if (!differs) continue;
    parts.push_back(StrCat(name, " differs across ranks (", GroupRanksByValue(per_rank), ")"));
    if (everywhere && name.rfind("POSEIDON_", 0) == 0) settable.push_back(name);
  }
  if (parts.empty()) {
    // Same names and values, but in another order or repeated: compare the sequences of names.
    std::vector<std::optional<std::string>> orders;
    for (const auto& list : lists) {
      std::string seq;
      for (const auto& v : list) seq += StrCat(seq.empty() ? "" : ",", v.name);
      orders.push_back(seq);
    }
    parts.push_back(
        StrCat("the agreed values come in a different order across ranks (",
               GroupRanksByValue(orders), ")"));
  }
  std::string message = StrCat(call, ": ");
  for (size_t i = 0; i < parts.size(); ++i) message += StrCat(i ? "; " : "", parts[i]);
  message += "; expected the same value on every rank";
  std::vector<std::string> hints;
  if (!settable.empty()) {
    std::string hint =
        StrCat("set ", settable.size() == 1 ? "it" : "them", " alike for all ranks, e.g. mpirun");
    for (const auto& name : settable) hint += StrCat(" -x ", name);
    hints.push_back(hint);
  }
  if (length_differs) hints.push_back("run the same build of Poseidon on every rank");
  if (!hints.empty()) {
    message += " (";
    for (size_t i = 0; i < hints.size(); ++i) message += StrCat(i ? "; " : "", hints[i]);
    message += ")";
  }
  return MismatchError(message);
}

// The shortest text that reads back as exactly v (0.001, 60, 1e+100), so that two values
// print alike only when they are equal.
std::string ShortestDouble(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}

std::string Canonical(const SettingInfo& info, const std::string& text) {
  switch (info.type) {
    case SettingType::kBool: {
      auto v = ParseBool(info.name, text);
      return v.ok() ? (*v ? "1" : "0") : text;
    }
    case SettingType::kInt: {
      auto v = ParseInt(info.name, text);
      return v.ok() ? std::to_string(*v) : text;
    }
    case SettingType::kDouble: {
      auto v = ParseDouble(info.name, text);
      return v.ok() ? ShortestDouble(*v) : text;
    }
    case SettingType::kString:
      return text;
  }
  return text;
}

}  // namespace

std::string FormatRanks(const std::vector<int>& ranks) {
  if (ranks.empty()) return "no rank";
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i > 0) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) out += StrCat("-", ranks[j]);
    i = j + 1;
  }
  return out;
}

std::string GroupRanksByValue(const std::vector<std::optional<std::string>>& per_rank) {
  std::vector<std::pair<std::optional<std::string>, std::vector<int>>> groups;
  for (int r = 0; r < static_cast<int>(per_rank.size()); ++r) {
    auto it = groups.begin();
    while (it != groups.end() && it->first != per_rank[r]) ++it;
    if (it == groups.end()) {
      groups.push_back({per_rank[r], {r}});
    } else {
      it->second.push_back(r);
    }
  }
  std::string out;
  for (size_t g = 0; g < groups.size() && g < kMaxGroupsShown; ++g) {
    if (g > 0) out += "; ";
    const auto& value = groups[g].first;
    out += StrCat(FormatRanks(groups[g].second), ": ",
                  !value           ? "(absent)"
                  : value->empty() ? "''"
                                   : *value);
  }
  if (groups.size() > kMaxGroupsShown) {
    out += StrCat("; and ", groups.size() - kMaxGroupsShown, " more values");
  }
  return out;
}


uint64_t HashAgreedValues(const std::vector<AgreedValue>& values) {
  std::string bytes = Serialize(values);
  return Fnv1a(bytes.data(), bytes.size());
}

std::vector<AgreedValue> AgreedSettings() {
  std::vector<AgreedValue> out;
  for (const auto& s : Settings::Global().Snapshot()) {
    if (s.info.agreed) out.push_back(AgreedValue{s.info.name, Canonical(s.info, s.value)});
  }
  return out;
}

uint64_t AgreedSettingsHash() { return HashAgreedValues(AgreedSettings()); }

Status AgreeOnValues(MPI_Comm comm, const std::vector<AgreedValue>& values, const char* call) {
  PSD_REQUIRE_ARG(comm != MPI_COMM_NULL, call, ": AgreeOnValues: comm is MPI_COMM_NULL");
  int size = 1;
  MPI_Comm_size(comm, &size);
  const std::string mine = Serialize(values);

  // Round 1 (runtime/or_agreement.h): the list's length and hash as values.
  uint64_t words[4];
  or_agreement::PutValue(&words[0], values.size());
  or_agreement::PutValue(&words[2], Fnv1a(mine.data(), mine.size()));
  Status reduced = or_agreement::OrAllReduce(comm, words, 4, MpiWait{}, nullptr);
  if (!reduced.ok()) return reduced.WithPrefix(StrCat(call, ": agreed values hash: "));
  if (or_agreement::AllSame(&words[0]) && or_agreement::AllSame(&words[2])) return Status::Ok();

  // Round 2: every rank's list, so that every rank can name what differs where.
  int my_bytes = mine.size() > static_cast<size_t>(INT_MAX) ? -1 : static_cast<int>(mine.size());
  std::vector<int> bytes(static_cast<size_t>(size));
  int rc = MPI_Allgather(&my_bytes, 1, MPI_INT, bytes.data(), 1, MPI_INT, comm);
  if (rc != MPI_SUCCESS) {
    return MpiError(StrCat(call, ": MPI_Allgather(agreed values sizes)").c_str(), rc);
  }
  std::vector<int> displs(static_cast<size_t>(size));
  long long total = 0;
  for (int r = 0; r < size; ++r) {
    if (bytes[r] < 0 || total + bytes[r] > INT_MAX) {
      // Every rank sees the same sizes, so every rank stops here alike.
      return MismatchError(call,
                           ": the agreed values differ across ranks and are too large to "
                           "gather and compare (rank ",
                           r,
                           "); expected the same value on every "
                           "rank");
    }
    displs[r] = static_cast<int>(total);
    total += bytes[r];
  }
  std::vector<char> all(static_cast<size_t>(total));
  rc = MPI_Allgatherv(mine.data(), my_bytes, MPI_BYTE, all.data(), bytes.data(), displs.data(),
                      MPI_BYTE, comm);
  if (rc != MPI_SUCCESS) {
    return MpiError(StrCat(call, ": MPI_Allgatherv(agreed values)").c_str(), rc);
  }
  std::vector<std::vector<AgreedValue>> lists(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    if (!Deserialize(all.data() + displs[r], static_cast<size_t>(bytes[r]), &lists[r])) {
      return InternalError(call, ": the agreed values from rank ", r, " do not parse (", bytes[r],
                           " bytes); expected what AgreeOnValues serialized");
    }
  }
  return DescribeMismatch(lists, call);
}

Result<std::vector<std::string>> GatherHostNames(MPI_Comm comm, const char* call) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  char name[MPI_MAX_PROCESSOR_NAME + 1] = {0};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::vector<char> all(static_cast<size_t>(size) * MPI_MAX_PROCESSOR_NAME);
  int rc = MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(),
                         MPI_MAX_PROCESSOR_NAME, MPI_CHAR, comm);
  if (rc != MPI_SUCCESS) return MpiError(StrCat(call, ": MPI_Allgather(host names)").c_str(), rc);
  std::vector<std::string> hosts(static_cast<size_t>(size));
  for (size_t r = 0; r < hosts.size(); ++r) {
    const char* h = &all[r * MPI_MAX_PROCESSOR_NAME];
    hosts[r].assign(h, strnlen(h, MPI_MAX_PROCESSOR_NAME));
  }
  return hosts;
}

}  // namespace poseidon
