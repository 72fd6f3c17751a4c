// The layer and plan entry points of the C API (psdLayerConfigInit, psdRegisterLayer,
// psdNumLayers, psdBuildPlan, psdGetLayerStrategy, psdGetPlan, psdPrintPlan) and the checks of
// a psdLayerConfig_t (layer_config.h).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "bindings/c/engine_bridge.h"
#include "bindings/c/entry_common.h"
#include "bindings/c/layer_config.h"
#include "bindings/c/registry.h"
#include "collectives/layer.h"
#include "runtime/arg_check.h"

using poseidon::capi::CommState;
using poseidon::capi::Guard;
using poseidon::capi::WithComm;

namespace poseidon::capi {
namespace {

Result<OptimizerSpec> ToOptimizer(const psdOptimizer_t& o) {
  const int kind = EnumInt(o.kind);
  switch (kind) {
    case psdOptimizerNone:
      return OptimizerSpec::None();
    case psdOptimizerSgd: {
      SgdParams p;
      p.lr = o.lr;
      p.momentum = o.momentum;
      p.weight_decay = o.weight_decay;
      PSD_REQUIRE_ARG(o.nesterov == 0 || o.nesterov == 1, "optimizer.nesterov ", o.nesterov,
                      " is invalid; expected 0 or 1");
      p.nesterov = o.nesterov != 0;
      return OptimizerSpec::Sgd(p);
    }
    case psdOptimizerAdam: {
      AdamParams p;
      p.lr = o.lr;
      p.beta1 = o.beta1;
      p.beta2 = o.beta2;
      p.eps = o.eps;
      p.weight_decay = o.weight_decay;
      return OptimizerSpec::Adam(p);
    }
  }
  return InvalidArgument("optimizer.kind ", kind,
                         " is unknown; expected psdOptimizerNone (0), psdOptimizerSgd (1) or "
                         "psdOptimizerAdam (2)");
}

}  // namespace

Result<LayerSpec> ToLayerSpec(const psdLayerConfig_t& c) {
  LayerSpec spec;
  PSD_REQUIRE_ARG(c.name != nullptr, "config->name is NULL; expected a layer name");
  spec.name = c.name;
  const std::string who = StrCat("layer '", spec.name, "'");
  PSD_REQUIRE_ARG(c.ndim >= 0 && c.ndim <= 8, who, ": ndim ", c.ndim,
                  " is out of range; expected 0..8");
  PSD_REQUIRE_ARG(c.ndim == 0 || c.shape != nullptr, who, ": shape is NULL with ndim ", c.ndim,
                  "; expected ndim extents");
  spec.shape.assign(c.shape, c.shape + c.ndim);
  int kind = EnumInt(c.kind);
  PSD_REQUIRE_ARG(kind >= psdLayerDense && kind <= psdLayerSparse, who, ": kind ", kind,
                  " is unknown; expected psdLayerDense (0), psdLayerFullyConnected (1) or "
                  "psdLayerSparse (2)");
  spec.kind = static_cast<LayerKind>(kind);
  int strategy = EnumInt(c.strategy);
  PSD_REQUIRE_ARG(strategy >= psdStrategyAuto && strategy <= psdStrategyTopk, who, ": strategy ",
                  strategy,
                  " is unknown; expected psdStrategyAuto (-1), psdStrategyAllReduce (0), "
                  "psdStrategyPs (1), psdStrategySfb (2) or psdStrategyTopk (3)");
  if (strategy != psdStrategyAuto) spec.force = static_cast<StrategyKind>(strategy);
  // 0 means "the setting"; anything else must be a fraction in (0, 1] (NaN fails both tests).
  PSD_REQUIRE_ARG(c.density == 0 || (c.density > 0 && c.density <= 1), who, ": density ", c.density,
                  " is out of range; expected (0, 1], or 0 for the default");
  if (c.density != 0) spec.topk.density = c.density;
  if (c.candidates != nullptr) {
    auto list = ParseStrategyList(c.candidates);
    if (!list.ok()) return list.status().WithPrefix(who + ": candidates");
    spec.candidates = *list;
  }
  auto opt = ToOptimizer(c.optimizer);
  if (!opt.ok()) return opt.status().WithPrefix(who);
  spec.optimizer = *opt;
  return ResolveLayerSpec(spec);
}

namespace {

// Makes the exchange communicator and the hybrid collective (collective), registers the layers
// it has not seen, and plans.
Status BuildPlanLocked(CommState& s, size_t batch) {
  // The engine owns the hybrid collective while it runs: stop it (draining what is pending)
  // before the plan changes under it.
  // A failure the engine had is already in the handles and the sticky asynchronous error;
  // a new plan starts a fresh engine.
  if (s.engine) {
    (void)s.engine->Stop();
    s.engine.reset();
  }
  if (!s.exchange_comm) {
    PSD_ASSIGN_OR_RETURN(s.exchange_comm, Communicator::Create(s.comm->mpi_comm()));
    PSD_ASSIGN_OR_RETURN(s.hybrid, HybridCollective::Create(s.exchange_comm));
  }
  for (size_t i = static_cast<size_t>(s.hybrid->num_layers()); i < s.layers.size(); ++i) {
    PSD_ASSIGN_OR_RETURN(int id, s.hybrid->RegisterLayer(s.layers[i]));
    PSD_REQUIRE(id == static_cast<int>(i), StatusCode::kInternal, "layer '", s.layers[i].name,
                "' got id ", id, " in the hybrid collective; expected ", i);
  }
  PSD_CHECK(s.hybrid->BuildPlan(batch));
  s.plan_text = s.hybrid->PrintPlan();
  s.strategies.clear();
  for (int i = 0; i < s.hybrid->num_layers(); ++i) s.strategies.push_back(s.hybrid->strategy(i));
  PSD_ASSIGN_OR_RETURN(s.engine, EngineBridge::Start(s));
  return Status::Ok();
}

}  // namespace
}  // namespace poseidon::capi

