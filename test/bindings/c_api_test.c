/* The C API from C (compiled as C99), under mpirun at several rank counts.
 *
 * Values follow the multi-rank tests' exact formula: rank r contributes (r + 1) * f(i) with
 * small integers f(i), so every sum is exact and compares with ==; an exchange's average is
 * that exact float32 sum times the float32 1 / P (Average below), which is not (P + 1) / 2 f(i)
 * exactly at every P (84 * (1 / 7.0f) is 12.000001). Each check counts; a failure
 * prints the rank, the line and the library's message, and the run's exit code is the maximum
 * over ranks. */
#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "poseidon.h"

static int g_rank = 0;
static int g_checks = 0;
static int g_failures = 0;

#define CHECK(cond)                                                                 \
  do {                                                                              \
    ++g_checks;                                                                     \
    if (!(cond)) {                                                                  \
      ++g_failures;                                                                 \
      fprintf(stderr, "rank %d: %s:%d: CHECK(%s) failed; last error: %s\n", g_rank, \
              __FILE__, __LINE__, #cond, psdGetLastError(NULL));                    \
    }                                                                               \
  } while (0)

#define CHECK_OK(call) CHECK((call) == psdSuccess)

static double F(size_t i) { return (double)(i % 7 + 1); }

/* The average over `size` ranks of an exact float32 sum, as the exchange computes it: one
 * float32 multiply by the float32 1 / P (the engine's Scale of a summed dense gradient; sfb's
 * GEMM with alpha = 1 / P over the gathered factors, whose products here are small integers and
 * sum exactly). */
static float Average(double exact_sum, int size) {
  const float sum = (float)exact_sum;
  const float inv = 1.0f / (float)size;
  return sum * inv;
}

static void TestVersionAndStrings(void) {
  int v = -1;
  CHECK_OK(psdGetVersion(&v));
  CHECK(v == PSD_VERSION_CODE);
  CHECK(PSD_VERSION_CODE == PSD_VERSION_MAJOR * 10000 + PSD_VERSION_MINOR * 100 +
                                PSD_VERSION_PATCH);
  CHECK(psdGetVersion(NULL) == psdInvalidArgument);
  CHECK(strstr(psdGetLastError(NULL), "psdGetVersion") != NULL);
  CHECK(strcmp(psdGetErrorString(psdSuccess), "success") == 0);
  CHECK(strcmp(psdGetErrorString(psdTimeout), "timed out") == 0);
  CHECK(psdPeerLost == 9 && psdNumResults == 10);
  CHECK(strstr(psdGetErrorString(psdPeerLost), "peer stopped answering") != NULL);
  CHECK(strcmp(psdGetErrorString((psdResult_t)1234), "unknown result code") == 0);
}

static void TestAllReduce(psdComm_t comm, int size) {
  static const size_t counts[] = {0, 1, 7, 1001, 300000};
  double tri = size * (size + 1) / 2.0;
  for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); ++c) {
    size_t n = counts[c];
    float* f = malloc((n + 1) * sizeof(float));
    float* out = malloc((n + 1) * sizeof(float));
    double* d = malloc((n + 1) * sizeof(double));
    int64_t* l = malloc((n + 1) * sizeof(int64_t));
    for (size_t i = 0; i < n; ++i) {
      f[i] = (float)((g_rank + 1) * F(i));
      d[i] = (g_rank + 1) * F(i);
      l[i] = (int64_t)((g_rank + 1) * F(i));
    }
    CHECK_OK(psdAllReduce(comm, f, out, n, psdFloat32, psdMemHost, NULL));
    CHECK_OK(psdAllReduce(comm, d, d, n, psdFloat64, psdMemHost, NULL)); /* in place */
    CHECK_OK(psdAllReduce(comm, l, l, n, psdInt64, psdMemHost, NULL));
    int bad = 0;
    for (size_t i = 0; i < n; ++i) {
      if (out[i] != (float)(tri * F(i)) || d[i] != tri * F(i) || l[i] != (int64_t)(tri * F(i)))
        ++bad;
    }
    CHECK(bad == 0);
    free(f);
    free(out);
    free(d);
    free(l);
  }
}

