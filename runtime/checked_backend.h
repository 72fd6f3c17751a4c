// CheckedBackend: the checks every backend owes its callers, written once. Each public
// collective of Backend runs this rank's local checks (dtype, memory kind, the counts vector,
// root, the backend's element limit, the buffers), describes the call as a CollectiveArgs
// whose `local` holds the outcome, and hands both to the backend's hook. The five blocking
// ones are written as templates over the backend's type (Checked*, below): CheckedBackend's
// own overrides run them with the hooks dispatched virtually; a final backend may override
// the five itself with nothing but a call to the template for its own type (MpiBackend does),
// which makes every check and the hook a direct call. Every backend is final, so that none
// can override a collective and skip its checks by mistake.
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
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
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

// Declares, inside a final class derived from CheckedBackend, the five blocking collectives as
// direct calls of the Checked* templates for that class (define them with
// PSD_CHECKED_BACKEND_DIRECT_CALLS(Class) in its .cc file; or only the two with a counts vector,
// with PSD_CHECKED_BACKEND_DIRECT_COUNTED_CALLS(Class), where the class writes AllReduce,
// AllGather and Broadcast itself: a path for the common case in front of the Checked* template,
// taken only where every check the template makes would pass).
#define PSD_CHECKED_BACKEND_DIRECT                                                             \
  Status AllReduce(const void* send, void* recv, size_t count, DType dtype,                    \
                   const CallOptions& opts = {}) override;                                     \
  Status ReduceScatter(const void* send, void* recv, const std::vector<size_t>& counts,        \
                       DType dtype, const CallOptions& opts = {}) override;                    \
  Status AllGather(const void* send, void* recv, size_t count, DType dtype,                    \
                   const CallOptions& opts = {}) override;                                     \
  Status AllGatherV(const void* send, void* recv, const std::vector<size_t>& counts,           \
                    DType dtype, const CallOptions& opts = {}) override;                       \
  Status Broadcast(void* buf, size_t count, DType dtype, int root,                             \
                   const CallOptions& opts = {}) override;                                     \
  friend class CheckedBackend;

#define PSD_CHECKED_BACKEND_DIRECT_CALLS(Class)                                                \
  PSD_CHECKED_BACKEND_DIRECT_COUNTED_CALLS(Class)                                              \
  Status Class::AllReduce(const void* send, void* recv, size_t count, DType dtype,             \
                          const CallOptions& opts) {                                           \
    return CheckedAllReduce(*this, send, recv, count, dtype, opts);                            \
  }                                                                                            \
  Status Class::AllGather(const void* send, void* recv, size_t count, DType dtype,             \
                          const CallOptions& opts) {                                           \
    return CheckedAllGather(*this, send, recv, count, dtype, opts);                            \
  }                                                                                            \
  Status Class::Broadcast(void* buf, size_t count, DType dtype, int root,                      \
                          const CallOptions& opts) {                                           \
    return CheckedBroadcast(*this, buf, count, dtype, root, opts);                             \
  }

#define PSD_CHECKED_BACKEND_DIRECT_COUNTED_CALLS(Class)                                        \
  Status Class::ReduceScatter(const void* send, void* recv, const std::vector<size_t>& counts, \
                              DType dtype, const CallOptions& opts) {                          \
    return CheckedReduceScatter(*this, send, recv, counts, dtype, opts);                       \
  }                                                                                            \
  Status Class::AllGatherV(const void* send, void* recv, const std::vector<size_t>& counts,    \
                           DType dtype, const CallOptions& opts) {                             \
    return CheckedAllGatherV(*this, send, recv, counts, dtype, opts);                          \
  }

class CheckedBackend : public Backend {
 public:
  Status AllReduce(const void* send, void* recv, size_t count, DType dtype,
                   const CallOptions& opts = {}) override {
    return CheckedAllReduce(*this, send, recv, count, dtype, opts);
  }
  Status ReduceScatter(const void* send, void* recv, const std::vector<size_t>& counts,
                       DType dtype, const CallOptions& opts = {}) override {
    return CheckedReduceScatter(*this, send, recv, counts, dtype, opts);
  }
  Status AllGather(const void* send, void* recv, size_t count, DType dtype,
                   const CallOptions& opts = {}) override {
    return CheckedAllGather(*this, send, recv, count, dtype, opts);
  }
  Status AllGatherV(const void* send, void* recv, const std::vector<size_t>& counts, DType dtype,
                    const CallOptions& opts = {}) override {
    return CheckedAllGatherV(*this, send, recv, counts, dtype, opts);
  }
  Status Broadcast(void* buf, size_t count, DType dtype, int root,
                   const CallOptions& opts = {}) override {
    return CheckedBroadcast(*this, buf, count, dtype, root, opts);
  }
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
  virtual Status Usable(const char* call) {
    (void)call;
    return Status::Ok();
  }
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

