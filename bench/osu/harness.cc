// The OSU-style benchmark harness (see harness.h). Steps of RunMain:
//   1. the options (no MPI needed: -t picks the level MPI_Init_thread asks for), MPI init, the
//      communicator (same argv on every rank, so every rank agrees on a bad option and exits
//      alike; rank 0 reports it after MPI init);
//   2. a preamble: program, machine (hostname, CPU model), ranks and nodes, MPI library,
//      backend and its settings, build, options;
//   3. for each size, doubling from MIN to MAX: Prepare on every rank (agreed: one rank's
//      failure stops all), then for ours and for the peer: warm-up runs, timed runs (poison,
//      barrier, time one run, check every element), reduce the figures across ranks;
//   4. a row (text or JSON) with both figures and the busbw ratio; the exit status says whether
//      every result was right.
#include "bench/osu/harness.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "runtime/build_config.h"
#include "runtime/half.h"
#include "runtime/liveness.h"
#include "runtime/mpi_backend.h"
#include "runtime/settings.h"

#if POSEIDON_CUDA_ENABLED
#include <cuda_runtime_api.h>
#endif

namespace poseidon::osu {
namespace {

constexpr size_t kLargeBytes = size_t{1} << 20;  // above this, fewer runs (OSU does the same)

Result<long long> ParseCount(const std::string& option, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || errno != 0 || end == nullptr || *end != '\0' || v < 0) {
    return InvalidArgument("option ", option, ": '", text,
                           "' is not a non-negative integer");
  }
  return v;
}

// Accepts plain bytes and K / M / G suffixes (powers of 1024), e.g. 64M.
Result<size_t> ParseBytes(const std::string& option, const std::string& text) {
  std::string t = text;
  size_t mult = 1;
  if (!t.empty()) {
    char s = t.back();
    if (s == 'K' || s == 'k') mult = size_t{1} << 10;
    if (s == 'M' || s == 'm') mult = size_t{1} << 20;
    if (s == 'G' || s == 'g') mult = size_t{1} << 30;
    if (mult != 1) t.pop_back();
  }
  PSD_ASSIGN_OR_RETURN(long long v, ParseCount(option, t));
  return static_cast<size_t>(v) * mult;
}

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

std::string HostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

std::string MpiLibrary() {
  char buf[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0;
  MPI_Get_library_version(buf, &len);
  std::string s(buf, static_cast<size_t>(len));
  size_t nl = s.find_first_of("\n,");
  return nl == std::string::npos ? s : s.substr(0, nl);
}

// One implementation's figures at one size, already combined across ranks.
struct Figures {
  bool ran = false;
  double avg_us = 0, min_us = 0, max_us = 0;
  int iterations = 0;
  double algbw = 0, busbw = 0;
  unsigned long long wrong = 0;
};

int RunsFor(size_t bytes, int n, int floor_value) {
  return bytes > kLargeBytes ? std::max(floor_value, n / 10) : n;
}

// Stops every rank: a failed call on one rank would otherwise leave the others waiting.
[[noreturn]] void Fail(MPI_Comm comm, const std::string& program, const Status& st) {
  std::fprintf(stderr, "%s: %s\n", program.c_str(), st.ToString().c_str());
  std::fflush(stderr);
  MPI_Abort(comm, 1);
  std::exit(1);
}

Figures Measure(const Options& opt, const Context& ctx, Collective& c, bool peer, size_t bytes,
                const std::string& program) {
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
  unsigned long long wrong = 0;
  for (int i = 0; i < f.iterations; ++i) {
    Status st = c.PoisonOutput();
    if (!st.ok()) Fail(comm, program, st);
    MPI_Barrier(comm);
    double t0 = MPI_Wtime();
    st = run();
    double t = MPI_Wtime() - t0;
    if (!st.ok()) Fail(comm, program, st);
    sum += t;
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
  double t = total_avg / ctx.world;
  f.avg_us = t * 1e6;
  f.min_us = lo * 1e6;
  f.max_us = hi * 1e6;
  f.algbw = t > 0 ? static_cast<double>(bytes) / t / 1e9 : 0;
  f.busbw = f.algbw * c.BusFactor(ctx.world);
  f.wrong = wrong;
  return f;
}

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
  os << "{\"time_us\": " << f.avg_us << ", \"min_us\": " << f.min_us << ", \"max_us\": "
     << f.max_us << ", \"iterations\": " << f.iterations << ", \"algbw_gbs\": " << f.algbw
     << ", \"busbw_gbs\": " << f.busbw << ", \"wrong\": " << f.wrong << "}";
  return os.str();
}

}  // namespace

std::string ThreadLevelName(int level) {
  if (level == MPI_THREAD_SINGLE) return "single";
  if (level == MPI_THREAD_FUNNELED) return "funneled";
  if (level == MPI_THREAD_SERIALIZED) return "serialized";
  if (level == MPI_THREAD_MULTIPLE) return "multiple";
  return StrCat("level ", level);
}

std::string UsageText(const std::string& program) {
  return StrCat(
      "usage: ", program,
      " [-m [MIN:]MAX] [-i ITER] [-x WARMUP] [-f] [-d host|cuda] [-T TYPE] [--json] "
      "[--no-peer] [-t LEVEL]\n"
      "  -m [MIN:]MAX  message sizes in bytes (K/M/G suffixes), doubling (default 4:1M)\n"
      "  -i ITER       timed runs per size (default 100; ITER/10, at least 2, above 1 MiB)\n"
      "  -x WARMUP     warm-up runs per size (default 10; WARMUP/10, at least 1, above 1 MiB)\n"
      "  -f            full rows: min / max time and iterations\n"
      "  -d host|cuda  buffer memory (cuda needs a CUDA build)\n"
      "  -T TYPE       float32 (default), float64, float16, bfloat16, int32, int64\n"
      "  --json        JSON instead of the table\n"
      "  --no-peer     skip Open MPI's own call\n"
      "  -t LEVEL      MPI thread level: single, funneled, serialized, multiple (default: the\n"
      "                lowest the program needs, ", ThreadLevelName(MPI_THREAD_SINGLE),
      " for the blocking benchmarks)\n");
}

Result<Options> ParseOptions(int argc, char** argv, bool* help) {
  Options o;
  *help = false;
  auto need = [&](int& i, const std::string& opt) -> Result<std::string> {
    if (i + 1 >= argc) return InvalidArgument("option ", opt, " needs a value");
    return std::string(argv[++i]);
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      *help = true;
    } else if (a == "-m" || a == "--message-size") {
      PSD_ASSIGN_OR_RETURN(std::string v, need(i, a));
      size_t colon = v.find(':');
      if (colon == std::string::npos) {
        PSD_ASSIGN_OR_RETURN(o.max_bytes, ParseBytes(a, v));
      } else {
        PSD_ASSIGN_OR_RETURN(o.min_bytes, ParseBytes(a, v.substr(0, colon)));
        PSD_ASSIGN_OR_RETURN(o.max_bytes, ParseBytes(a, v.substr(colon + 1)));
      }
      PSD_REQUIRE_ARG(o.min_bytes >= 1, "option -m: MIN is 0; expected at least 1 byte");
      PSD_REQUIRE_ARG(o.min_bytes <= o.max_bytes, "option -m: MIN ", o.min_bytes, " > MAX ",
                      o.max_bytes, "; expected [MIN:]MAX with MIN <= MAX");
    } else if (a == "-i" || a == "--iterations") {
      PSD_ASSIGN_OR_RETURN(std::string v, need(i, a));
      PSD_ASSIGN_OR_RETURN(long long n, ParseCount(a, v));
      PSD_REQUIRE_ARG(n >= 1 && n <= 1000000, "option -i: ", n, " iterations; expected 1..1000000");
      o.iterations = static_cast<int>(n);
    } else if (a == "-x" || a == "--warmup") {
      PSD_ASSIGN_OR_RETURN(std::string v, need(i, a));
      PSD_ASSIGN_OR_RETURN(long long n, ParseCount(a, v));
      PSD_REQUIRE_ARG(n <= 1000000, "option -x: ", n, " warm-up runs; expected 0..1000000");
      o.warmup = static_cast<int>(n);
    } else if (a == "-f" || a == "--full") {
      o.full = true;
    } else if (a == "--json") {
      o.json = true;
    } else if (a == "--no-peer") {
      o.peer = false;
    } else if (a == "-d" || a == "--accelerator") {
      PSD_ASSIGN_OR_RETURN(std::string v, need(i, a));
      if (v == "host" || v == "cpu") {
        o.memory = MemoryKind::kHost;
      } else if (v == "cuda") {
#if POSEIDON_CUDA_ENABLED
        o.memory = MemoryKind::kDevice;
#else
        return Status(StatusCode::kUnavailable,
                      "option -d cuda: this build has no CUDA (configured with "
                      "POSEIDON_WITH_CUDA=OFF or without nvcc); use -d host");
#endif
      } else {
        return InvalidArgument("option -d: '", v, "'; expected host or cuda");
      }
    } else if (a == "-T" || a == "--type") {
      PSD_ASSIGN_OR_RETURN(std::string v, need(i, a));
      PSD_ASSIGN_OR_RETURN(o.dtype, ParseDType(v));
    } else if (a == "-t" || a == "--thread-level") {
      PSD_ASSIGN_OR_RETURN(std::string v, need(i, a));
      o.thread_level = -1;
      for (int level : {MPI_THREAD_SINGLE, MPI_THREAD_FUNNELED, MPI_THREAD_SERIALIZED,
                        MPI_THREAD_MULTIPLE}) {
        if (v == ThreadLevelName(level)) o.thread_level = level;
      }
      PSD_REQUIRE_ARG(o.thread_level >= 0, "option -t: '", v,
                      "'; expected single, funneled, serialized or multiple");
    } else {
      return InvalidArgument("unknown option '", a, "'; see --help");
    }
  }
  return o;
}

