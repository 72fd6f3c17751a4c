// The command-line flag parser of the benchmarks and tools (see flags.h).
#include "tools/flags.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace poseidon::cli {
namespace {

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    size_t c = s.find(sep, pos);
    out.push_back(s.substr(pos, c == std::string::npos ? std::string::npos : c - pos));
    if (c == std::string::npos) return out;
    pos = c + 1;
  }
}

std::string Number(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

Status OptionError(const Status& st) {
  const std::string& m = st.message();
  const size_t at = m.find(" [at ");
  if (st.ok() || at == std::string::npos) return st;
  return Status(st.code(), m.substr(0, at));
}

std::string Range::Text() const {
  return StrCat(lo_open ? "(" : "[", Number(lo), ", ", Number(hi), hi_open ? ")" : "]");
}

bool Range::Contains(double v) const {
  return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
}

Result<long long> ParseInteger(const std::string& flag, const std::string& value, long long lo,
                               long long hi) {
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || errno != 0 || end == nullptr || *end != '\0') {
    return InvalidArgument("option ", flag, ": '", value, "' is not an integer; expected ", lo,
                           "..", hi);
  }
  PSD_REQUIRE_ARG(v >= lo && v <= hi, "option ", flag, ": '", value, "' is out of range; expected ",
                  lo, "..", hi);
  return v;
}

Result<double> ParseNumber(const std::string& flag, const std::string& value, Range range) {
  char* end = nullptr;
  double v = std::strtod(value.c_str(), &end);
  if (value.empty() || end == nullptr || *end != '\0' || !std::isfinite(v)) {
    return InvalidArgument("option ", flag, ": '", value,
                           "' is not a number; expected a number in ", range.Text());
  }
  PSD_REQUIRE_ARG(range.Contains(v), "option ", flag, ": '", value,
                  "' is out of range; expected a number in ", range.Text());
  return v;
}

Result<std::vector<std::string>> SplitList(const std::string& flag, const std::string& value) {
  std::vector<std::string> items = Split(value, ',');
  for (const std::string& item : items) {
    PSD_REQUIRE_ARG(!item.empty(), "option ", flag, ": '", value,
                    "' has an empty item; expected a comma-separated list");
  }
  return items;
}

void Flags::Add(const std::string& names, const std::string& meta, const std::string& help,
                bool takes_value,
                std::function<Status(const std::string& flag, const std::string& value)> set) {
  Flag f;
  f.names = Split(names, ',');
  f.meta = meta;
  f.help = help;
  f.takes_value = takes_value;
  f.set = std::move(set);
  flags_.push_back(std::move(f));
}

void Flags::Bool(const std::string& names, bool* out, const std::string& help) {
  Add(names, "", help, false, [out](const std::string&, const std::string&) {
    *out = true;
    return Status::Ok();
  });
}

void Flags::Int(const std::string& names, long long* out, long long lo, long long hi,
                const std::string& meta, const std::string& help) {
  Add(names, meta, help, true, [out, lo, hi](const std::string& flag, const std::string& v) {
    PSD_ASSIGN_OR_RETURN(*out, ParseInteger(flag, v, lo, hi));
    return Status::Ok();
  });
}

void Flags::Int(const std::string& names, int* out, int lo, int hi, const std::string& meta,
                const std::string& help) {
  Add(names, meta, help, true, [out, lo, hi](const std::string& flag, const std::string& v) {
    PSD_ASSIGN_OR_RETURN(long long x, ParseInteger(flag, v, lo, hi));
    *out = static_cast<int>(x);
    return Status::Ok();
  });
}

void Flags::Number(const std::string& names, double* out, Range range, const std::string& meta,
                   const std::string& help) {
  Add(names, meta, help, true, [out, range](const std::string& flag, const std::string& v) {
    PSD_ASSIGN_OR_RETURN(*out, ParseNumber(flag, v, range));
    return Status::Ok();
  });
}

void Flags::Text(const std::string& names, std::string* out, const std::string& meta,
                 const std::string& help) {
  Add(names, meta, help, true, [out](const std::string&, const std::string& v) {
    *out = v;
    return Status::Ok();
  });
}

void Flags::Custom(const std::string& names, const std::string& meta, const std::string& help,
                   std::function<Status(const std::string& flag, const std::string& value)> set) {
  Add(names, meta, help, true, std::move(set));
}

Flags::Flag* Flags::Find(const std::string& spelling) {
  for (Flag& f : flags_) {
    for (const std::string& n : f.names) {
      if (n == spelling) return &f;
    }
  }
  return nullptr;
}

Status Flags::Parse(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      help_ = true;
      continue;
    }
    std::string name = arg, value;
    bool inline_value = false;
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      inline_value = true;
    }
    Flag* f = Find(name);
    if (f == nullptr) return InvalidArgument("unknown option '", arg, "'; see --help");
    if (!f->takes_value) {
      PSD_REQUIRE_ARG(!inline_value, "option ", name, " takes no value (got '", value, "')");
    } else if (!inline_value) {
      PSD_REQUIRE_ARG(i + 1 < argc, "option ", name, " needs a value (", f->meta, ")");
      value = argv[++i];
    }
    Status st = f->set(name, value);
    if (!st.ok()) return OptionError(st);
    f->given = true;
  }
  return Status::Ok();
}

bool Flags::Given(const std::string& name) const {
  for (const Flag& f : flags_) {
    for (const std::string& n : f.names) {
      if (n == name) return f.given;
    }
  }
  return false;
}

std::string Flags::Usage() const {
  std::string out = StrCat("usage: ", program_, " [options]\n");
  for (const Flag& f : flags_) {
    std::string spell;
    for (const std::string& n : f.names) spell += StrCat(spell.empty() ? "" : ", ", n);
    if (f.takes_value) spell += StrCat(" ", f.meta);
    std::string line = StrCat("  ", spell);
    if (line.size() < 26) {
      line.resize(26, ' ');
    } else {
      line += "\n" + std::string(26, ' ');
    }
    std::string help = f.help;  // continuation lines line up under the first
    for (size_t p = help.find('\n'); p != std::string::npos; p = help.find('\n', p + 1)) {
      help.insert(p + 1, std::string(26, ' '));
    }
    out += line + help + "\n";
  }
  out += StrCat("  -h, --help", std::string(14, ' '), "this text\n");
  return out;
}

}  // namespace poseidon::cli
