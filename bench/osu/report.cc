// The OSU-style benchmarks' output (see report.h).
#include "bench/osu/report.h"

#include <cstdio>
#include <sstream>

namespace poseidon::osu {
namespace {

std::string FiguresText(const Figures& f, bool full) {
  char buf[160];
  if (!f.ran) {
    std::snprintf(buf, sizeof(buf), full ? "%10s %10s %10s %6s %9s %9s %7s" : "%10s %9s %9s %7s",
                  "-", "-", "-", "-", "-", "-", "-");
    return buf;
  }
  if (full) {
    std::snprintf(buf, sizeof(buf), "%10.2f %10.2f %10.2f %6d %9.3f %9.3f %7llu", f.avg_us,
                  f.min_us, f.max_us, f.iterations, f.algbw, f.busbw, f.wrong);
  } else {
    std::snprintf(buf, sizeof(buf), "%10.2f %9.3f %9.3f %7llu", f.avg_us, f.algbw, f.busbw,
                  f.wrong);
  }
  return buf;
}

std::string FiguresJson(const Figures& f) {
  std::ostringstream os;
  os << "{\"time_us\": " << f.avg_us << ", \"min_us\": " << f.min_us << ", \"max_us\": " << f.max_us
     << ", \"iterations\": " << f.iterations << ", \"algbw_gbs\": " << f.algbw
     << ", \"busbw_gbs\": " << f.busbw << ", \"wrong\": " << f.wrong << "}";
  return os.str();
}

// "[[median, p90, p99, mean], ...]" per rank, or "null" without --per-rank.
std::string PerRankJson(const Figures& f) {
  if (f.per_rank.empty()) return "null";
  std::ostringstream os;
  os << "[";
  for (size_t r = 0; r < f.per_rank.size(); ++r) {
    const auto& v = f.per_rank[r];
    os << (r ? ", " : "") << "[" << v[0] << ", " << v[1] << ", " << v[2] << ", " << v[3] << "]";
  }
  os << "]";
  return os.str();
}

// One comment line per column: "#   ours per rank (median / p90 / p99 / mean us): r0 ...".
void PrintPerRank(const char* column, const Figures& f) {
  if (f.per_rank.empty()) return;
  std::printf("#   %s per rank (median / p90 / p99 / mean us):", column);
  for (size_t r = 0; r < f.per_rank.size(); ++r) {
    const auto& v = f.per_rank[r];
    std::printf(" r%zu %.2f/%.2f/%.2f/%.2f", r, v[0], v[1], v[2], v[3]);
  }
  std::printf("\n");
}

}  // namespace

void Report::Header(const bench::Preamble& preamble, const ThreadLevels& t) {
  const std::string peer_name = peer_ ? c_.peer_name() : std::string("(no peer)");
  const std::string level = ThreadLevelName(t.provided), asked = ThreadLevelName(t.asked);
  const std::string needed = ThreadLevelName(t.needed);
  if (opt_.json) {
    std::printf("{\n%s", preamble.JsonMembers().c_str());
    std::printf("  \"ours\": \"%s\",\n  \"peer\": \"%s\",\n",
                bench::JsonEscape(c_.ours_name()).c_str(),
                bench::JsonEscape(peer_ ? c_.peer_name() : "").c_str());
    std::printf(
        "  \"mpi_thread_level\": \"%s\",\n  \"mpi_thread_level_asked\": \"%s\",\n"
        "  \"mpi_thread_level_needed\": \"%s\",\n  \"liveness_thread\": %s,\n"
        "  \"barrier\": \"%s\",\n  \"buffers\": \"%s\",\n",
        level.c_str(), asked.c_str(), needed.c_str(), t.liveness ? "true" : "false",
        BarrierName(opt_.barrier).c_str(), opt_.registered ? "registered" : "private");
    std::printf("  \"busbw_factor\": \"%s\",\n", c_.factor_text().c_str());
    std::printf(
        "  \"options\": {\"min_bytes\": %zu, \"max_bytes\": %zu, \"iterations\": %d, "
        "\"warmup\": %d, \"type\": \"%s\"},\n  \"rows\": [",
        opt_.min_bytes, opt_.max_bytes, opt_.iterations, opt_.warmup,
        DTypeName(opt_.dtype).c_str());
    return;
  }
  std::fputs(preamble.Text().c_str(), stdout);
  std::printf(
      "# MPI thread level: %s (asked %s%s; the program needs %s; both columns) | "
      "liveness heartbeat thread %s\n",
      level.c_str(), asked.c_str(), t.given ? " with -t" : "", needed.c_str(),
      t.liveness ? "on" : "off");
  std::printf("# barrier around each timed run: %s\n",
              opt_.barrier == BarrierKind::kNode
                  ? "node (shared-memory spin barrier, no MPI progress; --barrier node)"
                  : "MPI_Barrier (as OSU)");
  std::printf("# buffers: %s\n", opt_.registered
                                      ? "node-shared (Backend::AllocShared, --registered), both "
                                        "columns"
                                      : "private (aligned_alloc), both columns");
  std::printf("# sizes %zu..%zu B, %d iterations (%d above 1 MiB), %d warm-up, type %s\n",
              opt_.min_bytes, opt_.max_bytes, opt_.iterations,
              RunsFor(kLargeBytes * 2, opt_.iterations, 2), opt_.warmup,
              DTypeName(opt_.dtype).c_str());
  std::printf(
      "# time: average per run, averaged across ranks; algbw = size / time; "
      "busbw = algbw x %s; #wrong: elements that differ from the exact formula, "
      "summed over runs and ranks\n#\n",
      c_.factor_text().c_str());
  std::string cols = opt_.full ? "  time(us)    min(us)    max(us)  iters algbw(GB/s) "
                                 "busbw      #wrong"
                               : "  time(us) algbw(GB/s) busbw  #wrong";
  std::printf("#%11s %12s %8s | ours:%s | %s:%s | busbw ours/peer%s\n", "size(B)", "count", "type",
              cols.c_str(), peer_name.c_str(), cols.c_str(), c_.ExtraHeader().c_str());
  std::fflush(stdout);
}

void Report::Row(size_t bytes, size_t count, const Figures& ours, const Figures& theirs,
                 const std::string& extra_text, const std::string& extra_json) {
  const double ratio = (peer_ && theirs.busbw > 0) ? ours.busbw / theirs.busbw : 0;
  if (opt_.json) {
    std::printf(
        "%s\n    {\"size\": %zu, \"count\": %zu, \"type\": \"%s\", \"ours\": %s, "
        "\"peer\": %s, \"busbw_ratio\": %s%s%s}",
        first_row_ ? "" : ",", bytes, count, DTypeName(opt_.dtype).c_str(),
        FiguresJson(ours).c_str(), peer_ ? FiguresJson(theirs).c_str() : "null",
        peer_ ? StrCat(ratio).c_str() : "null", extra_json.c_str(),
        opt_.per_rank ? StrCat(", \"per_rank\": {\"ours\": ", PerRankJson(ours),
                               ", \"peer\": ", PerRankJson(theirs), "}").c_str()
                      : "");
    first_row_ = false;
    return;
  }
  char ratio_text[32];
  if (peer_) {
    std::snprintf(ratio_text, sizeof(ratio_text), "%8.2f", ratio);
  } else {
    std::snprintf(ratio_text, sizeof(ratio_text), "%8s", "-");
  }
  std::printf("%12zu %12zu %8s | %s | %s | %s%s\n", bytes, count, DTypeName(opt_.dtype).c_str(),
              FiguresText(ours, opt_.full).c_str(), FiguresText(theirs, opt_.full).c_str(),
              ratio_text, extra_text.c_str());
  PrintPerRank("ours", ours);
  if (peer_) PrintPerRank(c_.peer_name().c_str(), theirs);
  std::fflush(stdout);
}

void Report::Footer(bool ok) {
  if (opt_.json) {
    std::printf("\n  ],\n  \"ok\": %s\n}\n", ok ? "true" : "false");
  } else if (!ok) {
    std::printf("# FAILED: some results differ from the exact formula (#wrong > 0)\n");
  }
  std::fflush(stdout);
}

}  // namespace poseidon::osu
