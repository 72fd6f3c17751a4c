// The cost model's arithmetic, its text form, the start-up probe and its cache.
//
// Probe, step by step (every rank runs it; rank 0's numbers win):
//   1. For each collective (allreduce, reduce-scatter, allgather) and each of two payloads
//      (small, large): one warm-up call, then `repetitions` timed calls, each after a barrier;
//      keep the median.
//   2. Fit time = steps * alpha + wire * beta through the two points (beta from the slope,
//      alpha from the small point), clamped at 0.
//   3. Time the kernels on typical sizes (GEMM, fused residual top-k, scatter-add, SGD step),
//      median of 3, into rates.
//   4. Broadcast rank 0's figures so every rank plans from identical numbers.
#include "collectives/cost_model.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <vector>

#include "runtime/log.h"
#include "runtime/mpi_backend.h"
#include "runtime/settings.h"
#include "runtime/shard.h"

namespace poseidon {

const char* CollectiveKindName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return "allreduce";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllGather:
      return "allgather";
  }
  return "invalid";
}

double CostModel::Steps(CollectiveKind kind, int world) {
  if (world <= 1) return 0;
  double p1 = world - 1;
  return kind == CollectiveKind::kAllReduce ? 2 * p1 : p1;
}

double CostModel::WireBytes(CollectiveKind kind, int world, double payload_bytes) {
  if (world <= 1) return 0;
  double frac = static_cast<double>(world - 1) / world;
  return (kind == CollectiveKind::kAllReduce ? 2 * frac : frac) * payload_bytes;
}

namespace {
double LinkTime(const LinkCost& l, CollectiveKind kind, int world, double payload_bytes) {
  return CostModel::Steps(kind, world) * l.alpha_s +
         CostModel::WireBytes(kind, world, payload_bytes) * l.beta_s_per_b;
}
}  // namespace

double CostModel::CollectiveTime(CollectiveKind kind, int world, double payload_bytes) const {
  const double flat = LinkTime(link[static_cast<int>(kind)], kind, world, payload_bytes);
  if (kind != CollectiveKind::kAllReduce || !has_hier()) return flat;
  return std::min(flat, LinkTime(hier_allreduce, kind, world, payload_bytes));
}

long long CostModel::HierAllReduceFromBytes(int world) const {
  if (!has_hier() || world <= 1) return 0;
  const LinkCost& f = link[static_cast<int>(CollectiveKind::kAllReduce)];
  const LinkCost& h = hier_allreduce;
  const double steps = Steps(CollectiveKind::kAllReduce, world);
  const double wire_per_byte = WireBytes(CollectiveKind::kAllReduce, world, 1.0);
  // flat(S) - hier(S) = steps (af - ah) + wire(S) (bf - bh): linear in S.
  const double at_zero = steps * (f.alpha_s - h.alpha_s);
  const double slope = wire_per_byte * (f.beta_s_per_b - h.beta_s_per_b);
  if (at_zero >= 0 && slope >= 0) return 1;  // no slower anywhere
  if (slope <= 0) return 0;                  // slower at large sizes, and not faster at small
  const double from = std::ceil(-at_zero / slope);
  if (from > 9e18) return 0;
  return std::max(1LL, static_cast<long long>(from));
}

CostModel CostModel::Network(double latency_s, double bandwidth_bytes_per_s) {
  CostModel m;
  for (LinkCost& l : m.link) {
    l.alpha_s = latency_s;
    l.beta_s_per_b = 1.0 / bandwidth_bytes_per_s;
  }
  m.source = "network";
  return m;
}

CostModel CostModel::BytesOnly(double bandwidth_bytes_per_s) {
  CostModel m = Network(0.0, bandwidth_bytes_per_s);
  // Free compute: rates so high that any kernel time is far below a byte's time.
  m.gemm_flops = m.topk_bytes_per_s = m.scatter_bytes_per_s = m.optimizer_bytes_per_s =
      std::numeric_limits<double>::infinity();
  m.source = "bytes-only";
  return m;
}

