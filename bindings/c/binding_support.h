// What the C layer shares with the bindings built on the C API (the Python module,
// bindings/python), beside the public poseidon.h. Not installed; the only bindings/c header the
// Python module includes (registry.h, engine_bridge.h and the others are bindings/c's own).
//
// A binding checks what the C API cannot see (an array's dtype, layout or size) before calling
// it; an argument it refuses on one rank must still fail the peers, which would otherwise wait
// for this rank in the call. FailBlockingCollective and FailSubmit below do that through the C
// layer's own plumbing, and record the message as the C call's error. A binding's own terms of
// a call (an op it applies on top of the sum) travel as a detail the ranks compare.
#pragma once

#include <string>

#include "bindings/c/poseidon.h"

namespace poseidon::capi {

// An argument error found before a blocking collective (e.g. two arrays of different sizes)
// joins the peers' argument agreement in the backend call `backend_call` ("AllReduce", ...), so
// the peers fail with a message naming this rank instead of waiting. Returns psdInvalidArgument
// with "<c_call>: <message>" recorded (poseidon.cc).
psdResult_t FailBlockingCollective(psdComm_t handle, const char* c_call, const char* backend_call,
                                   const std::string& message);

// The same for psdSubmit (engine_bridge.cc): an argument error found before psdSubmit (e.g. an
// array of the wrong dtype) fails the communicator's engine on every rank, the message naming
// this rank, so the peers do not wait for this submission. Returns psdInvalidArgument with
// "psdSubmit: <message>" recorded.
psdResult_t FailSubmit(psdComm_t handle, const std::string& message);

// psdAllReduce, psdReduceScatter, psdAllGather and psdBroadcast with CallOptions::detail: the
// binding's own terms of the call beyond its buffers (e.g. "op average, prescale_factor 1.0,
// postscale_factor 1.0" when it averages the sum itself, or the name a caller gave the tensor,
// since calls match by their order on each rank), compared across ranks
// like the count: a rank whose detail differs fails every rank with psdMismatch naming each
// rank's text. Null or "" for none.
psdResult_t AllReduce(psdComm_t comm, const void* send, void* recv, size_t count,
                      psdDataType_t dtype, psdMemory_t memory, void* stream, const char* detail);
psdResult_t ReduceScatter(psdComm_t comm, const void* send, void* recv, size_t recv_count,
                          psdDataType_t dtype, psdMemory_t memory, void* stream,
                          const char* detail);
psdResult_t AllGather(psdComm_t comm, const void* send, void* recv, size_t send_count,
                      psdDataType_t dtype, psdMemory_t memory, void* stream, const char* detail);
psdResult_t Broadcast(psdComm_t comm, void* buf, size_t count, psdDataType_t dtype, int root,
                      psdMemory_t memory, void* stream, const char* detail);

// psdWait's timeout rule: negative, or beyond kWaitForeverMs (10^7 s: a duration that large
// overflows the clock's arithmetic and would time out at once), waits for ever. WaitSeconds
// gives Handle::Wait's seconds (-1: for ever).
inline constexpr long long kWaitForeverMs = 10'000'000'000LL;
inline double WaitSeconds(long long timeout_ms) {
  if (timeout_ms < 0 || timeout_ms > kWaitForeverMs) return -1.0;
  return static_cast<double>(timeout_ms) / 1000.0;
}

}  // namespace poseidon::capi
