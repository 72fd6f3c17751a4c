// Waiting on a word that another process writes in shared memory: the pause between two looks,
// and how long a wait has lasted (read only when a look found the word not yet there).
#pragma once

#include <chrono>

namespace poseidon {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

inline double SecondsSince(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace poseidon
