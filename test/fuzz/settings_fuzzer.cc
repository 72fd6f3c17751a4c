// Fuzzes setting values (runtime/settings.h): every value text goes through the parser of each
// setting type (bool, int, double), and each NAME=VALUE line is set through Settings::Set (the
// path of psdSetSetting and the Python module) and then read back by every consumer: the typed
// getters, the generated accessors, Validate, Snapshot, the canonical agreed values that
// Communicator::Create compares across ranks, and the option readers of the planner and the
// engine. Nothing may crash or hit undefined behaviour; a value Set accepts must read back as
// the same value, and its canonical agreed form must parse to the same value again.
// Input: lines NAME=VALUE, as in the environment (corpus/settings/); NAME may omit POSEIDON_.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "collectives/planner.h"
#include "engine/options.h"
#include "runtime/agreement.h"
#include "runtime/settings.h"

namespace {

using poseidon::Settings;
using poseidon::SettingType;

void Fail(const std::string& what, const std::string& text) {
  std::fprintf(stderr, "settings_fuzzer: %s\n--- input ---\n%s\n", what.c_str(), text.c_str());
  std::abort();
}

bool SameDouble(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

// The value text alone, through the parser of every type.
void ParseAsEveryType(const std::string& value) {
  (void)poseidon::ParseBool("POSEIDON_FUZZ", value);
  (void)poseidon::ParseInt("POSEIDON_FUZZ", value);
  (void)poseidon::ParseDouble("POSEIDON_FUZZ", value);
  (void)poseidon::ParseStrategyList(value);
  (void)poseidon::ParseStrategy(value);
}

// A value Set accepted reads back as what the type's parser makes of it.
void CheckReadBack(const poseidon::SettingInfo& info, const std::string& value,
                   const std::string& text) {
  Settings& s = Settings::Global();
  switch (info.type) {
    case SettingType::kBool: {
      auto got = s.GetBool(info.name);
      auto want = poseidon::ParseBool(info.name, value);
      if (!got.ok() || !want.ok() || *got != *want) Fail(info.name + " reads back wrong", text);
      break;
    }
    case SettingType::kInt: {
      auto got = s.GetInt(info.name);
      auto want = poseidon::ParseInt(info.name, value);
      if (!got.ok() || !want.ok() || *got != *want) Fail(info.name + " reads back wrong", text);
      break;
    }
    case SettingType::kDouble: {
      auto got = s.GetDouble(info.name);
      auto want = poseidon::ParseDouble(info.name, value);
      if (!got.ok() || !want.ok() || !SameDouble(*got, *want)) {
        Fail(info.name + " reads back wrong", text);
      }
      break;
    }
    case SettingType::kString: {
      auto got = s.GetString(info.name);
      if (!got.ok() || *got != value) Fail(info.name + " reads back wrong", text);
      break;
    }
  }
}

// The canonical text of each agreed value must parse to the same value (ranks compare it).
void CheckAgreed(const std::string& text) {
  Settings& s = Settings::Global();
  for (const poseidon::AgreedValue& a : poseidon::AgreedSettings()) {
    for (const poseidon::SettingInfo& info : s.All()) {
      if (info.name != a.name) continue;
      auto raw = s.GetString(info.name);  // the text as set, whatever the type
      if (!raw.ok()) Fail("GetString failed for " + info.name, text);
      if (info.type == SettingType::kInt) {
        auto v = poseidon::ParseInt(info.name, *raw);
        auto c = poseidon::ParseInt(info.name, a.value);
        if (v.ok() && (!c.ok() || *c != *v)) Fail(info.name + ": canonical '" + a.value +
                                                      "' is not the value '" + *raw + "'",
                                                  text);
      } else if (info.type == SettingType::kDouble) {
        auto v = poseidon::ParseDouble(info.name, *raw);
        auto c = poseidon::ParseDouble(info.name, a.value);
        if (v.ok() && (!c.ok() || !SameDouble(*c, *v))) {
          Fail(info.name + ": canonical '" + a.value + "' is not the value '" + *raw + "'", text);
        }
      } else if (info.type == SettingType::kBool) {
        auto v = poseidon::ParseBool(info.name, *raw);
        auto c = poseidon::ParseBool(info.name, a.value);
        if (v.ok() && (!c.ok() || *c != *v)) Fail(info.name + ": canonical form differs", text);
      }
    }
  }
  (void)poseidon::AgreedSettingsHash();
}

void ReadEverything() {
  Settings& s = Settings::Global();
  (void)s.Validate();
  (void)s.Snapshot();
#define PSD_SETTING(type, accessor, env, def, scope, help) (void)poseidon::settings::accessor();
#include "runtime/settings.def"
#undef PSD_SETTING
  (void)poseidon::PlannerOptions::FromSettings();
  auto engine = poseidon::EngineOptions::FromSettings();
  if (engine.ok()) (void)engine->Shaping();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  Settings& s = Settings::Global();
  s.Reset();
  size_t at = 0;
  while (at <= text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    size_t eq = line.find('=');
    if (eq == std::string::npos) {
      ParseAsEveryType(line);
      continue;
    }
    std::string name = line.substr(0, eq);
    const std::string value = line.substr(eq + 1);
    ParseAsEveryType(value);
    if (name.rfind("POSEIDON_", 0) != 0) name = "POSEIDON_" + name;
    const poseidon::SettingInfo* info = nullptr;
    for (const poseidon::SettingInfo& i : s.All()) {
      if (i.name == name) info = &i;
    }
    poseidon::Status set = s.Set(name, value);
    if (info == nullptr) {
      if (set.ok()) Fail("Set accepted the unknown setting " + name, text);
      continue;
    }
    if (set.ok()) CheckReadBack(*info, value, text);
  }
  ReadEverything();
  CheckAgreed(text);
  s.Reset();
  return 0;
}