/* Node-shared memory: an allreduce between such buffers (above the window's one-step size, in
 * and out of place), a reduce-scatter and an allgather from such inputs, exact; a size of 0 on
 * one rank fails every rank; psdMemFree takes NULL on every rank, and fails every rank where
 * only some pass it. */
static void TestMemAlloc(psdComm_t comm, int size) {
  const size_t n = 300001;
  float* send = NULL;
  float* recv = NULL;
  CHECK_OK(psdMemAlloc(comm, n * sizeof(float), (void**)&send));
  CHECK_OK(psdMemAlloc(comm, n * sizeof(float), (void**)&recv));
  CHECK(send != NULL && recv != NULL && (uintptr_t)send % 64 == 0);
  for (size_t i = 0; i < n; ++i) send[i] = (float)((g_rank + 1) * F(i));
  CHECK_OK(psdAllReduce(comm, send, recv, n, psdFloat32, psdMemHost, NULL));
  CHECK_OK(psdAllReduce(comm, send, send, n, psdFloat32, psdMemHost, NULL));
  double tri = size * (size + 1) / 2.0;
  int bad = 0;
  for (size_t i = 0; i < n; ++i) {
    if (recv[i] != (float)(tri * F(i)) || send[i] != recv[i]) ++bad;
  }
  CHECK(bad == 0);
  void* none = NULL;
  psdResult_t r = psdMemAlloc(comm, g_rank == size - 1 ? 0 : 4096, &none);
  CHECK(r == psdInvalidArgument && none == NULL);
  CHECK(strstr(psdGetLastError(comm), "psdMemAlloc") != NULL);
  /* A reduce-scatter and an allgather read straight from node-shared inputs, private outputs. */
  const size_t per = 200003;
  float* whole = NULL;
  CHECK_OK(psdMemAlloc(comm, per * (size_t)size * sizeof(float), (void**)&whole));
  float* part = malloc(per * (size_t)size * sizeof(float));
  for (size_t i = 0; i < per * (size_t)size; ++i) whole[i] = (float)((g_rank + 1) * F(i));
  CHECK_OK(psdReduceScatter(comm, whole, part, per, psdFloat32, psdMemHost, NULL));
  for (size_t i = 0; i < per; ++i) {
    if (part[i] != (float)(tri * F((size_t)g_rank * per + i))) ++bad;
  }
  for (size_t i = 0; i < per; ++i) whole[i] = (float)((g_rank + 1) * F(i));
  CHECK_OK(psdAllGather(comm, whole, part, per, psdFloat32, psdMemHost, NULL));
  for (size_t i = 0; i < per * (size_t)size; ++i) {
    if (part[i] != (float)((i / per + 1) * F(i % per))) ++bad;
  }
  CHECK(bad == 0);
  free(part);
  CHECK_OK(psdMemFree(comm, whole));
  /* NULL on one rank while the others free an allocation: every rank fails, nothing is freed. */
  if (size > 1) {
    CHECK(psdMemFree(comm, g_rank == size - 1 ? NULL : recv) == psdInvalidArgument);
    CHECK(strstr(psdGetLastError(comm), "psdMemFree") != NULL);
    recv[0] = 1.0f; /* still mapped */
  }
  CHECK_OK(psdMemFree(comm, recv));
  CHECK_OK(psdMemFree(comm, send));
  CHECK_OK(psdMemFree(comm, NULL));
  int local = 0;
  CHECK(psdMemFree(comm, &local) == psdInvalidArgument);
  CHECK(strstr(psdGetLastError(comm), "not memory that AllocShared returned") != NULL);
}

