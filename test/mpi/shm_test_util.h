// What the shared-memory collective tests (shm_collectives_test.cc, shm_backend_test.cc)
// share: the formula F, exact values as a dtype holds them, the byte comparison with rank 0's,
// the dtypes and the uneven layouts.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/shard.h"
#include "runtime/status.h"
#include "test/mpi/typed_buffer.h"
#include "test/mpi_test_main.h"

namespace poseidon::testing {

inline double F(size_t i) { return static_cast<double>(i % 7 + 1); }

// The exact value v (an integer sum) as dtype dt holds it: what the collectives return.
inline double Exact(DType dt, double v) { return TypedBuffer::Rounded(dt, v); }

// True when `bytes` (n bytes) equal rank 0's on every rank.
inline bool SameOnEveryRank(const void* bytes, size_t n) {
  std::vector<unsigned char> root(static_cast<const unsigned char*>(bytes),
                                  static_cast<const unsigned char*>(bytes) + n);
  MPI_Bcast(root.data(), static_cast<int>(n), MPI_BYTE, 0, World()->mpi_comm());
  int same = n == 0 || std::memcmp(root.data(), bytes, n) == 0 ? 1 : 0, all = 0;
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, World()->mpi_comm());
  return all == 1;
}

// True when st's text (its first 255 characters) is rank 0's on every rank.
inline bool SameStatusOnEveryRank(const Status& st) {
  char text[256] = {};
  std::strncpy(text, st.ToString().c_str(), sizeof(text) - 1);
  return SameOnEveryRank(text, sizeof(text));
}

const DType kAllTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16,
                           DType::kBFloat16, DType::kInt32,   DType::kInt64};

// Layouts with zeros, one rank holding everything, and a ragged spread.
inline std::vector<std::vector<size_t>> Layouts(int world, size_t n) {
  std::vector<std::vector<size_t>> out;
  out.push_back(ShardCounts(n, world));
  std::vector<size_t> one(static_cast<size_t>(world), 0);
  one[static_cast<size_t>(world - 1)] = n;
  out.push_back(one);
  std::vector<size_t> ragged(static_cast<size_t>(world));
  for (int q = 0; q < world; ++q) ragged[static_cast<size_t>(q)] = (q % 3 == 1) ? 0 : n / (q + 1) + q;
  out.push_back(ragged);
  return out;
}

}  // namespace poseidon::testing
