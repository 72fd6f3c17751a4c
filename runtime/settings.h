// The registry of POSEIDON_* settings. Each one is declared once in settings.def with its type,
// default and help. Values come from the environment at first use and can be overridden with
// Settings::Set (the C and Python APIs use it); a value that does not parse is an error that
// names the variable, the value and the expected type. Settings marked Agreed in settings.def
// must hold the same value on every rank; Communicator::Create checks it (runtime/agreement.h).
#pragma once

#include <map>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/status.h"

namespace poseidon {

enum class SettingType { kBool, kInt, kDouble, kString };
const char* SettingTypeName(SettingType t);

struct SettingInfo {
  std::string name;           // POSEIDON_...
  SettingType type;
  std::string default_value;  // as text
  std::string help;
  // Declared Agreed in settings.def: it shapes the collectives a rank issues, so every rank of a
  // communicator must hold the same value.
  bool agreed = false;
};

struct SettingValue {
  SettingInfo info;
  std::string value;    // current value as text
  std::string source;   // "default", "env" or "api"
};

class Settings {
 public:
  // Inline: every collective call asks for the version.
  static Settings& Global() {
    static Settings* s = new Settings();  // never destroyed: usable from atexit and other threads
    return *s;
  }

  const std::vector<SettingInfo>& All() const { return infos_; }
  // Current value and where it came from, for every setting, in declaration order.
  std::vector<SettingValue> Snapshot() const;

  // Sets a value from an API call; checks the name and that the text parses as the type.
  Status Set(const std::string& name, const std::string& value);
  // Forgets API overrides and re-reads the environment (tests use it).
  void Reset();
  // Checks every environment value parses; the communicator calls it at creation.
  Status Validate() const;
  // Changes with every Set and Reset: hot paths keep the values they read and re-read them only
  // when this moves (the environment is read when they first look, and after a Reset). Static,
  // without Global(): every collective call asks for it, and Global()'s guarded local static
  // costs more than the load.
  static uint64_t version() { return version_.load(std::memory_order_acquire); }

  Result<bool> GetBool(const std::string& name) const;
  Result<long long> GetInt(const std::string& name) const;
  Result<double> GetDouble(const std::string& name) const;
  Result<std::string> GetString(const std::string& name) const;

  // Typed accessors generated from settings.def: settings::FusionBytes() etc. return the value,
  // or the default when the environment holds text that does not parse (Validate reports it).
 private:
  Settings();
  const SettingInfo* Find(const std::string& name) const;
  std::string RawValue(const SettingInfo& info, std::string* source) const;

  std::vector<SettingInfo> infos_;
  mutable std::mutex mu_;
  std::map<std::string, std::string> overrides_;  // guarded by mu_
  static inline std::atomic<uint64_t> version_{0};  // constant-initialized: no order issue
};

namespace settings {
#define PSD_SETTING_Bool bool
#define PSD_SETTING_Int long long
#define PSD_SETTING_Double double
#define PSD_SETTING_String std::string
#define PSD_SETTING(type, accessor, env, def, scope, help) PSD_SETTING_##type accessor();
#include "runtime/settings.def"
#undef PSD_SETTING
}  // namespace settings

// Parsers shared by the registry and by tests.
Result<bool> ParseBool(const std::string& name, const std::string& text);
Result<long long> ParseInt(const std::string& name, const std::string& text);
Result<double> ParseDouble(const std::string& name, const std::string& text);

}  // namespace poseidon
