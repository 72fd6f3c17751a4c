// The OSU-style benchmarks' runner (see runner.h). Steps of RunMain:
//   1. the options (no MPI needed: -t picks the level MPI_Init_thread asks for), MPI init, the
//      communicator (same argv on every rank, so every rank agrees on a bad option and exits
//      alike; rank 0 reports it after MPI init);
//   2. the header (report.h): bench/common's preamble, the thread level, sizes and columns;
//   3. for each size, doubling from MIN to MAX: Prepare on every rank (agreed: one rank's
//      failure stops all), untimed runs of both columns in turn (Settle), then for ours and for
//      the peer: warm-up runs, timed runs (poison, barrier, time one run, barrier, check every
//      element; the barrier is MPI_Barrier or, with --barrier node, NodeBarrier), reduce the
//      figures across ranks;
//   4. a row with both figures and the busbw ratio; the exit status says whether every result
//      was right.
#include "bench/osu/runner.h"

#include <mpi.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "bench/common/preamble.h"
#include "bench/osu/node_barrier.h"
#include "bench/osu/report.h"
#include "runtime/liveness.h"
#include "runtime/mpi_wait.h"
#include "runtime/settings.h"

namespace poseidon::osu {
namespace {

// How long a rank waits in the node barrier for the others before the run fails naming them
// (no call of the largest size takes a second here; within the tests' 90 s limit).
constexpr double kNodeBarrierTimeoutS = 30;

// Stops every rank: a failed call on one rank would otherwise leave the others waiting.
[[noreturn]] void Fail(MPI_Comm comm, const std::string& program, const Status& st) {
  std::fprintf(stderr, "%s: %s\n", program.c_str(), st.ToString().c_str());
  std::fflush(stderr);
  MPI_Abort(comm, 1);
  std::exit(1);
}

// This rank's median, 90th and 99th percentile (nearest rank) and mean of `times` (s), in us,
// gathered on rank 0 (empty elsewhere).
std::vector<std::array<double, 4>> PerRank(MPI_Comm comm, const Context& ctx,
                                           std::vector<double> times, double mean) {
  std::sort(times.begin(), times.end());
  auto at = [&](double q) {
    if (times.empty()) return 0.0;
    size_t k = static_cast<size_t>(std::ceil(q * static_cast<double>(times.size())));
    return times[std::min(times.size(), std::max<size_t>(k, 1)) - 1] * 1e6;
  };
  const std::array<double, 4> mine = {at(0.5), at(0.9), at(0.99), mean * 1e6};
  const bool root = ctx.rank == 0;
  std::vector<std::array<double, 4>> all(root ? static_cast<size_t>(ctx.world) : 0);
  MPI_Gather(mine.data(), 4, MPI_DOUBLE, root ? all.data() : nullptr, 4, MPI_DOUBLE, 0, comm);
  return all;
}

// The barrier around each timed run: MPI_Barrier, or the node barrier where one was made
// (--barrier node).
void Meet(MPI_Comm comm, NodeBarrier* node, const std::string& program) {
  if (node == nullptr) {
    MPI_Barrier(comm);
    return;
  }
  Status st = node->Wait();
  if (!st.ok()) Fail(comm, program, st);
}

Figures Measure(const Options& opt, const Context& ctx, Collective& c, bool peer, size_t bytes,
                NodeBarrier* node, const std::string& program) {
  MPI_Comm comm = ctx.comm->mpi_comm();
  auto run = [&]() { return peer ? c.RunPeer() : c.RunOurs(); };
  Figures f;
  f.ran = true;
  f.iterations = RunsFor(bytes, opt.iterations, 2);
  int warmup = RunsFor(bytes, opt.warmup, 1);
  if (opt.warmup == 0) warmup = 0;
  for (int i = 0; i < warmup; ++i) {
    Status st = run();
    if (!st.ok()) Fail(comm, program, st.WithPrefix(peer ? "peer warm-up" : "warm-up"));
  }
  double sum = 0, lo = 1e300, hi = 0;
  std::vector<double> times;
  if (opt.per_rank) times.reserve(static_cast<size_t>(f.iterations));
  unsigned long long wrong = 0;
  for (int i = 0; i < f.iterations; ++i) {
    Status st = c.PoisonOutput();
    if (!st.ok()) Fail(comm, program, st);
    Meet(comm, node, program);
    double t0 = MPI_Wtime();
    st = run();
    double t = MPI_Wtime() - t0;
    if (!st.ok()) Fail(comm, program, st);
    // Every rank waits here until the last one has returned, as OSU's loop does after each
    // call: a rank that returned early would otherwise check and poison its output while its
    // peers are still in the call, and where ranks outnumber cores that work takes their cores.
    Meet(comm, node, program);
    sum += t;
    if (opt.per_rank) times.push_back(t);
    lo = std::min(lo, t);
    hi = std::max(hi, t);
    auto w = c.CountWrong();
    if (!w.ok()) Fail(comm, program, w.status());
    wrong += *w;
  }
  double avg = f.iterations > 0 ? sum / f.iterations : 0;
  double total_avg = 0;
  MPI_Allreduce(&avg, &total_avg, 1, MPI_DOUBLE, MPI_SUM, comm);
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_DOUBLE, MPI_MIN, comm);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_DOUBLE, MPI_MAX, comm);
  MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, comm);
  if (opt.per_rank) f.per_rank = PerRank(comm, ctx, times, avg);
  double t = total_avg / ctx.world;
  f.avg_us = t * 1e6;
  f.min_us = lo * 1e6;
  f.max_us = hi * 1e6;
  f.algbw = t > 0 ? static_cast<double>(bytes) / t / 1e9 : 0;
  f.busbw = f.algbw * c.BusFactor(ctx.world);
  f.wrong = wrong;
  return f;
}