// ---- Buffer ----

Buffer::~Buffer() { Free(); }

void Buffer::Free() {
  if (data_ != nullptr) {
#if POSEIDON_CUDA_ENABLED
    if (memory_ == MemoryKind::kDevice) {
      cudaFree(data_);
    } else {
      std::free(data_);
    }
#else
    std::free(data_);
#endif
  }
  data_ = nullptr;
  bytes_ = 0;
}

Status Buffer::Allocate(MemoryKind memory, size_t bytes) {
  Free();
  memory_ = memory;
  bytes_ = bytes;
  size_t n = std::max<size_t>(bytes, 64);
#if POSEIDON_CUDA_ENABLED
  if (memory == MemoryKind::kDevice) {
    cudaError_t e = cudaMalloc(&data_, n);
    if (e != cudaSuccess) {
      data_ = nullptr;
      return BackendError("cudaMalloc of ", n, " bytes failed: ", cudaGetErrorString(e));
    }
    return Status::Ok();
  }
#endif
  data_ = std::aligned_alloc(64, (n + 63) / 64 * 64);
  if (data_ == nullptr) return BackendError("aligned_alloc of ", n, " bytes failed");
  std::memset(data_, 0, n);  // touch every page outside the timed runs
  return Status::Ok();
}

Status Buffer::Upload(const void* host, size_t bytes) {
  if (bytes == 0) return Status::Ok();
#if POSEIDON_CUDA_ENABLED
  if (memory_ == MemoryKind::kDevice) {
    cudaError_t e = cudaMemcpy(data_, host, bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) return BackendError("cudaMemcpy (upload): ", cudaGetErrorString(e));
    return Status::Ok();
  }
#endif
  std::memcpy(data_, host, bytes);
  return Status::Ok();
}