Status CostModel::Validate() const {
  for (int i = 0; i < kNumCollectiveKinds; ++i) {
    const char* name = CollectiveKindName(static_cast<CollectiveKind>(i));
    PSD_REQUIRE_ARG(std::isfinite(link[i].alpha_s) && link[i].alpha_s >= 0, "CostModel: ", name,
                    " alpha ", link[i].alpha_s, " s is invalid; expected a finite value >= 0");
    PSD_REQUIRE_ARG(std::isfinite(link[i].beta_s_per_b) && link[i].beta_s_per_b >= 0,
                    "CostModel: ", name, " beta ", link[i].beta_s_per_b,
                    " s/B is invalid; expected a finite value >= 0");
  }
  if (has_hier()) {
    PSD_REQUIRE_ARG(std::isfinite(hier_allreduce.alpha_s), "CostModel: hier_allreduce alpha ",
                    hier_allreduce.alpha_s, " s is invalid; expected a finite value");
    PSD_REQUIRE_ARG(std::isfinite(hier_allreduce.beta_s_per_b) && hier_allreduce.beta_s_per_b >= 0,
                    "CostModel: hier_allreduce beta ", hier_allreduce.beta_s_per_b,
                    " s/B is invalid; expected a finite value >= 0");
  }
  const std::pair<const char*, double> rates[] = {{"gemm_flops", gemm_flops},
                                                  {"topk_bytes_per_s", topk_bytes_per_s},
                                                  {"scatter_bytes_per_s", scatter_bytes_per_s},
                                                  {"optimizer_bytes_per_s", optimizer_bytes_per_s}};
  for (const auto& r : rates) {
    // +inf is allowed: "free" compute in the bytes-only model.
    PSD_REQUIRE_ARG(!std::isnan(r.second) && r.second > 0, "CostModel: ", r.first, " ", r.second,
                    " is invalid; expected a rate > 0");
  }
  return Status::Ok();
}

