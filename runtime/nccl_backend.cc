#include "runtime/nccl_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <utility>

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

using device::Backoff;

cudaStream_t ToStream(const CallOptions& opts) { return static_cast<cudaStream_t>(opts.stream); }

const unsigned char* At(const void* p, size_t bytes) {
  return static_cast<const unsigned char*>(p) + bytes;
}
unsigned char* At(void* p, size_t bytes) { return static_cast<unsigned char*>(p) + bytes; }

// A pending NCCL operation: the event recorded after it on the caller's stream.
class NcclRequest : public Request {
 public:
  NcclRequest(NcclBackend* backend, CudaEvent done) : backend_(backend), done_(std::move(done)) {}

  // The event is queried before the health check: an abort lets stuck kernels (and so the
  // event) finish, and that completion must not pass for success.
  Result<bool> Test() override {
    if (finished_) return true;
    Result<bool> done = done_.Query();
    PSD_CHECK(backend_->CheckAsyncError());
    PSD_ASSIGN_OR_RETURN(finished_, std::move(done));
    return finished_;
  }

  // Polls rather than cudaEventSynchronize: an operation waiting for a dead peer never
  // finishes, and only the watchdog's abort (within the deadline) or the caller's interrupt
  // ends it.
  using Request::Wait;
  Status Wait(const Interrupt* interrupt) override {
    Backoff backoff;
    while (true) {
      PSD_ASSIGN_OR_RETURN(bool done, Test());
      if (done) return Status::Ok();
      if (interrupt != nullptr) {
        Status s = interrupt->Check();
        if (!s.ok()) return s.WithPrefix("NcclBackend request: ");
      }
      backoff.Pause();
    }
  }

 private:
  NcclBackend* backend_;
  CudaEvent done_;
  bool finished_ = false;
};

}  // namespace

Result<float*> NcclBackend::Scratch(size_t elems, cudaStream_t stream) {
  const size_t bytes = elems * sizeof(float);
  if (bytes > scratch_bytes_) {
    const size_t cap = device::GrowCapacity(scratch_bytes_, bytes);
    void* p = nullptr;
    PSD_CHECK(CudaStatus(cudaMalloc(&p, cap),
                         StrCat("NcclBackend: cudaMalloc(", cap, " bytes of float32 scratch)")
                             .c_str()));
    if (scratch_ != nullptr) retired_.push_back(scratch_);
    scratch_ = static_cast<float*>(p);
    scratch_bytes_ = cap;
  }
  PSD_CUDA_CHECK(cudaStreamWaitEvent(stream, scratch_done_.get(), 0));
  return scratch_;
}

Status NcclBackend::ScratchUsed(cudaStream_t stream) { return scratch_done_.Record(stream); }

Status NcclBackend::CheckBuffer(const char* call, const char* which, const void* p, size_t count,
                                size_t bytes) const {
  (void)count;
  return CheckDevicePointer(call, which, p, bytes);
}

// A sticky error on one rank must fail the call everywhere, not leave peers in NCCL.
Status NcclBackend::Usable(const char* call) { return CheckUsable(call); }

Status NcclBackend::Agree(const CollectiveArgs& args, const Interrupt* interrupt) {
  (void)interrupt;  // a handful of words over MPI, before any NCCL work is queued
  if (!settings::CheckArgs()) return args.local;
  return AgreeOnArgs(mpi_comm_, args);
}

Status NcclBackend::LaunchAllReduce(const char* call, const void* send, void* recv, size_t count,
                                    DType dtype, cudaStream_t stream) {
  if (count == 0) return Status::Ok();
  if (!IsHalfDType(dtype)) {
    PSD_CHECK(Enqueue("ncclAllReduce", [&] {
      return ncclAllReduce(send, recv, count, ToNcclType(dtype), ncclSum, comm_, stream);
    }));
    return Track(call, stream);
  }
  // Half precision: widen, sum in float32 in place, round once into recv.
  PSD_ASSIGN_OR_RETURN(float* wide, Scratch(count, stream));
  Status s = LaunchWidenToFloat32(dtype, send, wide, count, stream);
  if (s.ok()) {
    s = Enqueue("ncclAllReduce(float32)", [&] {
      return ncclAllReduce(wide, wide, count, ncclFloat32, ncclSum, comm_, stream);
    });
  }
  if (s.ok()) s = LaunchNarrowFromFloat32(dtype, wide, recv, count, stream);
  Status used = ScratchUsed(stream);
  PSD_CHECK(s);
  PSD_CHECK(used);
  return Track(call, stream);
}