static void TestReduceScatterAllGatherBroadcast(psdComm_t comm, int size) {
  const size_t per = 5;
  size_t n = per * (size_t)size;
  float* send = malloc(n * sizeof(float));
  float recv[5];
  for (size_t i = 0; i < n; ++i) send[i] = (float)((g_rank + 1) * F(i));
  CHECK_OK(psdReduceScatter(comm, send, recv, per, psdFloat32, psdMemHost, NULL));
  double tri = size * (size + 1) / 2.0;
  int bad = 0;
  for (size_t i = 0; i < per; ++i) {
    if (recv[i] != (float)(tri * F((size_t)g_rank * per + i))) ++bad;
  }
  CHECK(bad == 0);

  int32_t mine[3] = {g_rank, 10 * g_rank, 100 * g_rank};
  int32_t* all = malloc(3 * (size_t)size * sizeof(int32_t));
  CHECK_OK(psdAllGather(comm, mine, all, 3, psdInt32, psdMemHost, NULL));
  bad = 0;
  for (int r = 0; r < size; ++r) {
    if (all[3 * r] != r || all[3 * r + 1] != 10 * r || all[3 * r + 2] != 100 * r) ++bad;
  }
  CHECK(bad == 0);

  double b[4] = {g_rank, g_rank, g_rank, g_rank};
  int root = size - 1;
  CHECK_OK(psdBroadcast(comm, b, 4, psdFloat64, root, psdMemHost, NULL));
  CHECK(b[0] == root && b[3] == root);
  CHECK_OK(psdBarrier(comm));
  free(send);
  free(all);
}

static void TestErrors(psdComm_t comm) {
  float x[4] = {0};
  /* NULL and made-up handles: refused, message kept per thread. */
  CHECK(psdAllReduce(NULL, x, x, 4, psdFloat32, psdMemHost, NULL) == psdInvalidArgument);
  CHECK(strstr(psdGetLastError(NULL), "psdAllReduce: comm is NULL") != NULL);
  CHECK(psdAllReduce((psdComm_t)(uintptr_t)0x1234, x, x, 4, psdFloat32, psdMemHost, NULL) ==
        psdInvalidArgument);
  CHECK(strstr(psdGetLastError(NULL), "not a live communicator") != NULL);
  /* Bad arguments on every rank: every rank fails the same way, none hangs; the message is on
   * the communicator too. */
  CHECK(psdAllReduce(comm, x, x, 4, (psdDataType_t)42, psdMemHost, NULL) == psdInvalidArgument);
  CHECK(strstr(psdGetLastError(comm), "dtype 42 is unknown") != NULL);
  CHECK(psdAllReduce(comm, NULL, x, 4, psdFloat32, psdMemHost, NULL) == psdInvalidArgument);
  CHECK(strstr(psdGetLastError(comm), "send is NULL") != NULL);
  CHECK(psdAllReduce(comm, x, x, 4, psdFloat32, (psdMemory_t)7, NULL) == psdInvalidArgument);
  CHECK(strstr(psdGetLastError(comm), "memory 7 is unknown") != NULL);
  int rank = -1;
  CHECK(psdCommRank(comm, NULL) == psdInvalidArgument);
  CHECK_OK(psdCommRank(comm, &rank));
  CHECK(rank == g_rank);

  /* Counts that differ across ranks: the argument agreement fails every rank. */
  int size = 0;
  CHECK_OK(psdCommSize(comm, &size));
  if (size > 1) {
    psdResult_t r = psdAllReduce(comm, x, x, g_rank == 0 ? 3 : 4, psdFloat32, psdMemHost, NULL);
    CHECK(r == psdMismatch || r == psdInvalidArgument);
    CHECK(strstr(psdGetLastError(comm), "count") != NULL);
  }

  /* Settings. */
  CHECK(psdSetSetting("POSEIDON_NO_SUCH_THING", "1") == psdInvalidArgument);
  CHECK(strstr(psdGetLastError(NULL), "POSEIDON_NO_SUCH_THING") != NULL);
  CHECK(psdSetSetting("TOPK_DENSITY", "abc") == psdInvalidArgument);
  CHECK_OK(psdSetSetting("TOPK_DENSITY", "0.25"));
  size_t need = 0;
  CHECK_OK(psdGetSetting("POSEIDON_TOPK_DENSITY", NULL, &need));
  CHECK(need == 5);
  char small[2];
  size_t small_size = sizeof(small);
  CHECK(psdGetSetting("TOPK_DENSITY", small, &small_size) == psdInvalidArgument);
  CHECK(small_size == 5);
  char buf[16];
  size_t buf_size = sizeof(buf);
  CHECK_OK(psdGetSetting("TOPK_DENSITY", buf, &buf_size));
  CHECK(strcmp(buf, "0.25") == 0);
  CHECK_OK(psdSetSetting("POSEIDON_TOPK_DENSITY", "0.001"));

  /* Layers: bad configurations. */
  psdLayerConfig_t cfg;
  int id = -1;
  size_t shape[2] = {8, 4};
  CHECK_OK(psdLayerConfigInit(&cfg));
  CHECK(psdRegisterLayer(comm, &cfg, &id) == psdInvalidArgument); /* no name */
  cfg.name = "w";
  cfg.ndim = 2;
  cfg.shape = shape;
  cfg.kind = psdLayerSparse;
  cfg.density = 1.5;
  CHECK(psdRegisterLayer(comm, &cfg, &id) == psdInvalidArgument);
  CHECK(strstr(psdGetLastError(comm), "density 1.5 is out of range") != NULL);
  cfg.density = 0;
  cfg.strategy = (psdStrategy_t)9;
  CHECK(psdRegisterLayer(comm, &cfg, &id) == psdInvalidArgument);
  CHECK(strstr(psdGetLastError(comm), "strategy 9 is unknown") != NULL);
  CHECK(psdGetPlan(comm, NULL, &need) == psdInvalidArgument); /* no plan yet */
}

