#include "runtime/mpi_backend.h"

#include <climits>
#include <cstring>
#include <functional>

#include "runtime/arg_check.h"
#include "runtime/half.h"
#include "runtime/settings.h"
#include "runtime/shm_collectives.h"

namespace poseidon {

MPI_Datatype ToMpiType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return MPI_FLOAT;
    case DType::kFloat64: return MPI_DOUBLE;
    case DType::kFloat16: return MPI_UINT16_T;
    case DType::kBFloat16: return MPI_UINT16_T;
    case DType::kInt32: return MPI_INT32_T;
    case DType::kInt64: return MPI_INT64_T;
  }
  return MPI_DATATYPE_NULL;
}

Status MpiError(const char* what, int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return BackendError(what, " failed: ", std::string(buf, static_cast<size_t>(len)));
}

namespace {

constexpr size_t kMaxMpiCount = static_cast<size_t>(INT_MAX);

void Widen(DType dtype, const void* src, float* dst, size_t n) {
  const uint16_t* s = static_cast<const uint16_t*>(src);
  if (dtype == DType::kFloat16) {
    for (size_t i = 0; i < n; ++i) dst[i] = HalfToFloat(s[i]);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = BFloat16ToFloat(s[i]);
  }
}

void Narrow(DType dtype, const float* src, void* dst, size_t n) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  if (dtype == DType::kFloat16) {
    for (size_t i = 0; i < n; ++i) d[i] = FloatToHalf(src[i]);
  } else {
    for (size_t i = 0; i < n; ++i) d[i] = FloatToBFloat16(src[i]);
  }
}

Status CheckBuffer(const char* call, const char* which, const void* p, size_t count) {
  PSD_REQUIRE_ARG(p != nullptr || count == 0, call, ": ", which, " buffer is null with count ",
                  count, "; expected a valid pointer when count > 0");
  return Status::Ok();
}

Status CheckFitsInt(const char* call, size_t count) {
  PSD_REQUIRE_ARG(count <= kMaxMpiCount, call, ": count ", count,
                  " exceeds the MPI limit of 2^31-1 elements per call");
  return Status::Ok();
}

Status CheckCounts(const char* call, const std::vector<size_t>& counts, int world) {
  PSD_CHECK(CheckCountsPerRank(call, counts, world));
  PSD_CHECK(CheckFitsInt(call, SumCounts(counts)));
  return Status::Ok();
}

bool CheckArgsEnabled() { return settings::CheckArgs(); }

// A request wrapping one MPI_Request, with an optional completion step (narrowing halves).
class MpiRequest : public Request {
 public:
  MpiRequest() = default;
  MPI_Request* handle() { return &req_; }
  std::vector<float>& scratch() { return scratch_; }
  // MPI may read count / displacement arrays until a non-blocking call completes.
  std::vector<int>& counts() { return counts_; }
  std::vector<int>& displs() { return displs_; }
  void set_finish(std::function<void()> f) { finish_ = std::move(f); }
  void set_name(const char* name) { name_ = name; }

  Result<bool> Test() override {
    if (done_) return true;
    int flag = 0;
    int rc = MPI_Test(&req_, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return MpiError(name_, rc);
    if (flag) Complete();
    return done_;
  }
  Status Wait() override {
    if (done_) return Status::Ok();
    int rc = MPI_Wait(&req_, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return MpiError(name_, rc);
    Complete();
    return Status::Ok();
  }
  ~MpiRequest() override {
    // A request dropped while pending must still complete before its scratch is freed.
    if (!done_ && req_ != MPI_REQUEST_NULL) MPI_Wait(&req_, MPI_STATUS_IGNORE);
  }

 private:
  void Complete() {
    done_ = true;
    if (finish_) finish_();
  }
  MPI_Request req_ = MPI_REQUEST_NULL;
  std::vector<float> scratch_;
  std::vector<int> counts_;
  std::vector<int> displs_;
  std::function<void()> finish_;
  const char* name_ = "MPI request";
  bool done_ = false;
};

std::vector<int> ToInts(const std::vector<size_t>& v) {
  std::vector<int> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<int>(v[i]);
  return out;
}
std::vector<int> Displacements(const std::vector<size_t>& counts) {
  std::vector<int> d(counts.size());
  size_t off = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    d[i] = static_cast<int>(off);
    off += counts[i];
  }
  return d;
}

}  // namespace

MpiBackend::MpiBackend(MPI_Comm comm) : comm_(comm) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

MpiBackend::~MpiBackend() = default;

