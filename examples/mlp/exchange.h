// LayerExchange: the MLP's gradient exchange through Poseidon's hybrid collective.
//
// Step by step:
//  1. Create registers every parameter tensor of the model as a layer of a HybridCollective:
//     W_l as kFullyConnected {M = out, N = in} (or kSparse when topk is forced, so topk
//     applies), b_l as kDense; each with SGD momentum as its optimizer, so Poseidon applies the
//     same step whatever the strategy (ps needs it anyway) and the trainer's own optimizer is
//     idle. Then BuildPlan(K) (the measured or cached cost model, the planner, a forced
//     strategy where it applies), and, in engine mode, Engine::Create.
//  2. Weights planned as sfb exchange their factors U_l, V_l: the model is told not to form
//     dW_l locally (sfb rebuilds it from every rank's factors). Every other tensor hands over
//     its dense gradient and no factors (handing factors would make the strategy form U^T V a
//     second time).
//  3. Engine mode (Hooks): after_backward(l) submits W_l and b_l at once; before_forward(l)
//     of the next step waits for both handles, so communication overlaps the rest of the
//     backward pass and the forward pass of the layers below.
//     Synchronous mode (ExchangeAll): after the whole backward pass, every tensor through
//     HybridCollective::Exchange, last layer first (the order the engine would see them).
//  4. Finish waits for what is in flight and shuts the engine down; only then may the trainer
//     read the parameters, the traffic counters, or use other collectives freely.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/hybrid.h"
#include "examples/mlp/model.h"
#include "runtime/communicator.h"
#include "engine/engine.h"

namespace poseidon::mlp {

struct ExchangeConfig {
  std::string strategy = "auto";        // auto, or a strategy forced where it applies
  std::optional<double> density;        // topk (unset: the POSEIDON_TOPK_DENSITY setting)
  std::optional<int64_t> warmup_steps;  // topk (unset: the setting)
  double lr = 0.05;
  double momentum = 0.9;
  bool use_engine = true;
};

class LayerExchange {
 public:
  // Collective (BuildPlan, Engine::Create). `model` must outlive the exchange; batch is K.
  static Result<std::unique_ptr<LayerExchange>> Create(std::shared_ptr<Communicator> comm,
                                                       Mlp* model, int batch,
                                                       const ExchangeConfig& config);
  ~LayerExchange();

  // Engine mode: the hooks for Mlp::ForwardBackward of 0-based step `step`. The returned
  // object refers to this exchange and must not outlive it.
  StepHooks Hooks(int64_t step);
  // Synchronous mode: exchanges every tensor of the step just computed.
  Status ExchangeAll(int64_t step);
  // Waits for every pending exchange and stops the engine (idempotent, collective).
  Status Finish();

  bool uses_engine() const { return config_.use_engine; }
  const HybridCollective& collective() const { return *hc_; }
  std::string PlanText() const { return hc_->PrintPlan(); }
  // "fc0.weight=sfb fc0.bias=allreduce ..." in registration order.
  std::string ChoiceSummary() const;
  // Seconds the trainer thread spent blocked in the exchange (waits, or synchronous calls).
  double blocked_seconds() const { return blocked_s_; }
  // Engine counters (zero without the engine); valid after Finish too.
  EngineStats engine_stats() const { return engine_stats_; }

 private:
  LayerExchange() = default;
  Status Submit(int l, int64_t step);
  Status WaitLayer(int l);
  // The Gradient of tensor `id` (layer l's weight or bias) for the engine or Exchange.
  Gradient GradientOf(int l, bool weight) const;

  std::shared_ptr<Communicator> comm_;
  Mlp* model_ = nullptr;
  ExchangeConfig config_;
  std::unique_ptr<HybridCollective> hc_;
  std::unique_ptr<Engine> engine_;
  std::vector<int> weight_id_, bias_id_;  // per layer
  std::vector<bool> sends_factors_;       // per layer: W_l planned as sfb
  std::vector<HandlePtr> weight_handle_, bias_handle_;
  EngineStats engine_stats_;
  double blocked_s_ = 0;
  bool finished_ = false;
};

}  // namespace poseidon::mlp
