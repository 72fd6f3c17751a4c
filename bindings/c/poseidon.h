/* Poseidon C API: the stable ABI over the C++ runtime (communicator, blocking collectives, the
 * hybrid per-layer gradient exchange and the background engine).
 *
 * Conventions that hold for every entry point below:
 *  - Every call returns a psdResult_t; psdSuccess (0) is the only success value. No C++
 *    exception ever leaves the library: an unexpected one becomes psdInternalError.
 *  - On failure, a message naming the call, the bad value and what was expected is kept: per
 *    communicator (psdGetLastError(comm)) and per thread (psdGetLastError(NULL)), so calls
 *    without a valid communicator (a NULL or destroyed handle) still explain themselves.
 *  - Handles (psdComm_t, psdHandle_t) are opaque numbers looked up in a registry of live
 *    objects, never dereferenced: a destroyed, freed or made-up handle is detected and refused
 *    with psdInvalidArgument instead of touching freed memory. Handle values are never reused.
 *  - "Collective" means every rank of the communicator must make the same call with matching
 *    arguments in the same order (like MPI). With POSEIDON_CHECK_ARGS on (the default), blocking
 *    collectives first agree across ranks, so a bad argument on one rank fails the call on all
 *    ranks (psdInvalidArgument / psdMismatch) instead of hanging them.
 *  - Threads: every call is safe to make from any thread. Calls on one communicator are
 *    serialized by the library; the caller keeps collective calls in the same order on every
 *    rank. MPI should provide MPI_THREAD_MULTIPLE when several threads call (psdInit asks for
 *    it).
 *  - Buffers are owned by the caller. Blocking calls do not keep them; psdSubmit borrows them
 *    until its handle completes.
 *
 * Link with -lposeidon (pkg-config poseidon, or CMake find_package(Poseidon) and the target
 * Poseidon::poseidon). The header includes mpi.h for MPI_Comm.
 */
#ifndef POSEIDON_C_POSEIDON_H_
#define POSEIDON_C_POSEIDON_H_

/* Only MPI's C API is needed: keep the deprecated MPI C++ bindings out of C++ callers (they
 * would need linking with libmpi_cxx). */
#if defined(__cplusplus) && !defined(OMPI_SKIP_MPICXX)
#define OMPI_SKIP_MPICXX 1
#endif
#if defined(__cplusplus) && !defined(MPICH_SKIP_MPICXX)
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>
#include <stddef.h>
#include <stdio.h>

#if defined(_WIN32)
#define PSD_API
#elif defined(POSEIDON_C_BUILDING)
#define PSD_API __attribute__((visibility("default")))
#else
#define PSD_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Version of this header; psdGetVersion returns the library's (they match when the header and
 * the library come from the same install). */
#define PSD_VERSION_MAJOR 0
#define PSD_VERSION_MINOR 1
#define PSD_VERSION_PATCH 0
#define PSD_VERSION_CODE_OF(major, minor, patch) ((major) * 10000 + (minor) * 100 + (patch))
#define PSD_VERSION_CODE \
  PSD_VERSION_CODE_OF(PSD_VERSION_MAJOR, PSD_VERSION_MINOR, PSD_VERSION_PATCH)

/* Result codes. Numbered like poseidon::StatusCode; never renumbered. */
typedef enum {
  psdSuccess = 0,
  psdInvalidArgument = 1, /* a bad value from the caller (NULL, unknown enum, bad handle, ...) */
  psdMismatch = 2,        /* ranks disagree about a collective (count, dtype, layer, order) */
  psdBackendError = 3,    /* MPI / NCCL / CUDA reported an error */
  psdTimeout = 4,         /* psdWait ran past its timeout (the operation continues) */
  psdAborted = 5,         /* the communicator failed earlier (sticky) or was shut down */
  psdUnavailable = 6,     /* not built in or not present here (no CUDA, no GPU, an MPI thread
                             level below what the engine needs, ...) */
  psdInternalError = 7,   /* a broken invariant inside Poseidon */
  psdUnimplemented = 8,   /* the operation is not supported (yet) for these arguments */
  psdPeerLost = 9,        /* a peer stopped answering heartbeats for POSEIDON_PEER_TIMEOUT_S
                             (frozen, dead or cut off; the message names its rank and host); the
                             job is ending */
  psdNumResults = 10
} psdResult_t;

