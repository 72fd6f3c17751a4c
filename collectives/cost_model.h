// CostModel: what communication and compute cost on this communicator, measured, not assumed.
//
// Communication follows the alpha-beta model with nccl-tests' "bus bytes": a collective over P
// ranks of a payload of S bytes (the full vector for allreduce / reduce-scatter, the gathered
// total for allgather) costs
//     time = steps(P) * alpha + wire_bytes(P, S) * beta
//   allreduce       steps 2(P-1)  wire 2(P-1)/P * S    (ring: reduce-scatter then allgather)
//   reduce-scatter  steps  (P-1)  wire  (P-1)/P * S
//   allgather       steps  (P-1)  wire  (P-1)/P * S
// so alpha is a per-step latency and 1/beta the bus bandwidth. wire_bytes is also what we count
// as "bytes sent per rank". With P = 1 nothing moves and the time is 0.
// Compute: GEMM flop/s, top-k selection (bytes of gradient scanned per second), scatter-add
// (bytes of (index, value) pairs per second) and the optimizer step (bytes of parameters per
// second).
//
// Probe (Measure): each collective at two payloads (4 KiB and 8 MiB), a few repetitions,
// median; alpha from the small size, beta from the difference (8 MiB so that the figure holds
// for the large layers that dominate a step: bus bandwidth falls once messages leave the
// caches); the kernels timed on typical sizes with every rank computing at once (ranks that
// share cores see contended rates). Rank 0's figures are broadcast so every rank plans from
// the same numbers (plans must agree). Cached in a text file keyed by
// Communicator::host_key(); POSEIDON_REPROBE re-measures.
//
// Across nodes with several ranks on each, the host allreduce can also run in two levels
// (runtime/hier_allreduce.h). The probe then times the allreduce both ways, flat and two-level,
// and fits each (hier_allreduce below, with the same steps and wire bytes over all P ranks):
// CollectiveTime(kAllReduce) is the cheaper of the two, and HierAllReduceFromBytes the payload
// from which the two-level form wins, which BuildPlan hands to the backend.
#pragma once

#include <string>

#include "kernels/kernels.h"
#include "runtime/communicator.h"
#include "runtime/status.h"

namespace poseidon {

enum class CollectiveKind : int { kAllReduce = 0, kReduceScatter = 1, kAllGather = 2 };
inline constexpr int kNumCollectiveKinds = 3;
// "allreduce", "reduce_scatter", "allgather".
const char* CollectiveKindName(CollectiveKind kind);

struct LinkCost {
  double alpha_s = 0;       // seconds per ring step
  double beta_s_per_b = 0;  // seconds per wire byte (1 / bus bandwidth)
};

struct CostModel {
  LinkCost link[kNumCollectiveKinds];
  // The two-level allreduce across nodes, fitted like link[kAllReduce]; alpha_s < 0: not
  // measured (one node, one rank per node, uneven nodes, or a model from elsewhere).
  LinkCost hier_allreduce{-1, 0};
  double gemm_flops = 1e10;            // flop/s of SufficientFactorGemm
  double topk_bytes_per_s = 1e9;       // gradient bytes scanned per second by FusedResidualTopK
  double scatter_bytes_per_s = 1e9;    // (index, value) pair bytes per second of ScatterAdd
  double optimizer_bytes_per_s = 1e9;  // parameter bytes per second of SgdStep / AdamStep
  std::string source = "default";      // "measured", "cache:<path>", "network", "default", ...

  // Steps and wire bytes of one collective (see the table above).
  static double Steps(CollectiveKind kind, int world);
  static double WireBytes(CollectiveKind kind, int world, double payload_bytes);
  // Predicted seconds of one collective of `payload_bytes` over `world` ranks (an allreduce:
  // the cheaper of flat and two-level when both were measured).
  double CollectiveTime(CollectiveKind kind, int world, double payload_bytes) const;
  bool has_hier() const { return hier_allreduce.alpha_s >= 0; }
  // The smallest payload in bytes at which the two-level allreduce is predicted no slower
  // than the flat one over `world` ranks: 0 when it never is (or was not measured), 1 when it
  // always is.
  long long HierAllReduceFromBytes(int world) const;
  double GemmTime(double flops) const { return flops / gemm_flops; }
  double TopkTime(double bytes) const { return bytes / topk_bytes_per_s; }
  double ScatterTime(double bytes) const { return bytes / scatter_bytes_per_s; }
  double OptimizerTime(double bytes) const { return bytes / optimizer_bytes_per_s; }

  // A network of identical links: every collective gets the same per-step latency and bus
  // bandwidth (e.g. 25e-6 s and 10 Gbit/s = 1.25e9 bytes/s). Compute rates keep the defaults.
  static CostModel Network(double latency_s, double bandwidth_bytes_per_s);
  // Zero latency, the given bandwidth everywhere, free compute: Poseidon's bytes-only view.
  static CostModel BytesOnly(double bandwidth_bytes_per_s = 1e9);

  // Checks every figure is finite, latencies >= 0, betas >= 0 and rates > 0.
  Status Validate() const;

  // Text form, one "key value" per line after a header line; Parse accepts what ToText writes
  // and names the line of any error. The two hier_allreduce figures may be missing (files
  // written before they existed): the model then has no two-level figures.
  std::string ToText(const std::string& host_key) const;
  static Result<CostModel> Parse(const std::string& text, std::string* host_key);
  // One line for logs: "allreduce 3.1us+0.41ns/B ... gemm 12.3 GF/s ...".
  std::string Summary() const;
};

struct ProbeOptions {
  int repetitions = 5;            // per size; the median is kept
  size_t small_bytes = 4096;      // payload for the latency point
  size_t large_bytes = 8u << 20;  // payload for the bandwidth point
  bool time_kernels = true;       // false: keep the default compute rates (tests)
};

// Runs the probe on `backend` (collective: every rank calls it) with `kernels`; every rank
// returns rank 0's figures.
Result<CostModel> MeasureCostModel(Backend& backend, const Kernels& kernels,
                                   const ProbeOptions& options = {});

// The cache file: POSEIDON_COST_CACHE when set, else $HOME/.cache/poseidon/cost-<key>.txt.
std::string CostCachePath(const std::string& host_key);

// Loads the model from the cache (rank 0 reads; the decision and the figures are broadcast),
// or measures and writes it (rank 0) when the cache is missing, unreadable, holds another
// host_key, or POSEIDON_REPROBE is set. Collective over the communicator.
Result<CostModel> LoadOrMeasureCostModel(Communicator& comm, const Kernels& kernels,
                                         const ProbeOptions& options = {});

}  // namespace poseidon
