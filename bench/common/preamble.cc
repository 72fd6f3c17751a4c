// The benchmarks' preamble (see preamble.h).
#include "bench/common/preamble.h"

#include <mpi.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstring>
#include <ctime>
#include <fstream>

#include "runtime/build_config.h"
#include "runtime/settings.h"

namespace poseidon::bench {
namespace {

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      size_t colon = line.find(':');
      if (colon != std::string::npos) {
        size_t start = line.find_first_not_of(' ', colon + 1);
        return start == std::string::npos ? "" : line.substr(start);
      }
    }
  }
  return "unknown";
}

// The first line of MPI's own description (callable before MPI_Init).
std::string MpiLibrary() {
  char buf[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0;
  MPI_Get_library_version(buf, &len);
  std::string s(buf, static_cast<size_t>(len));
  size_t nl = s.find_first_of("\n,");
  return nl == std::string::npos ? s : s.substr(0, nl);
}

std::string Quoted(const std::string& s) { return StrCat("\"", JsonEscape(s), "\""); }

}  // namespace

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

std::string BuildText() {
  std::string sanitize = POSEIDON_SANITIZE;
  return StrCat("Poseidon ", POSEIDON_VERSION_STRING, " ", POSEIDON_BUILD_TYPE, ", ",
                POSEIDON_COMPILER, ", CUDA ", POSEIDON_CUDA_ENABLED ? "on" : "off", ", NCCL ",
                POSEIDON_NCCL_ENABLED ? "on" : "off", ", BLAS ", POSEIDON_BLAS_NAME,
                sanitize.empty() ? "" : ", sanitize " + sanitize);
}

Preamble Preamble::Gather(std::string program, std::string what) {
  Preamble p;
  p.program = std::move(program);
  p.what = std::move(what);
  char host[256] = {0};
  p.host = gethostname(host, sizeof(host) - 1) == 0 ? host : "unknown";
  p.cpu = CpuModel();
  p.cores = sysconf(_SC_NPROCESSORS_ONLN);
  struct utsname u;
  p.os = uname(&u) == 0 ? StrCat(u.sysname, " ", u.release) : "unknown";
  p.mpi = MpiLibrary();
  p.build = BuildText();
  char date[64];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  p.date = date;
  return p;
}

void Preamble::SetRun(const Communicator& comm, const Backend& b, MemoryKind kind) {
  ranks = comm.size();
  nodes = comm.num_nodes();
  backend = b.name();
  memory = MemoryKindName(kind);
  settings =
      StrCat("shm threshold ", settings::ShmThresholdBytes(), " B, shm chunk ",
             settings::ShmChunkBytes(), " B, check args ", settings::CheckArgs() ? "on" : "off");
  if (nodes > 1) {
    // Across nodes: where the host allreduce goes two-level (when nodes hold equal counts).
    settings += StrCat(", two-level allreduce from ", settings::HierAllReduceBytes(), " B");
  }
}

std::string Preamble::Text() const {
  std::string out = StrCat("# ", program, ": ", what, "\n");
  out += StrCat("# host ", host, " | CPU ", cpu, " | ", cores, " cores online | ", os, "\n");
  if (ranks > 0) {
    out += StrCat("# ranks ", ranks, " on ", nodes, " node(s) | ", mpi, "\n");
    out += StrCat("# backend ", backend, ", ", memory, " memory | ", settings, "\n");
  } else {
    out += StrCat("# ", mpi, "\n");
  }
  out += StrCat("# build: ", build, "\n");
  out += StrCat("# date ", date, "\n");
  for (const std::string& l : lines) out += StrCat("# ", l, "\n");
  return out;
}

std::string Preamble::JsonMembers() const {
  std::string out;
  for (const auto& [key, value] : Facts()) {
    const bool number = key == "cores" || key == "ranks" || key == "nodes";
    out += StrCat("  \"", key, "\": ", number ? value : Quoted(value), ",\n");
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> Preamble::Facts() const {
  std::vector<std::pair<std::string, std::string>> f = {
      {"benchmark", program},   {"host", host}, {"cpu", cpu},
      {"cores", StrCat(cores)}, {"os", os},     {"mpi", mpi}};
  if (ranks > 0) {
    f.insert(f.end(), {{"ranks", StrCat(ranks)},
                       {"nodes", StrCat(nodes)},
                       {"backend", backend},
                       {"memory", memory},
                       {"settings", settings}});
  }
  f.insert(f.end(), {{"build", build}, {"date", date}});
  return f;
}

std::vector<std::pair<std::string, std::string>> Preamble::BenchmarkContext() const {
  return {{"cpu", cpu}, {"os", os}, {"mpi", mpi}, {"build", build}};
}

}  // namespace poseidon::bench
