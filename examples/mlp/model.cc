#include "examples/mlp/model.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "examples/mlp/data.h"
#include "runtime/hash.h"

namespace poseidon::mlp {
namespace {

// Writes the mean-loss gradient of softmax cross-entropy into u (k x c) and adds the batch's
// loss and accuracy to *stats. Uses log-sum-exp with the row maximum subtracted, so large
// logits cannot overflow.
void SoftmaxCrossEntropy(const float* logits, const int32_t* y, int k, int c, float* u,
                         EvalResult* stats) {
  const float inv_k = 1.0f / static_cast<float>(k);
  for (int i = 0; i < k; ++i) {
    const float* z = logits + static_cast<size_t>(i) * c;
    int arg = 0;
    for (int j = 1; j < c; ++j) {
      if (z[j] > z[arg]) arg = j;
    }
    double sum = 0;
    for (int j = 0; j < c; ++j) sum += std::exp(static_cast<double>(z[j] - z[arg]));
    const double lse = static_cast<double>(z[arg]) + std::log(sum);
    if (stats != nullptr) {
      stats->loss_sum += lse - z[y[i]];
      stats->correct += arg == y[i] ? 1 : 0;
      stats->count += 1;
    }
    if (u != nullptr) {
      float* g = u + static_cast<size_t>(i) * c;
      for (int j = 0; j < c; ++j) {
        const double p = std::exp(static_cast<double>(z[j]) - lse);
        g[j] = static_cast<float>(p - (j == y[i] ? 1.0 : 0.0)) * inv_k;
      }
    }
  }
}

}  // namespace

Result<Mlp> Mlp::Create(const std::vector<int>& widths, uint64_t seed) {
  PSD_REQUIRE_ARG(widths.size() >= 2, "Mlp::Create: ", widths.size(),
                  " widths given; expected at least 2 (inputs and classes)");
  for (size_t i = 0; i < widths.size(); ++i) {
    PSD_REQUIRE_ARG(widths[i] >= 1, "Mlp::Create: width ", i, " is ", widths[i], "; expected >= 1");
  }
  PSD_REQUIRE_ARG(widths.back() >= 2, "Mlp::Create: ", widths.back(), " classes; expected >= 2");
  Mlp m;
  m.widths_ = widths;
  size_t offset = 0;
  for (size_t l = 0; l + 1 < widths.size(); ++l) {
    LayerInfo info;
    info.in = widths[l];
    info.out = widths[l + 1];
    info.w_offset = offset;
    info.b_offset = offset + static_cast<size_t>(info.in) * info.out;
    offset += info.count();
    m.layers_.push_back(info);
  }
  m.params_.assign(offset, 0.0f);
  m.grads_.assign(offset, 0.0f);
  // He initialisation suits ReLU: it keeps the activations' variance about constant by depth.
  Rng rng(MixSeed(seed, 0x6d6c70 /* "mlp" */, 0));
  for (const LayerInfo& info : m.layers_) {
    const double scale = std::sqrt(2.0 / info.in);
    float* w = &m.params_[info.w_offset];
    for (size_t i = 0; i < static_cast<size_t>(info.in) * info.out; ++i) {
      w[i] = static_cast<float>(scale * rng.Normal());
    }
  }
  m.form_weight_grad_.assign(m.layers_.size(), true);
  for (int slot = 0; slot < 2; ++slot) {
    m.acts_[slot].resize(m.layers_.size() + 1);
    m.grad_out_[slot].resize(m.layers_.size());
  }
  return m;
}

std::string Mlp::Describe() const {
  std::string s;
  for (size_t i = 0; i < widths_.size(); ++i) s += (i ? "-" : "") + std::to_string(widths_[i]);
  return StrCat(s, " (", params_.size(), " parameters, ", layers_.size(), " layers)");
}

Status Mlp::CheckBatch(const char* call, const float* x, const int32_t* y, size_t k) const {
  PSD_REQUIRE_ARG(k == 0 || (x != nullptr && y != nullptr), call,
                  ": x or y is null for a batch of ", k, " rows");
  for (size_t i = 0; i < k; ++i) {
    PSD_REQUIRE_ARG(y[i] >= 0 && y[i] < classes(), call, ": label of row ", i, " is ", y[i],
                    "; expected a class in [0, ", classes(), ")");
  }
  return Status::Ok();
}

void Mlp::set_form_weight_grad(int l, bool form) {
  if (l >= 0 && l < num_layers()) form_weight_grad_[l] = form;
}

Status Mlp::Forward(const float* x, int k, std::vector<std::vector<float>>* acts,
                    const StepHooks* hooks) const {
  const int num = num_layers();
  acts->resize(num + 1);
  (*acts)[0].assign(x, x + static_cast<size_t>(k) * inputs());
  for (int l = 0; l < num; ++l) {
    if (hooks != nullptr && hooks->before_forward) PSD_CHECK(hooks->before_forward(l));
    const LayerInfo& info = layers_[l];
    const float* a = (*acts)[l].data();
    std::vector<float>& z = (*acts)[l + 1];
    z.resize(static_cast<size_t>(k) * info.out);
    // Start every row from the bias, then Z += A W^T (beta = 1).
    const float* b = &params_[info.b_offset];
    for (int i = 0; i < k; ++i)
      std::memcpy(&z[static_cast<size_t>(i) * info.out], b, sizeof(float) * info.out);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, k, info.out, info.in, 1.0f, a, info.in,
                &params_[info.w_offset], info.in, 1.0f, z.data(), info.out);
    if (l + 1 < num) {
      for (float& v : z) v = v > 0.0f ? v : 0.0f;
    }
  }
  return Status::Ok();
}