Result<ShmCollectives*> MpiBackend::ShmFor(size_t bytes) {
  long long threshold = settings::ShmThresholdBytes();
  if (threshold <= 0 || bytes < static_cast<size_t>(threshold) || shm_multi_node_) {
    return static_cast<ShmCollectives*>(nullptr);
  }
  long long chunk = settings::ShmChunkBytes();
  if (shm_ && static_cast<long long>(shm_->chunk_bytes()) == chunk) return shm_.get();
  shm_.reset();  // collective: every rank reaches this point with the same settings
  auto created = ShmCollectives::Create(comm_, chunk < 0 ? 0 : static_cast<size_t>(chunk),
                                        settings::ShmTimeoutS());
  if (!created.ok() && created.status().code() == StatusCode::kUnavailable) {
    shm_multi_node_ = true;
    return static_cast<ShmCollectives*>(nullptr);
  }
  PSD_CHECK(created.status());
  shm_ = std::move(created).value();
  return shm_.get();
}

bool MpiBackend::SupportsMemory(MemoryKind memory) const { return memory == MemoryKind::kHost; }

Status MpiBackend::CheckMemory(const char* call, const CallOptions& opts) const {
  if (opts.memory == MemoryKind::kHost) return Status::Ok();
  return UnavailableError(call, ": the MPI backend was given ", MemoryKindName(opts.memory),
                          " memory; this build stages only host memory");
}

Status MpiBackend::AllReduceUnchecked(const void* send, void* recv, size_t count, DType dtype) {
  if (count == 0) return Status::Ok();
  const void* src = (send == recv) ? MPI_IN_PLACE : send;
  if (IsHalfDType(dtype)) {
    std::vector<float> wide(count);
    Widen(dtype, send, wide.data(), count);
    int rc = MPI_Allreduce(MPI_IN_PLACE, wide.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                           comm_);
    if (rc != MPI_SUCCESS) return MpiError("MPI_Allreduce", rc);
    Narrow(dtype, wide.data(), recv, count);
    return Status::Ok();
  }
  int rc = MPI_Allreduce(src, recv, static_cast<int>(count), ToMpiType(dtype), MPI_SUM, comm_);
  if (rc != MPI_SUCCESS) return MpiError("MPI_Allreduce", rc);
  return Status::Ok();
}

Status MpiBackend::AllReduce(const void* send, void* recv, size_t count, DType dtype,
                             const CallOptions& opts) {
  const char* call = "AllReduce";
  Status local = CheckDType(call, dtype);
  if (local.ok()) local = CheckMemory(call, opts);
  if (local.ok()) local = CheckBuffer(call, "send", send, count);
  if (local.ok()) local = CheckBuffer(call, "recv", recv, count);
  if (local.ok()) local = CheckFitsInt(call, count);
  if (CheckArgsEnabled() && !opts.agreed) {
    PSD_CHECK(AgreeOnArgs(comm_, {call, static_cast<int64_t>(count),
                                  static_cast<int64_t>(dtype), -1, 0, local}));
  } else {
    PSD_CHECK(local);
  }
  PSD_ASSIGN_OR_RETURN(ShmCollectives* shm, ShmFor(count * DTypeSize(dtype)));
  if (shm != nullptr) return shm->AllReduce(send, recv, count, dtype);
  return AllReduceUnchecked(send, recv, count, dtype);
}

Status MpiBackend::ReduceScatterUnchecked(const void* send, void* recv,
                                          const std::vector<size_t>& counts, DType dtype) {
  size_t total = SumCounts(counts);
  if (total == 0) return Status::Ok();
  std::vector<int> rc_counts = ToInts(counts);
  size_t mine = counts[static_cast<size_t>(rank_)];
  if (IsHalfDType(dtype)) {
    std::vector<float> wide(total);
    std::vector<float> out(mine > 0 ? mine : 1);
    Widen(dtype, send, wide.data(), total);
    int rc = MPI_Reduce_scatter(wide.data(), out.data(), rc_counts.data(), MPI_FLOAT, MPI_SUM,
                                comm_);
    if (rc != MPI_SUCCESS) return MpiError("MPI_Reduce_scatter", rc);
    Narrow(dtype, out.data(), recv, mine);
    return Status::Ok();
  }
  // Open MPI wants a valid receive pointer even for an empty shard.
  char dummy[16];
  void* r = (recv == nullptr) ? dummy : recv;
  int rc = MPI_Reduce_scatter(send, r, rc_counts.data(), ToMpiType(dtype), MPI_SUM, comm_);
  if (rc != MPI_SUCCESS) return MpiError("MPI_Reduce_scatter", rc);
  return Status::Ok();
}

