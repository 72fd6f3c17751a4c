// What an OSU-style program defines: a Collective, how to size, fill, run and check one
// operation, ours and the peer's (Open MPI's own call), plus the program's own flags. The
// runner (runner.h) does the rest.
#pragma once

#include <cstddef>
#include <string>

#include "bench/osu/args.h"
#include "runtime/backend.h"
#include "runtime/communicator.h"
#include "runtime/dtype.h"
#include "runtime/status.h"
#include "tools/flags.h"

namespace poseidon::osu {

// What a Collective gets to set itself up for one size.
struct Context {
  Communicator* comm = nullptr;
  Backend* backend = nullptr;  // ours, for the chosen memory kind
  MemoryKind memory = MemoryKind::kHost;
  bool registered = false;  // host buffers from backend->AllocShared (--registered)
  DType dtype = DType::kFloat32;
  int rank = 0;
  int world = 1;
};

class Collective {
 public:
  virtual ~Collective() = default;
  virtual std::string program() const = 0;      // "osu_allreduce"
  virtual std::string ours_name() const = 0;    // "Backend::AllReduce"
  virtual std::string peer_name() const = 0;    // "MPI_Allreduce"
  virtual std::string factor_text() const = 0;  // "2(P-1)/P"
  virtual double BusFactor(int world) const = 0;
  // The program's own options (-D, -r, --model ...), declared on the harness's parser.
  virtual void AddFlags(cli::Flags& flags) {}
  // After parsing, before MPI starts: checks the program's options together and may set the
  // harness's (osu_hybrid sets the size to its model's). An error is an option error.
  virtual Status Configure(const cli::Flags& flags, Options* options) { return Status::Ok(); }
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
  // Whether --registered applies: the program's host buffers can come from AllocShared.
  virtual bool TakesRegistered() const { return false; }
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

// The peer's MPI call as a Status: Ok, or the call's name and MPI's error text.
Status PeerCall(const char* call, int rc);

}  // namespace poseidon::osu
