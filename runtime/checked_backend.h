// CheckedBackend: the checks every backend owes its callers, written once. The public
// collectives of Backend are final here: each runs this rank's local checks (dtype, memory
// kind, the counts vector, root, the backend's element limit, the buffers), describes the call
// as a CollectiveArgs whose `local` holds the outcome, and hands both to the backend's hook.
//
// Blocking calls: the hook (DoAllReduce, ...) must run the cross-rank agreement on `args`
// before it moves any data, through Agreed() or an equivalent folded into its data path (the
// MPI backend's shared-memory window checks the descriptor in the collective's first step),
// and return its error when it fails: then one rank's bad argument, or ranks that disagree,
// fail the call on every rank with the same message instead of leaving peers waiting. A hook
// may add to the local outcome before agreeing (the staged backend's copy to host memory).
// The hooks never see a call whose local checks failed without also joining the agreement.
//
// The non-blocking IAllReduce: the local checks only (the engine agrees on the arguments itself);
// the hook runs only when they pass.
//
// FailTogether is Agree with this rank's error and no data: a peer inside its matching
// blocking call fails with a message naming this rank.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "runtime/arg_check.h"
#include "runtime/backend.h"

namespace poseidon {

// Declares, inside a class derived from CheckedBackend, the overrides of its six Do* hooks
// (every backend implements all of them).
#define PSD_CHECKED_BACKEND_HOOKS                                                              \
  Status DoAllReduce(const void* send, void* recv, size_t count, DType dtype,                  \
                     const CallOptions& opts, const CollectiveArgs& args) override;            \
  Status DoReduceScatter(const void* send, void* recv, const std::vector<size_t>& counts,      \
                         DType dtype, const CallOptions& opts, const CollectiveArgs& args)     \
      override;                                                                                \
  Status DoAllGather(const void* send, void* recv, size_t count, DType dtype,                  \
                     const CallOptions& opts, const CollectiveArgs& args) override;            \
  Status DoAllGatherV(const void* send, void* recv, const std::vector<size_t>& counts,         \
                      DType dtype, const CallOptions& opts, const CollectiveArgs& args)        \
      override;                                                                                \
  Status DoBroadcast(void* buf, size_t count, DType dtype, int root, const CallOptions& opts,  \
                     const CollectiveArgs& args) override;                                     \
  Result<std::unique_ptr<Request>> DoIAllReduce(const void* send, void* recv, size_t count,    \
                                                DType dtype, const CallOptions& opts) override;

class CheckedBackend : public Backend {
 public:
  Status AllReduce(const void* send, void* recv, size_t count, DType dtype,
                   const CallOptions& opts = {}) final;
  Status ReduceScatter(const void* send, void* recv, const std::vector<size_t>& counts,
                       DType dtype, const CallOptions& opts = {}) final;
  Status AllGather(const void* send, void* recv, size_t count, DType dtype,
                   const CallOptions& opts = {}) final;
  Status AllGatherV(const void* send, void* recv, const std::vector<size_t>& counts, DType dtype,
                    const CallOptions& opts = {}) final;
  Status Broadcast(void* buf, size_t count, DType dtype, int root,
                   const CallOptions& opts = {}) final;
  // Runs Agree with `local` (moving no data) and returns `local`.
  Status FailTogether(const char* call, const Status& local, const Interrupt* interrupt) final;

  Result<std::unique_ptr<Request>> IAllReduce(const void* send, void* recv, size_t count,
                                              DType dtype, const CallOptions& opts = {}) final;
 protected:
  // ---- What depends on the backend ----

  // A buffer of `count` elements (`bytes` bytes) of the call's memory kind: host backends
  // refuse null with count > 0; device backends also ask CUDA where the pointer lives.
  virtual Status CheckBuffer(const char* call, const char* which, const void* p, size_t count,
                             size_t bytes) const = 0;
  // The most elements one call may pass to the transport (`elements`: the largest count the
  // call hands it). Default: no limit.
  virtual Status CheckElements(const char* call, size_t elements) const;
  // Whether the backend can still run a call. An error joins this rank's local outcome, so the
  // peers fail with it too. Default: always usable. (A backend whose transport is itself
  // broken, where even the agreement cannot run, refuses inside its hooks instead.)
  virtual Status Usable(const char* call);
  // The cross-rank agreement on a blocking call's arguments and on every rank's local outcome
  // (args.local). Collective: every rank of the call runs it alike. OK on every rank, or an
  // error on every rank (runtime/arg_check.h, ArgsVerdict). Honours POSEIDON_CHECK_ARGS (off:
  // args.local, except where the check costs nothing).
  virtual Status Agree(const CollectiveArgs& args, const Interrupt* interrupt) = 0;

  // The calls themselves, after the local checks (see the top of this file).
  virtual Status DoAllReduce(const void* send, void* recv, size_t count, DType dtype,
                             const CallOptions& opts, const CollectiveArgs& args) = 0;
  virtual Status DoReduceScatter(const void* send, void* recv, const std::vector<size_t>& counts,
                                 DType dtype, const CallOptions& opts,
                                 const CollectiveArgs& args) = 0;
  virtual Status DoAllGather(const void* send, void* recv, size_t count, DType dtype,
                             const CallOptions& opts, const CollectiveArgs& args) = 0;
  virtual Status DoAllGatherV(const void* send, void* recv, const std::vector<size_t>& counts,
                              DType dtype, const CallOptions& opts,
                              const CollectiveArgs& args) = 0;
  virtual Status DoBroadcast(void* buf, size_t count, DType dtype, int root,
                             const CallOptions& opts, const CollectiveArgs& args) = 0;
  virtual Result<std::unique_ptr<Request>> DoIAllReduce(const void* send, void* recv,
                                                        size_t count, DType dtype,
                                                        const CallOptions& opts) = 0;
  // ---- For the hooks ----

  // args.local when the caller vouched for agreement (CallOptions::agreed), else Agree.
  Status Agreed(const CollectiveArgs& args, const CallOptions& opts) {
    return opts.agreed ? args.local : Agree(args, opts.interrupt);
  }
  // The checks every call starts with: dtype, memory kind (SupportsMemory), then Usable.
  Status CheckCall(const char* call, DType dtype, const CallOptions& opts);

 private:
  // CheckCall, the transport's limit and both buffers of an allreduce.
  Status CheckSummed(const char* call, const void* send, void* recv, size_t count, DType dtype,
                     const CallOptions& opts);
  // CheckCall, the counts vector (one entry per rank), the transport's limit on its sum, and
  // the buffers of a reduce-scatter (send_all) or an allgatherv (!send_all).
  Status CheckCounted(const char* call, const void* send, void* recv,
                      const std::vector<size_t>& counts, DType dtype, const CallOptions& opts,
                      bool send_all);
};

}  // namespace poseidon