/* Element types; numbered like poseidon::DType. */
typedef enum {
  psdFloat32 = 0,
  psdFloat64 = 1,
  psdFloat16 = 2,  /* IEEE binary16; sums accumulate in float32 */
  psdBFloat16 = 3, /* bfloat16; sums accumulate in float32 */
  psdInt32 = 4,
  psdInt64 = 5,
  psdNumDataTypes = 6
} psdDataType_t;

/* Where a buffer lives. Device memory needs a CUDA build and a GPU (else psdUnavailable). */
typedef enum { psdMemHost = 0, psdMemDevice = 1 } psdMemory_t;

/* Layer kinds (which exchanges can apply), numbered like poseidon::LayerKind. */
typedef enum {
  psdLayerDense = 0,          /* conv or any tensor: allreduce (ps with an optimizer) */
  psdLayerFullyConnected = 1, /* an M x N weight with sufficient factors: adds sfb */
  psdLayerSparse = 2          /* tolerates sparsified updates: adds topk */
} psdLayerKind_t;

/* Exchange strategies, numbered like poseidon::StrategyKind; psdStrategyAuto lets the planner
 * choose. */
typedef enum {
  psdStrategyAuto = -1,
  psdStrategyAllReduce = 0,
  psdStrategyPs = 1,
  psdStrategySfb = 2,
  psdStrategyTopk = 3
} psdStrategy_t;

typedef enum { psdOptimizerNone = 0, psdOptimizerSgd = 1, psdOptimizerAdam = 2 } psdOptimizerKind_t;

/* An optimizer Poseidon applies inside the exchange (see psdLayerConfig_t). Fields not used by
 * the kind are ignored. */
typedef struct {
  psdOptimizerKind_t kind;
  float lr;
  float momentum;     /* sgd */
  int nesterov;       /* sgd: 0 or 1 */
  float beta1, beta2; /* adam */
  float eps;          /* adam */
  float weight_decay; /* both */
} psdOptimizer_t;

/* One layer (one parameter tensor whose gradient is exchanged every step). Fill it with
 * psdLayerConfigInit, then set what differs from the defaults.
 *   name      required, unique per communicator, no whitespace, not starting with '#';
 *             copied by the call.
 *   ndim      number of entries in shape (0..8); psdLayerFullyConnected needs exactly 2 {M, N}.
 *   shape     ndim extents (copied); may be NULL when ndim == 0.
 *   kind      default psdLayerDense.
 *   strategy  default psdStrategyAuto (the planner chooses); anything else forces it.
 *   density   topk: fraction of entries sent per step, in (0, 1]; 0 = POSEIDON_TOPK_DENSITY.
 *   candidates comma-separated strategy names the planner may choose from ("allreduce,topk");
 *             NULL = POSEIDON_CANDIDATES.
 *   optimizer kind psdOptimizerNone (default): the exchange returns the gradient averaged over
 *             ranks. Otherwise the exchange applies the step to the parameters on every rank
 *             (ps needs this). */
typedef struct {
  const char* name;
  int ndim;
  const size_t* shape;
  psdLayerKind_t kind;
  psdStrategy_t strategy;
  double density;
  const char* candidates;
  psdOptimizer_t optimizer;
} psdLayerConfig_t;

typedef struct psdComm* psdComm_t;     /* opaque communicator */
typedef struct psdHandle* psdHandle_t; /* opaque pending exchange from psdSubmit */

/* ---- errors and version (no communicator needed; never block; any thread) ---------------- */

/* A constant, static description of a result code ("invalid argument", ...); never NULL, also
 * for unknown codes. */
