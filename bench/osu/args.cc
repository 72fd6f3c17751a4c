// The OSU-style benchmarks' options (see args.h): declared once on bench/common's parser.
#include "bench/osu/args.h"

#include <mpi.h>

#include <algorithm>

#include "bench/osu/collective.h"
#include "runtime/build_config.h"

namespace poseidon::osu {
namespace {

// Plain bytes or a K / M / G suffix (powers of 1024), e.g. 64M.
Result<size_t> ParseBytes(const std::string& flag, const std::string& text) {
  std::string t = text;
  size_t mult = 1;
  if (!t.empty()) {
    char s = t.back();
    if (s == 'K' || s == 'k') mult = size_t{1} << 10;
    if (s == 'M' || s == 'm') mult = size_t{1} << 20;
    if (s == 'G' || s == 'g') mult = size_t{1} << 30;
    if (mult != 1) t.pop_back();
  }
  auto v = cli::ParseInteger(flag, t, 0, (1ll << 62) / static_cast<long long>(mult));
  if (!v.ok()) {
    return InvalidArgument("option ", flag, ": '", text,
                           "' is not a size; expected bytes with an optional K, M or G suffix");
  }
  return static_cast<size_t>(*v) * mult;
}

}  // namespace

int RunsFor(size_t bytes, int n, int floor_value) {
  return bytes > kLargeBytes ? std::max(floor_value, n / 10) : n;
}

std::string ThreadLevelName(int level) {
  if (level == MPI_THREAD_SINGLE) return "single";
  if (level == MPI_THREAD_FUNNELED) return "funneled";
  if (level == MPI_THREAD_SERIALIZED) return "serialized";
  if (level == MPI_THREAD_MULTIPLE) return "multiple";
  return StrCat("level ", level);
}

std::string BarrierName(BarrierKind kind) {
  return kind == BarrierKind::kNode ? "node" : "mpi";
}

void AddOptions(cli::Flags& flags, Options* o) {
  flags.Custom(
      "-m,--message-size", "[MIN:]MAX",
      "message sizes in bytes (K/M/G suffixes), doubling (default 4:1M)",
      [o](const std::string& flag, const std::string& v) -> Status {
        size_t colon = v.find(':');
        if (colon == std::string::npos) {
          PSD_ASSIGN_OR_RETURN(o->max_bytes, ParseBytes(flag, v));
        } else {
          PSD_ASSIGN_OR_RETURN(o->min_bytes, ParseBytes(flag, v.substr(0, colon)));
          PSD_ASSIGN_OR_RETURN(o->max_bytes, ParseBytes(flag, v.substr(colon + 1)));
        }
        PSD_REQUIRE_ARG(o->min_bytes >= 1, "option ", flag, ": MIN is 0; expected at least 1 byte");
        PSD_REQUIRE_ARG(o->min_bytes <= o->max_bytes, "option ", flag, ": MIN ", o->min_bytes,
                        " > MAX ", o->max_bytes, "; expected [MIN:]MAX with MIN <= MAX");
        return Status::Ok();
      });
  flags.Int("-i,--iterations,--iters", &o->iterations, 1, 1000000, "ITER",
            "timed runs per size (default 100; ITER/10, at least 2, above 1 MiB)");
  flags.Int("-x,--warmup", &o->warmup, 0, 1000000, "WARMUP",
            "warm-up runs per size (default 10; WARMUP/10, at least 1, above 1 MiB)");
  flags.Bool("-f,--full", &o->full, "full rows: min / max time and iterations");
  flags.Custom("-d,--accelerator", "host|cuda", "buffer memory (cuda needs a CUDA build)",
               [o](const std::string& flag, const std::string& v) -> Status {
                 if (v == "host" || v == "cpu") {
                   o->memory = MemoryKind::kHost;
                   return Status::Ok();
                 }
                 if (v == "cuda") {
#if POSEIDON_CUDA_ENABLED
                   o->memory = MemoryKind::kDevice;
                   return Status::Ok();
#else
                   return Status(StatusCode::kUnavailable,
                                 StrCat("option ", flag,
                                        " cuda: this build has no CUDA (configured with "
                                        "POSEIDON_WITH_CUDA=OFF or without nvcc); use -d host"));
#endif
                 }
                 return InvalidArgument("option ", flag, ": '", v, "'; expected host or cuda");
               });
  flags.Custom("-T,--type", "TYPE", "float32 (default), float64, float16, bfloat16, int32, int64",
               [o](const std::string& flag, const std::string& v) -> Status {
                 auto t = ParseDType(v);
                 if (!t.ok()) return t.status().WithPrefix(StrCat("option ", flag, ": "));
                 o->dtype = *t;
                 return Status::Ok();
               });
  flags.Bool("--registered", &o->registered,
             "host buffers from Backend::AllocShared (node-shared memory) instead of\n"
             "aligned_alloc, for both columns (allreduce, reduce_scatter, allgather, broadcast)");
  flags.Bool("--json", &o->json, "JSON instead of the table");
  flags.Bool("--no-peer", &o->no_peer, "skip Open MPI's own call");
  flags.Bool("--per-rank", &o->per_rank,
             "under each row, each rank's median / p90 / p99 / mean time per column");
  flags.Custom("--barrier", "mpi|node",
               "the barrier around each timed run: mpi (MPI_Barrier, as OSU; default) or node\n"
               "(a shared-memory spin barrier that drives no MPI progress; one node)",
               [o](const std::string& flag, const std::string& v) -> Status {
                 if (v == "mpi" || v == "node") {
                   o->barrier = v == "mpi" ? BarrierKind::kMpi : BarrierKind::kNode;
                   return Status::Ok();
                 }
                 return InvalidArgument("option ", flag, ": '", v, "'; expected mpi or node");
               });
  flags.Custom("-t,--thread-level", "LEVEL",
               "MPI thread level: single, funneled, serialized, multiple (default: the\n"
               "lowest the program needs, single for the blocking benchmarks)",
               [o](const std::string& flag, const std::string& v) -> Status {
                 o->thread_level = -1;
                 for (int level : {MPI_THREAD_SINGLE, MPI_THREAD_FUNNELED, MPI_THREAD_SERIALIZED,
                                   MPI_THREAD_MULTIPLE}) {
                   if (v == ThreadLevelName(level)) o->thread_level = level;
                 }
                 PSD_REQUIRE_ARG(o->thread_level >= 0, "option ", flag, ": '", v,
                                 "'; expected single, funneled, serialized or multiple");
                 return Status::Ok();
               });
}

Result<Options> ParseOptions(int argc, char** argv, Collective& c, bool* help, std::string* usage) {
  Options o;
  cli::Flags flags(c.program());
  c.AddFlags(flags);
  AddOptions(flags, &o);
  Status st = flags.Parse(argc, argv);
  *help = flags.help();
  *usage = flags.Usage();
  if (!st.ok()) return st;
  st = c.Configure(flags, &o);
  if (!st.ok()) return cli::OptionError(st);
  PSD_REQUIRE_ARG(!o.registered || (c.TakesRegistered() && o.memory == MemoryKind::kHost),
                  "option --registered: ", c.program(),
                  o.memory == MemoryKind::kHost ? " keeps its own buffers" : " with -d cuda",
                  "; expected osu_allreduce, osu_reduce_scatter, osu_allgather or osu_broadcast "
                  "on host memory");
  const int needed = c.RequiredThreadLevel();
  PSD_REQUIRE_ARG(o.thread_level < 0 || o.thread_level >= needed, "option -t ",
                  ThreadLevelName(o.thread_level), ": ", c.program(), " needs at least ",
                  ThreadLevelName(needed));
  return o;
}

}  // namespace poseidon::osu
