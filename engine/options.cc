#include "engine/options.h"

#include <cmath>

#include "runtime/settings.h"

namespace poseidon {

Result<EngineOptions> EngineOptions::FromSettings() {
  PSD_CHECK(Settings::Global().Validate());
  EngineOptions o;
  o.fusion_bytes = settings::FusionBytes();
  o.chunk_bytes = settings::ChunkBytes();
  o.stall_warn_s = settings::StallWarnS();
  o.stall_abort_s = settings::StallAbortS();
  o.cycle_us = settings::CycleUs();
  o.fusion_wait_us = settings::FusionWaitUs();
  o.slice_bytes = settings::SliceBytes();
  o.pipeline_negotiation = settings::PipelineNegotiation();
  o.response_cache = settings::ResponseCache();
  o.peer_timeout_s = settings::PeerTimeoutS();
  o.peer_lost_abort = settings::PeerLostAbort();
  o.peer_lost_grace_s = settings::PeerLostGraceS();
  o.timeline = settings::Timeline();
  PSD_CHECK(o.Validate());
  return o;
}

Status EngineOptions::Validate() const {
  PSD_REQUIRE_ARG(fusion_bytes >= 0, "Engine: POSEIDON_FUSION_BYTES=", fusion_bytes,
                  "; expected >= 0 (0 disables fusion)");
  PSD_REQUIRE_ARG(chunk_bytes >= 0, "Engine: POSEIDON_CHUNK_BYTES=", chunk_bytes,
                  "; expected >= 0 (0 disables chunking)");
  auto seconds = [](double v) { return std::isfinite(v) && v >= 0; };
  PSD_REQUIRE_ARG(seconds(stall_warn_s), "Engine: POSEIDON_STALL_WARN_S=", stall_warn_s,
                  "; expected a finite number of seconds >= 0 (0 disables the warning)");
  PSD_REQUIRE_ARG(seconds(stall_abort_s), "Engine: POSEIDON_STALL_ABORT_S=", stall_abort_s,
                  "; expected a finite number of seconds >= 0 (0 disables the abort)");
  PSD_REQUIRE_ARG(seconds(peer_timeout_s), "Engine: POSEIDON_PEER_TIMEOUT_S=", peer_timeout_s,
                  "; expected a finite number of seconds >= 0 (0 disables heartbeats)");
  PSD_REQUIRE_ARG(seconds(peer_lost_grace_s), "Engine: POSEIDON_PEER_LOST_GRACE_S=",
                  peer_lost_grace_s, "; expected a finite number of seconds >= 0");
  PSD_REQUIRE_ARG(cycle_us >= 1 && cycle_us <= 1000000, "Engine: POSEIDON_CYCLE_US=", cycle_us,
                  "; expected 1 to 1000000 microseconds");
  PSD_REQUIRE_ARG(fusion_wait_us >= 0 && fusion_wait_us <= 1000000,
                  "Engine: POSEIDON_FUSION_WAIT_US=", fusion_wait_us,
                  "; expected 0 to 1000000 microseconds (0 negotiates at once)");
  PSD_REQUIRE_ARG(slice_bytes >= 0, "Engine: POSEIDON_SLICE_BYTES=", slice_bytes,
                  "; expected >= 0 (0 runs whole layers every cycle)");
  PSD_REQUIRE_ARG(memory == MemoryKind::kHost || memory == MemoryKind::kDevice,
                  "Engine: memory kind ", static_cast<int>(memory), "; expected host or device");
  return Status::Ok();
}

std::vector<std::pair<std::string, std::string>> EngineOptions::Shaping() const {
  return {
      {"POSEIDON_FUSION_BYTES", StrCat(fusion_bytes)},
      {"POSEIDON_CHUNK_BYTES", StrCat(chunk_bytes)},
      {"POSEIDON_SLICE_BYTES", StrCat(slice_bytes)},
      {"POSEIDON_PIPELINE_NEGOTIATION", StrCat(pipeline_negotiation)},
      {"POSEIDON_RESPONSE_CACHE", StrCat(response_cache)},
      {"POSEIDON_PEER_TIMEOUT_S", StrCat(peer_timeout_s)},
      {"engine memory kind", MemoryKindName(memory)},
  };
}

}  // namespace poseidon