PSD_API const char* psdGetErrorString(psdResult_t result);

/* The message of the last failure: of `comm` when it is a live communicator, else (comm NULL,
 * destroyed or invalid) of the last failing call made by this thread. Returns "" when there was
 * none. The text is copied into storage owned by the calling thread and stays valid until the
 * same thread calls psdGetLastError again. */
PSD_API const char* psdGetLastError(psdComm_t comm);

/* *version = PSD_VERSION_CODE of the library. psdInvalidArgument when version is NULL. */
PSD_API psdResult_t psdGetVersion(int* version);

/* ---- MPI and communicators ----------------------------------------------------------------- */

/* Initializes MPI (MPI_Init_thread asking for MPI_THREAD_MULTIPLE) unless it already is. Safe
 * to call again. Not collective beyond MPI_Init's own rules. */
PSD_API psdResult_t psdInit(void);

/* Destroys every live communicator of this process (as psdCommDestroy), then calls
 * MPI_Finalize if psdInit (or psdCommInitWorld) initialized MPI. Collective over
 * MPI_COMM_WORLD when it finalizes. Later calls need psdInit again (MPI cannot restart, so
 * they fail with psdUnavailable after a finalize). */
PSD_API psdResult_t psdFinalize(void);

/* Creates a communicator over a duplicate of `mpi_comm` (Poseidon's traffic never matches the
 * caller's messages). MPI must be initialized. Collective over mpi_comm. On success *comm is a
 * new handle the caller owns (free with psdCommDestroy); on failure *comm is NULL. */
PSD_API psdResult_t psdCommInitFromMpi(MPI_Comm mpi_comm, psdComm_t* comm);

/* psdInit, then psdCommInitFromMpi(MPI_COMM_WORLD, comm). Collective over MPI_COMM_WORLD. */
PSD_API psdResult_t psdCommInitWorld(psdComm_t* comm);

/* Stops the communicator's engine (pending handles fail with psdAborted), frees its layers,
 * plan and MPI duplicate. Must run before MPI_Finalize. Calls already running on other threads
 * finish first; later calls with this handle fail with psdInvalidArgument. Collective (the MPI
 * duplicate is freed). */
PSD_API psdResult_t psdCommDestroy(psdComm_t comm);

/* Rank and size of the communicator, and among the ranks that share this node. Local. */
PSD_API psdResult_t psdCommRank(psdComm_t comm, int* rank);
PSD_API psdResult_t psdCommSize(psdComm_t comm, int* size);
PSD_API psdResult_t psdCommLocalRank(psdComm_t comm, int* local_rank);
PSD_API psdResult_t psdCommLocalSize(psdComm_t comm, int* local_size);

/* The sticky asynchronous error: psdSuccess until a submitted exchange or the engine fails (on
 * this rank or because another rank failed it, e.g. with a refused submission),
 * then that failure's code for the rest of the communicator's life (the message is in
 * psdGetLastError(comm)). A clean stop of the engine is not a failure: a re-plan or a destroy,
 * on this rank or on a peer that got there first, never sets it. Local: never waits for another
 * rank or call (at most a few milliseconds while a failed engine stops). */
PSD_API psdResult_t psdCommGetAsyncError(psdComm_t comm, psdResult_t* async_error);

/* ---- settings -------------------------------------------------------------------------- */

/* Overrides a POSEIDON_* setting for this process (name with or without the POSEIDON_ prefix).
 * The text must parse as the setting's type. Local; applies to calls made afterwards (the
 * planner reads its settings at psdBuildPlan, layers at psdRegisterLayer). */
PSD_API psdResult_t psdSetSetting(const char* name, const char* value);

/* Current value of a setting as text, written into buf (size bytes, NUL included). With
 * buf == NULL or a too small *size, *size is set to the bytes needed; a too small non-NULL buf
 * gives psdInvalidArgument. */
PSD_API psdResult_t psdGetSetting(const char* name, char* buf, size_t* size);

