// A multi-layer perceptron written over BLAS, shaped for per-layer gradient exchange.
//
// Layer l is fully connected, in_l -> out_l, with weights W_l (out_l x in_l, row-major) and
// bias b_l; hidden layers apply ReLU, the last layer's outputs are logits for a softmax
// cross-entropy loss averaged over the batch.
//
// Forward on a batch X (K rows):   A_0 = X;  Z_l = A_l W_l^T + b_l;  A_{l+1} = relu(Z_l)
//                                  (the last Z is the logits, no ReLU).
// Backward:                        U_L-1 = (softmax(Z) - onehot(y)) / K
//                                  dW_l = U_l^T A_l   (one GEMM: U_l is K x out, A_l is K x in)
//                                  db_l = column sums of U_l
//                                  U_{l-1} = (U_l W_l) * [A_l > 0]
// So each layer's weight gradient is the product of its sufficient factors U_l (K x M, the
// output-gradient rows) and V_l = A_l (K x N, the input rows). Both stay available after
// ForwardBackward for the sufficient-factor exchange.
//
// All parameters live in one flat buffer [W_0, b_0, W_1, b_1, ...] and all gradients in a
// second buffer with the same layout, so the whole gradient can be allreduced as one fused
// buffer, or layer by layer through the offsets in LayerInfo.
//
// Layer-by-layer exchange (wait-free backprop) goes through StepHooks: after_backward(l) hands
// layer l to an exchange as soon as its backward step is done, and before_forward(l) waits for
// that exchange before the next step reads layer l's parameters. The training scratch (the
// factors) alternates between two slots by step, so the factors handed out at step t stay intact
// while step t+1 runs; step t+2 reuses them only after every before_forward of step t+1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/status.h"

namespace poseidon::mlp {

struct LayerInfo {
  int in = 0;           // N: inputs per row
  int out = 0;          // M: outputs per row
  size_t w_offset = 0;  // W_l in params()/grads(): out x in floats
  size_t b_offset = 0;  // b_l: out floats, right after W_l
  size_t count() const { return static_cast<size_t>(in) * out + out; }  // W and b together
};

// Per-layer callbacks of one training step (either may be empty). A failing hook stops the step
// and its status is returned by ForwardBackward.
//  before_forward(l): called for l = 0, 1, ... before the forward pass reads layer l's
//                     parameters. An exchange that updates them must be complete on return.
//  after_backward(l): called for l = L-1, ..., 0 once layer l's gradient span (W_l and b_l) and
//                     its factors U_l, V_l are final and the backward pass no longer reads
//                     layer l's parameters. Until before_forward(l) of the next step, the model
//                     neither reads nor writes layer l's parameters or gradient span, nor the
//                     factors handed out, so an exchange may use them in the meantime.
struct StepHooks {
  std::function<Status(int layer)> before_forward;
  std::function<Status(int layer)> after_backward;
};

// Loss and accuracy of a batch or a data set.
struct EvalResult {
  double loss_sum = 0;  // sum over samples of the cross-entropy (natural log)
  int64_t correct = 0;  // samples whose arg-max logit equals the label
  int64_t count = 0;
};

class Mlp {
 public:
  // widths = {inputs, hidden..., classes}: at least two entries, each >= 1 (classes >= 2).
  // Weights ~ N(0, 2 / fan_in) (He), biases 0, drawn from seed only, so every rank that uses
  // the same seed builds bit-identical parameters.
  static Result<Mlp> Create(const std::vector<int>& widths, uint64_t seed);

  Mlp(Mlp&&) = default;
  Mlp& operator=(Mlp&&) = default;
  Mlp(const Mlp&) = delete;
  Mlp& operator=(const Mlp&) = delete;

  int num_layers() const { return static_cast<int>(layers_.size()); }
  const LayerInfo& layer(int l) const { return layers_[l]; }
  const std::vector<int>& widths() const { return widths_; }
  int inputs() const { return widths_.front(); }
  int classes() const { return widths_.back(); }
  // "64-128-64-10 (17,226 parameters)".
  std::string Describe() const;

  size_t num_params() const { return params_.size(); }
  float* params() { return params_.data(); }
  const float* params() const { return params_.data(); }
  float* grads() { return grads_.data(); }
  const float* grads() const { return grads_.data(); }

  // Forward and backward on k rows of x (k x inputs()) with labels y (each in [0, classes())).
  // Overwrites grads() with the gradient of the mean loss; adds this batch's loss and accuracy
  // to *stats when it is not null. With hooks, calls them as StepHooks describes.
  Status ForwardBackward(const float* x, const int32_t* y, int k, EvalResult* stats,
                         const StepHooks* hooks = nullptr);

  // Whether ForwardBackward forms layer l's dense weight gradient dW_l = U^T V (default true).
  // An exchange that sends the factors instead (sufficient-factor broadcasting) rebuilds dW from
  // every rank's factors, so the local GEMM would be wasted; the W_l span of grads() is then
  // left as it was. Biases are always formed. Out-of-range l is ignored.
  void set_form_weight_grad(int l, bool form);
  bool form_weight_grad(int l) const { return form_weight_grad_[l]; }

  // Sufficient factors of layer l from the last ForwardBackward (batch rows = batch_rows()):
  // U (K x out) and V (K x in), row-major, with dW_l = U^T V exactly as computed.
  const float* factor_u(int l) const { return grad_out_[slot_][l].data(); }
  const float* factor_v(int l) const { return acts_[slot_][l].data(); }
  int batch_rows() const { return batch_rows_; }

  // Loss and accuracy over n rows, in chunks; leaves the training factors untouched.
  Result<EvalResult> Evaluate(const float* x, const int32_t* y, size_t n) const;

 private:
  Mlp() = default;
  // Runs the forward pass on k rows into acts (acts[l] is layer l's input; acts[L] the logits),
  // calling hooks->before_forward(l) before layer l's parameters are read.
  Status Forward(const float* x, int k, std::vector<std::vector<float>>* acts,
                 const StepHooks* hooks) const;
  Status CheckBatch(const char* call, const float* x, const int32_t* y, size_t k) const;

  std::vector<int> widths_;
  std::vector<LayerInfo> layers_;
  std::vector<float> params_;
  std::vector<float> grads_;
  std::vector<bool> form_weight_grad_;  // per layer
  // Scratch of the training batches, two slots used by alternate steps (see StepHooks).
  int batch_rows_ = 0;
  int slot_ = 0;                                 // the slot of the last ForwardBackward
  std::vector<std::vector<float>> acts_[2];      // L + 1 entries: each layer's input, then logits
  std::vector<std::vector<float>> grad_out_[2];  // L entries: U_l = dLoss / dZ_l
  std::vector<float> grad_in_;                   // U_l W_l before the ReLU mask
};

// SGD with momentum (the form PyTorch uses): v = momentum * v + g;  w -= lr * v.
class SgdMomentum {
 public:
  // lr > 0 and finite; momentum in [0, 1).
  static Result<SgdMomentum> Create(size_t num_params, double lr, double momentum);
  // n must equal num_params.
  Status Step(float* params, const float* grads, size_t n);
  double lr() const { return lr_; }
  double momentum() const { return momentum_; }

 private:
  SgdMomentum() = default;
  float lr_ = 0, momentum_ = 0;
  std::vector<float> velocity_;
};

// FNV-1a 64-bit hash of bytes: equal parameter bytes give equal hashes on every rank.
uint64_t HashBytes(const void* data, size_t bytes);

}  // namespace poseidon::mlp
