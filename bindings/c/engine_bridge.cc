// psdSubmit / psdWait / psdTest / psdHandleFree over the background engine.
//
//   psdBuildPlan -> EngineBridge::Start: Engine::Create(exchange communicator, hybrid) (collective)
//   psdSubmit    -> Engine::TrySubmit, which checks the arguments (layer id, buffers, factors)
//                   and fails every rank on a refusal -> a psdHandle_t (a registry number mapped
//                   to the engine's Handle); the layer's step is counted here
//   psdWait      -> Handle::Wait(timeout) ; psdTest -> Handle::Test / status
//   what only the C layer can refuse (a NULL handle pointer, no current plan) and a binding's
//   refusal (FailSubmit) -> Engine::ReportError, so every rank fails
//   failures of submitted exchanges set the communicator's sticky asynchronous error (through
//   the completion callback); a clean stop never does, whichever rank started it (below).
//
// Clean stops. A re-plan or a destroy stops the engine with Engine::Shutdown, which is
// collective: the first rank to get there makes every engine fail what is pending with kAborted
// ("shut down on some rank") and stop, before the other ranks have called Stop themselves. On
// those ranks that abort is not a failure either, but a kAborted status alone cannot tell it from
// a real abort (an aborted NCCL communicator), so aborts never set the sticky error through the
// callback; the engine tells them apart once its thread has stopped (Shutdown returns OK after a
// clean shutdown, the failure otherwise), and Health / Stop ask it then.
#include "bindings/c/engine_bridge.h"

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"

namespace poseidon::capi {

struct HandleState {
  HandlePtr handle;
  uint64_t comm_id = 0;  // to record failures on the communicator while it lives
  std::string layer_name;
};

namespace {

class EngineBridgeImpl : public EngineBridge {
 public:
  EngineBridgeImpl(CommState* state, std::unique_ptr<Engine> engine)
      : state_(state), engine_(std::move(engine)), steps_(state->layers.size(), 0) {}

  ~EngineBridgeImpl() override {
    // Stop normally runs first (DestroyState / BuildPlanLocked); this covers error paths.
    stopping_.store(true);
    engine_.reset();
  }

  Status Stop() override {
    stopping_.store(true);
    // OK after a clean shutdown (ours, or a peer's that stopped this engine first).
    Status s = engine_->Shutdown();
    state_->SetAsyncError(s);
    return s;
  }

