#include "runtime/nccl_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "runtime/arg_check.h"
#include "runtime/settings.h"
#include "runtime/shard.h"

namespace poseidon {

ncclDataType_t ToNcclType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat64:
      return ncclFloat64;
    case DType::kFloat16:
      return ncclFloat16;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
  }
  return ncclFloat32;
}

namespace {

cudaStream_t ToStream(const CallOptions& opts) { return static_cast<cudaStream_t>(opts.stream); }

Status CheckCommon(const char* call, DType dtype, const CallOptions& opts) {
  PSD_CHECK(CheckDType(call, dtype));
  PSD_REQUIRE_ARG(opts.memory == MemoryKind::kDevice, call, ": the NCCL backend was given ",
                  MemoryKindName(opts.memory),
                  " memory; expected device memory (use the host backend for host memory)");
  return Status::Ok();
}


bool AllEqual(const std::vector<size_t>& v) {
  return std::all_of(v.begin(), v.end(), [&](size_t c) { return c == v[0]; });
}

const unsigned char* At(const void* p, size_t bytes) {
  return static_cast<const unsigned char*>(p) + bytes;
}
unsigned char* At(void* p, size_t bytes) { return static_cast<unsigned char*>(p) + bytes; }

// A pending NCCL operation: the event recorded after it on the caller's stream.
class NcclRequest : public Request {
 public:
  NcclRequest(NcclBackend* backend, CudaEvent done) : backend_(backend), done_(std::move(done)) {}

  Result<bool> Test() override {
    if (finished_) return true;
    PSD_CHECK(backend_->CheckAsyncError());
    PSD_ASSIGN_OR_RETURN(bool done, done_.Query());
    finished_ = done;
    return done;
  }

