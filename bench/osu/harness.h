// The OSU-style collective benchmark harness: one small library, one program per operation.
//
// A program defines a Collective (how to size, fill, run and check one operation, ours and
// the peer's: Open MPI's own call) and calls RunMain. The harness parses OSU's options, prints
// a preamble naming the machine, ranks, backend and build, then one row per size with
// nccl-tests' columns for ours and for the peer, and the busbw ratio ours / peer.
//
// Per size and per implementation: warm-up runs, then timed runs; before each timed run the
// output is poisoned (untimed) and the ranks meet in a barrier, after it every element is
// compared (untimed) with an exact formula, so a wrong or missing result shows in #wrong.
// Time is the average over the timed runs, averaged across ranks (min / max with -f).
//
// Options (same on every rank):
//   -m [MIN:]MAX    message sizes in bytes, doubling from MIN (default 4:1048576)
//   -i ITER         timed runs per size (default 100; sizes over 1 MiB use ITER/10, at least 2)
//   -x WARMUP       warm-up runs per size (default 10; sizes over 1 MiB use WARMUP/10, at least 1)
//   -f              full rows: min and max time and the iteration count
//   -d host|cuda    where the buffers live (cuda only in a CUDA build, else an error)
//   -T TYPE         element type: float32 (default), float64, float16, bfloat16, int32, int64
//   --json          one JSON document instead of the table
//   --no-peer       skip the MPI peer
//   -t LEVEL        the MPI thread level asked of MPI_Init_thread: single, funneled, serialized
//                   or multiple (default: the lowest the program needs, RequiredThreadLevel;
//                   single for the blocking benchmarks). Ours and the peer run under the same
//                   level; the header names the level MPI provided. Below multiple the
//                   communicator's liveness thread (runtime/liveness.h) cannot run, so unless
//                   POSEIDON_PEER_TIMEOUT_S is set the harness sets it to 0 (no warning); at
//                   multiple the heartbeat thread runs beside both columns.
// Exit status: 0 when every result was right, 1 when any #wrong > 0 or a call failed,
// 2 for bad options.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "runtime/backend.h"
#include "runtime/communicator.h"
#include "runtime/dtype.h"
#include "runtime/status.h"

namespace poseidon::osu {

struct Options {
  size_t min_bytes = 4;
  size_t max_bytes = size_t{1} << 20;
  int iterations = 100;
  int warmup = 10;
  bool full = false;
  bool json = false;
  bool peer = true;
  MemoryKind memory = MemoryKind::kHost;
  DType dtype = DType::kFloat32;
  int thread_level = -1;  // -t: an MPI_THREAD_* level; -1: the program's RequiredThreadLevel
};

// "single", "funneled", "serialized", "multiple" for the MPI_THREAD_* levels.
std::string ThreadLevelName(int level);

// Parses argv (argv[0] is the program); errors name the option, the value and what is valid.
// Sets *help when -h / --help was given.
Result<Options> ParseOptions(int argc, char** argv, bool* help);
std::string UsageText(const std::string& program);

// A buffer on the host or the device (a CUDA build's -d cuda), with host-side staging for
// filling and checking.
class Buffer {
 public:
  Buffer() = default;
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Status Allocate(MemoryKind memory, size_t bytes);
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Status Upload(const void* host, size_t bytes);
  Status Download(void* host, size_t bytes) const;
  Status Poison();  // fills with 0xFF bytes (a NaN / -1 pattern no formula produces)
  void Free();