Status Buffer::Download(void* host, size_t bytes) const {
  if (bytes == 0) return Status::Ok();
#if POSEIDON_CUDA_ENABLED
  if (memory_ == MemoryKind::kDevice) {
    cudaError_t e = cudaMemcpy(host, data_, bytes, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) return BackendError("cudaMemcpy (download): ", cudaGetErrorString(e));
    return Status::Ok();
  }
#endif
  std::memcpy(host, data_, bytes);
  return Status::Ok();
}

Status Buffer::Poison() {
  if (bytes_ == 0) return Status::Ok();
#if POSEIDON_CUDA_ENABLED
  if (memory_ == MemoryKind::kDevice) {
    cudaError_t e = cudaMemset(data_, 0xFF, bytes_);
    if (e != cudaSuccess) return BackendError("cudaMemset: ", cudaGetErrorString(e));
    return Status::Ok();
  }
#endif
  std::memset(data_, 0xFF, bytes_);
  return Status::Ok();
}

// ---- formula helpers ----

double FormulaF(size_t i) { return static_cast<double>(i % 7 + 1); }

namespace {
template <typename T>
void FillTyped(double scale, size_t first, size_t n, void* out) {
  T* p = static_cast<T*>(out);
  // F repeats every 7 indices: fill one period, then copy it (this runs at 64 MiB per size).
  T period[7];
  for (size_t k = 0; k < 7; ++k) period[k] = static_cast<T>(scale * FormulaF(first + k));
  for (size_t i = 0; i < n; ++i) p[i] = period[i % 7];
}
void FillHalf(bool bf16, double scale, size_t first, size_t n, void* out) {
  uint16_t period[7];
  for (size_t k = 0; k < 7; ++k) {
    float v = static_cast<float>(scale * FormulaF(first + k));
    period[k] = bf16 ? FloatToBFloat16(v) : FloatToHalf(v);
  }
  uint16_t* p = static_cast<uint16_t*>(out);
  for (size_t i = 0; i < n; ++i) p[i] = period[i % 7];
}
}  // namespace

