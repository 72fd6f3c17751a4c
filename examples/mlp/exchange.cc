#include "examples/mlp/exchange.h"

#include <chrono>

#include "collectives/cost_model.h"
#include "collectives/planner.h"
#include "kernels/kernels.h"

namespace poseidon::mlp {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Result<std::unique_ptr<LayerExchange>> LayerExchange::Create(std::shared_ptr<Communicator> comm,
                                                             Mlp* model, int batch,
                                                             const ExchangeConfig& config) {
  PSD_REQUIRE_ARG(comm != nullptr && model != nullptr,
                  "LayerExchange::Create: comm or model is null");
  PSD_REQUIRE_ARG(batch >= 1, "LayerExchange::Create: batch ", batch, "; expected K >= 1");
  std::optional<StrategyKind> force;
  if (config.strategy != "auto") {
    PSD_ASSIGN_OR_RETURN(StrategyKind k, ParseStrategy(config.strategy));
    force = k;
  }
  const bool topk = force == StrategyKind::kTopk;
  PSD_REQUIRE_ARG(topk || (!config.density && !config.warmup_steps),
                  "LayerExchange::Create: density / warm-up given with strategy '", config.strategy,
                  "'; expected them with topk only");

  std::unique_ptr<LayerExchange> x(new LayerExchange());
  x->comm_ = comm;
  x->model_ = model;
  x->config_ = config;
  PSD_ASSIGN_OR_RETURN(x->hc_, HybridCollective::Create(comm));

  SgdParams sgd;
  sgd.lr = static_cast<float>(config.lr);
  sgd.momentum = static_cast<float>(config.momentum);
  const OptimizerSpec optimizer = OptimizerSpec::Sgd(sgd);
  for (int l = 0; l < model->num_layers(); ++l) {
    const LayerInfo& info = model->layer(l);
    LayerSpec w;
    w.name = StrCat("fc", l, ".weight");
    w.shape = {static_cast<size_t>(info.out), static_cast<size_t>(info.in)};
    w.optimizer = optimizer;
    if (topk) {
      // Only sparse-tolerant layers may be sparsified; the user asked for it on the weights.
      w.kind = LayerKind::kSparse;
      w.topk.density = config.density;
      w.topk.warmup_steps = config.warmup_steps;
      // The optimizer carries the momentum; DGC's correction on the residual would apply it a
      // second time (layer.h), so it stays off whatever POSEIDON_TOPK_MOMENTUM says.
      w.topk.momentum = 0.0;
      // This model's weights are all below the default size floor (16384); a forced topk is
      // meant to sparsify them.
      w.topk.min_elements = 0;
    } else {
      w.kind = LayerKind::kFullyConnected;
    }
    PSD_ASSIGN_OR_RETURN(int wid, x->hc_->RegisterLayer(w));
    LayerSpec b;
    b.name = StrCat("fc", l, ".bias");
    b.shape = {static_cast<size_t>(info.out)};
    b.kind = LayerKind::kDense;
    b.optimizer = optimizer;
    PSD_ASSIGN_OR_RETURN(int bid, x->hc_->RegisterLayer(b));
    x->weight_id_.push_back(wid);
    x->bias_id_.push_back(bid);
  }

  PSD_ASSIGN_OR_RETURN(CostModel cost, LoadOrMeasureCostModel(*comm, CpuKernels()));
  PSD_ASSIGN_OR_RETURN(PlannerOptions planner, PlannerOptions::FromSettings());
  if (force) planner.global_force = force;
  PSD_CHECK(x->hc_->BuildPlan(static_cast<size_t>(batch), cost, planner));

  for (int l = 0; l < model->num_layers(); ++l) {
    const bool sfb = x->hc_->strategy(x->weight_id_[l]) == StrategyKind::kSfb;
    x->sends_factors_.push_back(sfb);
    model->set_form_weight_grad(l, !sfb);
  }
  x->weight_handle_.resize(model->num_layers());
  x->bias_handle_.resize(model->num_layers());
  if (config.use_engine) {
    PSD_REQUIRE(comm->mpi_thread_level() >= MPI_THREAD_MULTIPLE, StatusCode::kUnavailable,
                "LayerExchange::Create: MPI provides thread level ", comm->mpi_thread_level(),
                "; the engine mode needs MPI_THREAD_MULTIPLE (", MPI_THREAD_MULTIPLE,
                ") because the trainer keeps using MPI while it runs; use --no-engine");
    PSD_ASSIGN_OR_RETURN(x->engine_, Engine::Create(comm, x->hc_.get()));
  }
  return x;
}

LayerExchange::~LayerExchange() {
  if (!finished_) (void)Finish();
}

std::string LayerExchange::ChoiceSummary() const {
  std::string s;
  for (int id = 0; id < hc_->num_layers(); ++id) {
    s += StrCat(id ? " " : "", hc_->layer(id).name, "=", StrategyName(hc_->strategy(id)));
  }
  return s;
}

Gradient LayerExchange::GradientOf(int l, bool weight) const {
  const LayerInfo& info = model_->layer(l);
  const size_t offset = weight ? info.w_offset : info.b_offset;
  Gradient g;
  g.data = model_->grads() + offset;
  g.count = weight ? static_cast<size_t>(info.in) * info.out : static_cast<size_t>(info.out);
  g.params = model_->params() + offset;
  if (weight && sends_factors_[l]) {
    g.u = model_->factor_u(l);
    g.v = model_->factor_v(l);
    g.batch = static_cast<size_t>(model_->batch_rows());
  }
  return g;
}

Status LayerExchange::Submit(int l, int64_t step) {
  // Submit never blocks; an argument error fails the handle, and Wait reports it.
  weight_handle_[l] = engine_->Submit(weight_id_[l], GradientOf(l, true), step);
  bias_handle_[l] = engine_->Submit(bias_id_[l], GradientOf(l, false), step);
  return Status::Ok();
}

Status LayerExchange::WaitLayer(int l) {
  // Complete already (the step's first wait ran the fused exchange): nothing to time.
  const bool waits = (weight_handle_[l] != nullptr && !weight_handle_[l]->Test()) ||
                     (bias_handle_[l] != nullptr && !bias_handle_[l]->Test());
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = waits ? Clock::now() : Clock::time_point();
  Status st;
  for (HandlePtr* h : {&weight_handle_[l], &bias_handle_[l]}) {
    if (*h == nullptr) continue;
    Status s = (*h)->Wait();
    if (!s.ok() && st.ok()) {
      // The engine's messages name the layer and step already ("layer 0 (fc0.weight) step 3:").
      const bool named =
          s.message().find(StrCat("layer ", (*h)->layer(), " (")) != std::string::npos;
      st = named ? s
                 : s.WithPrefix(StrCat("step ", (*h)->step(), ": layer ",
                                       hc_->layer((*h)->layer()).name, ": "));
    }
    h->reset();
  }
  if (waits) blocked_s_ += SecondsSince(t0);
  return st;
}

StepHooks LayerExchange::Hooks(int64_t step) {
  StepHooks hooks;
  if (!engine_) return hooks;
  hooks.before_forward = [this](int l) { return WaitLayer(l); };
  hooks.after_backward = [this, step](int l) { return Submit(l, step); };
  return hooks;
}

Status LayerExchange::ExchangeAll(int64_t step) {
  PSD_REQUIRE(!engine_, StatusCode::kInvalidArgument,
              "LayerExchange::ExchangeAll: the engine drives this exchange; use Hooks");
  const auto t0 = std::chrono::steady_clock::now();
  for (int l = model_->num_layers() - 1; l >= 0; --l) {
    for (bool weight : {true, false}) {
      const Gradient g = GradientOf(l, weight);
      ExchangeBuffers b;
      b.grad = static_cast<float*>(g.data);
      b.params = g.params;
      b.u = g.u;
      b.v = g.v;
      b.batch = g.batch;
      Status s = hc_->Exchange(weight ? weight_id_[l] : bias_id_[l], b, step);
      if (!s.ok()) return s.WithPrefix(StrCat("step ", step, ": "));
    }
  }
  blocked_s_ += SecondsSince(t0);
  return Status::Ok();
}

Status LayerExchange::Finish() {
  if (finished_) return Status::Ok();
  finished_ = true;
  Status st;
  if (engine_) {
    for (int l = 0; l < model_->num_layers(); ++l) {
      Status s = WaitLayer(l);
      if (st.ok()) st = s;
    }
    engine_stats_ = engine_->stats();
    Status s = engine_->Shutdown();
    if (st.ok()) st = s;
  }
  return st;
}

}  // namespace poseidon::mlp