Status MpiBackend::ReduceScatter(const void* send, void* recv, const std::vector<size_t>& counts,
                                 DType dtype, const CallOptions& opts) {
  const char* call = "ReduceScatter";
  Status local = CheckDType(call, dtype);
  if (local.ok()) local = CheckMemory(call, opts);
  if (local.ok()) local = CheckCounts(call, counts, size_);
  size_t total = SumCounts(counts);
  if (local.ok()) local = CheckBuffer(call, "send", send, total);
  if (local.ok()) local = CheckBuffer(call, "recv", recv, counts[static_cast<size_t>(rank_)]);
  if (CheckArgsEnabled() && !opts.agreed) {
    PSD_CHECK(AgreeOnArgs(comm_, {call, static_cast<int64_t>(total), static_cast<int64_t>(dtype),
                                  -1, HashCounts(counts), local}));
  } else {
    PSD_CHECK(local);
  }
  PSD_ASSIGN_OR_RETURN(ShmCollectives* shm, ShmFor(total * DTypeSize(dtype)));
  if (shm != nullptr) return shm->ReduceScatter(send, recv, counts, dtype);
  return ReduceScatterUnchecked(send, recv, counts, dtype);
}

Status MpiBackend::AllGather(const void* send, void* recv, size_t count, DType dtype,
                             const CallOptions& opts) {
  const char* call = "AllGather";
  Status local = CheckDType(call, dtype);
  if (local.ok()) local = CheckMemory(call, opts);
  if (local.ok()) local = CheckBuffer(call, "send", send, count);
  if (local.ok()) local = CheckBuffer(call, "recv", recv, count);
  if (local.ok()) local = CheckFitsInt(call, count * static_cast<size_t>(size_));
  if (CheckArgsEnabled() && !opts.agreed) {
    PSD_CHECK(AgreeOnArgs(comm_, {call, static_cast<int64_t>(count),
                                  static_cast<int64_t>(dtype), -1, 0, local}));
  } else {
    PSD_CHECK(local);
  }
  if (count == 0) return Status::Ok();
  PSD_ASSIGN_OR_RETURN(ShmCollectives* shm,
                       ShmFor(count * static_cast<size_t>(size_) * DTypeSize(dtype)));
  if (shm != nullptr) return shm->AllGather(send, recv, count, dtype);
  int rc = MPI_Allgather(send, static_cast<int>(count), ToMpiType(dtype), recv,
                         static_cast<int>(count), ToMpiType(dtype), comm_);
  if (rc != MPI_SUCCESS) return MpiError("MPI_Allgather", rc);
  return Status::Ok();
}

Status MpiBackend::AllGatherV(const void* send, void* recv, const std::vector<size_t>& counts,
                              DType dtype, const CallOptions& opts) {
  const char* call = "AllGatherV";
  Status local = CheckDType(call, dtype);
  if (local.ok()) local = CheckMemory(call, opts);
  if (local.ok()) local = CheckCounts(call, counts, size_);
  size_t total = SumCounts(counts);
  if (local.ok()) local = CheckBuffer(call, "send", send, counts[static_cast<size_t>(rank_)]);
  if (local.ok()) local = CheckBuffer(call, "recv", recv, total);
  if (CheckArgsEnabled() && !opts.agreed) {
    PSD_CHECK(AgreeOnArgs(comm_, {call, static_cast<int64_t>(total), static_cast<int64_t>(dtype),
                                  -1, HashCounts(counts), local}));
  } else {
    PSD_CHECK(local);
  }
  if (total == 0) return Status::Ok();
  std::vector<int> c = ToInts(counts);
  std::vector<int> d = Displacements(counts);
  char dummy[16];
  const void* s = send == nullptr ? dummy : send;
  int rc = MPI_Allgatherv(s, c[static_cast<size_t>(rank_)], ToMpiType(dtype), recv, c.data(),
                          d.data(), ToMpiType(dtype), comm_);
  if (rc != MPI_SUCCESS) return MpiError("MPI_Allgatherv", rc);
  return Status::Ok();
}

Status MpiBackend::Broadcast(void* buf, size_t count, DType dtype, int root,
                             const CallOptions& opts) {
  const char* call = "Broadcast";
  Status local = CheckDType(call, dtype);
  if (local.ok()) local = CheckMemory(call, opts);
  if (local.ok()) local = CheckBuffer(call, "buf", buf, count);
  if (local.ok()) local = CheckFitsInt(call, count);
  if (local.ok() && (root < 0 || root >= size_)) {
    local = InvalidArgument(call, ": root ", root, " is outside 0..", size_ - 1);
  }
  if (CheckArgsEnabled() && !opts.agreed) {
    PSD_CHECK(AgreeOnArgs(comm_, {call, static_cast<int64_t>(count),
                                  static_cast<int64_t>(dtype), root, 0, local}));
  } else {
    PSD_CHECK(local);
  }
  if (count == 0) return Status::Ok();
  int rc = MPI_Bcast(buf, static_cast<int>(count), ToMpiType(dtype), root, comm_);
  if (rc != MPI_SUCCESS) return MpiError("MPI_Bcast", rc);
  return Status::Ok();
}