using namespace poseidon;  // NOLINT: the entry points below name many core types

extern "C" {

psdResult_t psdLayerConfigInit(psdLayerConfig_t* config) {
  return Guard("psdLayerConfigInit", [&]() -> Status {
    PSD_REQUIRE_ARG(config != nullptr, "config is NULL; expected a psdLayerConfig_t*");
    std::memset(config, 0, sizeof(*config));
    config->kind = psdLayerDense;
    config->strategy = psdStrategyAuto;
    config->density = 0;
    config->optimizer.kind = psdOptimizerNone;
    SgdParams sgd;
    AdamParams adam;
    config->optimizer.lr = sgd.lr;
    config->optimizer.momentum = sgd.momentum;
    config->optimizer.nesterov = sgd.nesterov ? 1 : 0;
    config->optimizer.beta1 = adam.beta1;
    config->optimizer.beta2 = adam.beta2;
    config->optimizer.eps = adam.eps;
    config->optimizer.weight_decay = 0;
    return Status::Ok();
  });
}

psdResult_t psdRegisterLayer(psdComm_t comm, const psdLayerConfig_t* config, int* layer_id) {
  return WithComm("psdRegisterLayer", comm, [&](CommState& s) -> Status {
    PSD_REQUIRE_ARG(config != nullptr,
                    "config is NULL; expected a psdLayerConfig_t "
                    "(psdLayerConfigInit fills the defaults)");
    PSD_REQUIRE_ARG(layer_id != nullptr, "layer_id is NULL; expected an int*");
    PSD_ASSIGN_OR_RETURN(LayerSpec spec, capi::ToLayerSpec(*config));
    for (size_t i = 0; i < s.layers.size(); ++i) {
      PSD_REQUIRE_ARG(s.layers[i].name != spec.name, "layer name '", spec.name,
                      "' is already registered (id ", i, "); expected unique names");
    }
    s.layers.push_back(std::move(spec));
    *layer_id = static_cast<int>(s.layers.size() - 1);
    return Status::Ok();
  });
}

psdResult_t psdNumLayers(psdComm_t comm, int* num_layers) {
  return WithComm("psdNumLayers", comm, [&](CommState& s) -> Status {
    PSD_REQUIRE_ARG(num_layers != nullptr, "num_layers is NULL; expected an int*");
    *num_layers = static_cast<int>(s.layers.size());
    return Status::Ok();
  });
}

psdResult_t psdBuildPlan(psdComm_t comm, size_t batch) {
  return WithComm("psdBuildPlan", comm, [&](CommState& s) -> Status {
    PSD_REQUIRE_ARG(!s.layers.empty(),
                    "no layers are registered; expected psdRegisterLayer "
                    "before psdBuildPlan");
    return capi::BuildPlanLocked(s, batch);
  });
}

psdResult_t psdGetLayerStrategy(psdComm_t comm, int layer_id, psdStrategy_t* strategy) {
  return WithComm("psdGetLayerStrategy", comm, [&](CommState& s) -> Status {
    PSD_REQUIRE_ARG(strategy != nullptr, "strategy is NULL; expected a psdStrategy_t*");
    PSD_REQUIRE_ARG(layer_id >= 0 && static_cast<size_t>(layer_id) < s.layers.size(), "layer_id ",
                    layer_id, " is not registered; expected 0..",
                    static_cast<long long>(s.layers.size()) - 1);
    PSD_REQUIRE_ARG(static_cast<size_t>(layer_id) < s.strategies.size(), "layer ", layer_id, " ('",
                    s.layers[static_cast<size_t>(layer_id)].name,
                    "') has no plan yet; expected psdBuildPlan first");
    *strategy = static_cast<psdStrategy_t>(s.strategies[static_cast<size_t>(layer_id)]);
    return Status::Ok();
  });
}

psdResult_t psdGetPlan(psdComm_t comm, char* buf, size_t* size) {
  return WithComm("psdGetPlan", comm, [&](CommState& s) -> Status {
    PSD_REQUIRE_ARG(!s.plan_text.empty(), "no plan yet; expected psdBuildPlan first");
    return capi::CopyOut(s.plan_text, buf, size);
  });
}

psdResult_t psdPrintPlan(psdComm_t comm, FILE* stream) {
  return WithComm("psdPrintPlan", comm, [&](CommState& s) -> Status {
    PSD_REQUIRE_ARG(!s.plan_text.empty(), "no plan yet; expected psdBuildPlan first");
    FILE* out = stream != nullptr ? stream : stdout;
    PSD_REQUIRE(std::fputs(s.plan_text.c_str(), out) >= 0 && std::fflush(out) == 0,
                StatusCode::kBackendError, "writing the plan failed: ", std::strerror(errno));
    return Status::Ok();
  });
}

}  // extern "C"