Status Mlp::ForwardBackward(const float* x, const int32_t* y, int k, EvalResult* stats,
                            const StepHooks* hooks) {
  PSD_REQUIRE_ARG(k >= 1, "Mlp::ForwardBackward: batch of ", k, " rows; expected >= 1");
  PSD_CHECK(CheckBatch("Mlp::ForwardBackward", x, y, static_cast<size_t>(k)));
  // The other slot: the previous step's factors may still be in an exchange (see StepHooks).
  slot_ ^= 1;
  std::vector<std::vector<float>>& acts = acts_[slot_];
  std::vector<std::vector<float>>& grad_out = grad_out_[slot_];
  batch_rows_ = k;
  PSD_CHECK(Forward(x, k, &acts, hooks));
  const int num = num_layers();
  grad_out[num - 1].resize(static_cast<size_t>(k) * classes());
  SoftmaxCrossEntropy(acts[num].data(), y, k, classes(), grad_out[num - 1].data(), stats);

  for (int l = num - 1; l >= 0; --l) {
    const LayerInfo& info = layers_[l];
    const float* u = grad_out[l].data();  // K x out
    const float* v = acts[l].data();      // K x in
    if (form_weight_grad_[l]) {
      // dW = U^T V: (out x K) (K x in).
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, info.out, info.in, k, 1.0f, u, info.out,
                  v, info.in, 0.0f, &grads_[info.w_offset], info.in);
    }
    float* db = &grads_[info.b_offset];
    std::fill(db, db + info.out, 0.0f);
    for (int i = 0; i < k; ++i) {
      const float* row = u + static_cast<size_t>(i) * info.out;
      for (int j = 0; j < info.out; ++j) db[j] += row[j];
    }
    if (l > 0) {  // no gradient needed for the data
      // U_{l-1} = (U_l W_l) masked by where the ReLU was active (A_l > 0).
      std::vector<float>& prev = grad_out[l - 1];
      prev.resize(static_cast<size_t>(k) * info.in);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, k, info.in, info.out, 1.0f, u,
                  info.out, &params_[info.w_offset], info.in, 0.0f, prev.data(), info.in);
      // A select, not a branch: which units are active is data, about half of them, so a
      // branch here mispredicts on every other element (it took most of this function's time).
      float* p = prev.data();
      for (size_t i = 0; i < prev.size(); ++i) p[i] = v[i] > 0.0f ? p[i] : 0.0f;
    }
    // Layer l is done: nothing below reads its parameters, gradient span or factors.
    if (hooks != nullptr && hooks->after_backward) PSD_CHECK(hooks->after_backward(l));
  }
  return Status::Ok();
}

Result<EvalResult> Mlp::Evaluate(const float* x, const int32_t* y, size_t n) const {
  PSD_CHECK(CheckBatch("Mlp::Evaluate", x, y, n));
  constexpr size_t kChunk = 512;
  EvalResult r;
  std::vector<std::vector<float>> acts;
  for (size_t start = 0; start < n; start += kChunk) {
    const int k = static_cast<int>(std::min(kChunk, n - start));
    PSD_CHECK(Forward(x + start * inputs(), k, &acts, nullptr));
    SoftmaxCrossEntropy(acts.back().data(), y + start, k, classes(), nullptr, &r);
  }
  return r;
}

Result<SgdMomentum> SgdMomentum::Create(size_t num_params, double lr, double momentum) {
  PSD_REQUIRE_ARG(lr > 0 && std::isfinite(lr), "SgdMomentum::Create: lr = ", lr,
                  "; expected a finite value > 0");
  PSD_REQUIRE_ARG(momentum >= 0 && momentum < 1, "SgdMomentum::Create: momentum = ", momentum,
                  "; expected a value in [0, 1)");
  SgdMomentum s;
  s.lr_ = static_cast<float>(lr);
  s.momentum_ = static_cast<float>(momentum);
  s.velocity_.assign(num_params, 0.0f);
  return s;
}

Status SgdMomentum::Step(float* params, const float* grads, size_t n) {
  PSD_REQUIRE_ARG(n == velocity_.size(), "SgdMomentum::Step: ", n, " parameters; expected the ",
                  velocity_.size(), " it was created for");
  PSD_REQUIRE_ARG(n == 0 || (params != nullptr && grads != nullptr),
                  "SgdMomentum::Step: params or grads is null");
  for (size_t i = 0; i < n; ++i) {
    velocity_[i] = momentum_ * velocity_[i] + grads[i];
    params[i] -= lr_ * velocity_[i];
  }
  return Status::Ok();
}

uint64_t HashBytes(const void* data, size_t bytes) {
  return Fnv1a(data, bytes);
}

}  // namespace poseidon::mlp