Status NcclBackend::LaunchReduceScatter(const char* call, const void* send, void* recv,
                                        const std::vector<size_t>& counts, DType dtype,
                                        cudaStream_t stream) {
  using Kind = device::ReduceScatterPlan::Kind;
  const device::ReduceScatterPlan plan = device::PlanReduceScatter(counts, rank_);
  if (plan.kind == Kind::kNothing) return Status::Ok();
  const bool half = IsHalfDType(dtype);
  // Half precision runs the same plan in float32 on a widened copy, in place (this rank's
  // shard of the scratch receives its sum), and rounds that shard once into recv.
  float* wide = nullptr;
  if (half) {
    PSD_ASSIGN_OR_RETURN(wide, Scratch(plan.total, stream));
  }
  const ncclDataType_t t = half ? ncclFloat32 : ToNcclType(dtype);
  const size_t es = half ? sizeof(float) : DTypeSize(dtype);
  const void* in = half ? static_cast<const void*>(wide) : send;
  void* out = half ? static_cast<void*>(wide + plan.mine_offset) : recv;
  Status s = half ? LaunchWidenToFloat32(dtype, send, wide, plan.total, stream) : Status::Ok();
  if (s.ok() && plan.kind == Kind::kEven) {
    s = Enqueue(half ? "ncclReduceScatter(float32)" : "ncclReduceScatter", [&] {
      return ncclReduceScatter(in, out, plan.even, t, ncclSum, comm_, stream);
    });
  } else if (s.ok()) {
    // One reduce per owner, rooted at it (see device::PlanReduceScatter). recvbuff is used on
    // the root only; in place there when summing in the scratch.
    s = Enqueue("ncclReduce(reduce-scatter)", [&] {
      ncclResult_t first = ncclGroupStart();
      if (first != ncclSuccess) return first;
      for (const device::ReducePiece& piece : plan.pieces) {
        void* dst = piece.root == rank_ ? out : nullptr;
        ncclResult_t r = ncclReduce(At(in, piece.offset * es), dst, piece.count, t, ncclSum,
                                    piece.root, comm_, stream);
        if (r != ncclSuccess && first == ncclSuccess) first = r;
        if (first != ncclSuccess) break;
      }
      ncclResult_t end = ncclGroupEnd();  // closed even after a failed enqueue
      return first != ncclSuccess ? first : end;
    });
  }
  if (half) {
    if (s.ok()) s = LaunchNarrowFromFloat32(dtype, wide + plan.mine_offset, recv, plan.mine,
                                            stream);
    Status used = ScratchUsed(stream);
    if (s.ok()) s = used;
  }
  PSD_CHECK(s);
  return Track(call, stream);
}

Status NcclBackend::LaunchAllGatherV(const char* call, const void* send, void* recv,
                                     const std::vector<size_t>& counts, DType dtype,
                                     cudaStream_t stream) {
  size_t total = SumCounts(counts);
  if (total == 0) return Status::Ok();
  ncclDataType_t t = ToNcclType(dtype);
  if (std::all_of(counts.begin(), counts.end(), [&](size_t c) { return c == counts[0]; })) {
    PSD_CHECK(Enqueue("ncclAllGather",
                      [&] { return ncclAllGather(send, recv, counts[0], t, comm_, stream); }));
    return Track(call, stream);
  }
  size_t es = DTypeSize(dtype);
  std::vector<size_t> off = PrefixOffsets(counts);
  PSD_CHECK(Enqueue("ncclBroadcast(allgatherv)", [&] {
    ncclResult_t first = ncclGroupStart();
    if (first != ncclSuccess) return first;
    for (int r = 0; r < size_ && first == ncclSuccess; ++r) {
      size_t c = counts[static_cast<size_t>(r)];
      if (c == 0) continue;
      void* dst = At(recv, off[static_cast<size_t>(r)] * es);
      const void* src = r == rank_ ? send : dst;  // only the root's send buffer is read
      first = ncclBroadcast(src, dst, c, t, r, comm_, stream);
    }
    ncclResult_t end = ncclGroupEnd();  // closed even after a failed enqueue
    return first != ncclSuccess ? first : end;
  }));
  return Track(call, stream);
}