/* Layers, plan and submit / wait on a fresh communicator. */
static void TestExchange(int size) {
  psdComm_t comm = NULL;
  CHECK_OK(psdCommInitFromMpi(MPI_COMM_WORLD, &comm));
  size_t dense_shape[1] = {1000};
  size_t fc_shape[2] = {6, 5}; /* M x N */
  psdLayerConfig_t cfg;
  int dense = -1, fc = -1;
  CHECK_OK(psdLayerConfigInit(&cfg));
  cfg.name = "dense0";
  cfg.ndim = 1;
  cfg.shape = dense_shape;
  cfg.strategy = psdStrategyAllReduce;
  CHECK_OK(psdRegisterLayer(comm, &cfg, &dense));
  cfg.name = "fc1";
  cfg.ndim = 2;
  cfg.shape = fc_shape;
  cfg.kind = psdLayerFullyConnected;
  cfg.strategy = psdStrategySfb;
  CHECK_OK(psdRegisterLayer(comm, &cfg, &fc));
  CHECK(dense == 0 && fc == 1);
  CHECK(psdRegisterLayer(comm, &cfg, &fc) == psdInvalidArgument); /* duplicate name */
  CHECK(strstr(psdGetLastError(comm), "already registered") != NULL);
  int num = 0;
  CHECK_OK(psdNumLayers(comm, &num));
  CHECK(num == 2);
  const size_t batch = 3;
  CHECK_OK(psdBuildPlan(comm, batch));
  psdStrategy_t st;
  CHECK_OK(psdGetLayerStrategy(comm, fc, &st));
  CHECK(st == psdStrategySfb);
  CHECK_OK(psdGetLayerStrategy(comm, dense, &st));
  CHECK(st == psdStrategyAllReduce);
  size_t need = 0;
  CHECK_OK(psdGetPlan(comm, NULL, &need));
  char* plan = malloc(need);
  CHECK_OK(psdGetPlan(comm, plan, &need));
  CHECK(strstr(plan, "dense0") != NULL && strstr(plan, "fc1") != NULL);
  free(plan);

  /* Two steps: the dense gradient averages to ((P + 1) / 2) f(i); the fc gradient from factors
   * U (K x M) = (r + 1), V (K x N) = 1 averages to K (P + 1) / 2 everywhere; both as Average
   * rounds them (the sums P (P + 1) / 2 f(i) and K P (P + 1) / 2 are exact). */
  float* g = malloc(1000 * sizeof(float));
  float fcg[30];
  float u[3 * 6], v[3 * 5];
  for (int step = 0; step < 2; ++step) {
    for (size_t i = 0; i < 1000; ++i) g[i] = (float)((g_rank + 1) * F(i));
    for (size_t i = 0; i < 18; ++i) u[i] = (float)(g_rank + 1);
    for (size_t i = 0; i < 15; ++i) v[i] = 1.0f;
    psdHandle_t h1 = NULL, h2 = NULL;
    CHECK_OK(psdSubmit(comm, fc, fcg, NULL, u, v, batch, &h2));
    CHECK_OK(psdSubmit(comm, dense, g, NULL, NULL, NULL, 0, &h1));
    CHECK_OK(psdWait(h1, step == 0 ? -1 : LLONG_MAX)); /* LLONG_MAX: for ever as well */
    int done = 0;
    CHECK_OK(psdWait(h2, 60000));
    CHECK_OK(psdTest(h2, &done));
    CHECK(done == 1);
    CHECK_OK(psdWait(h2, 0)); /* a completed handle keeps its result */
    CHECK_OK(psdWait(h2, LLONG_MAX)); /* too large for a clock duration: for ever, not a timeout */
    int bad = 0;
    const double tri = size * (size + 1) / 2.0;
    for (size_t i = 0; i < 1000; ++i) {
      if (g[i] != Average(tri * F(i), size)) ++bad;
    }
    for (size_t i = 0; i < 30; ++i) {
      if (fcg[i] != Average((double)batch * tri, size)) ++bad;
    }
    CHECK(bad == 0);
    CHECK_OK(psdHandleFree(h1));
    CHECK_OK(psdHandleFree(h2));
    CHECK(psdWait(h1, 0) == psdInvalidArgument); /* freed: refused, not dereferenced */
    CHECK(psdHandleFree(h1) == psdInvalidArgument);
  }
  CHECK_OK(psdHandleFree(NULL));
  psdResult_t async = psdInternalError;
  CHECK_OK(psdCommGetAsyncError(comm, &async));
  CHECK(async == psdSuccess);
  /* Local argument errors on submit. */
  psdHandle_t h = NULL;
  CHECK(psdSubmit(comm, 7, g, NULL, NULL, NULL, 0, &h) == psdInvalidArgument);
  CHECK(h == NULL);
  CHECK(strstr(psdGetLastError(comm), "layer id 7 is out of range") != NULL);
  CHECK_OK(psdCommDestroy(comm));
  free(g);
}

