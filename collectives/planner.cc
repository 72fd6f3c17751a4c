// The planner, step by step (per layer):
//   1. Cost allreduce (always: it is the baseline the plan compares against) and every other
//      candidate that applies to the layer.
//   2. Choose: per-layer force, else a global force that applies, else the cheapest candidate
//      (exact ties within 1e-12 relative broken sfb, allreduce, ps, topk; with one rank,
//      allreduce first).
// The plan table prints one line per layer and parses back.
#include "collectives/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "collectives/strategy.h"
#include "runtime/settings.h"

namespace poseidon {
namespace {

// Lower wins a tie: sfb (lossless, Poseidon's rule is "<="), allreduce, ps, topk (lossy). With
// one rank nothing is exchanged and sfb ties allreduce exactly (the same GEMM forms the
// gradient); allreduce wins there: it is the identity, and the engine fuses it into one cached
// op per step instead of one exchange per layer.
int TiePreference(StrategyKind s, int world) {
  if (world == 1 && s == StrategyKind::kAllReduce) return -1;
  switch (s) {
    case StrategyKind::kSfb:
      return 0;
    case StrategyKind::kAllReduce:
      return 1;
    case StrategyKind::kPs:
      return 2;
    case StrategyKind::kTopk:
      return 3;
  }
  return 4;
}

bool Contains(const std::vector<StrategyKind>& v, StrategyKind s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

std::string Cell(const CandidateCost& c) {
  if (!c.applies) return "-";
  char buf[96];
  std::snprintf(buf, sizeof(buf), c.candidate ? "%.9g/%.9g" : "(%.9g/%.9g)", c.time_s * 1e6,
                c.bytes_sent);
  return buf;
}

std::string Human(double v, const char* unit) {
  char buf[64];
  const char* prefixes[] = {"", "K", "M", "G", "T"};
  int i = 0;
  while (std::fabs(v) >= 1000 && i < 4) {
    v /= 1000;
    ++i;
  }
  std::snprintf(buf, sizeof(buf), "%.3g %s%s", v, prefixes[i], unit);
  return buf;
}

}  // namespace

Result<PlannerOptions> PlannerOptions::FromSettings() {
  PlannerOptions o;
  std::string force = settings::Strategy();
  if (force != "auto" && !force.empty()) {
    auto s = ParseStrategy(force);
    if (!s.ok()) {
      return InvalidArgument("POSEIDON_STRATEGY='", force,
                             "' is not a strategy; expected auto, allreduce, ps, sfb or topk");
    }
    o.global_force = *s;
  }
  std::string cands = settings::Candidates();
  auto list = ParseStrategyList(cands);
  if (!list.ok()) {
    return InvalidArgument("POSEIDON_CANDIDATES='", cands, "': ", list.status().message());
  }
  o.candidates = *list;
  o.fusion_bytes = settings::FusionBytes();
  return o;
}

Result<PlanEntry> PlanLayer(const LayerSpec& layer, size_t batch, int world, const CostModel& model,
                            const PlannerOptions& options) {
  PSD_REQUIRE_ARG(world >= 1, "PlanLayer: world ", world, " is invalid; expected >= 1");
  PlanEntry e;
  e.layer = layer.name;
  e.shape = layer.shape;
  e.kind = layer.kind;
  const std::vector<StrategyKind>& cands =
      layer.candidates.empty() ? options.candidates : layer.candidates;
  std::optional<StrategyKind> global;
  if (options.global_force && StrategyApplies(*options.global_force, layer, nullptr)) {
    global = options.global_force;
  }
  for (StrategyKind s : kAllStrategies) {
    CandidateCost c;
    c.strategy = s;
    bool considered =
        s == StrategyKind::kAllReduce || Contains(cands, s) || layer.force == s || global == s;
    c.applies = considered && StrategyApplies(s, layer, nullptr);
    c.candidate = c.applies && Contains(cands, s);
    if (c.applies) {
      CostEstimate est = GetStrategy(s).Cost(layer, batch, world, model);
      c.time_s = est.time_s;
      c.bytes_sent = est.bytes_sent;
    }
    e.candidates.push_back(c);
  }

  if (layer.force) {
    e.choice = *layer.force;
    e.reason = "layer";
    return e;
  }
  if (global) {
    e.choice = *global;
    e.reason = "global";
    return e;
  }
  const CandidateCost* best = nullptr;
  for (const CandidateCost& c : e.candidates) {
    if (!c.candidate) continue;
    if (best == nullptr) {
      best = &c;
      continue;
    }
    double tol = 1e-12 * std::max(std::fabs(c.time_s), std::fabs(best->time_s));
    if (c.time_s < best->time_s - tol ||
        (std::fabs(c.time_s - best->time_s) <= tol &&
         TiePreference(c.strategy, world) < TiePreference(best->strategy, world))) {
      best = &c;
    }
  }
  if (best == nullptr) {
    e.choice = StrategyKind::kAllReduce;
    e.reason = "fallback";
  } else {
    e.choice = best->strategy;
    e.reason = options.global_force ? "global-na" : "auto";
  }
  return e;
}

Result<Plan> MakePlan(const std::vector<LayerSpec>& layers, size_t batch, int world,
                      const CostModel& model, const PlannerOptions& options) {
  PSD_CHECK(model.Validate());
  Plan plan;
  plan.world = world;
  plan.batch = batch;
  plan.model_source = model.source;
  for (const LayerSpec& l : layers) {
    PSD_ASSIGN_OR_RETURN(PlanEntry e, PlanLayer(l, batch, world, model, options));
    plan.entries.push_back(std::move(e));
  }
  if (options.fusion_bytes <= 0) return plan;
  // Fusion: one latency for the group instead of one (or two, for ps) per layer.
  std::vector<size_t> group;
  double separate_s = 0, fused_bytes = 0, local_s = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    const PlanEntry& e = plan.entries[i];
    const CandidateCost& ar = e.cost(StrategyKind::kAllReduce);
    const double bytes = 4.0 * static_cast<double>(layers[i].NumElements());
    if (e.reason != "auto" || !ar.candidate || bytes > static_cast<double>(options.fusion_bytes)) {
      continue;
    }
    group.push_back(i);
    separate_s += e.cost(e.choice).time_s;
    fused_bytes += bytes;
    // What the allreduce candidate costs besides its collective (optimizer step, forming a
    // factored gradient) stays per layer.
    local_s += ar.time_s - model.CollectiveTime(CollectiveKind::kAllReduce, world, bytes);
  }
  if (group.size() < 2) return plan;
  const double groups = std::ceil(fused_bytes / static_cast<double>(options.fusion_bytes));
  const double fused_s =
      groups * model.CollectiveTime(CollectiveKind::kAllReduce, world, fused_bytes / groups) +
      local_s;
  if (fused_s >= separate_s) return plan;
  for (size_t i : group) {
    PlanEntry& e = plan.entries[i];
    if (e.choice == StrategyKind::kAllReduce) continue;
    e.choice = StrategyKind::kAllReduce;
    e.reason = "fused";
  }
  return plan;
}

double Plan::PredictedTime() const {
  double t = 0;
  for (const PlanEntry& e : entries) t += e.cost(e.choice).time_s;
  return t;
}
double Plan::PredictedBytes() const {
  double b = 0;
  for (const PlanEntry& e : entries) b += e.cost(e.choice).bytes_sent;
  return b;
}
double Plan::DenseAllReduceTime() const {
  double t = 0;
  for (const PlanEntry& e : entries) t += e.cost(StrategyKind::kAllReduce).time_s;
  return t;
}
double Plan::DenseAllReduceBytes() const {
  double b = 0;
  for (const PlanEntry& e : entries) b += e.cost(StrategyKind::kAllReduce).bytes_sent;
  return b;
}

std::string Plan::ToString() const {
  std::ostringstream os;
  os << "# poseidon-plan P=" << world << " K=" << batch << " model=" << model_source << "\n";
  os << "# layer shape kind choice reason";
  for (StrategyKind s : kAllStrategies) os << " " << StrategyName(s) << "(us/bytes)";
  os << "\n";
  for (const PlanEntry& e : entries) {
    os << e.layer << " " << ShapeString(e.shape) << " " << LayerKindName(e.kind) << " "
       << StrategyName(e.choice) << " " << e.reason;
    for (const CandidateCost& c : e.candidates) os << " " << Cell(c);
    os << "\n";
  }
  os << "# predicted " << Human(PredictedTime(), "s") << ", " << Human(PredictedBytes(), "B")
     << " per rank per step; dense allreduce " << Human(DenseAllReduceTime(), "s") << ", "
     << Human(DenseAllReduceBytes(), "B") << "\n";
  return os.str();
}

namespace {

Result<CandidateCost> ParseCell(StrategyKind s, const std::string& cell, int line_no) {
  CandidateCost c;
  c.strategy = s;
  if (cell == "-") return c;
  std::string body = cell;
  c.candidate = true;
  if (body.size() >= 2 && body.front() == '(' && body.back() == ')') {
    body = body.substr(1, body.size() - 2);
    c.candidate = false;
  }
  size_t slash = body.find('/');
  char* end1 = nullptr;
  char* end2 = nullptr;
  std::string t = slash == std::string::npos ? "" : body.substr(0, slash);
  std::string b = slash == std::string::npos ? "" : body.substr(slash + 1);
  double tv = std::strtod(t.c_str(), &end1);
  double bv = std::strtod(b.c_str(), &end2);
  PSD_REQUIRE_ARG(!t.empty() && !b.empty() && *end1 == '\0' && *end2 == '\0', "ParsePlan: line ",
                  line_no, ": cell '", cell, "' of ", StrategyName(s),
                  " is not '-', 'time_us/bytes' or '(time_us/bytes)'");
  c.applies = true;
  c.time_s = tv * 1e-6;
  c.bytes_sent = bv;
  return c;
}

}  // namespace

Result<Plan> ParsePlan(const std::string& text) {
  Plan plan;
  std::istringstream is(text);
  std::string line;
  int line_no = 0;
  bool header = false;
  while (std::getline(is, line)) {
    ++line_no;
    if (line.empty()) continue;
    if (line.rfind("# poseidon-plan ", 0) == 0) {
      std::istringstream hs(line.substr(16));
      std::string p, k;
      hs >> p >> k;
      size_t model_at = line.find(" model=");
      PSD_REQUIRE_ARG(
          p.rfind("P=", 0) == 0 && k.rfind("K=", 0) == 0 && model_at != std::string::npos,
          "ParsePlan: line ", line_no, " '", line,
          "' is not '# poseidon-plan P=<n> K=<n> model=<source>'");
      plan.world = std::atoi(p.c_str() + 2);
      plan.batch = static_cast<size_t>(std::strtoull(k.c_str() + 2, nullptr, 10));
      plan.model_source = line.substr(model_at + 7);
      header = true;
      continue;
    }
    // A comment, also after blanks: the first word of a layer line (its name) never starts
    // with '#' (ResolveLayerSpec), so what ParsePlan accepts prints back the same.
    const size_t first = line.find_first_not_of(" \t\v\f\r");
    if (first == std::string::npos || line[first] == '#') continue;
    std::istringstream ls(line);
    std::vector<std::string> tok;
    std::string t;
    while (ls >> t) tok.push_back(t);
    PSD_REQUIRE_ARG(tok.size() == 5 + kNumStrategies, "ParsePlan: line ", line_no, " has ",
                    tok.size(), " fields; expected ", 5 + kNumStrategies,
                    " (layer shape kind choice reason and one cell per strategy)");
    PlanEntry e;
    e.layer = tok[0];
    PSD_ASSIGN_OR_RETURN(e.shape, ParseShape(tok[1]));
    PSD_ASSIGN_OR_RETURN(e.kind, ParseLayerKind(tok[2]));
    PSD_ASSIGN_OR_RETURN(e.choice, ParseStrategy(tok[3]));
    e.reason = tok[4];
    for (int i = 0; i < kNumStrategies; ++i) {
      PSD_ASSIGN_OR_RETURN(CandidateCost c, ParseCell(kAllStrategies[i], tok[5 + i], line_no));
      e.candidates.push_back(c);
    }
    PSD_REQUIRE_ARG(e.cost(e.choice).applies, "ParsePlan: line ", line_no, ": layer ", e.layer,
                    " chooses ", StrategyName(e.choice), " but its cell is '-'");
    plan.entries.push_back(std::move(e));
  }
  PSD_REQUIRE_ARG(header, "ParsePlan: no '# poseidon-plan' header line");
  return plan;
}

}  // namespace poseidon
