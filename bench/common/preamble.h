// The preamble every benchmark prints before its figures, written once: what runs, the machine
// (host, CPU model, cores, kernel), ranks and nodes, the MPI library, the backend and its
// settings, and the build (Poseidon version, build type, compiler, CUDA, NCCL, BLAS).
//
// Two forms of the same facts: Text(), '# ' lines for people and for bench/cluster/report.py
// (which keeps some of them by their first word: the program, host, ranks, network, build);
// JsonMembers(), members of a program's JSON document, read by bench/osu/best_peer.py. Google
// Benchmark programs add BenchmarkContext() to its context instead (it prints the host, date
// and cores itself).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "runtime/backend.h"
#include "runtime/communicator.h"

namespace poseidon::bench {

struct Preamble {
  // What runs: "osu_allreduce", and one line on what is measured against what.
  std::string program, what;
  // The machine and the build (Gather).
  std::string host, cpu, os, mpi, build, date;
  long cores = 0;
  // The run (SetRun); ranks 0: a single-process program, no ranks and backend line.
  int ranks = 0, nodes = 0;
  std::string backend, memory, settings;
  // The program's own lines (options, model, compute model, ...), printed after the others.
  std::vector<std::string> lines;

  // The machine and build facts; no MPI call that needs MPI initialized.
  static Preamble Gather(std::string program, std::string what);
  // Ranks, nodes, the backend for `memory` and the settings that steer it.
  void SetRun(const Communicator& comm, const Backend& backend, MemoryKind memory);
  // Every line starts with "# ".
  std::string Text() const;
  // "  \"key\": value,\n" per fact (benchmark, host, cpu, cores, os, ranks, nodes, mpi,
  // backend, memory, settings, build, date), each ending with a comma.
  std::string JsonMembers() const;
  std::vector<std::pair<std::string, std::string>> Facts() const;
  // The facts Google Benchmark does not print itself (cpu, os, mpi, build), for
  // benchmark::AddCustomContext.
  std::vector<std::pair<std::string, std::string>> BenchmarkContext() const;
};

// "Poseidon 0.1.0 Release, GNU 12.2.0, CUDA off, NCCL off, BLAS <library>".
std::string BuildText();
std::string JsonEscape(const std::string& s);

}  // namespace poseidon::bench
