// EngineOptions: the settings of one engine (FromSettings reads the POSEIDON_* values).
#pragma once

#include <string>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/status.h"

namespace poseidon {

struct EngineOptions {
  long long fusion_bytes = 4 << 20;       // POSEIDON_FUSION_BYTES (0: no fusion)
  long long chunk_bytes = 16 << 20;       // POSEIDON_CHUNK_BYTES (0: no chunking)
  double stall_warn_s = 60;               // POSEIDON_STALL_WARN_S (0: never warn)
  double stall_abort_s = 300;             // POSEIDON_STALL_ABORT_S (0: never abort)
  long long cycle_us = 1000;              // POSEIDON_CYCLE_US
  long long fusion_wait_us = 200;         // POSEIDON_FUSION_WAIT_US (0: negotiate at once)
  long long slice_bytes = 1 << 20;        // POSEIDON_SLICE_BYTES (0: whole layers per cycle)
  bool pipeline_negotiation = true;       // POSEIDON_PIPELINE_NEGOTIATION
  bool response_cache = true;             // POSEIDON_RESPONSE_CACHE
  double peer_timeout_s = 60;             // POSEIDON_PEER_TIMEOUT_S (0: no heartbeats)
  bool peer_lost_abort = true;            // POSEIDON_PEER_LOST_ABORT
  double peer_lost_grace_s = 2;           // POSEIDON_PEER_LOST_GRACE_S
  std::string timeline;                   // POSEIDON_TIMELINE ("" = off)
  MemoryKind memory = MemoryKind::kHost;  // where the submitted buffers live (as the collective)

  static Result<EngineOptions> FromSettings();
  // Ranges: bytes >= 0, seconds finite and >= 0, cycle in [1, 1000000] us, fusion wait in
  // [0, 1000000] us.
  Status Validate() const;
  // The options that decide which collectives a rank issues, as (setting name, value) text:
  // Engine::Create agrees on them across ranks (a difference fails creation everywhere).
  std::vector<std::pair<std::string, std::string>> Shaping() const;
};

}  // namespace poseidon
