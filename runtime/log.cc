#include "runtime/log.h"

#include <atomic>
#include <cstdio>

#include "runtime/settings.h"

namespace poseidon {
namespace {
std::atomic<int> g_rank{-1};

LogLevel Threshold() {
  std::string s = settings::LogLevel();
  if (s == "error") return LogLevel::kError;
  if (s == "info") return LogLevel::kInfo;
  if (s == "debug") return LogLevel::kDebug;
  return LogLevel::kWarn;
}
const char* LevelName(LogLevel l) {
  switch (l) {
    case LogLevel::kError: return "error";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kInfo: return "info";
    case LogLevel::kDebug: return "debug";
  }
  return "?";
}
}  // namespace

bool LogEnabled(LogLevel level) { return static_cast<int>(level) <= static_cast<int>(Threshold()); }

void LogMessage(LogLevel level, const std::string& msg) {
  // One fprintf per line so lines from threads do not interleave.
  std::fprintf(stderr, "[poseidon r%d %s] %s\n", g_rank.load(), LevelName(level), msg.c_str());
}

void SetLogRank(int rank) { g_rank.store(rank); }

}  // namespace poseidon
