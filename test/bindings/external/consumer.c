/* Built against an installed Poseidon (find_package or pkg-config) and run under mpirun:
 * checks the header and library versions agree and that an allreduce sums exactly. */
#include <stdio.h>

#include "poseidon.h"

int main(void) {
  int version = 0, rank = 0, size = 0;
  psdComm_t comm = NULL;
  if (psdGetVersion(&version) != psdSuccess || version != PSD_VERSION_CODE) {
    fprintf(stderr, "consumer: library version %d, header %d\n", version, PSD_VERSION_CODE);
    return 1;
  }
  if (psdCommInitWorld(&comm) != psdSuccess || psdCommRank(comm, &rank) != psdSuccess ||
      psdCommSize(comm, &size) != psdSuccess) {
    fprintf(stderr, "consumer: %s\n", psdGetLastError(NULL));
    return 1;
  }
  double x[3] = {rank + 1.0, 2.0 * (rank + 1), 0.5};
  if (psdAllReduce(comm, x, x, 3, psdFloat64, psdMemHost, NULL) != psdSuccess) {
    fprintf(stderr, "consumer: %s\n", psdGetLastError(comm));
    return 1;
  }
  double tri = size * (size + 1) / 2.0;
  int ok = x[0] == tri && x[1] == 2 * tri && x[2] == 0.5 * size;
  if (rank == 0) printf("consumer: version %d, %d ranks, allreduce %s\n", version, size,
                        ok ? "ok" : "WRONG");
  psdCommDestroy(comm);
  psdFinalize();
  return ok ? 0 : 1;
}
