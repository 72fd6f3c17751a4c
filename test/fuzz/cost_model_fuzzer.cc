// Fuzzes the cost-model cache file parser (collectives/cost_model.h): CostModel::Parse on any
// text must return a model or an error, never crash. A model it accepts must pass Validate,
// write (ToText) text that parses back to the same figures bit for bit, and be usable: its
// predictions and a plan made from it (MakePlan over a few layers of every kind) must not hit
// undefined behaviour whatever valid figures the file held (zero, huge, infinite rates).
// Input: the cache file as LoadOrMeasureCostModel writes it (corpus/cost_model/).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/cost_model.h"
#include "collectives/planner.h"

namespace {

void Fail(const std::string& what, const std::string& text, const std::string& printed) {
  std::fprintf(stderr, "cost_model_fuzzer: %s\n--- input ---\n%s\n--- printed ---\n%s\n",
               what.c_str(), text.c_str(), printed.c_str());
  std::abort();
}

bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

std::vector<poseidon::LayerSpec> Layers() {
  using poseidon::LayerKind;
  using poseidon::LayerSpec;
  std::vector<LayerSpec> out;
  auto add = [&](const char* name, std::vector<size_t> shape, LayerKind kind, bool optimizer) {
    LayerSpec s;
    s.name = name;
    s.shape = std::move(shape);
    s.kind = kind;
    if (optimizer) s.optimizer = poseidon::OptimizerSpec::Sgd({});
    auto r = poseidon::ResolveLayerSpec(s);
    if (!r.ok()) {
      std::fprintf(stderr, "cost_model_fuzzer: %s\n", r.status().ToString().c_str());
      std::abort();
    }
    out.push_back(*r);
  };
  add("conv1.w", {64, 3, 11, 11}, LayerKind::kDense, false);
  add("conv1.b", {64}, LayerKind::kDense, true);
  add("fc6.w", {4096, 9216}, LayerKind::kFullyConnected, true);
  add("fc8.w", {1000, 4096}, LayerKind::kFullyConnected, false);
  add("embed", {1000000, 16}, LayerKind::kSparse, false);
  add("tiny", {3}, LayerKind::kSparse, true);
  add("empty", {0}, LayerKind::kDense, false);
  add("scalar", {}, LayerKind::kDense, false);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<poseidon::LayerSpec> layers = Layers();
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::string key;
  auto model = poseidon::CostModel::Parse(text, &key);
  if (!model.ok()) {
    (void)model.status().ToString();
    return 0;
  }
  if (!model->Validate().ok()) Fail("Parse accepted a model Validate refuses", text, "");

  // What LoadOrMeasureCostModel writes for this host key must read back exactly.
  const std::string host = key.empty() ? "host" : key;
  const std::string printed = model->ToText(host);
  std::string key2;
  auto again = poseidon::CostModel::Parse(printed, &key2);
  if (!again.ok()) Fail("ToText wrote text Parse refuses: " + again.status().ToString(), text,
                        printed);
  if (key2 != host) Fail("the host key changed in the round trip", text, printed);
  for (int i = 0; i < poseidon::kNumCollectiveKinds; ++i) {
    if (!SameBits(model->link[i].alpha_s, again->link[i].alpha_s) ||
        !SameBits(model->link[i].beta_s_per_b, again->link[i].beta_s_per_b)) {
      Fail("a link figure changed in the round trip", text, printed);
    }
  }
  if (!SameBits(model->gemm_flops, again->gemm_flops) ||
      !SameBits(model->topk_bytes_per_s, again->topk_bytes_per_s) ||
      !SameBits(model->scatter_bytes_per_s, again->scatter_bytes_per_s) ||
      !SameBits(model->optimizer_bytes_per_s, again->optimizer_bytes_per_s)) {
    Fail("a compute rate changed in the round trip", text, printed);
  }
  (void)model->Summary();

  // The planner over the parsed figures: every strategy's cost, fusion, the plan table.
  poseidon::PlannerOptions options;
  for (int world : {1, 2, 7, 64}) {
    for (long long fusion : {0LL, 4LL << 20}) {
      options.fusion_bytes = fusion;
      auto plan = poseidon::MakePlan(layers, 32, world, *model, options);
      if (!plan.ok()) Fail("MakePlan failed: " + plan.status().ToString(), text, printed);
      auto parsed = poseidon::ParsePlan(plan->ToString());
      if (!parsed.ok()) Fail("a plan's table does not parse: " + parsed.status().ToString(), text,
                             plan->ToString());
    }
  }
  return 0;
}
