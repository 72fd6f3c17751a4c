#include "engine/controller.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "engine/timeline.h"
#include "runtime/agreement.h"

namespace poseidon::engine {

Result<std::unique_ptr<Controller>> Controller::Create(MPI_Comm comm, int num_layers) {
  std::unique_ptr<Controller> c(new Controller());
  PSD_ASSIGN_OR_RETURN(c->channel_, ControlChannel::Create(comm));
  c->send_ = std::make_unique<NegotiationVector>(num_layers);
  c->recv_ = std::make_unique<NegotiationVector>(num_layers);
  c->result_ = std::make_unique<NegotiationVector>(num_layers);
  return c;
}

Status Controller::Post() {
  posted_us_ = Timeline::NowUs();
  return channel_->PostOr(send_->data(), recv_->data(), static_cast<size_t>(send_->size()));
}

__attribute__((noinline)) void Controller::TakeDelivered() {
  const size_t bytes = static_cast<size_t>(recv_->size()) * sizeof(uint64_t);
  std::memcpy(result_->data(), recv_->data(), bytes);
}

Status Controller::Wait(const Interrupt* interrupt, double limit_s) {
  const double start = Timeline::NowUs();
  long long sleep_us = 0;
  for (int polls = 0;; ++polls) {
    PSD_ASSIGN_OR_RETURN(bool done, channel_->TestOr());
    if (done) {
      TakeDelivered();
      return Status::Ok();
    }
    Status lost = interrupt != nullptr ? interrupt->Check() : Status::Ok();
    const double waited_s = (Timeline::NowUs() - start) * 1e-6;
    if (!lost.ok() || (limit_s > 0 && waited_s > limit_s)) {
      // MPI still owns the buffers of the abandoned round: keep them alive forever.
      channel_->AbandonOr();
      (void)send_.release();
      (void)recv_.release();
      if (!lost.ok()) return lost;
      return TimeoutError("Engine: rank ", channel_->rank(),
                          ": the other ranks' engines did not answer the negotiation for ",
                          waited_s,
                          " s although every process answers heartbeats (a rank never created "
                          "its engine, or its engine thread is stuck); limit 2 x "
                          "POSEIDON_STALL_ABORT_S + 5 s");
    }
    if (polls < 8) {
      std::this_thread::yield();
      continue;
    }
    sleep_us = std::min<long long>(std::max<long long>(2 * sleep_us, 10), 500);
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
  }
}

Status Controller::GatherErrors(StatusCode my_code, const std::string& my_error,
                                const Interrupt* interrupt) {
  // Each rank's text is "<code>:<message>" (empty when it had no error).
  const std::string mine =
      my_error.empty() ? std::string() : StrCat(static_cast<int>(my_code), ":", my_error);
  PSD_ASSIGN_OR_RETURN(std::vector<std::string> all, channel_->AllGather(mine, interrupt));
  std::vector<int> ranks;
  std::string detail;
  StatusCode code = StatusCode::kOk;
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i].empty()) continue;
    ranks.push_back(static_cast<int>(i));
    const size_t colon = all[i].find(':');
    if (code == StatusCode::kOk) code = static_cast<StatusCode>(std::stoi(all[i].substr(0, colon)));
    detail += StrCat(detail.empty() ? "" : "; ", "rank ", i, ": ", all[i].substr(colon + 1));
  }
  if (ranks.empty()) return Status::Ok();
  if (code == StatusCode::kOk) code = StatusCode::kInternal;
  return Status(code, StrCat("Engine: failed on ", FormatRanks(ranks), ": ", detail));
}

Status Controller::GatherMismatch(const std::vector<Descriptor>& mine,
                                  const std::vector<int>& layers, const LayerNamer& name,
                                  const Interrupt* interrupt) {
  std::string bytes(mine.size() * Descriptor::kWords * sizeof(int64_t), '\0');
  for (size_t i = 0; i < mine.size(); ++i) {
    int64_t w[Descriptor::kWords];
    mine[i].ToWords(w);
    std::memcpy(&bytes[i * sizeof(w)], w, sizeof(w));
  }
  PSD_ASSIGN_OR_RETURN(std::vector<std::string> all, channel_->AllGather(bytes, interrupt));
  std::vector<std::vector<Descriptor>> per_rank(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    const size_t per = Descriptor::kWords * sizeof(int64_t);
    for (size_t off = 0; off + per <= all[r].size(); off += per) {
      int64_t w[Descriptor::kWords];
      std::memcpy(w, &all[r][off], per);
      per_rank[r].push_back(Descriptor::FromWords(w));
    }
  }
  return MismatchError("Engine: ranks submitted different work: ",
                       DescribeMismatch(per_rank, layers, name),
                       ". Every rank must submit the same layers (in any order within a step) "
                       "with the same element count, dtype and step");
}

Result<std::string> Controller::GatherStall(const std::vector<int>& layers,
                                            const LayerNamer& name,
                                            const Interrupt* interrupt) {
  const std::vector<uint64_t> words = send_->MaskWords();
  std::string mine(words.size() * sizeof(uint64_t), '\0');
  std::memcpy(mine.data(), words.data(), mine.size());
  PSD_ASSIGN_OR_RETURN(std::vector<std::string> all, channel_->AllGather(mine, interrupt));
  std::vector<std::vector<uint64_t>> masks(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    masks[r].resize(all[r].size() / sizeof(uint64_t));
    std::memcpy(masks[r].data(), all[r].data(), masks[r].size() * sizeof(uint64_t));
  }
  return DescribeStall(masks, layers, name);
}

}  // namespace poseidon::engine