void FillFormula(DType dtype, double scale, size_t first, size_t n, void* out) {
  switch (dtype) {
    case DType::kFloat32: FillTyped<float>(scale, first, n, out); break;
    case DType::kFloat64: FillTyped<double>(scale, first, n, out); break;
    case DType::kInt32: FillTyped<int32_t>(scale, first, n, out); break;
    case DType::kInt64: FillTyped<int64_t>(scale, first, n, out); break;
    case DType::kFloat16: FillHalf(false, scale, first, n, out); break;
    case DType::kBFloat16: FillHalf(true, scale, first, n, out); break;
  }
}

size_t CountMismatches(DType dtype, const void* got, const void* want, size_t n) {
  size_t es = DTypeSize(dtype);
  if (n == 0 || std::memcmp(got, want, n * es) == 0) return 0;
  const unsigned char* g = static_cast<const unsigned char*>(got);
  const unsigned char* w = static_cast<const unsigned char*>(want);
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += std::memcmp(g + i * es, w + i * es, es) != 0 ? 1 : 0;
  return bad;
}

bool MpiSumSupported(DType dtype) { return !IsHalfDType(dtype); }

Status PeerCall(const char* call, int rc) {
  return rc == MPI_SUCCESS ? Status::Ok() : MpiError(call, rc);
}

