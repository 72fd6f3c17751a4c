// What the CPU kernel tests (kernels_cpu_test.cc, kernels_cpu_ops_test.cc) share: the CPU
// kernel table, an error check naming the code and the message parts, and bitwise equality.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/kernels.h"
#include "runtime/half.h"
#include "runtime/status.h"

namespace poseidon::testing {

inline const Kernels& K() { return CpuKernels(); }

inline ::testing::AssertionResult HasError(const Status& s, StatusCode code,
                                           const std::vector<std::string>& needles) {
  if (s.ok()) return ::testing::AssertionFailure() << "expected an error, got OK";
  if (s.code() != code) {
    return ::testing::AssertionFailure() << "wrong code: " << s.ToString();
  }
  for (const std::string& needle : needles) {
    if (s.message().find(needle) == std::string::npos) {
      return ::testing::AssertionFailure() << "'" << needle << "' missing in: " << s.ToString();
    }
  }
  return ::testing::AssertionSuccess();
}

inline bool SameBits(float a, float b) { return FloatBits(a) == FloatBits(b); }

}  // namespace poseidon::testing
