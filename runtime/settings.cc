#include "runtime/settings.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <limits>
#include <sstream>

namespace poseidon {

namespace {
template <typename T>
std::string DefaultText(const T& v) {
  std::ostringstream os;
  if constexpr (std::is_same_v<T, bool>) {
    os << (v ? "1" : "0");
  } else {
    os << v;
  }
  return os.str();
}
}  // namespace

const char* SettingTypeName(SettingType t) {
  switch (t) {
    case SettingType::kBool: return "bool";
    case SettingType::kInt: return "int";
    case SettingType::kDouble: return "double";
    case SettingType::kString: return "string";
  }
  return "?";
}

Result<bool> ParseBool(const std::string& name, const std::string& text) {
  std::string s = text;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return false;
  return InvalidArgument("setting ", name, "='", text,
                         "' is not a bool; expected 1/0, true/false, yes/no or on/off");
}

Result<long long> ParseInt(const std::string& name, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  // Accept binary suffixes K, M, G for byte sizes.
  if (end != text.c_str() && errno == 0) {
    std::string rest(end);
    int shift = -1;
    if (rest.empty()) shift = 0;
    if (rest == "K" || rest == "k" || rest == "KiB") shift = 10;
    if (rest == "M" || rest == "m" || rest == "MiB") shift = 20;
    if (rest == "G" || rest == "g" || rest == "GiB") shift = 30;
    if (shift == 0) return v;
    if (shift > 0) {
      // Scaled by a multiplication kept in range: shifting a negative value, or past 64 bits,
      // is undefined.
      const long long limit = std::numeric_limits<long long>::max() >> shift;
      if (v >= -limit && v <= limit) return v * (1LL << shift);
      return InvalidArgument("setting ", name, "='", text,
                             "' is out of range; expected a 64-bit integer");
    }
  }
  return InvalidArgument("setting ", name, "='", text,
                         "' is not an integer; expected digits with an optional K, M or G suffix");
}

Result<double> ParseDouble(const std::string& name, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() && *end == '\0' && errno == 0) return v;
  return InvalidArgument("setting ", name, "='", text, "' is not a number");
}

// The Scope column of settings.def; a token other than these two does not compile.
#define PSD_SETTING_AGREED_Agreed true
#define PSD_SETTING_AGREED_PerRank false

Settings::Settings() {
#define PSD_SETTING(type, accessor, env, def, scope, help) \
  infos_.push_back(                                        \
      SettingInfo{env, SettingType::k##type, DefaultText(def), help, PSD_SETTING_AGREED_##scope});
#include "runtime/settings.def"
#undef PSD_SETTING
}

const SettingInfo* Settings::Find(const std::string& name) const {
  for (const auto& i : infos_) {
    if (i.name == name) return &i;
  }
  return nullptr;
}

std::string Settings::RawValue(const SettingInfo& info, std::string* source) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = overrides_.find(info.name);
    if (it != overrides_.end()) {
      if (source) *source = "api";
      return it->second;
    }
  }
  const char* env = std::getenv(info.name.c_str());
  if (env != nullptr) {
    if (source) *source = "env";
    return env;
  }
  if (source) *source = "default";
  return info.default_value;
}

static Status CheckParses(const SettingInfo& info, const std::string& text) {
  switch (info.type) {
    case SettingType::kBool: return ParseBool(info.name, text).status();
    case SettingType::kInt: return ParseInt(info.name, text).status();
    case SettingType::kDouble: return ParseDouble(info.name, text).status();
    case SettingType::kString: return Status::Ok();
  }
  return Status::Ok();
}

Status Settings::Set(const std::string& name, const std::string& value) {
  const SettingInfo* info = Find(name);
  PSD_REQUIRE_ARG(info != nullptr, "Settings::Set: unknown setting '", name,
                  "'; run poseidon-info for the list");
  PSD_CHECK(CheckParses(*info, value));
  std::lock_guard<std::mutex> lock(mu_);
  overrides_[name] = value;
  version_.fetch_add(1, std::memory_order_acq_rel);
  return Status::Ok();
}

void Settings::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  overrides_.clear();
  version_.fetch_add(1, std::memory_order_acq_rel);
}

Status Settings::Validate() const {
  for (const auto& info : infos_) {
    std::string src;
    PSD_CHECK(CheckParses(info, RawValue(info, &src)));
  }
  return Status::Ok();
}

std::vector<SettingValue> Settings::Snapshot() const {
  std::vector<SettingValue> out;
  for (const auto& info : infos_) {
    SettingValue v{info, "", ""};
    v.value = RawValue(info, &v.source);
    out.push_back(std::move(v));
  }
  return out;
}

#define PSD_DEFINE_GETTER(Type, CType, Parser, Kind)                                      \
  Result<CType> Settings::Get##Type(const std::string& name) const {                      \
    const SettingInfo* info = Find(name);                                                 \
    PSD_REQUIRE_ARG(info != nullptr, "Settings::Get" #Type ": unknown setting '", name, "'"); \
    PSD_REQUIRE_ARG(info->type == SettingType::Kind, "Settings::Get" #Type ": ", name,     \
                    " has type ", SettingTypeName(info->type));                           \
    return Parser(name, RawValue(*info, nullptr));                                        \
  }
PSD_DEFINE_GETTER(Bool, bool, ParseBool, kBool)
PSD_DEFINE_GETTER(Int, long long, ParseInt, kInt)
PSD_DEFINE_GETTER(Double, double, ParseDouble, kDouble)
#undef PSD_DEFINE_GETTER

Result<std::string> Settings::GetString(const std::string& name) const {
  const SettingInfo* info = Find(name);
  PSD_REQUIRE_ARG(info != nullptr, "Settings::GetString: unknown setting '", name, "'");
  return RawValue(*info, nullptr);
}

namespace settings {
namespace {
template <typename T>
T ValueOr(Result<T> r, T def) {
  return r.ok() ? *r : def;
}
}  // namespace
#define PSD_SETTING(type, accessor, env, def, scope, help)                    \
  PSD_SETTING_##type accessor() {                                             \
    return ValueOr<PSD_SETTING_##type>(Settings::Global().Get##type(env),     \
                                       static_cast<PSD_SETTING_##type>(def)); \
  }
#include "runtime/settings.def"
#undef PSD_SETTING
}  // namespace settings

}  // namespace poseidon