  // The errors of the checks above (out of line: they build messages).
  static Status WrongMemory(const Backend& b, const char* call, const CallOptions& opts);
  static Status BadRoot(const char* call, int root, int size);
  static Status GatherTooLarge(const char* call, size_t count, int size);
  // args.local when the caller vouched for agreement (CallOptions::agreed), else Agree.
  Status Agreed(const CollectiveArgs& args, const CallOptions& opts) {
    return opts.agreed ? args.local : Agree(args, opts.interrupt);
  }
  // The checks every call starts with: dtype, memory kind (SupportsMemory), then Usable.
  Status CheckCall(const char* call, DType dtype, const CallOptions& opts) {
    return CheckCallOf(*this, call, dtype, opts);
  }

  // The five blocking collectives: the local checks, then the hook (see the top of the file).
  // B is the backend's type; a final B makes every call in them direct.
  template <class B>
  static Status CheckedAllReduce(B& b, const void* send, void* recv, size_t count, DType dtype,
                                 const CallOptions& opts);
  template <class B>
  static Status CheckedReduceScatter(B& b, const void* send, void* recv,
                                     const std::vector<size_t>& counts, DType dtype,
                                     const CallOptions& opts);
  template <class B>
  static Status CheckedAllGather(B& b, const void* send, void* recv, size_t count, DType dtype,
                                 const CallOptions& opts);
  template <class B>
  static Status CheckedAllGatherV(B& b, const void* send, void* recv,
                                  const std::vector<size_t>& counts, DType dtype,
                                  const CallOptions& opts);
  template <class B>
  static Status CheckedBroadcast(B& b, void* buf, size_t count, DType dtype, int root,
                                 const CallOptions& opts);

 private:
  template <class B>
  static Status CheckCallOf(B& b, const char* call, DType dtype, const CallOptions& opts);
  // CheckCall, the transport's limit and both buffers of an allreduce.
  template <class B>
  static Status CheckSummed(B& b, const char* call, const void* send, void* recv, size_t count,
                            DType dtype, const CallOptions& opts);
  // CheckCall, the counts vector (one entry per rank), the transport's limit on its sum, and
  // the buffers of a reduce-scatter (send_all) or an allgatherv (!send_all).
  template <class B>
  static Status CheckCounted(B& b, const char* call, const void* send, void* recv,
                             const std::vector<size_t>& counts, DType dtype,
                             const CallOptions& opts, bool send_all);
  // Every rank of a call describes it alike: the element count every rank must pass, the
  // dtype, the root (-1 without one), the hash of the shard layout (0 without one) and the
  // caller's detail (CallOptions::detail).
  static CollectiveArgs Describe(const char* call, size_t count, DType dtype, int root,
                                 uint64_t layout_hash, Status local, const CallOptions& opts) {
    return CollectiveArgs{call, static_cast<int64_t>(count), static_cast<int64_t>(dtype), root,
                          layout_hash, std::move(local), opts.detail};
  }
  // A call with a counts vector: their sum, and their hash as the layout.
  static CollectiveArgs DescribeCounted(const char* call, const std::vector<size_t>& counts,
                                        DType dtype, Status local, const CallOptions& opts) {
    return Describe(call, SumCounts(counts), dtype, -1, HashCounts(counts), std::move(local),
                    opts);
  }
};

template <class B>
Status CheckedBackend::CheckCallOf(B& b, const char* call, DType dtype, const CallOptions& opts) {
  PSD_CHECK(CheckDType(call, dtype));
  if (!b.SupportsMemory(opts.memory)) return WrongMemory(b, call, opts);
  return b.Usable(call);
}

