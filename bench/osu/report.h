// What an OSU-style program prints, on rank 0: the header (bench/common's preamble, then the
// thread level, the sizes and the column legend), one row per size with nccl-tests' columns
// for ours and for the peer and the busbw ratio ours / peer, and the verdict. As a table, or
// with --json as one document (the preamble's facts, the options, "rows" and "ok").
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include "bench/common/preamble.h"
#include "bench/osu/args.h"
#include "bench/osu/collective.h"

namespace poseidon::osu {

// One implementation's figures at one size, already combined across ranks.
struct Figures {
  bool ran = false;
  double avg_us = 0, min_us = 0, max_us = 0;
  int iterations = 0;
  double algbw = 0, busbw = 0;
  unsigned long long wrong = 0;
  // --per-rank, on rank 0: each rank's median, 90th and 99th percentile and mean time (us).
  std::vector<std::array<double, 4>> per_rank;
};

// The MPI thread level of the run, for the header.
struct ThreadLevels {
  int provided = 0, asked = 0, needed = 0;
  bool given = false;     // -t was on the command line
  bool liveness = false;  // the communicator's heartbeat thread runs
};

class Report {
 public:
  // peer: whether the peer runs (it may be skipped, or unsupported for the type or memory).
  Report(const Options& opt, const Collective& c, bool peer) : opt_(opt), c_(c), peer_(peer) {}
  void Header(const bench::Preamble& preamble, const ThreadLevels& levels);
  void Row(size_t bytes, size_t count, const Figures& ours, const Figures& peer,
           const std::string& extra_text, const std::string& extra_json);
  void Footer(bool ok);

 private:
  const Options& opt_;
  const Collective& c_;
  const bool peer_;
  bool first_row_ = true;
};

}  // namespace poseidon::osu