// Untimed calls of both columns, alternated, as many as Measure times for this size.
void Settle(const Options& opt, const Context& ctx, Collective& c, bool peer, size_t bytes,
            const std::string& program) {
  MPI_Comm comm = ctx.comm->mpi_comm();
  const int runs = RunsFor(bytes, opt.iterations, 2);
  for (int i = 0; i < runs; ++i) {
    Status st = c.RunOurs();
    if (st.ok() && peer) st = c.RunPeer();
    if (!st.ok()) Fail(comm, program, st.WithPrefix("settling run"));
  }
}

// Every size from MIN to MAX on an open communicator; returns the exit status.
int RunSizes(const Options& opt, const ThreadLevels& levels, Communicator& comm, Collective& c) {
  const std::string program = c.program();
  auto backend = comm.backend(opt.memory);
  if (!backend.ok()) Fail(comm.mpi_comm(), program, backend.status());
  Context ctx;
  ctx.comm = &comm;
  ctx.backend = *backend;
  ctx.memory = opt.memory;
  ctx.registered = opt.registered;
  ctx.dtype = opt.dtype;
  ctx.rank = comm.rank();
  ctx.world = comm.size();
  const bool root = ctx.rank == 0;
  const bool peer = !opt.no_peer && c.PeerSupported(ctx);
  std::unique_ptr<NodeBarrier> node;
  if (opt.barrier == BarrierKind::kNode) {
    auto made = NodeBarrier::Create(comm.mpi_comm(), kNodeBarrierTimeoutS);
    if (!made.ok()) Fail(comm.mpi_comm(), program, made.status());
    node = std::move(*made);
  }
  Report report(opt, c, peer);
  if (root) {
    auto pre = bench::Preamble::Gather(
        program, StrCat("ours = ", c.ours_name(), ", peer = ",
                        peer ? c.peer_name() : std::string("(no peer)"), " in the same run"));
    pre.SetRun(comm, **backend, opt.memory);
    report.Header(pre, levels);
  }

  int exit_code = 0;
  const size_t es = DTypeSize(opt.dtype);
  size_t last_count = 0;
  for (size_t req = opt.min_bytes; req <= opt.max_bytes; req = req * 2) {
    size_t count = c.CountFor(req, opt.dtype, ctx.world);
    if (count == 0 || count == last_count) continue;
    last_count = count;
    size_t bytes = count * es;
    Status prepared = c.Prepare(ctx, count);
    int ok = prepared.ok() ? 1 : 0, all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm.mpi_comm());
    if (!all_ok) {
      if (!prepared.ok()) Fail(comm.mpi_comm(), program, prepared);
      Fail(comm.mpi_comm(), program,
           InternalError("another rank failed to prepare ", bytes, " bytes"));
    }
    if (opt.warmup != 0) {
      // Untimed, both columns in turn run as many calls as they will time, so that the column
      // measured first does not take the settling alone: right after start-up the scheduler
      // still moves the ranks between cores (the first size of a -np 2 run came out 1.7 us
      // for ours and 0.5 us for Open MPI in the same mpirun), and every size's buffers are
      // new (P = 2, a 16 MiB allgather: 1735-1753 us for ours measured first against
      // 1431-1481 us for Open MPI after it, and 1365-1437 against 1356-1416 us with five
      // warm-up runs each instead of one).
      Settle(opt, ctx, c, peer, bytes, program);
    }
    Figures ours = Measure(opt, ctx, c, false, bytes, node.get(), program);
    Figures theirs;
    if (peer) theirs = Measure(opt, ctx, c, true, bytes, node.get(), program);
    const std::string extra_text = c.ExtraText(), extra_json = c.ExtraJson();
    c.Release();
    if (ours.wrong > 0 || theirs.wrong > 0) exit_code = 1;
    if (root) report.Row(bytes, count, ours, theirs, extra_text, extra_json);
  }
  if (root) report.Footer(exit_code == 0);
  return exit_code;
}

}  // namespace