template <class B>
Status CheckedBackend::CheckSummed(B& b, const char* call, const void* send, void* recv,
                                   size_t count, DType dtype, const CallOptions& opts) {
  PSD_CHECK(CheckCallOf(b, call, dtype, opts));
  const size_t bytes = count * DTypeSize(dtype);
  PSD_CHECK(b.CheckElements(call, count));
  PSD_CHECK(b.CheckBuffer(call, "send", send, count, bytes));
  return b.CheckBuffer(call, "recv", recv, count, bytes);
}

template <class B>
Status CheckedBackend::CheckCounted(B& b, const char* call, const void* send, void* recv,
                                    const std::vector<size_t>& counts, DType dtype,
                                    const CallOptions& opts, bool send_all) {
  PSD_CHECK(CheckCallOf(b, call, dtype, opts));
  PSD_CHECK(CheckCountsPerRank(call, counts, b.size()));
  const size_t total = SumCounts(counts);
  PSD_CHECK(b.CheckElements(call, total));
  const size_t mine = counts[static_cast<size_t>(b.rank())];
  const size_t es = DTypeSize(dtype);
  const size_t in = send_all ? total : mine, out = send_all ? mine : total;
  PSD_CHECK(b.CheckBuffer(call, "send", send, in, in * es));
  return b.CheckBuffer(call, "recv", recv, out, out * es);
}

template <class B>
Status CheckedBackend::CheckedAllReduce(B& b, const void* send, void* recv, size_t count,
                                        DType dtype, const CallOptions& opts) {
  const char* call = "AllReduce";
  Status local = CheckSummed(b, call, send, recv, count, dtype, opts);
  return b.DoAllReduce(send, recv, count, dtype, opts,
                       Describe(call, count, dtype, -1, 0, std::move(local), opts));
}

template <class B>
Status CheckedBackend::CheckedReduceScatter(B& b, const void* send, void* recv,
                                            const std::vector<size_t>& counts, DType dtype,
                                            const CallOptions& opts) {
  const char* call = "ReduceScatter";
  Status local = CheckCounted(b, call, send, recv, counts, dtype, opts, /*send_all=*/true);
  return b.DoReduceScatter(send, recv, counts, dtype, opts,
                           DescribeCounted(call, counts, dtype, std::move(local), opts));
}

template <class B>
Status CheckedBackend::CheckedAllGather(B& b, const void* send, void* recv, size_t count,
                                        DType dtype, const CallOptions& opts) {
  const char* call = "AllGather";
  Status local = CheckCallOf(b, call, dtype, opts);
  const size_t ranks = static_cast<size_t>(b.size());
  if (local.ok() && count > SIZE_MAX / ranks) local = GatherTooLarge(call, count, b.size());
  const size_t all = count * ranks;
  const size_t es = local.ok() ? DTypeSize(dtype) : 0;
  if (local.ok()) local = b.CheckElements(call, all);
  if (local.ok()) local = b.CheckBuffer(call, "send", send, count, count * es);
  if (local.ok()) local = b.CheckBuffer(call, "recv", recv, all, all * es);
  return b.DoAllGather(send, recv, count, dtype, opts,
                       Describe(call, count, dtype, -1, 0, std::move(local), opts));
}

template <class B>
Status CheckedBackend::CheckedAllGatherV(B& b, const void* send, void* recv,
                                         const std::vector<size_t>& counts, DType dtype,
                                         const CallOptions& opts) {
  const char* call = "AllGatherV";
  Status local = CheckCounted(b, call, send, recv, counts, dtype, opts, /*send_all=*/false);
  return b.DoAllGatherV(send, recv, counts, dtype, opts,
                        DescribeCounted(call, counts, dtype, std::move(local), opts));
}

template <class B>
Status CheckedBackend::CheckedBroadcast(B& b, void* buf, size_t count, DType dtype, int root,
                                        const CallOptions& opts) {
  const char* call = "Broadcast";
  Status local = CheckCallOf(b, call, dtype, opts);
  if (local.ok() && (root < 0 || root >= b.size())) local = BadRoot(call, root, b.size());
  if (local.ok()) local = b.CheckElements(call, count);
  if (local.ok()) local = b.CheckBuffer(call, "buf", buf, count, count * DTypeSize(dtype));
  return b.DoBroadcast(buf, count, dtype, root, opts,
                       Describe(call, count, dtype, root, 0, std::move(local), opts));
}

}  // namespace poseidon