Status BufferCollective::PrepareBuffers(const Context& ctx, size_t send_count,
                                        size_t recv_count) {
  ctx_ = ctx;
  recv_count_ = recv_count;
  const size_t es = DTypeSize(ctx.dtype);
  std::vector<unsigned char> host(send_count * es);
  FillFormula(ctx.dtype, ctx.rank + 1.0, 0, send_count, host.data());
  PSD_CHECK(send_.Allocate(ctx.memory, send_count * es));
  PSD_CHECK(send_.Upload(host.data(), send_count * es));
  PSD_CHECK(recv_.Allocate(ctx.memory, recv_count * es));
  want_.resize(recv_count * es);
  if (ctx.memory != MemoryKind::kHost) got_.resize(recv_count * es);
  return Status::Ok();
}

Result<size_t> BufferCollective::CountWrong() {
  const void* got = recv_.data();
  if (ctx_.memory != MemoryKind::kHost) {
    PSD_CHECK(recv_.Download(got_.data(), got_.size()));
    got = got_.data();
  }
  return CountMismatches(ctx_.dtype, got, want_.data(), recv_count_);
}

void BufferCollective::Release() {
  send_.Free();
  recv_.Free();
  want_ = {};
  got_ = {};
}

CallOptions BufferCollective::call_options() const {
  CallOptions o;
  o.memory = ctx_.memory;
  return o;
}

bool IsFirstRank() {
  const char* r = std::getenv("OMPI_COMM_WORLD_RANK");
  return r == nullptr || std::strcmp(r, "0") == 0;
}

void PlaceLargeEntries(int world, int rank, size_t n, size_t k, float* sum,
                       unsigned char* large, float* in) {
  const size_t s = n / k, h = (k + 1) / 2;
  for (int r = 0; r < world; ++r) {
    for (size_t j = 0; j < k; ++j) {
      size_t m = static_cast<size_t>(r) * h + j;
      size_t pos = (m * s) % n;
      float v = static_cast<float>((r + 1) * FormulaF(m)) * (m % 2 == 0 ? 1.0f : -1.0f);
      sum[pos] += v;
      large[pos] = 1;
      if (r == rank) in[pos] = v;
    }
  }
}

float GradientNoise(int rank, size_t i) {
  uint64_t x =
      (static_cast<uint64_t>(i) + 0x9E3779B97F4A7C15ull * (rank + 1)) * 0xD1B54A32D192ED03ull;
  x ^= x >> 29;
  float mag = std::ldexp(static_cast<float>((x >> 8) % 1024 + 1), -30);
  return (x & 1) ? -mag : mag;
}

Status InPlaceBuffers::Allocate(MemoryKind memory, std::vector<float> input) {
  memory_ = memory;
  input_ = std::move(input);
  const size_t bytes = input_.size() * sizeof(float);
  PSD_CHECK(grad.Allocate(memory, bytes));
  PSD_CHECK(peer_send.Allocate(memory, bytes));
  PSD_CHECK(peer_send.Upload(input_.data(), bytes));
  PSD_CHECK(peer_recv.Allocate(memory, bytes));
  if (memory != MemoryKind::kHost) got_.resize(input_.size());
  restored_ = false;
  return Status::Ok();
}

Status InPlaceBuffers::BeginOurs() {
  if (!restored_) PSD_CHECK(Restore());  // a warm-up run: untimed
  restored_ = false;
  last_peer_ = false;
  return Status::Ok();
}

Status InPlaceBuffers::PoisonOutput() {
  PSD_CHECK(Restore());
  restored_ = true;
  return peer_recv.Poison();
}

Result<const float*> InPlaceBuffers::Output() {
  const Buffer& out = last_peer_ ? peer_recv : grad;
  if (memory_ == MemoryKind::kHost) return static_cast<const float*>(out.data());
  PSD_CHECK(out.Download(got_.data(), got_.size() * sizeof(float)));
  return static_cast<const float*>(got_.data());
}

void InPlaceBuffers::Free() {
  grad.Free();
  peer_send.Free();
  peer_recv.Free();
  input_ = {};
  got_ = {};
}

size_t Collective::CountFor(size_t bytes, DType dtype, int world) const {
  return bytes / DTypeSize(dtype);
}