/* ---- blocking collectives (collective; block until done on this rank) --------------------
 * Sums over ranks. send == recv is in place for psdAllReduce and psdBroadcast. `memory` says
 * where both buffers live; `stream` is a cudaStream_t for device memory (NULL otherwise). */

/* recv[i] = sum over ranks of send[i], i < count. */
PSD_API psdResult_t psdAllReduce(psdComm_t comm, const void* send, void* recv, size_t count,
                                 psdDataType_t dtype, psdMemory_t memory, void* stream);

/* send holds size * recv_count elements; recv gets recv_count elements: the sum over ranks of
 * this rank's slice (offset rank * recv_count). */
PSD_API psdResult_t psdReduceScatter(psdComm_t comm, const void* send, void* recv,
                                     size_t recv_count, psdDataType_t dtype, psdMemory_t memory,
                                     void* stream);

/* recv gets send_count elements from every rank, in rank order (size * send_count). */
PSD_API psdResult_t psdAllGather(psdComm_t comm, const void* send, void* recv, size_t send_count,
                                 psdDataType_t dtype, psdMemory_t memory, void* stream);

/* Every rank's buf gets root's count elements. */
PSD_API psdResult_t psdBroadcast(psdComm_t comm, void* buf, size_t count, psdDataType_t dtype,
                                 int root, psdMemory_t memory, void* stream);

PSD_API psdResult_t psdBarrier(psdComm_t comm);

/* ---- node-shared host memory --------------------------------------------------------------
 * *ptr gets `bytes` (> 0) of host memory, 64-byte aligned, that every rank on this node maps:
 * a psdAllReduce whose send and recv lie in such memory on every rank (above 32 KiB; 256 KiB at
 * 2 ranks) sums straight from every rank's input into every rank's output, with no copy
 * through the shared-memory window (the host counterpart of ncclMemAlloc). A psdAllGather of
 * more than 256 KiB per rank, or a psdReduceScatter whose shard exceeds 1 MiB / P (512 KiB / P
 * where ranks outnumber cores), whose send lies in such memory on every rank (its recv may lie
 * anywhere) reads the peers' inputs straight too (an allgather up to 32 MiB in all where ranks
 * outnumber cores). Collective: every rank calls psdMemAlloc,
 * and psdMemFree, in the same order; the sizes may differ. A size of 0
 * (or a NULL ptr) on one rank fails the call on every rank. Where the ranks span several nodes
 * or the window is off (POSEIDON_SHM_THRESHOLD_BYTES=0), plain memory, which psdMemFree still
 * takes. */
PSD_API psdResult_t psdMemAlloc(psdComm_t comm, size_t bytes, void** ptr);
/* Frees what psdMemAlloc returned on this rank; collective like it. NULL frees nothing: where
 * every rank passes NULL it returns psdSuccess; where some ranks pass NULL and others memory,
 * or the ranks free different allocations, every rank fails and nothing is freed. */
PSD_API psdResult_t psdMemFree(psdComm_t comm, void* ptr);

/* ---- layers and the plan ---------------------------------------------------------------- */

/* Fills *config with the defaults (dense, automatic strategy, default density, no optimizer;
 * sgd / adam fields get the usual values lr 0.01, momentum 0.9, beta1 0.9, beta2 0.999,
 * eps 1e-8). */
PSD_API psdResult_t psdLayerConfigInit(psdLayerConfig_t* config);

/* Registers one layer; *layer_id gets its id (0, 1, 2, ... in registration order). Local, but
 * every rank must register the same layers in the same order before psdBuildPlan. Registering
 * after a plan was built needs a new psdBuildPlan. Bad values (name, shape, kind, strategy,
 * density, optimizer) give psdInvalidArgument naming the layer and the field. */
PSD_API psdResult_t psdRegisterLayer(psdComm_t comm, const psdLayerConfig_t* config,
                                     int* layer_id);

