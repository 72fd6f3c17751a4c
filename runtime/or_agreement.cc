#include "runtime/or_agreement.h"

#include <climits>
#include <utility>

namespace poseidon::or_agreement {

void ClearBits(uint64_t* mask, uint64_t* complement, int words, int bits) {
  for (int w = 0; w < words; ++w) {
    const int used = bits - 64 * w;
    mask[w] = 0;
    complement[w] = used >= 64 ? ~uint64_t{0} : used <= 0 ? 0 : (uint64_t{1} << used) - 1;
  }
}

Status OrAllReduce(MPI_Comm comm, uint64_t* words, size_t n, const MpiWait& how,
                   std::shared_ptr<void> keep) {
  PSD_REQUIRE(n <= static_cast<size_t>(INT_MAX), StatusCode::kInternal,
              "OrAllReduce: ", n, " words; expected at most ", INT_MAX);
  const int count = static_cast<int>(n);
  return RunMpi(how, "MPI_Allreduce(BOR)", std::move(keep), [&](MPI_Request* r) {
    return r ? MPI_Iallreduce(MPI_IN_PLACE, words, count, MPI_UINT64_T, MPI_BOR, comm, r)
             : MPI_Allreduce(MPI_IN_PLACE, words, count, MPI_UINT64_T, MPI_BOR, comm);
  });
}

Result<bool> RaisedAnywhere(MPI_Comm comm, bool raised, const char* what) {
  uint64_t flag = raised ? 1 : 0;
  PSD_CHECK(OrAllReduce(comm, &flag, 1, MpiWait{nullptr, what}, nullptr));
  return flag != 0;
}

}  // namespace poseidon::or_agreement
