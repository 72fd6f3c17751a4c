#include "runtime/checked_backend.h"

#include <utility>

namespace poseidon {

namespace {

// Every rank of a call describes it alike: the element count every rank must pass, the dtype,
// the root (-1 without one), the hash of the shard layout (0 without one) and the caller's
// detail (CallOptions::detail).
CollectiveArgs Describe(const char* call, size_t count, DType dtype, int root,
                        uint64_t layout_hash, Status local, const CallOptions& opts) {
  return CollectiveArgs{call, static_cast<int64_t>(count), static_cast<int64_t>(dtype), root,
                        layout_hash, std::move(local), opts.detail};
}

}  // namespace

Status CheckedBackend::CheckElements(const char* call, size_t elements) const {
  (void)call, (void)elements;
  return Status::Ok();
}

Status CheckedBackend::Usable(const char* call) {
  (void)call;
  return Status::Ok();
}

Status CheckedBackend::CheckCall(const char* call, DType dtype, const CallOptions& opts) {
  PSD_CHECK(CheckDType(call, dtype));
  PSD_REQUIRE_ARG(SupportsMemory(opts.memory), call, ": the ", name(), " backend was given ",
                  MemoryKindName(opts.memory), " memory; expected ",
                  MemoryKindName(opts.memory == MemoryKind::kHost ? MemoryKind::kDevice
                                                                  : MemoryKind::kHost),
                  " memory (each backend moves one kind: use the ",
                  opts.memory == MemoryKind::kHost ? "host" : "device",
                  " backend of the communicator for this buffer)");
  return Usable(call);
}

Status CheckedBackend::CheckSummed(const char* call, const void* send, void* recv, size_t count,
                                   DType dtype, const CallOptions& opts) {
  PSD_CHECK(CheckCall(call, dtype, opts));
  const size_t bytes = count * DTypeSize(dtype);
  PSD_CHECK(CheckElements(call, count));
  PSD_CHECK(CheckBuffer(call, "send", send, count, bytes));
  return CheckBuffer(call, "recv", recv, count, bytes);
}

Status CheckedBackend::CheckCounted(const char* call, const void* send, void* recv,
                                    const std::vector<size_t>& counts, DType dtype,
                                    const CallOptions& opts, bool send_all) {
  PSD_CHECK(CheckCall(call, dtype, opts));
  PSD_CHECK(CheckCountsPerRank(call, counts, size()));
  const size_t total = SumCounts(counts);
  PSD_CHECK(CheckElements(call, total));
  const size_t mine = counts[static_cast<size_t>(rank())];
  const size_t es = DTypeSize(dtype);
  const size_t in = send_all ? total : mine, out = send_all ? mine : total;
  PSD_CHECK(CheckBuffer(call, "send", send, in, in * es));
  return CheckBuffer(call, "recv", recv, out, out * es);
}

Status CheckedBackend::AllReduce(const void* send, void* recv, size_t count, DType dtype,
                                 const CallOptions& opts) {
  const char* call = "AllReduce";
  Status local = CheckSummed(call, send, recv, count, dtype, opts);
  return DoAllReduce(send, recv, count, dtype, opts,
                     Describe(call, count, dtype, -1, 0, std::move(local), opts));
}

Status CheckedBackend::ReduceScatter(const void* send, void* recv,
                                     const std::vector<size_t>& counts, DType dtype,
                                     const CallOptions& opts) {
  const char* call = "ReduceScatter";
  Status local = CheckCounted(call, send, recv, counts, dtype, opts, /*send_all=*/true);
  return DoReduceScatter(
      send, recv, counts, dtype, opts,
      Describe(call, SumCounts(counts), dtype, -1, HashCounts(counts), std::move(local), opts));
}

Status CheckedBackend::AllGather(const void* send, void* recv, size_t count, DType dtype,
                                 const CallOptions& opts) {
  const char* call = "AllGather";
  Status local = CheckCall(call, dtype, opts);
  const size_t all = count * static_cast<size_t>(size());
  const size_t es = local.ok() ? DTypeSize(dtype) : 0;
  if (local.ok()) local = CheckElements(call, all);
  if (local.ok()) local = CheckBuffer(call, "send", send, count, count * es);
  if (local.ok()) local = CheckBuffer(call, "recv", recv, all, all * es);
  return DoAllGather(send, recv, count, dtype, opts,
                     Describe(call, count, dtype, -1, 0, std::move(local), opts));
}

Status CheckedBackend::AllGatherV(const void* send, void* recv, const std::vector<size_t>& counts,
                                  DType dtype, const CallOptions& opts) {
  const char* call = "AllGatherV";
  Status local = CheckCounted(call, send, recv, counts, dtype, opts, /*send_all=*/false);
  return DoAllGatherV(
      send, recv, counts, dtype, opts,
      Describe(call, SumCounts(counts), dtype, -1, HashCounts(counts), std::move(local), opts));
}

Status CheckedBackend::Broadcast(void* buf, size_t count, DType dtype, int root,
                                 const CallOptions& opts) {
  const char* call = "Broadcast";
  Status local = CheckCall(call, dtype, opts);
  if (local.ok() && (root < 0 || root >= size())) {
    local = InvalidArgument(call, ": root ", root, " is outside 0..", size() - 1);
  }
  if (local.ok()) local = CheckElements(call, count);
  if (local.ok()) local = CheckBuffer(call, "buf", buf, count, count * DTypeSize(dtype));
  return DoBroadcast(buf, count, dtype, root, opts,
                     Describe(call, count, dtype, root, 0, std::move(local), opts));
}

Status CheckedBackend::FailTogether(const char* call, const Status& local,
                                    const Interrupt* interrupt) {
  Status ignored = Agree(CollectiveArgs{call, -1, 0, -1, 0, local}, interrupt);
  (void)ignored;  // this rank reports its own error, not the agreement's
  return local;
}

Result<std::unique_ptr<Request>> CheckedBackend::IAllReduce(const void* send, void* recv,
                                                            size_t count, DType dtype,
                                                            const CallOptions& opts) {
  PSD_CHECK(CheckSummed("IAllReduce", send, recv, count, dtype, opts));
  return DoIAllReduce(send, recv, count, dtype, opts);
}

}  // namespace poseidon
