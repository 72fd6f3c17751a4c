#include "runtime/control_channel.h"

#include <algorithm>

#include "runtime/mpi_backend.h"
#include "runtime/mpi_wait.h"

namespace poseidon {

Result<std::unique_ptr<ControlChannel>> ControlChannel::Create(MPI_Comm comm) {
  std::unique_ptr<ControlChannel> c(new ControlChannel());
  int rc = MPI_Comm_dup(comm, &c->comm_);
  if (rc != MPI_SUCCESS) return MpiError("ControlChannel::Create: MPI_Comm_dup", rc);
  MPI_Comm_set_errhandler(c->comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(c->comm_, &c->rank_);
  MPI_Comm_size(c->comm_, &c->size_);
  return c;
}

ControlChannel::~ControlChannel() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  // An abandoned request still belongs to MPI (a lost peer never completes it): freeing the
  // communicator under it is undefined, so it is left for the process exit.
  if (!finalized && !abandoned_ && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

Status ControlChannel::Usable(const char* call) const {
  PSD_REQUIRE(!abandoned_, StatusCode::kAborted, "ControlChannel::", call,
              ": an earlier control round was abandoned (a peer was lost); the channel is "
              "unusable");
  return Status::Ok();
}

Status ControlChannel::PostOr(const uint64_t* send, uint64_t* recv, size_t n) {
  PSD_CHECK(Usable("PostOr"));
  PSD_REQUIRE(or_req_ == MPI_REQUEST_NULL, StatusCode::kInternal,
              "ControlChannel::PostOr: a reduction is already in flight; expected one at a time");
  int rc = MPI_Iallreduce(send, recv, static_cast<int>(n), MPI_UINT64_T, MPI_BOR, comm_, &or_req_);
  if (rc != MPI_SUCCESS) {
    or_req_ = MPI_REQUEST_NULL;
    return MpiError("ControlChannel::PostOr: MPI_Iallreduce", rc);
  }
  return Status::Ok();
}

Result<bool> ControlChannel::TestOr() {
  PSD_CHECK(Usable("TestOr"));
  if (or_req_ == MPI_REQUEST_NULL) return true;
  int done = 0;
  int rc = MPI_Test(&or_req_, &done, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS) {
    or_req_ = MPI_REQUEST_NULL;
    return MpiError("ControlChannel::TestOr: MPI_Test", rc);
  }
  return done != 0;
}

void ControlChannel::AbandonOr() {
  if (or_req_ == MPI_REQUEST_NULL) return;
  or_req_ = MPI_REQUEST_NULL;
  abandoned_ = true;
}

Status ControlChannel::Wait(MPI_Request* req, const Interrupt* interrupt, const char* call) {
  Status s = WaitMpi(req, interrupt, StrCat("ControlChannel::", call).c_str());
  // An interrupted wait leaves the request to MPI (a lost peer never completes it).
  if (!s.ok() && *req != MPI_REQUEST_NULL) abandoned_ = true;
  return s;
}

Result<std::vector<std::string>> ControlChannel::AllGather(const std::string& mine,
                                                           const Interrupt* interrupt) {
  PSD_CHECK(Usable("AllGather"));
  // The sizes, then the bytes. Both buffers outlive an abandoned request on purpose (leaked
  // below), since MPI may still write into them.
  auto* lens = new std::vector<int>(static_cast<size_t>(size_));
  int my_len = static_cast<int>(mine.size());
  MPI_Request req = MPI_REQUEST_NULL;
  int rc = MPI_Iallgather(&my_len, 1, MPI_INT, lens->data(), 1, MPI_INT, comm_, &req);
  if (rc != MPI_SUCCESS) {
    delete lens;
    return MpiError("ControlChannel::AllGather: MPI_Iallgather", rc);
  }
  Status s = Wait(&req, interrupt, "AllGather (sizes)");
  if (!s.ok()) return s;  // lens leaked: MPI owns it
  std::vector<int> displs(static_cast<size_t>(size_));
  int total = 0;
  for (int i = 0; i < size_; ++i) {
    displs[static_cast<size_t>(i)] = total;
    total += (*lens)[static_cast<size_t>(i)];
  }
  auto* text = new std::string(static_cast<size_t>(std::max(total, 1)), '\0');
  rc = MPI_Iallgatherv(mine.data(), my_len, MPI_CHAR, text->data(), lens->data(), displs.data(),
                       MPI_CHAR, comm_, &req);
  if (rc != MPI_SUCCESS) {
    delete lens;
    delete text;
    return MpiError("ControlChannel::AllGather: MPI_Iallgatherv", rc);
  }
  s = Wait(&req, interrupt, "AllGather (bytes)");
  if (!s.ok()) return s;  // lens and text leaked: MPI owns them
  std::vector<std::string> out;
  for (int i = 0; i < size_; ++i) {
    out.push_back(text->substr(static_cast<size_t>(displs[static_cast<size_t>(i)]),
                               static_cast<size_t>((*lens)[static_cast<size_t>(i)])));
  }
  delete lens;
  delete text;
  return out;
}

}  // namespace poseidon