int main(int argc, char** argv) {
  (void)argc;
  (void)argv;
  /* psdInit starts MPI itself (MPI_THREAD_MULTIPLE); psdFinalize ends it. */
  if (psdInit() != psdSuccess) {
    fprintf(stderr, "psdInit failed: %s\n", psdGetLastError(NULL));
    return 1;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  TestVersionAndStrings();
  psdComm_t comm = NULL;
  CHECK_OK(psdCommInitWorld(&comm));
  int size = 0;
  CHECK_OK(psdCommSize(comm, &size));
  TestAllReduce(comm, size);
  TestMemAlloc(comm, size);
  TestReduceScatterAllGatherBroadcast(comm, size);
  TestErrors(comm);
  TestExchange(size);

  /* A destroyed communicator is refused (never dereferenced), also when destroyed twice. */
  CHECK_OK(psdCommDestroy(comm));
  float x = 1;
  CHECK(psdAllReduce(comm, &x, &x, 1, psdFloat32, psdMemHost, NULL) == psdInvalidArgument);
  CHECK(strstr(psdGetLastError(comm), "not a live communicator") != NULL);
  CHECK(psdCommDestroy(comm) == psdInvalidArgument);

  int failures = g_failures, any = 0;
  MPI_Allreduce(&failures, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (g_rank == 0) {
    printf("c_api_test: %d checks on rank 0, %s\n", g_checks, any ? "FAILED" : "all passed");
  }
  if (psdFinalize() != psdSuccess) {
    fprintf(stderr, "psdFinalize failed: %s\n", psdGetLastError(NULL));
    return 1;
  }
  return any ? 1 : 0;
}
