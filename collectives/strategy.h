// The Strategy seam: one exchange algorithm per file (allreduce.cc, ps.cc, sfb.cc, topk.cc),
// each written only against Backend and Kernels, each with its own byte and time model.
//
// A strategy is stateless; what a layer keeps between steps (top-k residual, momentum, the
// optimizer state, kernel workspace, scratch) lives in a LayerState the strategy makes with
// NewState and the caller owns. Exchange is synchronous and collective: every rank calls it for
// the same layer, in the same order.
//
// Memory: the state and scratch are StrategyBuffers allocated through the context's Kernels,
// so they live where the layer's buffers live (host memory with the CPU kernels, device memory
// with the CUDA kernels) and the same strategy code runs on both. Strategies never touch the
// bytes from the host; every access goes through a Kernels call or the Backend.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/cost_model.h"
#include "collectives/layer.h"
#include "kernels/kernels.h"
#include "runtime/backend.h"

namespace poseidon {

// The buffers of one layer for one step (host or device memory, as the collective's kind).
//  grad      n floats. Input: this rank's gradient, except for a fully connected layer given
//            as factors (u and v non-null): its gradient is then U^T V, formed here when the
//            strategy needs it dense, and grad is only an output. Output without an optimizer:
//            the gradient averaged over ranks. With an optimizer: scratch.
//  params    n floats, required with an optimizer: updated in place, identical on every rank.
//  u, v      fully connected layers: this rank's sufficient factors, batch x M and batch x N,
//            row-major; required for sfb (unless batch == 0).
//  batch     K, this rank's number of factor rows.
//  max_batch sfb: the row count every rank sends (the planned K; HybridCollective sets it). A
//            rank with a shorter batch pads with zero rows, which add exact zeros to U^T V, so
//            K may differ per rank (a short last batch) with one allgather and no extra round
//            trip. 0 means batch, which must then be the same on every rank (checked).
struct ExchangeBuffers {
  float* grad = nullptr;
  float* params = nullptr;
  const float* u = nullptr;
  const float* v = nullptr;
  size_t batch = 0;
  size_t max_batch = 0;
};

// The local checks of one submission of `layer`'s buffers, planned as `strategy`: what only the
// submitting rank can see (the engine and the backends check agreement across ranks). Run once
// per submission: by Engine::Submit (psdSubmit and the Python module go through it) or, for a
// direct caller, by HybridCollective::Exchange; the strategies do not repeat it. Refused: a
// null grad (a null params when the layer has an optimizer) for a non-empty layer; one factor
// of u, v without the other for a batch of rows; factors for a layer that is not fully
// connected; a batch without factors on such a layer; a layer planned as sfb without factors
// for a batch of rows. The message names the layer, the argument and what was expected.
Status CheckSubmission(const LayerSpec& layer, StrategyKind strategy, const ExchangeBuffers& buf);

// Everything a strategy runs on.
struct StrategyContext {
  Backend* backend = nullptr;
  const Kernels* kernels = nullptr;
  CallOptions call;  // memory kind and stream for the backend and kernels
};

// Predicted cost of one exchange of one layer.
struct CostEstimate {
  double time_s = 0;      // predicted seconds
  double bytes_sent = 0;  // wire bytes per rank (see cost_model.h)
};

// What one exchange did, for the traffic counters.
struct ExchangeReport {
  double bytes_sent = 0;         // wire bytes per rank of the collectives it ran
  bool fell_back_dense = false;  // topk ran a dense allreduce (warm-up or a small layer)
};

class LayerState {
 public:
  virtual ~LayerState() = default;
};

// A buffer a strategy keeps between steps (state) or reuses (scratch), allocated through the
// Kernels of the collective: host or device memory. Empty until Grow or Reset.
class StrategyBuffer {
 public:
  // Scratch: at least `bytes` (reallocated, zero-filled, only when it is too small; otherwise
  // the contents are whatever the last user left).
  Status Grow(const Kernels& kernels, size_t bytes);
  // State: exactly `bytes`, zero-filled when (re)made; kept as it is when already that size.
  Status Reset(const Kernels& kernels, size_t bytes);
  void* data() const { return buf_ ? buf_->data() : nullptr; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data());
  }
  size_t bytes() const { return buf_ ? buf_->bytes() : 0; }
  bool empty() const { return bytes() == 0; }
  // A host copy of the first `count` Ts (at most what the buffer holds), synchronizing the
  // stream; empty when the copy fails. For tests and tools only.
  template <typename T>
  std::vector<T> Download(const Kernels& kernels, size_t count, void* stream) const {
    std::vector<T> host(std::min(count, bytes() / sizeof(T)));
    if (!host.empty() &&
        (!kernels.Copy(host.data(), data(), host.size() * sizeof(T), stream).ok() ||
         !kernels.Synchronize(stream).ok())) {
      host.clear();
    }
    return host;
  }

