// The OSU-style benchmarks' options: what every program takes (sizes, runs, memory, type, thread
// level, output form), declared on bench/common's flag parser beside the program's own flags.
//
//   -m [MIN:]MAX    message sizes in bytes, doubling from MIN (default 4:1048576; K/M/G suffixes)
//   -i ITER         timed runs per size (default 100; sizes over 1 MiB use ITER/10, at least 2)
//   -x WARMUP       warm-up runs per size (default 10; sizes over 1 MiB use WARMUP/10, at least 1)
//   -f              full rows: min and max time and the iteration count
//   -d host|cuda    where the buffers live (cuda only in a CUDA build, else an error)
//   -T TYPE         element type: float32 (default), float64, float16, bfloat16, int32, int64
//   --json          one JSON document instead of the table
//   --no-peer       skip the MPI peer
//   --per-rank      under each row, every rank's median, 90th and 99th percentile and mean time
//                   per column (JSON: the row's "per_rank"): where ranks outnumber cores a
//                   small call's time is bimodal (a rank either finds its data or waits for a
//                   scheduler round), and the mean alone hides which ranks wait
//   --barrier mpi|node
//                   the barrier before and after each timed run: mpi (default) is MPI_Barrier,
//                   as in OSU's loop; node is a spin barrier through a shared-memory window of
//                   the harness's own (bench/osu/node_barrier.h, one node only), which drives no
//                   MPI progress, so Open MPI's receivers take in an eager message inside the
//                   timed call instead of in the barrier before it. Meant for runs where every
//                   rank has a core: where ranks outnumber cores, the order in which a barrier
//                   lets them go decides small calls' times, and it differs from MPI_Barrier's
//   -t LEVEL        the MPI thread level asked of MPI_Init_thread: single, funneled, serialized
//                   or multiple (default: the lowest the program needs, RequiredThreadLevel;
//                   single for the blocking benchmarks). Ours and the peer run under the same
//                   level; the header names the level MPI provided. Below multiple the
//                   communicator's liveness thread (runtime/liveness.h) cannot run, so unless
//                   POSEIDON_PEER_TIMEOUT_S is set the harness sets it to 0 (no warning); at
//                   multiple the heartbeat thread runs beside both columns.
#pragma once

#include <cstddef>
#include <string>

#include "runtime/dtype.h"
#include "runtime/status.h"
#include "tools/flags.h"

namespace poseidon::osu {

class Collective;

// The barrier around each timed run (--barrier).
enum class BarrierKind { kMpi, kNode };

struct Options {
  size_t min_bytes = 4;
  size_t max_bytes = size_t{1} << 20;
  int iterations = 100;
  int warmup = 10;
  bool full = false;
  bool json = false;
  bool no_peer = false;
  bool per_rank = false;
  BarrierKind barrier = BarrierKind::kMpi;
  MemoryKind memory = MemoryKind::kHost;
  bool registered = false;  // --registered: buffers from Backend::AllocShared
  DType dtype = DType::kFloat32;
  int thread_level = -1;  // -t: an MPI_THREAD_* level; -1: the program's RequiredThreadLevel
};

// Above this size a program makes a tenth of the runs (OSU does the same).
constexpr size_t kLargeBytes = size_t{1} << 20;
// Runs at `bytes` for a count `n` given for small sizes, at least `floor_value`.
int RunsFor(size_t bytes, int n, int floor_value);

// "mpi" or "node".
std::string BarrierName(BarrierKind kind);

// "single", "funneled", "serialized", "multiple" for the MPI_THREAD_* levels.
std::string ThreadLevelName(int level);

// Declares the harness's options on `flags`, writing into *o.
void AddOptions(cli::Flags& flags, Options* o);

// Parses argv (argv[0] is the program) with the harness's options and the program's own
// (Collective::AddFlags), then lets the program check them (Collective::Configure). Errors name
// the option, the value and what is valid. Sets *help for -h / --help and *usage to the text.
Result<Options> ParseOptions(int argc, char** argv, Collective& c, bool* help, std::string* usage);

}  // namespace poseidon::osu
