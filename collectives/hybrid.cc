// HybridCollective: registration, planning and per-layer dispatch.
//  BuildPlan: cost model (probe / cache / given) -> MakePlan over every layer -> every rank
//  checks that all ranks hold the same plan (a hash allgather), so a rank that registered
//  different layers fails everywhere with a clear error instead of deadlocking in Exchange;
//  the error names the first line of the table where that rank's plan and rank 0's part.
//  Exchange: the layer's planned strategy runs with its LayerState (made on first use, kept
//  while the strategy stays the same), then the traffic counters are updated.
#include "collectives/hybrid.h"

#include <cstring>
#include <sstream>

#include "runtime/hash.h"
#include "runtime/log.h"
#include "runtime/mpi_backend.h"

namespace poseidon {

Result<std::unique_ptr<HybridCollective>> HybridCollective::Create(
    std::shared_ptr<Communicator> comm, MemoryKind memory, const Kernels* kernels) {
  PSD_REQUIRE_ARG(comm != nullptr, "HybridCollective::Create: comm is null");
  PSD_REQUIRE_ARG(memory == MemoryKind::kHost || memory == MemoryKind::kDevice,
                  "HybridCollective::Create: memory kind ", static_cast<int>(memory),
                  " is invalid; expected host or device");
  if (kernels == nullptr) {
    PSD_ASSIGN_OR_RETURN(kernels, KernelsFor(memory));
  }
  PSD_REQUIRE_ARG(kernels->memory() == memory, "HybridCollective::Create: kernels '",
                  kernels->name(), "' work on ", MemoryKindName(kernels->memory()),
                  " memory; expected ", MemoryKindName(memory));
  PSD_ASSIGN_OR_RETURN(Backend * backend, comm->backend(memory));
  std::unique_ptr<HybridCollective> h(new HybridCollective());
  h->comm_ = std::move(comm);
  h->ctx_.backend = backend;
  h->ctx_.kernels = kernels;
  h->ctx_.call.memory = memory;
  return h;
}

Status HybridCollective::CheckId(const char* call, int id) const {
  PSD_REQUIRE_ARG(id >= 0 && id < num_layers(), call, ": layer id ", id,
                  " is not registered; expected 0..", num_layers() - 1);
  return Status::Ok();
}

Result<int> HybridCollective::RegisterLayer(const LayerSpec& spec) {
  PSD_ASSIGN_OR_RETURN(LayerSpec resolved, ResolveLayerSpec(spec));
  PSD_REQUIRE_ARG(ids_.count(resolved.name) == 0, "RegisterLayer: layer name '", resolved.name,
                  "' is already registered (id ", ids_[resolved.name], "); expected unique names");
  int id = num_layers();
  Layer l;
  l.spec = std::move(resolved);
  layers_.push_back(std::move(l));
  ids_[layers_.back().spec.name] = id;
  plan_.reset();  // a new layer needs a new plan
  return id;
}

namespace {

// `text` from `root` on every rank: its length, then its bytes packed in int32 words (a
// broadcast moves them unchanged).
Result<std::string> BroadcastText(Backend& be, const std::string& text, int root, int me) {
  int64_t n = me == root ? static_cast<int64_t>(text.size()) : 0;
  PSD_CHECK(be.Broadcast(&n, 1, DType::kInt64, root));
  std::vector<int32_t> words((static_cast<size_t>(n) + 3) / 4);
  if (me == root) std::memcpy(words.data(), text.data(), text.size());
  PSD_CHECK(be.Broadcast(words.data(), words.size(), DType::kInt32, root));
  return std::string(reinterpret_cast<const char*>(words.data()), static_cast<size_t>(n));
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream is(text);
  for (std::string line; std::getline(is, line);) lines.push_back(line);
  return lines;
}

}  // namespace

Result<std::string> HybridCollective::FirstPlanDifference(const std::string& mine, int other) {
  Backend& be = comm_->host_backend();
  const int me = comm_->rank();
  PSD_ASSIGN_OR_RETURN(std::string first, BroadcastText(be, mine, 0, me));
  std::string where;
  if (me == other) {
    const std::vector<std::string> a = Lines(first), b = Lines(mine);
    size_t i = 0;
    while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
    auto line = [](const std::vector<std::string>& v, size_t k) {
      return k < v.size() ? "'" + v[k] + "'" : std::string("(no such line)");
    };
    where = StrCat("first at line ", i + 1, " of the table: rank 0 ", line(a, i), ", rank ", me,
                   " ", line(b, i));
  }
  return BroadcastText(be, where, other, me);
}

Status HybridCollective::BuildPlan(size_t batch) {
  PSD_ASSIGN_OR_RETURN(CostModel model, LoadOrMeasureCostModel(*comm_, *ctx_.kernels));
  return BuildPlan(batch, model);
}

Status HybridCollective::BuildPlan(size_t batch, const CostModel& model,
                                   std::optional<PlannerOptions> options) {
  PSD_REQUIRE_ARG(batch >= 1, "BuildPlan: batch ", batch,
                  " is invalid; expected the per-rank batch size K >= 1");
  if (!options) {
    PSD_ASSIGN_OR_RETURN(PlannerOptions o, PlannerOptions::FromSettings());
    options = o;
  }
  std::vector<LayerSpec> specs;
  for (const Layer& l : layers_) specs.push_back(l.spec);
  PSD_ASSIGN_OR_RETURN(Plan plan, MakePlan(specs, batch, world(), model, *options));

  // Every rank must hold the same plan: compare a hash of its table (FNV-1a, 63 bits so it
  // travels as int64) across ranks.
  std::string text = plan.ToString();
  uint64_t h = Fnv1a(text.data(), text.size());
  int64_t mine = static_cast<int64_t>(h >> 1);
  std::vector<int64_t> all(static_cast<size_t>(world()));
  PSD_CHECK(comm_->host_backend().AllGather(&mine, all.data(), 1, DType::kInt64));
  for (int r = 0; r < world(); ++r) {
    if (all[static_cast<size_t>(r)] != all[0]) {
      // Every rank knows r: name the first line where its plan and rank 0's part.
      PSD_ASSIGN_OR_RETURN(std::string where, FirstPlanDifference(text, r));
      return MismatchError("BuildPlan: the plan on rank ", r, " differs from rank 0's (",
                           where, "); expected every rank to register the same layers in the "
                           "same order with the same batch and settings");
    }
  }
  model_ = model;
  plan_ = std::move(plan);
  if (model.has_hier()) {
    // The measured crossover between the flat and the two-level host allreduce (every rank
    // holds rank 0's figures, so all set the same value).
    if (auto* mpi = dynamic_cast<MpiBackend*>(&comm_->host_backend())) {
      const long long from = model.HierAllReduceFromBytes(world());
      mpi->SetHierAllReduceBytes(from);
      PSD_LOG(kInfo, "host allreduce across nodes: two-level ",
              from > 0 ? StrCat("from ", from, " bytes") : std::string("never"),
              " (measured crossover; ", model.Summary(), ")");
    }
  }
  PSD_LOG(kInfo, "plan for ", num_layers(), " layers at P=", world(), " K=", batch, ":\n",
          plan_->ToString());
  return Status::Ok();
}

std::string HybridCollective::PrintPlan() const {
  return plan_ ? plan_->ToString() : std::string("# no plan yet (call BuildPlan)\n");
}

StrategyKind HybridCollective::strategy(int id) const {
  return plan_->entries[static_cast<size_t>(id)].choice;
}

const LayerState* HybridCollective::state(int id) const {
  if (id < 0 || id >= num_layers()) return nullptr;
  return layers_[static_cast<size_t>(id)].state.get();
}

Result<LayerState*> HybridCollective::StateFor(int id) {
  Layer& l = layers_[static_cast<size_t>(id)];
  const StrategyKind kind = strategy(id);
  if (!l.state || l.state_kind != kind) {
    PSD_ASSIGN_OR_RETURN(l.state, GetStrategy(kind).NewState(l.spec, ctx_));
    l.state_kind = kind;
  }
  return l.state.get();
}

Status HybridCollective::Exchange(int id, const ExchangeBuffers& buffers, int64_t step) {
  PSD_CHECK(CheckId("Exchange", id));
  const Layer& l = layers_[static_cast<size_t>(id)];
  PSD_REQUIRE(plan_.has_value(), StatusCode::kInvalidArgument, "Exchange: layer ", l.spec.name,
              ": no plan; call BuildPlan after registering every layer");
  PSD_REQUIRE_ARG(step >= 0, "Exchange: step ", step, " is negative; expected >= 0");
  const StrategyKind kind = strategy(id);
  if (Status st = CheckSubmission(l.spec, kind, buffers); !st.ok()) {
    return strategy_internal::FailTogether(ctx_, st.WithPrefix("Exchange: "))
        .WithPrefix(
            StrCat("while exchanging layer ", l.spec.name, " with ", StrategyName(kind), ": "));
  }
  return ExchangeChecked(id, buffers, step);
}

Status HybridCollective::ExchangeChecked(int id, const ExchangeBuffers& buffers, int64_t step) {
  Layer& l = layers_[static_cast<size_t>(id)];
  const StrategyKind kind = strategy(id);
  const Strategy& s = GetStrategy(kind);
  PSD_ASSIGN_OR_RETURN(LayerState * state, StateFor(id));
  ExchangeBuffers b = buffers;
  if (kind == StrategyKind::kSfb && b.max_batch == 0) b.max_batch = plan_->batch;
  ExchangeReport report;
  Status st = s.Exchange(l.spec, state, b, step, ctx_, &report);
  if (!st.ok()) {
    return st.WithPrefix(StrCat("while exchanging layer ", l.spec.name, " with ", s.name(), ": "));
  }
  const double dense = CostModel::WireBytes(CollectiveKind::kAllReduce, world(),
                                            4.0 * static_cast<double>(l.spec.NumElements()));
  AddTraffic(id, report.bytes_sent, dense);
  if (report.fell_back_dense) {
    l.traffic.dense_fallbacks += 1;
    total_.dense_fallbacks += 1;
  }
  return Status::Ok();
}

Status HybridCollective::FinishDenseSum(int id, const ExchangeBuffers& buffers, int64_t step) {
  PSD_CHECK(CheckId("FinishDenseSum", id));
  Layer& l = layers_[static_cast<size_t>(id)];
  PSD_REQUIRE(plan_.has_value(), StatusCode::kInvalidArgument, "FinishDenseSum: layer ",
              l.spec.name, ": no plan; call BuildPlan after registering every layer");
  PSD_REQUIRE_ARG(step >= 0, "FinishDenseSum: step ", step, " is negative; expected >= 0");
  const StrategyKind kind = strategy(id);
  PSD_REQUIRE_ARG(kind == StrategyKind::kAllReduce, "FinishDenseSum: layer ", l.spec.name,
                  " is planned as ", StrategyName(kind),
                  "; expected allreduce (only a dense sum can be finished locally)");
  PSD_ASSIGN_OR_RETURN(LayerState * state, StateFor(id));
  Status st = GetStrategy(kind).FinishSum(l.spec, state, buffers, ctx_);
  if (!st.ok()) return st.WithPrefix(StrCat("while finishing layer ", l.spec.name, ": "));
  return Status::Ok();
}

OptimizerState* HybridCollective::SumOptimizerOf(int id) {
  if (id < 0 || id >= num_layers() || !plan_.has_value()) return nullptr;
  const Layer& l = layers_[static_cast<size_t>(id)];
  if (!l.spec.optimizer.enabled() || strategy(id) != StrategyKind::kAllReduce) return nullptr;
  Result<LayerState*> state = StateFor(id);
  return state.ok() ? GetStrategy(StrategyKind::kAllReduce).SumOptimizer(*state) : nullptr;
}

void HybridCollective::AddTraffic(int id, double bytes_sent, double dense_bytes) {
  if (id < 0 || id >= num_layers()) return;
  Layer& l = layers_[static_cast<size_t>(id)];
  for (Traffic* t : {&l.traffic, &total_}) {
    t->exchanges += 1;
    t->bytes_sent += bytes_sent;
    t->dense_bytes += dense_bytes;
  }
  l.traffic.last_bytes_sent = bytes_sent;
  total_.last_bytes_sent += bytes_sent;
}

}  // namespace poseidon
