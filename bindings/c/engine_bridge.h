// The C API's link to the background engine: psdSubmit -> Engine::TrySubmit -> a psdHandle_t
// whose psdWait / psdTest map to the engine handle's Wait(timeout) / Test() (the timeout rule:
// binding_support.h). Internal to bindings/c.
#pragma once

#include <memory>

#include "bindings/c/registry.h"
#include "collectives/strategy.h"
#include "runtime/status.h"

namespace poseidon::capi {

struct HandleState;  // defined in engine_bridge.cc

class EngineBridge {
 public:
  // Starts the engine over the communicator's hybrid collective (planned). Collective.
  static Result<std::unique_ptr<EngineBridge>> Start(CommState& state);
  virtual ~EngineBridge() = default;
  // Drains or fails what is pending and stops the engine thread; the hybrid collective is the
  // communicator's again afterwards.
  virtual Status Stop() = 0;
  // The engine's sticky failure: OK while healthy and after a clean stop, whether our own Stop
  // or a peer's (its re-plan or destroy reaches this engine as a shutdown); the failure
  // otherwise. Local.
  virtual Status Health() = 0;
  // A local error found before the engine saw the call (an argument the C layer or a binding
  // refused): fails the engine on every rank within a cycle, the message naming this rank,
  // instead of leaving the peers waiting for a submission that never comes.
  virtual void ReportError(const Status& error) = 0;
};

}  // namespace poseidon::capi
