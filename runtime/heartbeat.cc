#include "runtime/heartbeat.h"

#include <mutex>

#include "runtime/agreement.h"
#include "runtime/mpi_backend.h"
#include "runtime/or_agreement.h"

namespace poseidon {
namespace {

// Beats are the only traffic on the private duplicate, so one tag serves every peer.
constexpr int kBeatTag = 0;

uint64_t Encode(uint64_t seq, bool leaving) { return (seq << 1) | (leaving ? 1u : 0u); }

// Receives still posted when their channel went away, with the buffers MPI may still write.
// Reachable from a global for the life of the process, so leak checkers do not count them.
struct ParkedReceives {
  std::vector<uint64_t> words;
  std::vector<MPI_Request> requests;
};
std::mutex g_parked_mu;
std::vector<ParkedReceives>* g_parked = nullptr;  // guarded; never freed

void ParkReceives(std::vector<uint64_t> words, std::vector<MPI_Request> requests) {
  // Moving a vector (here, and when the list grows) keeps its heap block, so the addresses MPI
  // holds stay valid.
  std::lock_guard<std::mutex> lock(g_parked_mu);
  if (g_parked == nullptr) g_parked = new std::vector<ParkedReceives>();
  g_parked->push_back({std::move(words), std::move(requests)});
}

}  // namespace

Result<std::unique_ptr<HeartbeatChannel>> HeartbeatChannel::Create(MPI_Comm comm) {
  PSD_REQUIRE_ARG(comm != MPI_COMM_NULL, "HeartbeatChannel::Create: comm is MPI_COMM_NULL");
  std::unique_ptr<HeartbeatChannel> c(new HeartbeatChannel());
  int rc = MPI_Comm_dup(comm, &c->comm_);
  if (rc != MPI_SUCCESS) return MpiError("HeartbeatChannel::Create: MPI_Comm_dup", rc);
  // Errors come back as codes (a Status), never as MPI's default abort.
  MPI_Comm_set_errhandler(c->comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(c->comm_, &c->rank_);
  MPI_Comm_size(c->comm_, &c->size_);

  PSD_ASSIGN_OR_RETURN(c->hosts_, GatherHostNames(c->comm_, "HeartbeatChannel::Create"));
  const size_t n = static_cast<size_t>(c->size_);
  c->send_word_.assign(n, 0);
  c->recv_word_.assign(n, 0);
  c->send_req_.assign(n, MPI_REQUEST_NULL);
  c->recv_req_.assign(n, MPI_REQUEST_NULL);
  return c;
}

HeartbeatChannel::~HeartbeatChannel() {
  if (comm_ == MPI_COMM_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;  // MPI has released everything already; no call is allowed now.
  // Posted receives: parked, never cancelled. A peer's leaving beat can arrive at any moment,
  // and another thread's MPI call (another communicator's liveness thread, the engine) may be
  // matching it against our receive exactly while we would cancel it: Open MPI 4.1's ob1 can
  // then unlink the request twice and crash inside MPI_Cancel (seen in CI at shutdown). Left
  // posted, a receive that matches later writes into its parked buffer, which stays alive; MPI
  // reclaims the requests at MPI_Finalize. The cost is one word and one request per peer.
  if (receiving_) ParkReceives(std::move(recv_word_), std::move(recv_req_));
  // Beats still in flight: freed, not waited for. A frozen peer may never take its beat, so
  // waiting could block forever; a freed send still completes (or stays queued inside MPI,
  // a few bytes per frozen peer) without us.
  for (MPI_Request& r : send_req_) {
    if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  }
  if (!started_p2p_) {
    // Only collectives ever ran on the duplicate, all complete: nothing can still arrive.
    MPI_Comm_free(&comm_);
    return;
  }
  // Deliberately leaked once beats have flowed. Peers keep sending until our leaving beat
  // reaches them, and a frozen one may resume much later, so beats can still arrive; waiting
  // for every peer to go quiet could take forever. A message for a freed communicator is
  // parked by Open MPI's ob1 under its context id (a later communicator reusing the id could
  // then receive it) or dropped with a warning. Kept alive, the duplicate just absorbs them
  // (a few bytes each, until the peers see our leaving beat). The cost is one communicator.
}

const std::string& HeartbeatChannel::host(int r) const {
  static const std::string kUnknown = "?";
  return r >= 0 && r < size_ ? hosts_[static_cast<size_t>(r)] : kUnknown;
}

Status HeartbeatChannel::OrOverRanks(uint64_t* words, size_t n) {
  return or_agreement::OrAllReduce(comm_, words, n, MpiWait{nullptr, "HeartbeatChannel"}, nullptr);
}

Result<std::vector<double>> HeartbeatChannel::GatherValues(double mine) {
  std::vector<double> all(static_cast<size_t>(size_));
  int rc = MPI_Allgather(&mine, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, comm_);
  if (rc != MPI_SUCCESS) return MpiError("HeartbeatChannel::GatherValues: MPI_Allgather", rc);
  return all;
}

Result<bool> HeartbeatChannel::Send(int peer, uint64_t seq, bool leaving) {
  PSD_REQUIRE_ARG(peer >= 0 && peer < size_ && peer != rank_, "HeartbeatChannel::Send: peer is ",
                  peer, "; expected a rank in [0, ", size_, ") other than this rank (", rank_, ")");
  const size_t p = static_cast<size_t>(peer);
  if (send_req_[p] != MPI_REQUEST_NULL) {
    int done = 0;
    int rc = MPI_Test(&send_req_[p], &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return MpiError("HeartbeatChannel::Send: MPI_Test(previous beat)", rc);
    if (!done) return false;  // the peer has not taken the previous beat: skip this one
  }
  started_p2p_ = true;
  send_word_[p] = Encode(seq, leaving);
  int rc = MPI_Isend(&send_word_[p], 1, MPI_UINT64_T, peer, kBeatTag, comm_, &send_req_[p]);
  if (rc != MPI_SUCCESS) return MpiError("HeartbeatChannel::Send: MPI_Isend", rc);
  return true;
}

Result<bool> HeartbeatChannel::SendsDone() {
  int done = 0;
  int rc = MPI_Testall(size_, send_req_.data(), &done, MPI_STATUSES_IGNORE);
  if (rc != MPI_SUCCESS) return MpiError("HeartbeatChannel::SendsDone: MPI_Testall", rc);
  return done != 0;
}

Status HeartbeatChannel::PostReceive(int peer) {
  const size_t p = static_cast<size_t>(peer);
  started_p2p_ = true;
  int rc = MPI_Irecv(&recv_word_[p], 1, MPI_UINT64_T, peer, kBeatTag, comm_, &recv_req_[p]);
  if (rc != MPI_SUCCESS) return MpiError("HeartbeatChannel::Poll: MPI_Irecv", rc);
  return Status::Ok();
}

Status HeartbeatChannel::Poll(std::vector<Beat>* arrived) {
  if (!receiving_) {
    // First poll: one receive per peer, kept posted from now on. Beats sent before it wait in
    // MPI's unexpected queue and match here.
    for (int peer = 0; peer < size_; ++peer) {
      if (peer != rank_) PSD_CHECK(PostReceive(peer));
    }
    receiving_ = true;
  }
  std::vector<int> done(static_cast<size_t>(size_));
  // Each round completes at most one beat per peer; repeat until nothing more has arrived (a
  // peer resumed after a freeze delivers its queued beats all at once).
  while (true) {
    int count = 0;
    int rc = MPI_Testsome(size_, recv_req_.data(), &count, done.data(), MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) return MpiError("HeartbeatChannel::Poll: MPI_Testsome", rc);
    if (count == MPI_UNDEFINED || count == 0) return Status::Ok();
    for (int i = 0; i < count; ++i) {
      const int peer = done[static_cast<size_t>(i)];
      const uint64_t word = recv_word_[static_cast<size_t>(peer)];
      arrived->push_back(Beat{peer, word >> 1, (word & 1u) != 0});
      PSD_CHECK(PostReceive(peer));
    }
  }
}

}  // namespace poseidon
