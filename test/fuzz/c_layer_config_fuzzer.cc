// Fuzzes what the C API accepts as a layer: a psdLayerConfig_t filled by a C caller (any int in
// its enum fields, any float, any name and candidates string, ndim extents) goes through the
// checks of psdRegisterLayer (bindings/c/layer_config.h), after settings set through
// psdSetSetting / read through psdGetSetting. Nothing may crash or hit undefined behaviour; a
// config accepted must keep the caller's name and shape, and plan (PlanLayer at a few world
// sizes) into a table that parses back.
// Input: one field per line, as a C caller would fill them after psdLayerConfigInit
// (corpus/c_layer_config/); missing lines keep the defaults:
//   name <text>               the rest of the line (no line: NULL)
//   ndim <int>
//   shape <extent> ...        exactly ndim extents are passed when 0 <= ndim <= 8 (missing
//                             ones 0), else those given; no line: NULL
//   kind <int>                psdLayerKind_t
//   strategy <int>            psdStrategy_t
//   density <double>
//   candidates <text>         the rest of the line (no line: NULL)
//   optimizer <kind> <lr> <momentum> <nesterov> <beta1> <beta2> <eps> <weight_decay>
//   setting <name> <value>    psdSetSetting before the layer is checked (value: the rest)
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "bindings/c/layer_config.h"
#include "bindings/c/poseidon.h"
#include "collectives/planner.h"
#include "runtime/settings.h"

namespace {

void Fail(const std::string& what, const std::string& text) {
  std::fprintf(stderr, "c_layer_config_fuzzer: %s\n--- input ---\n%s\n", what.c_str(),
               text.c_str());
  std::abort();
}

// A C caller may store any int in an enum field.
template <typename E>
void StoreInt(E* field, long long v) {
  static_assert(sizeof(E) == sizeof(int), "C enums are int-sized here");
  int i = static_cast<int>(v);
  std::memcpy(field, &i, sizeof(int));
}

std::string RestOf(std::istringstream& ls) {
  std::string rest;
  std::getline(ls, rest);
  if (!rest.empty() && rest[0] == ' ') rest.erase(0, 1);
  return rest;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  poseidon::Settings::Global().Reset();

  psdLayerConfig_t c;
  if (psdLayerConfigInit(&c) != psdSuccess) Fail("psdLayerConfigInit failed", text);
  bool has_name = false, has_shape = false, has_candidates = false;
  std::string name, candidates;
  std::vector<unsigned long long> extents;

  std::istringstream is(text);
  std::string line;
  while (std::getline(is, line)) {
    std::istringstream ls(line);
    std::string key;
    ls >> key;
    if (key == "name") {
      has_name = true;
      name = RestOf(ls);
    } else if (key == "ndim") {
      long long v = 0;
      ls >> v;
      c.ndim = static_cast<int>(v);
    } else if (key == "shape") {
      has_shape = true;
      unsigned long long e;
      while (extents.size() < 64 && ls >> e) extents.push_back(e);
    } else if (key == "kind") {
      long long v = 0;
      ls >> v;
      StoreInt(&c.kind, v);
    } else if (key == "strategy") {
      long long v = 0;
      ls >> v;
      StoreInt(&c.strategy, v);
    } else if (key == "density") {
      ls >> c.density;
    } else if (key == "candidates") {
      has_candidates = true;
      candidates = RestOf(ls);
    } else if (key == "optimizer") {
      long long kind = 0, nesterov = c.optimizer.nesterov;
      ls >> kind;
      StoreInt(&c.optimizer.kind, kind);
      ls >> c.optimizer.lr >> c.optimizer.momentum >> nesterov;
      c.optimizer.nesterov = static_cast<int>(nesterov);
      ls >> c.optimizer.beta1 >> c.optimizer.beta2 >> c.optimizer.eps >> c.optimizer.weight_decay;
    } else if (key == "setting") {
      std::string setting;
      ls >> setting;
      const std::string value = RestOf(ls);
      if (psdSetSetting(setting.c_str(), value.c_str()) == psdSuccess) {
        size_t need = 0;
        if (psdGetSetting(setting.c_str(), nullptr, &need) != psdSuccess) {
          Fail("psdGetSetting refused a setting psdSetSetting accepted", text);
        }
        std::vector<char> buf(need);
        if (psdGetSetting(setting.c_str(), buf.data(), &need) != psdSuccess ||
            std::string(buf.data()) != value.substr(0, std::strlen(value.c_str()))) {
          Fail("psdGetSetting does not return what psdSetSetting set", text);
        }
      } else if (std::strlen(psdGetLastError(nullptr)) == 0) {
        Fail("psdSetSetting failed without a message", text);
      }
    }
  }

  c.name = has_name ? name.c_str() : nullptr;
  c.candidates = has_candidates ? candidates.c_str() : nullptr;
  // Exactly as many extents as the caller promises (ASan sees any read past them).
  size_t passed = c.ndim >= 0 && c.ndim <= 8 ? static_cast<size_t>(c.ndim) : extents.size();
  std::vector<size_t> shape(passed, 0);
  for (size_t i = 0; i < passed && i < extents.size(); ++i) shape[i] = extents[i];
  size_t* heap = nullptr;
  if (has_shape) {
    heap = static_cast<size_t*>(std::malloc(passed * sizeof(size_t)));
    if (passed > 0) std::memcpy(heap, shape.data(), passed * sizeof(size_t));
  }
  c.shape = heap;

  auto spec = poseidon::capi::ToLayerSpec(c);
  if (spec.ok()) {
    if (spec->name != name.c_str()) Fail("the accepted layer's name changed", text);
    if (spec->shape != shape) Fail("the accepted layer's shape changed", text);
    if (poseidon::ShapeString(spec->shape) != "scalar") {
      auto reparsed = poseidon::ParseShape(poseidon::ShapeString(spec->shape));
      if (!reparsed.ok() || *reparsed != spec->shape) Fail("the shape does not print back", text);
    }
    auto options = poseidon::PlannerOptions::FromSettings();
    if (options.ok()) {
      const poseidon::CostModel model = poseidon::CostModel::Network(25e-6, 1.25e9);
      for (int world : {1, 3, 64}) {
        auto plan = poseidon::MakePlan({*spec}, 32, world, model, *options);
        if (!plan.ok()) Fail("MakePlan refused an accepted layer: " + plan.status().ToString(),
                             text);
        auto parsed = poseidon::ParsePlan(plan->ToString());
        if (!parsed.ok() || parsed->entries.size() != 1 ||
            parsed->entries[0].layer != spec->name) {
          Fail("the accepted layer's plan does not parse back:\n" + plan->ToString(), text);
        }
      }
    }
  } else if (spec.status().message().empty()) {
    Fail("a refused config has no message", text);
  }
  std::free(heap);
  poseidon::Settings::Global().Reset();
  return 0;
}