 private:
  std::unique_ptr<KernelBuffer> buf_;
};

class OptimizerState;

class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual StrategyKind kind() const = 0;
  const char* name() const { return StrategyName(kind()); }

  // Predicted time and bytes per rank for `layer` (resolved), batch K per rank, P ranks.
  virtual CostEstimate Cost(const LayerSpec& layer, size_t batch, int world,
                            const CostModel& model) const = 0;

  // Makes the per-layer state (sized lazily where it depends on the step's buffers).
  virtual Result<std::unique_ptr<LayerState>> NewState(const LayerSpec& layer,
                                                       const StrategyContext& ctx) const = 0;

  // One synchronous exchange. `step` is the 0-based training step (top-k warm-up counts it).
  // The caller has checked the buffers (CheckSubmission); a strategy checks only what is its
  // own (ps: an optimizer; sfb: batch <= max_batch).
  virtual Status Exchange(const LayerSpec& layer, LayerState* state, const ExchangeBuffers& buf,
                          int64_t step, const StrategyContext& ctx,
                          ExchangeReport* report) const = 0;

  // The local tail of an exchange whose sum over ranks someone else computed (the engine's
  // fusion buffer or chunks): buf.grad holds the sum; apply the average or the optimizer step
  // exactly as Exchange would have (the buffers checked by the caller, as for Exchange). Only
  // the dense allreduce has such a tail; the others return kUnimplemented. Local: no
  // communication.
  virtual Status FinishSum(const LayerSpec& layer, LayerState* state, const ExchangeBuffers& buf,
                           const StrategyContext& ctx) const;
  // The optimizer state FinishSum steps for a layer with an optimizer (the dense allreduce's),
  // so that a caller may apply it range by range as the sum arrives; null for the others.
  virtual OptimizerState* SumOptimizer(LayerState*) const { return nullptr; }
};

// The four strategies (static instances).
const Strategy& GetStrategy(StrategyKind kind);

// Top-k state visible to tests and tools: this rank's residual and what it sent last step.
// With device memory the accessors return host copies, refreshed once after each exchange
// (the first call after an exchange copies and synchronizes the stream).
class TopkLayerState : public LayerState {
 public:
  virtual const std::vector<float>& residual() const = 0;
  virtual const std::vector<float>& momentum() const = 0;  // empty without momentum correction
  virtual const std::vector<uint32_t>& last_indices() const = 0;
  virtual const std::vector<float>& last_values() const = 0;
  virtual size_t k() const = 0;
};

