// MpiBackend's non-blocking collectives (mpi_backend.h): each posts one MPI call and returns a
// Request that owns what the call reads or writes besides the caller's buffers.
#include <functional>
#include <memory>
#include <utility>

#include "runtime/arg_check.h"
#include "runtime/mpi_backend.h"
#include "runtime/mpi_internal.h"

namespace poseidon {

namespace {

using mpi_internal::Displacements;
using mpi_internal::g_empty;
using mpi_internal::OutOfPlaceSend;
using mpi_internal::Scratch;
using mpi_internal::ToInts;

// A request wrapping one MPI_Request, with an optional completion step (narrowing halves).
class MpiRequest : public Request {
 public:
  MpiRequest(const char* name, std::shared_ptr<StickyError> sticky)
      : name_(name), sticky_(std::move(sticky)) {}
  MPI_Request* handle() { return &req_; }
  Scratch& scratch() { return *scratch_; }
  void set_finish(std::function<void()> f) { finish_ = std::move(f); }

  using Request::Wait;
  Result<bool> Test() override {
    if (done_) return true;
    PSD_CHECK(failure_);
    int flag = 0;
    int rc = MPI_Test(&req_, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return MpiError(StrCat(name_, ": MPI_Test").c_str(), rc);
    if (flag) Complete();
    return done_;
  }
  Status Wait(const Interrupt* interrupt) override {
    if (done_) return Status::Ok();
    PSD_CHECK(failure_);
    Status s = WaitOrAbandon(&req_, scratch_, MpiWait{interrupt, name_, sticky_.get()});
    if (!s.ok()) {
      failure_ = s;
      return s;
    }
    Complete();
    return Status::Ok();
  }
  ~MpiRequest() override {
    if (done_ || req_ == MPI_REQUEST_NULL) return;
    // A request dropped while pending must complete before its scratch is freed. Once its
    // backend has given up on a call, though, it may never complete: leave it to MPI with its
    // scratch instead of blocking the owner's thread for good.
    if (sticky_->failed()) {
      AbandonMpi(req_, scratch_);
      return;
    }
    MPI_Wait(&req_, MPI_STATUS_IGNORE);
  }

 private:
  void Complete() {
    done_ = true;
    if (finish_) finish_();
  }
  MPI_Request req_ = MPI_REQUEST_NULL;
  std::shared_ptr<Scratch> scratch_ = std::make_shared<Scratch>();
  std::function<void()> finish_;
  const char* name_;
  std::shared_ptr<StickyError> sticky_;
  Status failure_;  // why an earlier Wait gave up (the request is then abandoned)
  bool done_ = false;
};

}  // namespace

Result<std::unique_ptr<Request>> MpiBackend::DoIAllReduce(const void* send, void* recv,
                                                          size_t count, DType dtype,
                                                          const CallOptions& opts) {
  (void)opts;
  PSD_CHECK(sticky_->Check("MpiBackend::IAllReduce"));
  auto req = std::make_unique<MpiRequest>("MpiBackend::IAllReduce", sticky_);
  int rc;
  if (IsHalfDType(dtype)) {
    auto& wide = req->scratch().wide;
    wide.resize(count);
    WidenToFloat32(dtype, send, wide.data(), count);
    const void* copy = OutOfPlaceSend(&req->scratch(), wide.data(), count * sizeof(float));
    rc = MPI_Iallreduce(copy, wide.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, comm_,
                        req->handle());
    Scratch* scratch = &req->scratch();
    req->set_finish([scratch, dtype, recv, count] {
      NarrowFromFloat32(dtype, scratch->wide.data(), recv, count);
    });
  } else {
    const void* src =
        send == recv ? OutOfPlaceSend(&req->scratch(), recv, count * DTypeSize(dtype)) : send;
    rc = MPI_Iallreduce(src, recv, static_cast<int>(count), ToMpiType(dtype), MPI_SUM, comm_,
                        req->handle());
  }
  if (rc != MPI_SUCCESS) return MpiError("MPI_Iallreduce", rc);
  return std::unique_ptr<Request>(std::move(req));
}

}  // namespace poseidon