int RunMain(int argc, char** argv, Collective& c) {
  const std::string program = c.program();
  // The options come first (they need no MPI): -t names the level MPI_Init_thread asks for.
  // A bad option is reported after MPI init, by rank 0 only.
  bool help = false;
  std::string usage;
  auto parsed = ParseOptions(argc, argv, c, &help, &usage);
  ThreadLevels levels;
  levels.needed = c.RequiredThreadLevel();
  levels.given = parsed.ok() && parsed->thread_level >= 0;
  levels.asked = levels.given ? parsed->thread_level : levels.needed;
  // MPI_Init_thread itself, not poseidon::InitMpi (which always asks for MPI_THREAD_MULTIPLE):
  // the level changes how Open MPI locks, so both columns must run under the level the
  // program needs, and the same one.
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) {
    MPI_Query_thread(&levels.provided);
  } else {
    int rc = MPI_Init_thread(&argc, &argv, levels.asked, &levels.provided);
    if (rc != MPI_SUCCESS) {
      std::fprintf(stderr, "%s: %s\n", program.c_str(),
                   MpiError("MPI_Init_thread", rc).ToString().c_str());
      return 1;
    }
  }
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  if (parsed.ok() && !help && levels.provided < levels.needed) {
    if (world_rank == 0) {
      std::fprintf(stderr, "%s: MPI provides thread level %s, below the %s it needs\n",
                   program.c_str(), ThreadLevelName(levels.provided).c_str(),
                   ThreadLevelName(levels.needed).c_str());
    }
    MPI_Finalize();
    return 1;
  }
  if (!parsed.ok() || help) {
    if (world_rank == 0) {
      if (!parsed.ok()) {
        std::fprintf(stderr, "%s: %s\n", program.c_str(), parsed.status().ToString().c_str());
      }
      std::fputs(usage.c_str(), parsed.ok() ? stdout : stderr);
    }
    MPI_Finalize();
    return parsed.ok() ? 0 : 2;
  }
  // Below multiple the communicator's liveness thread cannot run (runtime/liveness.h): with the
  // default POSEIDON_PEER_TIMEOUT_S it would only warn on every run. Same on every rank (the
  // setting is agreed; every rank has the same -t and environment).
  if (levels.provided < MPI_THREAD_MULTIPLE && std::getenv("POSEIDON_PEER_TIMEOUT_S") == nullptr) {
    Status st = Settings::Global().Set("POSEIDON_PEER_TIMEOUT_S", "0");
    if (!st.ok()) Fail(MPI_COMM_WORLD, program, st);
  }
  int exit_code = 0;
  {
    auto created = Communicator::Create(MPI_COMM_WORLD);
    if (!created.ok()) Fail(MPI_COMM_WORLD, program, created.status());
    std::shared_ptr<Communicator> comm = *created;
    levels.liveness = comm->liveness().active();
    exit_code = RunSizes(*parsed, levels, *comm, c);
  }
  MPI_Finalize();
  return exit_code;
}

}  // namespace poseidon::osu