namespace {

constexpr const char* kHeader = "poseidon-cost-model 1";

std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

// The figures as a flat array, in a fixed order (broadcast and text form share it).
// The last two (hier_allreduce) may be missing from a file.
constexpr int kNumFigures = 2 * kNumCollectiveKinds + 4 + 2;
constexpr int kNumOptionalFigures = 2;
std::vector<std::string> FigureNames() {
  std::vector<std::string> names;
  for (int i = 0; i < kNumCollectiveKinds; ++i) {
    std::string c = CollectiveKindName(static_cast<CollectiveKind>(i));
    names.push_back(c + ".alpha_s");
    names.push_back(c + ".beta_s_per_b");
  }
  names.insert(names.end(),
               {"gemm_flops", "topk_bytes_per_s", "scatter_bytes_per_s", "optimizer_bytes_per_s",
                "hier_allreduce.alpha_s", "hier_allreduce.beta_s_per_b"});
  return names;
}
std::vector<double> ToFigures(const CostModel& m) {
  std::vector<double> f;
  for (const LinkCost& l : m.link) {
    f.push_back(l.alpha_s);
    f.push_back(l.beta_s_per_b);
  }
  f.insert(f.end(),
           {m.gemm_flops, m.topk_bytes_per_s, m.scatter_bytes_per_s, m.optimizer_bytes_per_s,
            m.hier_allreduce.alpha_s, m.hier_allreduce.beta_s_per_b});
  return f;
}
CostModel FromFigures(const std::vector<double>& f) {
  CostModel m;
  for (int i = 0; i < kNumCollectiveKinds; ++i) {
    m.link[i].alpha_s = f[2 * i];
    m.link[i].beta_s_per_b = f[2 * i + 1];
  }
  m.gemm_flops = f[6];
  m.topk_bytes_per_s = f[7];
  m.scatter_bytes_per_s = f[8];
  m.optimizer_bytes_per_s = f[9];
  m.hier_allreduce = {f[10], f[11]};
  return m;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string CostModel::ToText(const std::string& host_key) const {
  std::ostringstream os;
  os << kHeader << "\n";
  os << "host_key " << host_key << "\n";
  std::vector<std::string> names = FigureNames();
  std::vector<double> f = ToFigures(*this);
  for (int i = 0; i < kNumFigures; ++i) os << names[i] << " " << Num(f[i]) << "\n";
  return os.str();
}

Result<CostModel> CostModel::Parse(const std::string& text, std::string* host_key) {
  std::istringstream is(text);
  std::string line;
  int line_no = 0;
  PSD_REQUIRE_ARG(std::getline(is, line) && line == kHeader, "CostModel::Parse: line 1 is '", line,
                  "'; expected '", kHeader, "'");
  ++line_no;
  std::vector<std::string> names = FigureNames();
  std::vector<double> f = ToFigures(CostModel{});  // the optional ones keep their defaults
  std::vector<bool> seen(kNumFigures, false);
  std::string key;
  while (std::getline(is, line)) {
    ++line_no;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string name, value, extra;
    ls >> name >> value;
    PSD_REQUIRE_ARG(!name.empty() && !value.empty() && !(ls >> extra), "CostModel::Parse: line ",
                    line_no, " '", line, "' is not 'name value'");
    if (name == "host_key") {
      key = value;
      continue;
    }
    auto it = std::find(names.begin(), names.end(), name);
    PSD_REQUIRE_ARG(it != names.end(), "CostModel::Parse: line ", line_no, ": unknown figure '",
                    name, "'");
    char* end = nullptr;
    double v = std::strtod(value.c_str(), &end);
    PSD_REQUIRE_ARG(end != value.c_str() && *end == '\0', "CostModel::Parse: line ", line_no,
                    ": value '", value, "' of ", name, " is not a number");
    size_t idx = static_cast<size_t>(it - names.begin());
    f[idx] = v;
    seen[idx] = true;
  }
  for (int i = 0; i < kNumFigures - kNumOptionalFigures; ++i) {
    PSD_REQUIRE_ARG(seen[i], "CostModel::Parse: figure '", names[i], "' is missing");
  }
  PSD_REQUIRE_ARG(seen[kNumFigures - 2] == seen[kNumFigures - 1], "CostModel::Parse: only one of '",
                  names[kNumFigures - 2], "' and '", names[kNumFigures - 1],
                  "' is given; expected both or neither");
  CostModel m = FromFigures(f);
  PSD_CHECK(m.Validate());
  if (host_key != nullptr) *host_key = key;
  return m;
}

std::string CostModel::Summary() const {
  std::ostringstream os;
  os.precision(3);
  for (int i = 0; i < kNumCollectiveKinds; ++i) {
    os << CollectiveKindName(static_cast<CollectiveKind>(i)) << " " << link[i].alpha_s * 1e6
       << "us/step " << (link[i].beta_s_per_b > 0 ? 1e-9 / link[i].beta_s_per_b : 0.0) << "GB/s; ";
  }
  if (has_hier()) {
    os << "two-level allreduce " << hier_allreduce.alpha_s * 1e6 << "us/step "
       << (hier_allreduce.beta_s_per_b > 0 ? 1e-9 / hier_allreduce.beta_s_per_b : 0.0)
       << "GB/s; ";
  }
  os << "gemm " << gemm_flops * 1e-9 << " GF/s; topk " << topk_bytes_per_s * 1e-9
     << " GB/s; scatter " << scatter_bytes_per_s * 1e-9 << " GB/s; optimizer "
     << optimizer_bytes_per_s * 1e-9 << " GB/s (" << source << ")";
  return os.str();
}

namespace {

// Median seconds of `reps` calls of fn, each after a barrier (so ranks start together).
Result<double> TimeCollective(Backend& be, int reps, const std::function<Status()>& fn) {
  PSD_CHECK(fn());  // warm-up: connection set-up and first-touch of buffers
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    PSD_CHECK(be.Barrier());
    double t0 = Now();
    PSD_CHECK(fn());
    t.push_back(Now() - t0);
  }
  return Median(t);
}

// Median seconds of 3 calls of a kernel, each after a barrier: every rank computes at the same
// time, as in training, so ranks sharing cores measure the contended rate they will see.
Result<double> TimeKernel(Backend& be, const std::function<Status()>& fn) {
  PSD_CHECK(fn());
  std::vector<double> t;
  for (int r = 0; r < 3; ++r) {
    PSD_CHECK(be.Barrier());
    double t0 = Now();
    PSD_CHECK(fn());
    t.push_back(Now() - t0);
  }
  return std::max(Median(t), 1e-9);
}

}  // namespace

Result<CostModel> MeasureCostModel(Backend& be, const Kernels& kernels, const ProbeOptions& opt) {
  PSD_REQUIRE_ARG(opt.repetitions >= 1, "MeasureCostModel: repetitions ", opt.repetitions,
                  " is invalid; expected >= 1");
  PSD_REQUIRE_ARG(opt.small_bytes >= 4 && opt.large_bytes > opt.small_bytes,
                  "MeasureCostModel: sizes ", opt.small_bytes, " and ", opt.large_bytes,
                  " are invalid; expected 4 <= small < large");
  const int world = be.size();
  CostModel m;
  std::vector<float> send(opt.large_bytes / 4 + world, 1.0f);
  std::vector<float> recv(opt.large_bytes / 4 + world, 0.0f);

  // Across nodes with equal nodes: the allreduce flat and in two levels (the backend's
  // threshold forced each way while timing, its own setting back afterwards).
  auto* mpi = dynamic_cast<MpiBackend*>(&be);
  bool two_level = false;
  if (mpi != nullptr) {
    PSD_ASSIGN_OR_RETURN(two_level, mpi->HasHierarchy());
  }
  struct RestoreThreshold {
    MpiBackend* mpi;
    ~RestoreThreshold() {
      if (mpi != nullptr) mpi->SetHierAllReduceBytes(-1);
    }
  } restore{two_level ? mpi : nullptr};

  for (int c = 0; c < kNumCollectiveKinds + (two_level ? 1 : 0); ++c) {
    // c == kNumCollectiveKinds: the two-level allreduce.
    const bool hier = c == kNumCollectiveKinds;
    CollectiveKind kind = hier ? CollectiveKind::kAllReduce : static_cast<CollectiveKind>(c);
    if (two_level && kind == CollectiveKind::kAllReduce) mpi->SetHierAllReduceBytes(hier ? 1 : 0);
    double t[2], wire[2];
    for (int s = 0; s < 2; ++s) {
      size_t count = (s == 0 ? opt.small_bytes : opt.large_bytes) / 4;
      std::function<Status()> fn;
      double payload = 4.0 * static_cast<double>(count);
      if (kind == CollectiveKind::kAllReduce) {
        fn = [&, count] { return be.AllReduce(send.data(), recv.data(), count, DType::kFloat32); };
      } else if (kind == CollectiveKind::kReduceScatter) {
        std::vector<size_t> counts = ShardCounts(count, world);
        fn = [&, counts] {
          return be.ReduceScatter(send.data(), recv.data(), counts, DType::kFloat32);
        };
      } else {
        size_t per = std::max<size_t>(1, count / static_cast<size_t>(world));
        payload = 4.0 * static_cast<double>(per) * world;
        fn = [&, per] { return be.AllGather(send.data(), recv.data(), per, DType::kFloat32); };
      }
      PSD_ASSIGN_OR_RETURN(t[s], TimeCollective(be, opt.repetitions, fn));
      wire[s] = CostModel::WireBytes(kind, world, payload);
    }
    double steps = CostModel::Steps(kind, world);
    LinkCost& l = hier ? m.hier_allreduce : m.link[c];
    l = LinkCost{};
    if (steps > 0) {
      l.beta_s_per_b = std::max(0.0, (t[1] - t[0]) / (wire[1] - wire[0]));
      l.alpha_s = std::max(0.0, (t[0] - wire[0] * l.beta_s_per_b) / steps);
    }
  }

  if (opt.time_kernels) {
    // GEMM: 128 rows of 512 x 512 factors (a mid-sized FC layer at batch 32, P 4).
    const size_t rows = 128, gm = 512, gn = 512;
    std::vector<float> u(rows * gm, 0.5f), v(rows * gn, 0.25f), g(gm * gn, 0.0f);
    PSD_ASSIGN_OR_RETURN(double t_gemm, TimeKernel(be, [&] {
                           return kernels.SufficientFactorGemm(u.data(), v.data(), rows, gm, gn,
                                                               1.0f, 0.0f, g.data(), nullptr);
                         }));
    m.gemm_flops = 2.0 * rows * gm * gn / t_gemm;

    // Fused residual top-k on 1 Mi floats at density 0.001, on gradient-like values (a
    // hashed, continuous spread: few ties, like real gradients).
    const size_t n = 1u << 20, k = n / 1000;
    std::vector<float> grad(n), residual(n, 0.0f);
    for (size_t i = 0; i < n; ++i) {
      uint32_t h = static_cast<uint32_t>(i) * 2654435761u;
      h ^= h >> 15;
      grad[i] = (static_cast<float>(h % 2000001u) - 1000000.0f) * 1e-6f;
    }
    std::vector<uint32_t> idx(k);
    std::vector<float> val(k);
    std::unique_ptr<KernelWorkspace> ws = kernels.NewWorkspace();
    PSD_ASSIGN_OR_RETURN(double t_topk, TimeKernel(be, [&] {
                           return kernels.FusedResidualTopK(grad.data(), residual.data(), nullptr,
                                                            0.0f, n, k, idx.data(), val.data(),
                                                            ws.get(), nullptr);
                         }));
    m.topk_bytes_per_s = 4.0 * n / t_topk;

    // Scatter-add of one block of 64 Ki pairs (ascending indices) into 1 Mi floats, as the
    // top-k exchange adds each rank's block.
    const size_t pairs = 1u << 16;
    std::vector<uint32_t> block(2 * pairs);
    const float one = 1.0f;
    for (size_t j = 0; j < pairs; ++j) {
      block[j] = static_cast<uint32_t>((j * 16 + 7) % n);
      std::memcpy(&block[pairs + j], &one, sizeof(one));
    }
    std::unique_ptr<ScatterWorkspace> sws = kernels.NewScatterWorkspace();
    PSD_ASSIGN_OR_RETURN(double t_scatter, TimeKernel(be, [&] {
                           return kernels.ScatterAddBlocks(block.data(), 1, pairs,
                                                           residual.data(), n, sws.get(),
                                                           nullptr);
                         }));
    m.scatter_bytes_per_s = 8.0 * pairs / t_scatter;

    // SGD step over 1 Mi parameters.
    std::vector<float> param(n, 1.0f), velocity(n, 0.0f);
    SgdParams sp;
    PSD_ASSIGN_OR_RETURN(double t_opt, TimeKernel(be, [&] {
                           return kernels.SgdStep(param.data(), grad.data(), 1, 0, 1.0f,
                                                  velocity.data(), n, sp, nullptr);
                         }));
    m.optimizer_bytes_per_s = 4.0 * n / t_opt;
  }

  // Everyone adopts rank 0's figures.
  std::vector<double> f = ToFigures(m);
  PSD_CHECK(be.Broadcast(f.data(), f.size(), DType::kFloat64, 0));
  CostModel out = FromFigures(f);
  out.source = "measured";
  return out;
}

std::string CostCachePath(const std::string& host_key) {
  std::string set = settings::CostCache();
  if (!set.empty()) return set;
  const char* home = std::getenv("HOME");
  std::string base = (home != nullptr && *home != '\0') ? home : "/tmp";
  return base + "/.cache/poseidon/cost-" + host_key + ".txt";
}

namespace {

// mkdir -p of the file's directory; failures surface when the file is written.
void MakeParentDirs(const std::string& path) {
  for (size_t i = 1; i < path.size(); ++i) {
    if (path[i] == '/') mkdir(path.substr(0, i).c_str(), 0755);
  }
}

}  // namespace

Result<CostModel> LoadOrMeasureCostModel(Communicator& comm, const Kernels& kernels,
                                         const ProbeOptions& options) {
  Backend& be = comm.host_backend();
  const std::string path = CostCachePath(comm.host_key());
  // Rank 0 decides: figures from the cache (flag 1) or a fresh probe (flag 0).
  std::vector<double> msg(kNumFigures + 1, 0.0);
  if (comm.rank() == 0 && !settings::Reprobe()) {
    std::ifstream in(path);
    if (in) {
      std::stringstream ss;
      ss << in.rdbuf();
      std::string key;
      auto parsed = CostModel::Parse(ss.str(), &key);
      if (parsed.ok() && key == comm.host_key()) {
        std::vector<double> f = ToFigures(*parsed);
        std::copy(f.begin(), f.end(), msg.begin() + 1);
        msg[0] = 1;
      } else if (!parsed.ok()) {
        PSD_LOG(kWarn, "cost cache ", path, " is unreadable (", parsed.status().message(),
                "); measuring again");
      } else {
        PSD_LOG(kInfo, "cost cache ", path, " is for ", key, ", not ", comm.host_key(),
                "; measuring again");
      }
    }
  }
  PSD_CHECK(be.Broadcast(msg.data(), msg.size(), DType::kFloat64, 0));
  if (msg[0] == 1) {
    CostModel m = FromFigures(std::vector<double>(msg.begin() + 1, msg.end()));
    m.source = "cache:" + path;
    return m;
  }
  PSD_ASSIGN_OR_RETURN(CostModel m, MeasureCostModel(be, kernels, options));
  if (comm.rank() == 0) {
    MakeParentDirs(path);
    std::ofstream out(path, std::ios::trunc);
    out << m.ToText(comm.host_key());
    if (!out) PSD_LOG(kWarn, "could not write the cost cache ", path, "; continuing without it");
  }
  return m;
}

}  // namespace poseidon
