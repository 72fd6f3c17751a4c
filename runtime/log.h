// Minimal leveled logging to stderr, prefixed with the rank: "[poseidon r3 warn] ...".
#pragma once

#include <string>

#include "runtime/status.h"

namespace poseidon {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

bool LogEnabled(LogLevel level);
void LogMessage(LogLevel level, const std::string& msg);
// Rank shown in log lines; set by the communicator (-1 before).
void SetLogRank(int rank);

}  // namespace poseidon

#define PSD_LOG(level, ...)                                                       \
  do {                                                                            \
    if (::poseidon::LogEnabled(::poseidon::LogLevel::level)) {                    \
      ::poseidon::LogMessage(::poseidon::LogLevel::level, ::poseidon::StrCat(__VA_ARGS__)); \
    }                                                                             \
  } while (0)