  // Polls rather than cudaEventSynchronize: an operation waiting for a dead peer never
  // finishes, and only the async-error poll (which aborts the communicator) or the caller's
  // interrupt can end it.
  using Request::Wait;
  Status Wait(const Interrupt* interrupt) override {
    auto pause = std::chrono::microseconds(20);
    while (true) {
      PSD_ASSIGN_OR_RETURN(bool done, Test());
      if (done) return Status::Ok();
      if (interrupt != nullptr) {
        Status s = interrupt->Check();
        if (!s.ok()) return s.WithPrefix("NcclBackend request: ");
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

 private:
  NcclBackend* backend_;
  CudaEvent done_;
  bool finished_ = false;
};

}  // namespace

Result<std::unique_ptr<NcclBackend>> NcclBackend::Create(MPI_Comm comm) {
  const char* call = "NcclBackend::Create";
  PSD_REQUIRE_ARG(comm != MPI_COMM_NULL, call, ": comm is MPI_COMM_NULL");
  std::unique_ptr<NcclBackend> b(new NcclBackend());
  b->mpi_comm_ = comm;
  MPI_Comm_rank(comm, &b->rank_);
  MPI_Comm_size(comm, &b->size_);

  // Step 1: every rank needs a GPU; all ranks learn who has none.
  Status local = CudaDeviceCount().status();
  if (local.ok()) local = CudaStatus(cudaGetDevice(&b->device_), "cudaGetDevice");
  int mine = local.ok() ? 1 : 0;
  std::vector<int> all(static_cast<size_t>(b->size_));
  int rc = MPI_Allgather(&mine, 1, MPI_INT, all.data(), 1, MPI_INT, comm);
  if (rc != MPI_SUCCESS) return BackendError(call, ": MPI_Allgather of the GPU check failed");
  if (!local.ok()) {
    return Status(
        local.code() == StatusCode::kUnavailable ? StatusCode::kUnavailable : local.code(),
        StrCat(call, ": rank ", b->rank_, ": ", local.message()));
  }
  for (int r = 0; r < b->size_; ++r) {
    if (all[static_cast<size_t>(r)] == 0) {
      return UnavailableError(call, ": rank ", r,
                              " has no usable GPU, so no NCCL communicator can span the ranks");
    }
  }

  // Step 2: the unique id travels with rank 0's status, so a failure there reaches everyone.
  struct {
    int ok;
    ncclUniqueId id;
  } boot{};
  if (b->rank_ == 0) {
    ncclResult_t r = ncclGetUniqueId(&boot.id);
    boot.ok = r == ncclSuccess ? 1 : 0;
    if (r != ncclSuccess)
      local = BackendError(call, ": ncclGetUniqueId failed: ", ncclGetErrorString(r));
  }
  rc = MPI_Bcast(&boot, static_cast<int>(sizeof(boot)), MPI_BYTE, 0, comm);
  if (rc != MPI_SUCCESS) return BackendError(call, ": MPI_Bcast of the NCCL unique id failed");
  if (!boot.ok) {
    return local.ok() ? BackendError(call, ": ncclGetUniqueId failed on rank 0") : local;
  }

  // Step 3: init, then agree that it worked everywhere.
  ncclResult_t r = ncclCommInitRank(&b->comm_, b->size_, boot.id, b->rank_);
  mine = r == ncclSuccess ? 1 : 0;
  if (r != ncclSuccess) {
    local = BackendError(call, ": ncclCommInitRank(rank ", b->rank_, " of ", b->size_, ", device ",
                         b->device_, ") failed: ", ncclGetErrorString(r));
    b->comm_ = nullptr;
  }
  int every = 0;
  rc = MPI_Allreduce(&mine, &every, 1, MPI_INT, MPI_MIN, comm);
  if (rc != MPI_SUCCESS || every == 0) {
    if (b->comm_ != nullptr) {
      ncclCommAbort(b->comm_);
      b->comm_ = nullptr;
    }
    if (!local.ok()) return local;
    return BackendError(call, ": ncclCommInitRank failed on another rank");
  }

  PSD_CUDA_CHECK(cudaStreamCreateWithFlags(&b->barrier_stream_, cudaStreamNonBlocking));
  PSD_CUDA_CHECK(cudaMalloc(&b->barrier_word_, sizeof(int)));
  return b;
}

NcclBackend::~NcclBackend() {
  if (comm_ != nullptr && !aborted_) ncclCommDestroy(comm_);
  if (barrier_word_ != nullptr) cudaFree(barrier_word_);
  if (barrier_stream_ != nullptr) cudaStreamDestroy(barrier_stream_);
}

Status NcclBackend::NcclStatus(ncclResult_t r, const char* what) {
  if (r == ncclSuccess || r == ncclInProgress) return Status::Ok();
  const char* last = comm_ != nullptr ? ncclGetLastError(comm_) : nullptr;
  Status s = BackendError(what, " failed: ", ncclGetErrorString(r),
                          (last != nullptr && last[0] != '\0') ? StrCat(" (", last, ")") : "");
  if (r == ncclSystemError || r == ncclInternalError || r == ncclRemoteError) {
    // The communicator cannot be trusted after these: abort it and make the error sticky.
    if (comm_ != nullptr && !aborted_) ncclCommAbort(comm_);
    aborted_ = true;
    sticky_ = AbortedError("NCCL communicator aborted after: ", s.message());
  }
  return s;
}

Status NcclBackend::CheckAsyncError() {
  if (aborted_) return sticky_;
  ncclResult_t async = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
  if (r != ncclSuccess) return NcclStatus(r, "ncclCommGetAsyncError");
  if (async == ncclSuccess || async == ncclInProgress) return Status::Ok();
  const char* last = ncclGetLastError(comm_);
  std::string msg = StrCat("NCCL reported an asynchronous error: ", ncclGetErrorString(async),
                           (last != nullptr && last[0] != '\0') ? StrCat(" (", last, ")") : "",
                           "; the communicator was aborted");
  ncclCommAbort(comm_);
  aborted_ = true;
  sticky_ = AbortedError(msg);
  return sticky_;
}

Status NcclBackend::Agree(const char* call, int64_t count, DType dtype, int64_t root,
                          uint64_t layout_hash, Status local) {
  // A sticky error on one rank must fail the call everywhere, not leave peers in NCCL.
  if (local.ok()) local = CheckAsyncError();
  if (!settings::CheckArgs()) return local;
  return AgreeOnArgs(
      mpi_comm_, {call, count, static_cast<int64_t>(dtype), root, layout_hash, std::move(local)});
}

Status NcclBackend::FailTogether(const char* call, const Status& local,
                                 const Interrupt* interrupt) {
  (void)interrupt;  // the argument agreement runs over MPI (AgreeOnArgs)
  Status ignored = Agree(call, -1, DType::kFloat32, -1, 0, local);
  (void)ignored;  // this rank reports its own error, not the agreement's
  return local;
}

Status NcclBackend::LaunchAllReduce(const void* send, void* recv, size_t count, DType dtype,
                                    cudaStream_t stream) {
  if (count == 0) return Status::Ok();
  PSD_CHECK(NcclStatus(ncclAllReduce(send, recv, count, ToNcclType(dtype), ncclSum, comm_, stream),
                       "ncclAllReduce"));
  return CheckAsyncError();
}

Status NcclBackend::LaunchReduceScatter(const void* send, void* recv,
                                        const std::vector<size_t>& counts, DType dtype,
                                        cudaStream_t stream) {
  size_t total = SumCounts(counts);
  if (total == 0) return Status::Ok();
  size_t es = DTypeSize(dtype);
  size_t mine = counts[static_cast<size_t>(rank_)];
  if (AllEqual(counts)) {
    PSD_CHECK(NcclStatus(
        ncclReduceScatter(send, recv, counts[0], ToNcclType(dtype), ncclSum, comm_, stream),
        "ncclReduceScatter"));
    return CheckAsyncError();
  }
  // Uneven shards: pad every slice to max(counts) in a stream-ordered scratch (see header).
  size_t maxc = *std::max_element(counts.begin(), counts.end());
  size_t slot = maxc * es;
  bool direct = mine == maxc;  // this rank's shard fills its slot: reduce straight into recv
  void* scratch = nullptr;
  size_t scratch_bytes = slot * static_cast<size_t>(size_) + (direct ? 0 : slot);
  PSD_CUDA_CHECK(cudaMallocAsync(&scratch, scratch_bytes, stream));
  std::vector<size_t> off = PrefixOffsets(counts);
  Status s;
  for (int r = 0; r < size_ && s.ok(); ++r) {
    size_t c = counts[static_cast<size_t>(r)];
    if (c == 0) continue;
    s = CudaStatus(cudaMemcpyAsync(At(scratch, slot * static_cast<size_t>(r)),
                                   At(send, off[static_cast<size_t>(r)] * es), c * es,
                                   cudaMemcpyDeviceToDevice, stream),
                   "ReduceScatter: cudaMemcpyAsync(pad)");
  }
  void* out = direct ? recv : At(scratch, slot * static_cast<size_t>(size_));
  if (s.ok()) {
    s = NcclStatus(ncclReduceScatter(scratch, out, maxc, ToNcclType(dtype), ncclSum, comm_, stream),
                   "ncclReduceScatter(padded)");
  }
  if (s.ok() && !direct && mine > 0) {
    s = CudaStatus(cudaMemcpyAsync(recv, out, mine * es, cudaMemcpyDeviceToDevice, stream),
                   "ReduceScatter: cudaMemcpyAsync(unpad)");
  }
  // Freed in stream order: the memory returns to the pool once the work above has run.
  Status f = CudaStatus(cudaFreeAsync(scratch, stream), "cudaFreeAsync");
  PSD_CHECK(s);
  PSD_CHECK(f);
  return CheckAsyncError();
}

Status NcclBackend::LaunchAllGatherV(const void* send, void* recv,
                                     const std::vector<size_t>& counts, DType dtype,
                                     cudaStream_t stream) {
  size_t total = SumCounts(counts);
  if (total == 0) return Status::Ok();
  ncclDataType_t t = ToNcclType(dtype);
  if (AllEqual(counts)) {
    PSD_CHECK(NcclStatus(ncclAllGather(send, recv, counts[0], t, comm_, stream), "ncclAllGather"));
    return CheckAsyncError();
  }
  size_t es = DTypeSize(dtype);
  std::vector<size_t> off = PrefixOffsets(counts);
  PSD_CHECK(NcclStatus(ncclGroupStart(), "ncclGroupStart"));
  Status s;
  for (int r = 0; r < size_ && s.ok(); ++r) {
    size_t c = counts[static_cast<size_t>(r)];
    if (c == 0) continue;
    void* dst = At(recv, off[static_cast<size_t>(r)] * es);
    const void* src = r == rank_ ? send : dst;  // only the root's send buffer is read
    s = NcclStatus(ncclBroadcast(src, dst, c, t, r, comm_, stream), "ncclBroadcast(allgatherv)");
  }
  // The group must be closed even after a failed enqueue.
  Status e = NcclStatus(ncclGroupEnd(), "ncclGroupEnd");
  PSD_CHECK(s);
  PSD_CHECK(e);
  return CheckAsyncError();
}

Status NcclBackend::AllReduce(const void* send, void* recv, size_t count, DType dtype,
                              const CallOptions& opts) {
  const char* call = "AllReduce";
  Status local = CheckCommon(call, dtype, opts);
  size_t bytes = count * DTypeSize(dtype);
  if (local.ok()) local = CheckDevicePointer(call, "send", send, bytes);
  if (local.ok()) local = CheckDevicePointer(call, "recv", recv, bytes);
  PSD_CHECK(opts.agreed ? (local.ok() ? CheckAsyncError() : local)
                        : Agree(call, static_cast<int64_t>(count), dtype, -1, 0, std::move(local)));
  return LaunchAllReduce(send, recv, count, dtype, ToStream(opts));
}

Status NcclBackend::ReduceScatter(const void* send, void* recv, const std::vector<size_t>& counts,
                                  DType dtype, const CallOptions& opts) {
  const char* call = "ReduceScatter";
  Status local = CheckCommon(call, dtype, opts);
  if (local.ok()) local = CheckCountsPerRank(call, counts, size_);
  size_t es = DTypeSize(dtype);
  size_t total = local.ok() ? SumCounts(counts) : 0;
  if (local.ok()) local = CheckDevicePointer(call, "send", send, total * es);
  if (local.ok()) {
    local = CheckDevicePointer(call, "recv", recv, counts[static_cast<size_t>(rank_)] * es);
  }
  PSD_CHECK(opts.agreed ? (local.ok() ? CheckAsyncError() : local)
                        : Agree(call, static_cast<int64_t>(total), dtype, -1,
                                local.ok() ? HashCounts(counts) : 0, std::move(local)));
  return LaunchReduceScatter(send, recv, counts, dtype, ToStream(opts));
}

Status NcclBackend::AllGather(const void* send, void* recv, size_t count, DType dtype,
                              const CallOptions& opts) {
  const char* call = "AllGather";
  Status local = CheckCommon(call, dtype, opts);
  size_t bytes = count * DTypeSize(dtype);
  if (local.ok()) local = CheckDevicePointer(call, "send", send, bytes);
  if (local.ok()) {
    local = CheckDevicePointer(call, "recv", recv, bytes * static_cast<size_t>(size_));
  }
  PSD_CHECK(opts.agreed ? (local.ok() ? CheckAsyncError() : local)
                        : Agree(call, static_cast<int64_t>(count), dtype, -1, 0, std::move(local)));
  if (count == 0) return Status::Ok();
  PSD_CHECK(NcclStatus(ncclAllGather(send, recv, count, ToNcclType(dtype), comm_, ToStream(opts)),
                       "ncclAllGather"));
  return CheckAsyncError();
}

Status NcclBackend::AllGatherV(const void* send, void* recv, const std::vector<size_t>& counts,
                               DType dtype, const CallOptions& opts) {
  const char* call = "AllGatherV";
  Status local = CheckCommon(call, dtype, opts);
  if (local.ok()) local = CheckCountsPerRank(call, counts, size_);
  size_t es = DTypeSize(dtype);
  size_t total = local.ok() ? SumCounts(counts) : 0;
  if (local.ok()) {
    local = CheckDevicePointer(call, "send", send, counts[static_cast<size_t>(rank_)] * es);
  }
  if (local.ok()) local = CheckDevicePointer(call, "recv", recv, total * es);
  PSD_CHECK(opts.agreed ? (local.ok() ? CheckAsyncError() : local)
                        : Agree(call, static_cast<int64_t>(total), dtype, -1,
                                local.ok() ? HashCounts(counts) : 0, std::move(local)));
  return LaunchAllGatherV(send, recv, counts, dtype, ToStream(opts));
}

Status NcclBackend::Broadcast(void* buf, size_t count, DType dtype, int root,
                              const CallOptions& opts) {
  const char* call = "Broadcast";
  Status local = CheckCommon(call, dtype, opts);
  if (local.ok() && (root < 0 || root >= size_)) {
    local = InvalidArgument(call, ": root ", root, " is outside 0..", size_ - 1);
  }
  if (local.ok()) local = CheckDevicePointer(call, "buf", buf, count * DTypeSize(dtype));
  PSD_CHECK(opts.agreed
                ? (local.ok() ? CheckAsyncError() : local)
                : Agree(call, static_cast<int64_t>(count), dtype, root, 0, std::move(local)));
  if (count == 0) return Status::Ok();
  PSD_CHECK(
      NcclStatus(ncclBroadcast(buf, buf, count, ToNcclType(dtype), root, comm_, ToStream(opts)),
                 "ncclBroadcast"));
  return CheckAsyncError();
}

Status NcclBackend::Barrier() {
  PSD_CHECK(CheckAsyncError());
  PSD_CHECK(NcclStatus(
      ncclAllReduce(barrier_word_, barrier_word_, 1, ncclInt32, ncclSum, comm_, barrier_stream_),
      "ncclAllReduce(barrier)"));
  PSD_ASSIGN_OR_RETURN(auto req, MakeRequest("Barrier", barrier_stream_));
  return req->Wait();
}

Result<std::unique_ptr<Request>> NcclBackend::MakeRequest(const char* call, cudaStream_t stream) {
  PSD_ASSIGN_OR_RETURN(CudaEvent ev, CudaEvent::Create());
  Status s = ev.Record(stream);
  if (!s.ok()) return s.WithPrefix(call);
  return std::unique_ptr<Request>(new NcclRequest(this, std::move(ev)));
}

Result<std::unique_ptr<Request>> NcclBackend::IAllReduce(const void* send, void* recv, size_t count,
                                                         DType dtype, const CallOptions& opts) {
  const char* call = "IAllReduce";
  PSD_CHECK(CheckCommon(call, dtype, opts));
  size_t bytes = count * DTypeSize(dtype);
  PSD_CHECK(CheckDevicePointer(call, "send", send, bytes));
  PSD_CHECK(CheckDevicePointer(call, "recv", recv, bytes));
  PSD_CHECK(CheckAsyncError());
  PSD_CHECK(LaunchAllReduce(send, recv, count, dtype, ToStream(opts)));
  return MakeRequest(call, ToStream(opts));
}

Result<std::unique_ptr<Request>> NcclBackend::IReduceScatter(const void* send, void* recv,
                                                             const std::vector<size_t>& counts,
                                                             DType dtype, const CallOptions& opts) {
  const char* call = "IReduceScatter";
  PSD_CHECK(CheckCommon(call, dtype, opts));
  PSD_CHECK(CheckCountsPerRank(call, counts, size_));
  size_t es = DTypeSize(dtype);
  PSD_CHECK(CheckDevicePointer(call, "send", send, SumCounts(counts) * es));
  PSD_CHECK(CheckDevicePointer(call, "recv", recv, counts[static_cast<size_t>(rank_)] * es));
  PSD_CHECK(CheckAsyncError());
  PSD_CHECK(LaunchReduceScatter(send, recv, counts, dtype, ToStream(opts)));
  return MakeRequest(call, ToStream(opts));
}

Result<std::unique_ptr<Request>> NcclBackend::IAllGatherV(const void* send, void* recv,
                                                          const std::vector<size_t>& counts,
                                                          DType dtype, const CallOptions& opts) {
  const char* call = "IAllGatherV";
  PSD_CHECK(CheckCommon(call, dtype, opts));
  PSD_CHECK(CheckCountsPerRank(call, counts, size_));
  size_t es = DTypeSize(dtype);
  PSD_CHECK(CheckDevicePointer(call, "send", send, counts[static_cast<size_t>(rank_)] * es));
  PSD_CHECK(CheckDevicePointer(call, "recv", recv, SumCounts(counts) * es));
  PSD_CHECK(CheckAsyncError());
  PSD_CHECK(LaunchAllGatherV(send, recv, counts, dtype, ToStream(opts)));
  return MakeRequest(call, ToStream(opts));
}

}  // namespace poseidon