int Collective::RequiredThreadLevel() const { return MPI_THREAD_SINGLE; }

bool Collective::PeerSupported(const Context& ctx) const {
  // Debian's Open MPI is not CUDA-aware, and MPI has no float16 / bfloat16 sum.
  return ctx.memory == MemoryKind::kHost && MpiSumSupported(ctx.dtype);
}

// ---- the program ----

int RunMain(int argc, char** argv, Collective& c) {
  const std::string program = c.program();
  // The options come first (they need no MPI): -t names the level MPI_Init_thread asks for.
  // A bad option is reported after MPI init, by rank 0 only, as before.
  bool help = false;
  auto parsed = ParseOptions(argc, argv, &help);
  const int needed = c.RequiredThreadLevel();
  if (parsed.ok() && parsed->thread_level >= 0 && parsed->thread_level < needed) {
    parsed = InvalidArgument("option -t ", ThreadLevelName(parsed->thread_level), ": ", program,
                             " needs at least ", ThreadLevelName(needed));
  }
  const bool level_given = parsed.ok() && parsed->thread_level >= 0;
  const int asked = level_given ? parsed->thread_level : needed;
  // MPI_Init_thread itself, not poseidon::InitMpi (which always asks for MPI_THREAD_MULTIPLE):
  // the level changes how Open MPI locks, so both columns must run under the level the
  // program needs, and the same one.
  int provided = MPI_THREAD_SINGLE;
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) {
    MPI_Query_thread(&provided);
  } else {
    int rc = MPI_Init_thread(&argc, &argv, asked, &provided);
    if (rc != MPI_SUCCESS) {
      std::fprintf(stderr, "%s: %s\n", program.c_str(),
                   MpiError("MPI_Init_thread", rc).ToString().c_str());
      return 1;
    }
  }
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  if (parsed.ok() && !help && provided < needed) {
    if (world_rank == 0) {
      std::fprintf(stderr, "%s: MPI provides thread level %s, below the %s it needs\n",
                   program.c_str(), ThreadLevelName(provided).c_str(),
                   ThreadLevelName(needed).c_str());
    }
    MPI_Finalize();
    return 1;
  }
  if (!parsed.ok() || help) {
    if (world_rank == 0) {
      if (!parsed.ok()) {
        std::fprintf(stderr, "%s: %s\n", program.c_str(), parsed.status().ToString().c_str());
      }
      std::fputs(UsageText(program).c_str(), parsed.ok() ? stdout : stderr);
    }
    MPI_Finalize();
    return parsed.ok() ? 0 : 2;
  }
  const Options opt = *parsed;
  // Below multiple the communicator's liveness thread cannot run (runtime/liveness.h): with the
  // default POSEIDON_PEER_TIMEOUT_S it would only warn on every run. Same on every rank (the
  // setting is agreed; every rank has the same -t and environment).
  if (provided < MPI_THREAD_MULTIPLE && std::getenv("POSEIDON_PEER_TIMEOUT_S") == nullptr) {
    Status st = Settings::Global().Set("POSEIDON_PEER_TIMEOUT_S", "0");
    if (!st.ok()) Fail(MPI_COMM_WORLD, program, st);
  }
  int exit_code = 0;
  {
    auto created = Communicator::Create(MPI_COMM_WORLD);
    if (!created.ok()) Fail(MPI_COMM_WORLD, program, created.status());
    std::shared_ptr<Communicator> comm = *created;
    auto backend = comm->backend(opt.memory);
    if (!backend.ok()) Fail(MPI_COMM_WORLD, program, backend.status());

    Context ctx;
    ctx.comm = comm.get();
    ctx.backend = *backend;
    ctx.memory = opt.memory;
    ctx.dtype = opt.dtype;
    ctx.rank = comm->rank();
    ctx.world = comm->size();
    const bool root = ctx.rank == 0;
    const bool peer = opt.peer && c.PeerSupported(ctx);
    const std::string peer_name = peer ? c.peer_name() : std::string("(no peer)");

    const std::string level_text = ThreadLevelName(provided);
    const std::string asked_text = ThreadLevelName(asked);
    const bool liveness = comm->liveness().active();
    if (root) {
      std::string settings_text = StrCat(
          "shm threshold ", settings::ShmThresholdBytes(), " B, shm chunk ",
          settings::ShmChunkBytes(), " B, check args ", settings::CheckArgs() ? "on" : "off");
      std::string build = StrCat("Poseidon ", POSEIDON_VERSION_STRING, " ", POSEIDON_BUILD_TYPE,
                                 ", ", POSEIDON_COMPILER, ", CUDA ",
                                 POSEIDON_CUDA_ENABLED ? "on" : "off", ", built ", __DATE__);
      if (!opt.json) {
        std::printf("# %s: ours = %s, peer = %s in the same run\n", program.c_str(),
                    c.ours_name().c_str(), peer_name.c_str());
        std::printf("# host %s | CPU %s | %ld cores online\n", HostName().c_str(),
                    CpuModel().c_str(), sysconf(_SC_NPROCESSORS_ONLN));
        std::printf("# ranks %d on %d node(s) | %s\n", ctx.world, comm->num_nodes(),
                    MpiLibrary().c_str());
        std::printf("# MPI thread level: %s (asked %s%s; the program needs %s; both columns) | "
                    "liveness heartbeat thread %s\n",
                    level_text.c_str(), asked_text.c_str(), level_given ? " with -t" : "",
                    ThreadLevelName(needed).c_str(), liveness ? "on" : "off");
        std::printf("# backend %s, %s memory | %s\n", ctx.backend->name().c_str(),
                    MemoryKindName(opt.memory), settings_text.c_str());
        std::printf("# build: %s\n", build.c_str());
        std::printf("# sizes %zu..%zu B, %d iterations (%d above 1 MiB), %d warm-up, type %s\n",
                    opt.min_bytes, opt.max_bytes, opt.iterations, RunsFor(kLargeBytes * 2, opt.iterations, 2),
                    opt.warmup, DTypeName(opt.dtype).c_str());
        std::printf("# time: average per run, averaged across ranks; algbw = size / time; "
                    "busbw = algbw x %s; #wrong: elements that differ from the exact formula, "
                    "summed over runs and ranks\n#\n",
                    c.factor_text().c_str());
        std::string ours_cols = opt.full ? "  time(us)    min(us)    max(us)  iters algbw(GB/s) "
                                           "busbw      #wrong"
                                         : "  time(us) algbw(GB/s) busbw  #wrong";
        std::printf("#%11s %12s %8s | ours:%s | %s:%s | busbw ours/peer%s\n", "size(B)", "count",
                    "type", ours_cols.c_str(), peer_name.c_str(), ours_cols.c_str(),
                    c.ExtraHeader().c_str());
        std::fflush(stdout);
      } else {
        std::printf("{\n  \"benchmark\": \"%s\",\n  \"ours\": \"%s\",\n  \"peer\": \"%s\",\n",
                    program.c_str(), JsonEscape(c.ours_name()).c_str(),
                    JsonEscape(peer ? c.peer_name() : "").c_str());
        std::printf("  \"host\": \"%s\",\n  \"cpu\": \"%s\",\n  \"ranks\": %d,\n  \"nodes\": %d,\n",
                    JsonEscape(HostName()).c_str(), JsonEscape(CpuModel()).c_str(), ctx.world,
                    comm->num_nodes());
        std::printf("  \"mpi\": \"%s\",\n  \"backend\": \"%s\",\n  \"memory\": \"%s\",\n",
                    JsonEscape(MpiLibrary()).c_str(), ctx.backend->name().c_str(),
                    MemoryKindName(opt.memory));
        std::printf("  \"mpi_thread_level\": \"%s\",\n  \"mpi_thread_level_asked\": \"%s\",\n"
                    "  \"mpi_thread_level_needed\": \"%s\",\n  \"liveness_thread\": %s,\n",
                    level_text.c_str(), asked_text.c_str(), ThreadLevelName(needed).c_str(),
                    liveness ? "true" : "false");
        std::printf("  \"settings\": \"%s\",\n  \"build\": \"%s\",\n  \"busbw_factor\": \"%s\",\n",
                    JsonEscape(settings_text).c_str(), JsonEscape(build).c_str(),
                    c.factor_text().c_str());
        std::printf("  \"options\": {\"min_bytes\": %zu, \"max_bytes\": %zu, \"iterations\": %d, "
                    "\"warmup\": %d, \"type\": \"%s\"},\n  \"rows\": [",
                    opt.min_bytes, opt.max_bytes, opt.iterations, opt.warmup,
                    DTypeName(opt.dtype).c_str());
      }
    }

    bool first_row = true;
    const size_t es = DTypeSize(opt.dtype);
    size_t last_count = 0;
    for (size_t req = opt.min_bytes; req <= opt.max_bytes; req = req * 2) {
      size_t count = c.CountFor(req, opt.dtype, ctx.world);
      if (count == 0 || count == last_count) continue;
      last_count = count;
      size_t bytes = count * es;
      Status prepared = c.Prepare(ctx, count);
      int ok = prepared.ok() ? 1 : 0, all_ok = 0;
      MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm->mpi_comm());
      if (!all_ok) {
        if (!prepared.ok()) Fail(comm->mpi_comm(), program, prepared);
        Fail(comm->mpi_comm(), program,
             InternalError("another rank failed to prepare ", bytes, " bytes"));
      }
      Figures ours = Measure(opt, ctx, c, false, bytes, program);
      Figures theirs;
      if (peer) theirs = Measure(opt, ctx, c, true, bytes, program);
      const std::string extra_text = c.ExtraText(), extra_json = c.ExtraJson();
      c.Release();
      if (ours.wrong > 0 || theirs.wrong > 0) exit_code = 1;
      double ratio = (peer && theirs.busbw > 0) ? ours.busbw / theirs.busbw : 0;
      if (!root) continue;
      if (!opt.json) {
        char ratio_text[32];
        if (peer) {
          std::snprintf(ratio_text, sizeof(ratio_text), "%8.2f", ratio);
        } else {
          std::snprintf(ratio_text, sizeof(ratio_text), "%8s", "-");
        }
        std::printf("%12zu %12zu %8s | %s | %s | %s%s\n", bytes, count,
                    DTypeName(opt.dtype).c_str(), FiguresText(ours, opt.full).c_str(),
                    FiguresText(theirs, opt.full).c_str(), ratio_text, extra_text.c_str());
        std::fflush(stdout);
      } else {
        std::printf("%s\n    {\"size\": %zu, \"count\": %zu, \"type\": \"%s\", \"ours\": %s, "
                    "\"peer\": %s, \"busbw_ratio\": %s%s}",
                    first_row ? "" : ",", bytes, count, DTypeName(opt.dtype).c_str(),
                    FiguresJson(ours).c_str(), peer ? FiguresJson(theirs).c_str() : "null",
                    peer ? StrCat(ratio).c_str() : "null", extra_json.c_str());
        first_row = false;
      }
    }
    if (root && opt.json) std::printf("\n  ],\n  \"ok\": %s\n}\n", exit_code == 0 ? "true" : "false");
    if (root && !opt.json && exit_code != 0) {
      std::printf("# FAILED: some results differ from the exact formula (#wrong > 0)\n");
    }
    std::fflush(stdout);
  }
  MPI_Finalize();
  return exit_code;
}

}  // namespace poseidon::osu
