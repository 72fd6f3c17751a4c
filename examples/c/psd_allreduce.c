/* Poseidon from C: a communicator over MPI_COMM_WORLD, a blocking allreduce, then one layer
 * exchanged through the background engine (submit, do other work, wait).
 *   mpirun -np 2 ./psd_allreduce
 * Build against an installed Poseidon:
 *   cc psd_allreduce.c $(pkg-config --cflags --libs poseidon)  (or CMake: Poseidon::poseidon) */
#include <stdio.h>
#include <stdlib.h>

#include "poseidon.h"

/* Every psd* call returns a psdResult_t; the message says what was wrong. */
#define PSD_TRY(call)                                                                  \
  do {                                                                                 \
    psdResult_t r_ = (call);                                                           \
    if (r_ != psdSuccess) {                                                            \
      fprintf(stderr, "%s failed: %s (%s)\n", #call, psdGetErrorString(r_),            \
              psdGetLastError(NULL));                                                  \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

int main(void) {
  psdComm_t comm;
  int rank, size;
  PSD_TRY(psdCommInitWorld(&comm)); /* initializes MPI when needed */
  PSD_TRY(psdCommRank(comm, &rank));
  PSD_TRY(psdCommSize(comm, &size));

  /* Blocking allreduce: every rank contributes rank + 1. */
  float x[4] = {rank + 1.0f, rank + 1.0f, rank + 1.0f, rank + 1.0f};
  PSD_TRY(psdAllReduce(comm, x, x, 4, psdFloat32, psdMemHost, NULL));

  /* One layer through the planner and the engine: the gradient comes back averaged. */
  size_t shape[1] = {1024};
  psdLayerConfig_t layer;
  int id;
  PSD_TRY(psdLayerConfigInit(&layer));
  layer.name = "weights";
  layer.ndim = 1;
  layer.shape = shape;
  PSD_TRY(psdRegisterLayer(comm, &layer, &id));
  PSD_TRY(psdBuildPlan(comm, /*batch=*/32));
  if (rank == 0) PSD_TRY(psdPrintPlan(comm, stdout));

  float* grad = malloc(1024 * sizeof(float));
  for (int i = 0; i < 1024; ++i) grad[i] = (float)rank;
  psdHandle_t h;
  PSD_TRY(psdSubmit(comm, id, grad, NULL, NULL, NULL, 0, &h));
  /* ... the backward pass of earlier layers would run here ... */
  PSD_TRY(psdWait(h, -1));
  PSD_TRY(psdHandleFree(h));

  int ok = x[0] == size * (size + 1) / 2.0f && grad[1023] == (size - 1) / 2.0f;
  if (rank == 0) {
    printf("allreduce: %g (expected %g); averaged gradient: %g (expected %g): %s\n", x[0],
           size * (size + 1) / 2.0, grad[1023], (size - 1) / 2.0, ok ? "ok" : "WRONG");
  }
  free(grad);
  PSD_TRY(psdCommDestroy(comm));
  PSD_TRY(psdFinalize());
  return ok ? 0 : 1;
}