 private:
  MemoryKind memory_ = MemoryKind::kHost;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// What a Collective gets to set itself up for one size.
struct Context {
  Communicator* comm = nullptr;
  Backend* backend = nullptr;  // ours, for the chosen memory kind
  MemoryKind memory = MemoryKind::kHost;
  DType dtype = DType::kFloat32;
  int rank = 0;
  int world = 1;
};

class Collective {
 public:
  virtual ~Collective() = default;
  virtual std::string program() const = 0;    // "osu_allreduce"
  virtual std::string ours_name() const = 0;  // "Backend::AllReduce"
  virtual std::string peer_name() const = 0;  // "MPI_Allreduce"
  virtual std::string factor_text() const = 0;  // "2(P-1)/P"
  virtual double BusFactor(int world) const = 0;
  // The element count of the full buffer (nccl-tests' size / dtype size) that a requested
  // size maps to; 0 skips the size. The default is bytes / dtype size.
  virtual size_t CountFor(size_t bytes, DType dtype, int world) const;
  // Allocates and fills inputs, computes the expected output, for count elements.
  virtual Status Prepare(const Context& ctx, size_t count) = 0;
  virtual Status RunOurs() = 0;
  virtual Status RunPeer() = 0;  // only called when PeerSupported
  virtual bool PeerSupported(const Context& ctx) const;
  // The lowest MPI thread level the program needs (an MPI_THREAD_* value): the default of -t,
  // and -t below it is an error. Blocking calls from the main thread need only single.
  virtual int RequiredThreadLevel() const;
  // Poisons the output before a timed run; counts wrong output elements after it.
  virtual Status PoisonOutput() = 0;
  virtual Result<size_t> CountWrong() = 0;
  virtual void Release() = 0;  // frees the buffers of the last size
  // Extra columns after the ratio (e.g. the bytes an exchange actually sent): a header, the
  // row's text and its JSON members (", \"key\": value" ...). Asked on every rank after a
  // size's runs, before Release; rank 0 prints them. Empty by default.
  virtual std::string ExtraHeader() const { return ""; }
  virtual std::string ExtraText() const { return ""; }
  virtual std::string ExtraJson() const { return ""; }
};

// The exact formula every program uses: rank r contributes (r + 1) * F(i), F(i) = i % 7 + 1,
// so every sum over up to 23 ranks is an integer below 2048, exact in every dtype.
double FormulaF(size_t i);
// out (n elements of dtype) = scale * F(first + i).
void FillFormula(DType dtype, double scale, size_t first, size_t n, void* out);
// Elements of `got` that differ (bitwise) from `want`, both n elements of dtype.
size_t CountMismatches(DType dtype, const void* got, const void* want, size_t n);
// MPI datatype for a dtype whose MPI_SUM is native (not the half types).
bool MpiSumSupported(DType dtype);

// The peer's MPI call as a Status: Ok, or the call's name and MPI's error text.
Status PeerCall(const char* call, int rc);

// A collective of one call from a send buffer into a separate receive buffer, checked whole
// against an exact expected output: a program only sizes the buffers, fills the expected
// output and makes the two calls.
class BufferCollective : public Collective {
 public:
  Status PoisonOutput() override { return recv_.Poison(); }
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

// The rank as mpirun tells it (before MPI is initialized); 0 for a singleton. Programs with
// their own options print their errors and help on this rank only.
bool IsFirstRank();

// Gradient inputs with exactly known sums for the sparse exchanges (osu_topk, osu_hybrid).
// Rank r's k large entries of an n-element gradient: (r + 1) F(m) with alternating signs at
// positions (m s) mod n for m in [r h, r h + k) (s = n / k, h = ceil(k / 2): neighbouring
// ranks share half their positions). Adds every rank's entries to sum in rank order (as the
// scatter-add), marks their positions in large and writes this rank's into in.
void PlaceLargeEntries(int world, int rank, size_t n, size_t k, float* sum,
                       unsigned char* large, float* in);
// Small noise for the other entries: +-(1..1024) x 2^-30 from a multiplicative hash of (rank,
// index): varied magnitudes, as real gradients have, never zero; sums of a few thousand are
// exact in float32.
float GradientNoise(int rank, size_t i);

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

// The whole program: MPI init (MPI_Init_thread at -t's level), communicator, options, preamble, rows, exit status.
int RunMain(int argc, char** argv, Collective& collective);

}  // namespace poseidon::osu