/* Number of registered layers. Local. */
PSD_API psdResult_t psdNumLayers(psdComm_t comm, int* num_layers);

/* Plans every registered layer for `batch` samples per rank: measures the cost model (or loads
 * its cache), then picks a strategy per layer. Collective; fails on every rank (psdMismatch)
 * when the ranks registered different layers or passed different batches. Then starts the
 * communicator's engine (psdSubmit needs it), after stopping the previous plan's, whose pending
 * handles fail with psdAborted. */
PSD_API psdResult_t psdBuildPlan(psdComm_t comm, size_t batch);

/* The strategy the plan chose for a layer (psdInvalidArgument before psdBuildPlan). Local. */
PSD_API psdResult_t psdGetLayerStrategy(psdComm_t comm, int layer_id, psdStrategy_t* strategy);

/* The plan as a text table (the same text psdPrintPlan writes). With buf == NULL or a too small
 * *size, *size is set to the bytes needed (NUL included); a too small non-NULL buf gives
 * psdInvalidArgument. Local. */
PSD_API psdResult_t psdGetPlan(psdComm_t comm, char* buf, size_t* size);

/* Writes the plan table to `stream` (stdout when NULL). Local: call it on one rank. */
PSD_API psdResult_t psdPrintPlan(psdComm_t comm, FILE* stream);

/* ---- asynchronous exchange through the engine ------------------------------------------- */

/* Submits this step's gradient of one layer to the engine psdBuildPlan started and returns at
 * once with *handle (owned by the caller: psdHandleFree). Collective in the engine's sense: every rank submits the same layers
 * (in any order per step: the engine agrees on one); a rank that disagrees (layer, size,
 * strategy) fails with psdMismatch instead of hanging.
 *   grad    the layer's gradient (float32, its element count), input and output: it holds the
 *           gradient averaged over ranks when the handle completes (with an optimizer: scratch).
 *           For a fully connected layer submitted as factors (u and v non-NULL), grad is only
 *           an output.
 *   params  the parameters (required with an optimizer, updated in place; else may be NULL).
 *   u, v    sufficient factors of a fully connected layer: batch x M and batch x N, row-major
 *           (NULL for other layers, or to send the dense gradient of one not planned as sfb;
 *           a layer planned as sfb needs both, not NULL also with batch 0).
 * All buffers are borrowed until the handle completes; do not touch them before.
 * A submission refused here (psdInvalidArgument: a NULL handle pointer, a bad layer, a missing
 * buffer or factors, layers registered after the plan) also fails the engine on every rank
 * within a cycle, since the other ranks would wait for it: their pending and later handles fail
 * with a message naming this rank, and psdCommGetAsyncError reports it; psdBuildPlan starts a
 * fresh engine. (With no plan at all there is no engine to fail.) */
PSD_API psdResult_t psdSubmit(psdComm_t comm, int layer_id, float* grad, float* params,
                              const float* u, const float* v, size_t batch,
                              psdHandle_t* handle);

/* Waits for the exchange: timeout_ms < 0 waits for ever, 0 only checks; a timeout beyond
 * 10^10 ms (about 116 days, e.g. LLONG_MAX) also waits for ever. Returns psdSuccess when it
 * completed, psdTimeout when it did not finish in time (the handle stays valid), or the
 * exchange's own error. Any thread; a completed handle returns the same result again. */
PSD_API psdResult_t psdWait(psdHandle_t handle, long long timeout_ms);

/* Never blocks: *done = 1 when the exchange completed (the return value is then its result),
 * 0 while it runs (returns psdSuccess). */
PSD_API psdResult_t psdTest(psdHandle_t handle, int* done);

/* Releases the handle. A handle still running is detached: the exchange completes in the
 * background (its buffers stay borrowed until then, at the latest until psdCommDestroy) and a
 * failure shows in psdCommGetAsyncError. NULL is accepted and does nothing. */
PSD_API psdResult_t psdHandleFree(psdHandle_t handle);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* POSEIDON_C_POSEIDON_H_ */