// Optimizer state for a span of parameters (the full tensor, or a ps shard). Adam counts its
// own steps so bias correction never depends on the caller's step numbering. The moments live
// in StrategyBuffers (host or device memory, as the collective).
class OptimizerState {
 public:
  explicit OptimizerState(const OptimizerSpec& spec) : spec_(spec) {}
  // params[0..n) -= update from grads = grad_scale * sum_g grads[g * stride + i].
  Status Apply(float* params, const float* grads, int num_grads, size_t stride, float grad_scale,
               size_t n, const StrategyContext& ctx);
  // Apply in parts, for a sum that arrives range by range (HybridCollective::ExchangeDense):
  // Reserve the moments for n elements (may allocate: before the collective), then, once the
  // sum is final, BeginStep once and ApplyRange on every range [offset, offset + count) with
  // that range's sum: the same bits as one Apply of the whole sum.
  Status Reserve(size_t n, const StrategyContext& ctx);
  void BeginStep() { ++steps_; }
  Status ApplyRange(float* params, const float* sum, float grad_scale, size_t offset,
                    size_t count, const StrategyContext& ctx);
  // Host copies of the moments (empty before the first step); tests and tools only.
  std::vector<float> first() const;   // SGD velocity / Adam m
  std::vector<float> second() const;  // Adam v
  int64_t steps() const { return steps_; }

 private:
  // The kernel over [offset, offset + n) of params and the moments (Reserve made them).
  Status Step(float* params, const float* grads, int num_grads, size_t stride, float grad_scale,
              size_t n, const StrategyContext& ctx, size_t offset = 0);
  OptimizerSpec spec_;
  StrategyBuffer first_, second_;
  size_t n_ = 0;
  const Kernels* kernels_ = nullptr;  // those of the last Apply, for first() / second()
  void* stream_ = nullptr;
  int64_t steps_ = 0;
};

// Helpers the strategies share (collectives/common.cc).
namespace strategy_internal {
// Wire bytes and time of a dense allreduce of n floats, plus an optimizer step over n floats
// when the layer has one.
CostEstimate DenseAllReduceCost(const LayerSpec& layer, int world, const CostModel& model);
// grad <- sum over ranks, then either the optimizer step on params (fused with the 1/P scale)
// or grad *= 1/P. Used by allreduce and by topk's dense fall-back.
Status DenseAllReduce(const LayerSpec& layer, OptimizerState* opt, const ExchangeBuffers& buf,
                      const StrategyContext& ctx, ExchangeReport* report);
// Local GEMM time of forming an FC layer's dense gradient from its factors (0 otherwise): the
// price every strategy but sfb pays when the trainer hands over factors.
double FormGradientTime(const LayerSpec& layer, size_t batch, const CostModel& model);
// The four strategies (defined in their own files).
const Strategy& AllReduceStrategy();
const Strategy& PsStrategy();
const Strategy& SfbStrategy();
const Strategy& TopkStrategy();
// k = ceil(density * n) (or the layer's explicit k), at least 1 for n > 0.
size_t TopkCount(const LayerSpec& layer);
// Returns `local` (an argument error found on this rank alone) after making the peers' next
// collective fail too (Backend::FailTogether) instead of leaving them waiting for this rank.
Status FailTogether(const StrategyContext& ctx, const Status& local);
// Runs `steps`, the local work (allocation, kernels) a strategy does before its next
// collective. A failure there is this rank's alone (out of memory, a kernel error): it goes
// through FailTogether so the peers' collective fails too instead of waiting for this rank.
template <typename Steps>
Status BeforeCollective(const StrategyContext& ctx, Steps&& steps) {
  Status st = steps();
  return st.ok() ? st : FailTogether(ctx, st);
}
// For a fully connected layer given as factors only: grad = U^T V (this rank's gradient).
Status FormGradientFromFactors(const LayerSpec& layer, const ExchangeBuffers& buf,
                               const StrategyContext& ctx);
// data[i] *= scale for n floats (Kernels::Scale, on the context's stream).
Status Scale(float* data, size_t n, float scale, const StrategyContext& ctx);
// data[i] = 0 for n floats (Kernels::Fill).
Status Zero(float* data, size_t n, const StrategyContext& ctx);
// What DenseAllReduce does after the sum: the optimizer step with the 1/P average fused in,
// or grad *= 1/P. The engine calls it (through HybridCollective::FinishDenseSum) for layers it
// summed itself in a fusion buffer or in chunks.
Status FinishDenseSum(const LayerSpec& layer, OptimizerState* opt, const ExchangeBuffers& buf,
                      const StrategyContext& ctx);
}  // namespace strategy_internal

}  // namespace poseidon
