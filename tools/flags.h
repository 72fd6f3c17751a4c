// One command-line parser for every program with flags: the benchmarks and poseidon_plan. In
// tools/ (library poseidon_flags, runtime only) so that the tools, built without the
// benchmarks, and the benchmarks share it.
//
// A program declares each flag once: its spellings ("-i,--iters"), where the value goes, the
// valid range and a help line. Parse takes "--name value", "--name=value" and "-x value" alike,
// checks every value against its declaration and stops at the first error, which names the
// flag as it was typed, the value and what is valid ("option --scale: '2' is out of range;
// expected a number in (0, 1]"). Usage() lists the declarations, so the help can never drift
// from what is parsed. The flags that several benchmarks share are declared by one function
// each (AddModelFlags in bench/common/model_shape.h: --model, --scale, --batch), so they are
// spelled, defaulted and checked the same way everywhere.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "runtime/status.h"

namespace poseidon::cli {

// Bounds of a number flag; an open end excludes its bound: (0, 1] is {0, 1, true, false}.
struct Range {
  double lo, hi;
  bool lo_open = false, hi_open = false;
  std::string Text() const;  // "(0, 1]"
  bool Contains(double v) const;
};

class Flags {
 public:
  explicit Flags(std::string program) : program_(std::move(program)) {}
  const std::string& program() const { return program_; }

  // names: the spellings, comma-separated, e.g. "-i,--iters,--iterations". The value's name
  // in the usage is `meta` ("N"). Defaults are what *out holds when Parse starts.
  void Bool(const std::string& names, bool* out, const std::string& help);
  void Int(const std::string& names, long long* out, long long lo, long long hi,
           const std::string& meta, const std::string& help);
  void Int(const std::string& names, int* out, int lo, int hi, const std::string& meta,
           const std::string& help);
  void Number(const std::string& names, double* out, Range range, const std::string& meta,
              const std::string& help);
  void Text(const std::string& names, std::string* out, const std::string& meta,
            const std::string& help);
  // Any other value: `set` gets the spelling typed and the value, and returns an error that
  // names both (sizes, lists, enumerations).
  void Custom(const std::string& names, const std::string& meta, const std::string& help,
              std::function<Status(const std::string& flag, const std::string& value)> set);

  // Parses argv[1..argc). -h / --help sets help() and parsing goes on.
  Status Parse(int argc, char** argv);
  bool help() const { return help_; }
  // Whether a flag (any of its spellings) was on the command line.
  bool Given(const std::string& name) const;
  // "usage: PROGRAM [options]" and one line per flag.
  std::string Usage() const;

 private:
  struct Flag {
    std::vector<std::string> names;
    std::string meta, help;
    bool takes_value = true;
    std::function<Status(const std::string& flag, const std::string& value)> set;
    bool given = false;
  };
  void Add(const std::string& names, const std::string& meta, const std::string& help,
           bool takes_value,
           std::function<Status(const std::string& flag, const std::string& value)> set);
  Flag* Find(const std::string& spelling);

  std::string program_;
  std::vector<Flag> flags_;
  bool help_ = false;
};

// An option error as the user should read it: without the code location that PSD_CHECK and
// PSD_ASSIGN_OR_RETURN append on the way up.
Status OptionError(const Status& st);

// Value parsers the declarations use, for programs with flags of their own shape.
Result<long long> ParseInteger(const std::string& flag, const std::string& value, long long lo,
                               long long hi);
Result<double> ParseNumber(const std::string& flag, const std::string& value, Range range);
// Comma-separated items ("2,4,8"); an empty item is an error.
Result<std::vector<std::string>> SplitList(const std::string& flag, const std::string& value);

}  // namespace poseidon::cli
