// The C API's link to the background engine: psdSubmit -> Engine::Submit -> a psdHandle_t whose
// psdWait / psdTest map to the engine handle's Wait(timeout) / Test(). Internal.
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
  // The engine's sticky failure (OK while healthy or after our own clean Stop).
  virtual Status Health() const = 0;
};

}  // namespace poseidon::capi