Status MpiBackend::Barrier() {
  int rc = MPI_Barrier(comm_);
  if (rc != MPI_SUCCESS) return MpiError("MPI_Barrier", rc);
  return Status::Ok();
}

Result<std::unique_ptr<Request>> MpiBackend::IAllReduce(const void* send, void* recv,
                                                        size_t count, DType dtype,
                                                        const CallOptions& opts) {
  const char* call = "IAllReduce";
  PSD_CHECK(CheckDType(call, dtype));
  PSD_CHECK(CheckMemory(call, opts));
  PSD_CHECK(CheckBuffer(call, "send", send, count));
  PSD_CHECK(CheckBuffer(call, "recv", recv, count));
  PSD_CHECK(CheckFitsInt(call, count));
  auto req = std::make_unique<MpiRequest>();
  req->set_name("MPI_Iallreduce");
  int rc;
  if (IsHalfDType(dtype)) {
    auto& wide = req->scratch();
    wide.resize(count);
    Widen(dtype, send, wide.data(), count);
    rc = MPI_Iallreduce(MPI_IN_PLACE, wide.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                        comm_, req->handle());
    MpiRequest* raw = req.get();
    req->set_finish([raw, dtype, recv, count] { Narrow(dtype, raw->scratch().data(), recv, count); });
  } else {
    rc = MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, static_cast<int>(count),
                        ToMpiType(dtype), MPI_SUM, comm_, req->handle());
  }
  if (rc != MPI_SUCCESS) return MpiError("MPI_Iallreduce", rc);
  return std::unique_ptr<Request>(std::move(req));
}

Result<std::unique_ptr<Request>> MpiBackend::IReduceScatter(const void* send, void* recv,
                                                            const std::vector<size_t>& counts,
                                                            DType dtype,
                                                            const CallOptions& opts) {
  const char* call = "IReduceScatter";
  PSD_CHECK(CheckDType(call, dtype));
  PSD_CHECK(CheckMemory(call, opts));
  PSD_CHECK(CheckCounts(call, counts, size_));
  size_t total = SumCounts(counts);
  size_t mine = counts[static_cast<size_t>(rank_)];
  PSD_CHECK(CheckBuffer(call, "send", send, total));
  PSD_CHECK(CheckBuffer(call, "recv", recv, mine));
  auto req = std::make_unique<MpiRequest>();
  req->set_name("MPI_Ireduce_scatter");
  std::vector<int>& c = req->counts();
  c = ToInts(counts);
  int rc;
  if (IsHalfDType(dtype)) {
    auto& wide = req->scratch();
    wide.resize(total + mine);  // [0, total): widened input, [total, total + mine): output
    Widen(dtype, send, wide.data(), total);
    rc = MPI_Ireduce_scatter(wide.data(), wide.data() + total, c.data(), MPI_FLOAT, MPI_SUM,
                             comm_, req->handle());
    MpiRequest* raw = req.get();
    req->set_finish([raw, dtype, recv, total, mine] {
      Narrow(dtype, raw->scratch().data() + total, recv, mine);
    });
  } else {
    static char dummy[16];
    rc = MPI_Ireduce_scatter(send == nullptr ? dummy : send, recv == nullptr ? dummy : recv,
                             c.data(), ToMpiType(dtype), MPI_SUM, comm_, req->handle());
  }
  if (rc != MPI_SUCCESS) return MpiError("MPI_Ireduce_scatter", rc);
  return std::unique_ptr<Request>(std::move(req));
}

Result<std::unique_ptr<Request>> MpiBackend::IAllGatherV(const void* send, void* recv,
                                                         const std::vector<size_t>& counts,
                                                         DType dtype, const CallOptions& opts) {
  const char* call = "IAllGatherV";
  PSD_CHECK(CheckDType(call, dtype));
  PSD_CHECK(CheckMemory(call, opts));
  PSD_CHECK(CheckCounts(call, counts, size_));
  size_t total = SumCounts(counts);
  PSD_CHECK(CheckBuffer(call, "send", send, counts[static_cast<size_t>(rank_)]));
  PSD_CHECK(CheckBuffer(call, "recv", recv, total));
  auto req = std::make_unique<MpiRequest>();
  req->set_name("MPI_Iallgatherv");
  req->counts() = ToInts(counts);
  req->displs() = Displacements(counts);
  static char dummy[16];
  int rc = MPI_Iallgatherv(send == nullptr ? dummy : send, req->counts()[static_cast<size_t>(rank_)],
                           ToMpiType(dtype), recv == nullptr ? dummy : recv, req->counts().data(),
                           req->displs().data(), ToMpiType(dtype), comm_, req->handle());
  if (rc != MPI_SUCCESS) return MpiError("MPI_Iallgatherv", rc);
  return std::unique_ptr<Request>(std::move(req));
}

}  // namespace poseidon
