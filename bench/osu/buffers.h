// The OSU-style benchmarks' buffers: a host or device buffer with host-side staging, the
// send / receive / expected buffers of a one-call collective (BufferCollective), and the
// restore-before-each-run buffers of an in-place exchange and its peer (InPlaceBuffers).
#pragma once

#include <cstddef>
#include <vector>

#include "bench/osu/collective.h"
#include "runtime/backend.h"
#include "runtime/dtype.h"
#include "runtime/status.h"

namespace poseidon::osu {

// A buffer on the host or the device (a CUDA build's -d cuda), with host-side staging for
// filling and checking.
class Buffer {
 public:
  Buffer() = default;
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  // shared (host memory only): from shared->AllocShared, a collective call (every rank
  // allocates, and frees, the same buffers in the same order); null: aligned_alloc.
  Status Allocate(MemoryKind memory, size_t bytes, Backend* shared = nullptr);
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Status Upload(const void* host, size_t bytes);
  Status Download(void* host, size_t bytes) const;
  Status Poison();  // fills with 0xFF bytes (a NaN / -1 pattern no formula produces)
  void Free();

 private:
  MemoryKind memory_ = MemoryKind::kHost;
  Backend* shared_ = nullptr;  // the backend that allocated data_, if AllocShared did
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// A collective of one call from a send buffer into a separate receive buffer, checked whole
// against an exact expected output: a program only sizes the buffers, fills the expected
// output and makes the two calls.
class BufferCollective : public Collective {
 public:
  Status PoisonOutput() override { return recv_.Poison(); }
  bool TakesRegistered() const override { return true; }
  Result<size_t> CountWrong() override;
  void Release() override;

 protected:
  // Keeps ctx; allocates send_ (send_count elements, this rank's (rank + 1) * F(i)) and recv_
  // (recv_count elements), and sizes want_ (recv_count elements) for the caller to fill.
  Status PrepareBuffers(const Context& ctx, size_t send_count, size_t recv_count);
  // The start of want_'s element i.
  unsigned char* want_at(size_t i) { return want_.data() + i * DTypeSize(ctx_.dtype); }
  CallOptions call_options() const;

  Context ctx_;
  Buffer send_, recv_;

 private:
  size_t recv_count_ = 0;
  std::vector<unsigned char> want_, got_;  // got_: the download of device output
};

// The buffers of an in-place exchange (ours overwrites grad) and of its peer, MPI_Allreduce
// of the same dense gradient from peer_send into peer_recv. Ours works in place, so the
// input is restored before every run outside the timed region: before a timed run by
// PoisonOutput, before a warm-up run (no PoisonOutput before it) by BeginOurs itself.
class InPlaceBuffers {
 public:
  // grad and both peer buffers for input.size() floats; peer_send holds the input.
  Status Allocate(MemoryKind memory, std::vector<float> input);
  Status BeginOurs();  // at the start of ours
  void BeginPeer() { last_peer_ = true; }
  Status PoisonOutput();
  bool last_peer() const { return last_peer_; }
  // The last run's output (ours: grad, the peer: peer_recv) readable on the host.
  Result<const float*> Output();
  void Free();

  Buffer grad, peer_send, peer_recv;

 private:
  Status Restore() { return grad.Upload(input_.data(), input_.size() * sizeof(float)); }

  MemoryKind memory_ = MemoryKind::kHost;
  std::vector<float> input_, got_;
  bool restored_ = false, last_peer_ = false;
};

}  // namespace poseidon::osu