  Status Health() override {
    if (stopping_.load()) return Status::Ok();
    Status s = engine_->status();
    if (s.code() != StatusCode::kAborted) return s;
    // A clean shutdown started by a peer, or a real abort (see the top of the file). The engine
    // thread stops right after failing; once it has, Shutdown is local (no round with the
    // peers) and tells which. Wait for that a few milliseconds at most, never for a peer.
    for (int i = 0; i < 20 && engine_->running(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (engine_->running()) return Status::Ok();  // not decided yet: asked again next time
    return engine_->Shutdown();
  }

  void ReportError(const Status& error) override { engine_->ReportError(error); }

  // The engine checks the layer id (a bad one gets step 0 and is refused there) and the
  // buffers; a refused submission does not count as a step.
  Result<HandlePtr> Submit(int layer, const Gradient& g) {
    const bool known = layer >= 0 && static_cast<size_t>(layer) < steps_.size();
    const int64_t step = known ? steps_[static_cast<size_t>(layer)] : 0;
    CommState* state = state_;
    const std::atomic<bool>* stopping = &stopping_;
    // The callback runs on the engine thread; the CommState outlives the engine (Stop runs
    // before the state is freed), so the raw pointer is safe. Aborts are left to Health / Stop,
    // which tell a clean shutdown on some rank from a failure.
    PSD_ASSIGN_OR_RETURN(
        HandlePtr h,
        engine_->TrySubmit("psdSubmit", layer, g, step, [state, stopping](const Status& s) {
          if (!s.ok() && s.code() != StatusCode::kAborted && !stopping->load()) {
            state->SetAsyncError(s);
          }
        }));
    ++steps_[static_cast<size_t>(layer)];
    return h;
  }

 private:
  CommState* state_;
  std::unique_ptr<Engine> engine_;
  std::vector<int64_t> steps_;  // per layer: submissions so far (the engine's step)
  std::atomic<bool> stopping_{false};
};

// What only the C layer can refuse: the handle pointer, and a plan that covers the layers
// registered (the engine runs the plan's layers; it checks the rest).
Status CheckSubmit(const CommState& s, psdHandle_t* handle) {
  PSD_REQUIRE_ARG(handle != nullptr, "handle is NULL; expected a psdHandle_t*");
  PSD_REQUIRE_ARG(s.engine != nullptr && s.strategies.size() == s.layers.size(), "no current plan ",
                  "(layers were registered after the last psdBuildPlan, or none was built); ",
                  "expected psdBuildPlan first");
  return Status::Ok();
}

// Fails the engine on every rank (when there is one) with a submission refused before it saw
// the call: the other ranks would wait for it until the stall abort otherwise.
Status Refuse(CommState& s, const Status& bad) {
  if (s.engine) s.engine->ReportError(bad.WithPrefix("psdSubmit: "));
  return bad;
}

}  // namespace

Result<std::unique_ptr<EngineBridge>> EngineBridge::Start(CommState& state) {
  PSD_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                       Engine::Create(state.exchange_comm, state.hybrid.get()));
  return std::unique_ptr<EngineBridge>(new EngineBridgeImpl(&state, std::move(engine)));
}

namespace {

// Looks a psdHandle_t up; records a failure on the thread and (while it lives) the
// communicator the handle came from.
psdResult_t WithHandle(const char* call, psdHandle_t handle,
                       const std::function<Status(HandleState&)>& body) {
  std::shared_ptr<HandleState> h;
  try {
    if (handle == nullptr) {
      return Fail(call, nullptr,
                  InvalidArgument("handle is NULL; expected a handle from "
                                  "psdSubmit"));
    }
    h = Registry::Get().FindHandle(handle);
    if (h == nullptr) {
      return Fail(call, nullptr,
                  InvalidArgument("handle ", static_cast<const void*>(handle),
                                  " is not a live handle (freed, or never returned by "
                                  "psdSubmit)"));
    }
    Status s = body(*h);
    if (s.ok()) return psdSuccess;
    std::shared_ptr<CommState> comm = Registry::Get().FindComm(HandleOf<psdComm_t>(h->comm_id));
    return Fail(call, comm.get(), s);
  } catch (const std::exception& e) {
    return Fail(call, nullptr, InternalError("unexpected C++ exception: ", e.what()));
  } catch (...) {
    return Fail(call, nullptr, InternalError("unexpected non-standard C++ exception"));
  }
}

}  // namespace

psdResult_t FailSubmit(psdComm_t handle, const std::string& message) {
  return WithComm("psdSubmit", handle,
                  [&](CommState& s) -> Status { return Refuse(s, InvalidArgument(message)); });
}

}  // namespace poseidon::capi

using namespace poseidon;  // NOLINT

extern "C" {

psdResult_t psdSubmit(psdComm_t comm, int layer_id, float* grad, float* params, const float* u,
                      const float* v, size_t batch, psdHandle_t* handle) {
  if (handle != nullptr) *handle = nullptr;
  return capi::WithComm("psdSubmit", comm, [&](capi::CommState& s) -> Status {
    if (Status bad = capi::CheckSubmit(s, handle); !bad.ok()) return capi::Refuse(s, bad);
    auto* bridge = static_cast<capi::EngineBridgeImpl*>(s.engine.get());
    // A bad layer id is the engine's to refuse (a count of 0 goes with it).
    const bool known = layer_id >= 0 && static_cast<size_t>(layer_id) < s.layers.size();
    Gradient g;
    g.data = grad;
    g.count = known ? s.layers[static_cast<size_t>(layer_id)].NumElements() : 0;
    g.params = params;
    g.u = u;
    g.v = v;
    g.batch = batch;
    PSD_ASSIGN_OR_RETURN(HandlePtr engine_handle, bridge->Submit(layer_id, g));
    auto state = std::make_shared<capi::HandleState>();
    state->handle = std::move(engine_handle);
    state->comm_id = s.id;
    state->layer_name = s.layers[static_cast<size_t>(layer_id)].name;
    uint64_t id = capi::Registry::Get().NextId();
    capi::Registry::Get().AddHandle(id, std::move(state));
    *handle = capi::HandleOf<psdHandle_t>(id);
    return Status::Ok();
  });
}

psdResult_t psdWait(psdHandle_t handle, long long timeout_ms) {
  return capi::WithHandle("psdWait", handle, [&](capi::HandleState& h) -> Status {
    if (timeout_ms == 0) {
      if (!h.handle->Test()) {
        return TimeoutError("layer '", h.layer_name, "' step ", h.handle->step(),
                            " has not completed (timeout 0 ms)");
      }
      return h.handle->status();
    }
    // LLONG_MAX ms as a clock duration overflows and would time out at once: a timeout that
    // large means "for ever".
    return h.handle->Wait(capi::WaitSeconds(timeout_ms));
  });
}

psdResult_t psdTest(psdHandle_t handle, int* done) {
  if (done != nullptr) *done = 0;
  return capi::WithHandle("psdTest", handle, [&](capi::HandleState& h) -> Status {
    PSD_REQUIRE_ARG(done != nullptr, "done is NULL; expected an int*");
    if (!h.handle->Test()) return Status::Ok();
    *done = 1;
    return h.handle->status();
  });
}

psdResult_t psdHandleFree(psdHandle_t handle) {
  if (handle == nullptr) return psdSuccess;
  return capi::Guard("psdHandleFree", [&]() -> Status {
    // Dropping our reference detaches a running exchange: the engine keeps its own.
    PSD_REQUIRE_ARG(capi::Registry::Get().RemoveHandle(handle) != nullptr, "handle ",
                    static_cast<const void*>(handle),
                    " is not a live handle (freed twice, or never returned by psdSubmit)");
    return Status::Ok();
  });
}

}  // extern "C"