Status NcclBackend::DoAllReduce(const void* send, void* recv, size_t count, DType dtype,
                                const CallOptions& opts, const CollectiveArgs& args) {
  PSD_CHECK(Agreed(args, opts));
  return LaunchAllReduce(args.call, send, recv, count, dtype, ToStream(opts));
}

Status NcclBackend::DoReduceScatter(const void* send, void* recv,
                                    const std::vector<size_t>& counts, DType dtype,
                                    const CallOptions& opts, const CollectiveArgs& args) {
  PSD_CHECK(Agreed(args, opts));
  return LaunchReduceScatter(args.call, send, recv, counts, dtype, ToStream(opts));
}

Status NcclBackend::DoAllGather(const void* send, void* recv, size_t count, DType dtype,
                                const CallOptions& opts, const CollectiveArgs& args) {
  PSD_CHECK(Agreed(args, opts));
  if (count == 0) return Status::Ok();
  cudaStream_t stream = ToStream(opts);
  PSD_CHECK(Enqueue("ncclAllGather", [&] {
    return ncclAllGather(send, recv, count, ToNcclType(dtype), comm_, stream);
  }));
  return Track(args.call, stream);
}

Status NcclBackend::DoAllGatherV(const void* send, void* recv, const std::vector<size_t>& counts,
                                 DType dtype, const CallOptions& opts,
                                 const CollectiveArgs& args) {
  PSD_CHECK(Agreed(args, opts));
  return LaunchAllGatherV(args.call, send, recv, counts, dtype, ToStream(opts));
}

Status NcclBackend::DoBroadcast(void* buf, size_t count, DType dtype, int root,
                                const CallOptions& opts, const CollectiveArgs& args) {
  PSD_CHECK(Agreed(args, opts));
  if (count == 0) return Status::Ok();
  cudaStream_t stream = ToStream(opts);
  PSD_CHECK(Enqueue("ncclBroadcast", [&] {
    return ncclBroadcast(buf, buf, count, ToNcclType(dtype), root, comm_, stream);
  }));
  return Track(args.call, stream);
}

Status NcclBackend::Barrier() {
  const char* call = "Barrier";
  PSD_CHECK(CheckUsable(call));
  PSD_CHECK(Enqueue("ncclAllReduce(barrier)", [&] {
    return ncclAllReduce(barrier_word_, barrier_word_, 1, ncclInt32, ncclSum, comm_,
                         barrier_stream_);
  }));
  PSD_CHECK(Track(call, barrier_stream_));
  PSD_ASSIGN_OR_RETURN(auto req, MakeRequest(call, barrier_stream_));
  return req->Wait();
}

Result<std::unique_ptr<Request>> NcclBackend::MakeRequest(const char* call, cudaStream_t stream) {
  PSD_ASSIGN_OR_RETURN(CudaEvent ev, CudaEvent::Create());
  Status s = ev.Record(stream);
  if (!s.ok()) return s.WithPrefix(call);
  return std::unique_ptr<Request>(new NcclRequest(this, std::move(ev)));
}

Result<std::unique_ptr<Request>> NcclBackend::DoIAllReduce(const void* send, void* recv,
                                                           size_t count, DType dtype,
                                                           const CallOptions& opts) {
  PSD_CHECK(LaunchAllReduce("IAllReduce", send, recv, count, dtype, ToStream(opts)));
  return MakeRequest("IAllReduce", ToStream(opts));
}

}  // namespace poseidon
