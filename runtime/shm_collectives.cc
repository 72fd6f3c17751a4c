// Shared-memory allreduce / reduce-scatter / allgather(v) / broadcast for the ranks of one node.
//
// Every call's first Sync goes through Enter, which carries the call's descriptor (see the
// header): a disagreement fails every rank there, before anyone reads a peer's data.
//
// AllReduce of at most one_shot_bytes_ (min(slot, 32 KiB; 256 KiB at P = 2)): copy my whole
// input into my slot;
// Sync; every rank sums every slot in rank order into its own output. One Sync, and the same
// bits as the pipelined form below (each element is summed in the same order).
//
// AllReduce, larger (P ranks, E = elements per slot, chunk k = elements [kE, (k+1)E)):
//   1. copy chunk 0 of my input into my slot of stage 0, except my own shard of it (I read
//      that straight from my input when I reduce it); Sync.
//   2. for each chunk k:
//        a. reduce my 1/P shard of chunk k: read that shard from every rank's slot (mine from my
//           input), sum in rank order, write the sum into my slot at the shard's place;
//        b. copy chunk k+1 of my input into my slot of the next stage (overlaps the peers'
//           step a);
//        c. Sync (everyone's shard of chunk k is reduced and chunk k+1 is in place);
//        d. copy every rank's reduced shard of chunk k out of the window into recv.
//   One Sync per chunk. A stage is rewritten three chunks later, and a rank can only get there
//   after passing the Sync that every rank reaches after its step d on the old chunk, so three
//   stages are enough for no rank to overwrite a slot a peer still reads.
//
// ReduceScatter (counts[q] elements for rank q at offset off[q]; L = E / P):
//   round k: every rank copies piece k (elements [kL, (k+1)L) of each rank q's slice) into
//   region q of its slot, except its own slice's piece; Sync; rank q sums region q of every
//   slot (its own piece from its input) straight into recv. The owner reduces, so nothing is
//   copied out.
//
// AllGatherV (AllGather: equal counts): round k: copy piece k of my input into my slot (and
// straight into my part of recv); Sync; copy every peer's piece k out of its slot.
//
// Broadcast: round k: the root copies piece k into its slot; Sync; the others copy it out.
//
// Sync: store my arrival count in my control line, wake peers sleeping on it, then wait for
// every peer's count: poll for up to 5 us when each rank has a core, then poll with
// sched_yield for up to 200 us (a runnable peer gets the core at once), then sleep on the peer's
// word with a futex (shared, not private: the word lives in a mapping of several processes),
// checking the caller's interrupt, if any, at every wake.
// Outputs of 4 MiB and more are written with streaming stores (no read-for-ownership).
#include "runtime/shm_collectives.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <sched.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "runtime/half.h"
#include "runtime/log.h"
#include "runtime/mpi_backend.h"
#include "runtime/multiversion.h"
#include "runtime/shard.h"

namespace poseidon {
namespace {

constexpr size_t kLineBytes = 128;  // the arrival counter, alone on its cache lines
constexpr uint64_t kStages = 3;
constexpr size_t kOneShotMaxBytes = size_t{32} << 10;
constexpr size_t kOneShotPairBytes = size_t{256} << 10;
constexpr size_t kMinChunkBytes = 4096;
constexpr size_t kBlock = 1024;  // elements summed per block: the accumulator stays in L1
// Outputs at least this large are written with streaming stores: they will not fit in this
// core's cache anyway, and skipping the read-for-ownership makes the copy-out ~1.4x faster.
constexpr size_t kStreamOutputBytes = size_t{4} << 20;

// memcpy into the caller's output, optionally with non-temporal stores.
void CopyOut(void* dst, const void* src, size_t n, bool stream) {
#if defined(__x86_64__)
  if (stream && n >= 256) {
    unsigned char* d = static_cast<unsigned char*>(dst);
    const unsigned char* s = static_cast<const unsigned char*>(src);
    size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
    std::memcpy(d, s, head);
    size_t i = head;
    for (; i + 64 <= n; i += 64) {
      __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
      __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
      __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
    }
    std::memcpy(d + i, s + i, n - i);
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

// Orders streaming stores before the call returns (the caller may hand the buffer on).
void StreamFence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Exact float16 -> float32 through a 64 Ki-entry table (256 KiB, built once): the scalar
// conversion branches on subnormals and is several times slower than the memory traffic.
const float* HalfTable() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t h = 0; h < 65536; ++h) t[h] = HalfToFloat(static_cast<uint16_t>(h));
    return t;
  }();
  return table.data();
}

// Sums in rank order, several sources per pass over the L1-resident accumulator (up to 4 in
// the first pass, then 3), which nearly halves the loads and stores of one source per pass.
// The parenthesization keeps the order ((s0 + s1) + s2) + ... exactly. Inlined into
// ShmReduceSum, so its loops are compiled for each of that function's targets.
template <typename T>
inline __attribute__((always_inline)) void SumTyped(const void* const* srcs, int n, void* dst,
                                                    size_t count) {
  T* out = static_cast<T*>(dst);
  auto src = [&](int p, size_t base) { return static_cast<const T*>(srcs[p]) + base; };
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t b = std::min(kBlock, count - base);
    T acc[kBlock];
    int g = std::min(n, 4);
    {
      const T* __restrict a = src(0, base);
      const T* __restrict c = src(g > 1 ? 1 : 0, base);
      const T* __restrict d = src(g > 2 ? 2 : 0, base);
      const T* __restrict e = src(g > 3 ? 3 : 0, base);
      switch (g) {
        case 1: for (size_t j = 0; j < b; ++j) acc[j] = a[j]; break;
        case 2: for (size_t j = 0; j < b; ++j) acc[j] = a[j] + c[j]; break;
        case 3: for (size_t j = 0; j < b; ++j) acc[j] = (a[j] + c[j]) + d[j]; break;
        default: for (size_t j = 0; j < b; ++j) acc[j] = ((a[j] + c[j]) + d[j]) + e[j]; break;
      }
    }
    for (int p = g; p < n; p += g) {
      g = std::min(n - p, 3);
      const T* __restrict a = src(p, base);
      const T* __restrict c = src(g > 1 ? p + 1 : p, base);
      const T* __restrict d = src(g > 2 ? p + 2 : p, base);
      switch (g) {
        case 1: for (size_t j = 0; j < b; ++j) acc[j] += a[j]; break;
        case 2: for (size_t j = 0; j < b; ++j) acc[j] = (acc[j] + a[j]) + c[j]; break;
        default: for (size_t j = 0; j < b; ++j) acc[j] = ((acc[j] + a[j]) + c[j]) + d[j]; break;
      }
    }
    // Written last so dst may alias a source at the same index.
    for (size_t j = 0; j < b; ++j) out[base + j] = acc[j];
  }
}

template <bool kBFloat16>
inline __attribute__((always_inline)) void SumHalf(const void* const* srcs, int n, void* dst,
                                                   size_t count) {
  const float* table = kBFloat16 ? nullptr : HalfTable();
  uint16_t* out = static_cast<uint16_t*>(dst);
  for (size_t base = 0; base < count; base += kBlock) {
    size_t b = std::min(kBlock, count - base);
    float acc[kBlock];
    for (int p = 0; p < n; ++p) {
      const uint16_t* __restrict sp = static_cast<const uint16_t*>(srcs[p]) + base;
      for (size_t j = 0; j < b; ++j) {
        float v = kBFloat16 ? BitsToFloat(static_cast<uint32_t>(sp[j]) << 16) : table[sp[j]];
        acc[j] = (p == 0) ? v : acc[j] + v;
      }
    }
    for (size_t j = 0; j < b; ++j) {
      out[base + j] = kBFloat16 ? FloatToBFloat16(acc[j]) : FloatToHalf(acc[j]);
    }
  }
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

// One call's descriptor as a rank publishes it (plain data: it lives in the shared window).
struct ShmCollectives::Descriptor {
  ArgRecord record;
  char call[24];
  char message[232];  // this rank's own argument error, when record.bad
};

namespace {
// The control area: the counter line, then two descriptors; slots start 64-byte aligned.
constexpr size_t kDescBytes = 320;  // one descriptor's place (two per rank)
constexpr size_t kControlBytes = (kLineBytes + 2 * kDescBytes + 63) / 64 * 64;
}  // namespace

PSD_MULTIVERSION
void ShmReduceSum(DType dtype, const void* const* srcs, int n, void* dst, size_t count) {
  if (count == 0 || n <= 0) return;
  switch (dtype) {
    case DType::kFloat32: SumTyped<float>(srcs, n, dst, count); break;
    case DType::kFloat64: SumTyped<double>(srcs, n, dst, count); break;
    case DType::kInt32: SumTyped<int32_t>(srcs, n, dst, count); break;
    case DType::kInt64: SumTyped<int64_t>(srcs, n, dst, count); break;
    case DType::kFloat16: SumHalf<false>(srcs, n, dst, count); break;
    case DType::kBFloat16: SumHalf<true>(srcs, n, dst, count); break;
  }
}

Result<std::unique_ptr<ShmCollectives>> ShmCollectives::Create(MPI_Comm comm, size_t chunk_bytes,
                                                               double timeout_s) {
  int size = 1, rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  std::unique_ptr<ShmCollectives> s(new ShmCollectives());
  // Keyed by the rank in comm, so the node communicator numbers ranks as comm does whenever it
  // holds all of them.
  int rc = MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &s->local_);
  if (rc != MPI_SUCCESS) return MpiError("ShmCollectives: MPI_Comm_split_type", rc);
  int local_size = 0;
  MPI_Comm_size(s->local_, &local_size);
  // local_size == size holds on every rank or on none, so all ranks return the same way.
  if (local_size != size) {
    return UnavailableError("ShmCollectives: the communicator spans more than one node (",
                            local_size, " of ", size, " ranks share this node)");
  }
  s->rank_ = rank;
  s->size_ = size;
  s->srcs_.resize(static_cast<size_t>(size));
  s->timeout_s_ = timeout_s;

  // Agree on the chunk size and on its validity before anyone allocates.
  long long mine[2] = {static_cast<long long>(chunk_bytes), -static_cast<long long>(chunk_bytes)};
  long long agreed[2];
  rc = MPI_Allreduce(mine, agreed, 2, MPI_LONG_LONG, MPI_MAX, s->local_);
  if (rc != MPI_SUCCESS) return MpiError("ShmCollectives: MPI_Allreduce(chunk bytes)", rc);
  if (agreed[0] != -agreed[1]) {
    return MismatchError("ShmCollectives: POSEIDON_SHM_CHUNK_BYTES differs across ranks (",
                         -agreed[1], " .. ", agreed[0], "); expected the same value on every rank");
  }
  PSD_REQUIRE_ARG(chunk_bytes >= kMinChunkBytes, "ShmCollectives: POSEIDON_SHM_CHUNK_BYTES is ",
                  chunk_bytes, "; expected at least ", kMinChunkBytes);
  s->chunk_bytes_ = chunk_bytes;
  // Room for one 8-byte element per rank region (reduce-scatter), 64-byte aligned slots.
  size_t slot = std::max(chunk_bytes, static_cast<size_t>(size) * 64);
  s->slot_bytes_ = (slot + 63) / 64 * 64;
  size_t segment = kControlBytes + kStages * s->slot_bytes_;
  // At P = 2 each rank sums only one peer's copy besides its own, and saving the second Sync
  // pays up to 256 KiB (np 2 here: 64-256 KiB 10-30% faster); at P = 4 and 8 the redundant
  // sums cost more than the Sync beyond 32 KiB.
  s->one_shot_bytes_ =
      std::min(s->slot_bytes_, size <= 2 ? kOneShotPairBytes : kOneShotMaxBytes);
  s->records_.resize(static_cast<size_t>(size));

  MPI_Info info;
  MPI_Info_create(&info);
  // Each segment may start on its own page: no false sharing between ranks' slots.
  MPI_Info_set(info, "alloc_shared_noncontig", "true");
  void* base = nullptr;
  rc = MPI_Win_allocate_shared(static_cast<MPI_Aint>(segment), 1, info, s->local_, &base,
                               &s->win_);
  MPI_Info_free(&info);
  int ok = (rc == MPI_SUCCESS) ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, s->local_);
  if (!all_ok) {
    if (rc != MPI_SUCCESS) return MpiError("ShmCollectives: MPI_Win_allocate_shared", rc);
    return BackendError("ShmCollectives: MPI_Win_allocate_shared of ", segment,
                        " bytes per rank failed on another rank");
  }
  MPI_Win_set_errhandler(s->win_, MPI_ERRORS_RETURN);
  int* model = nullptr;
  int flag = 0;
  MPI_Win_get_attr(s->win_, MPI_WIN_MODEL, &model, &flag);
  s->separate_model_ = flag && model && *model == MPI_WIN_SEPARATE;

  s->bases_.resize(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    MPI_Aint bytes = 0;
    int disp = 0;
    void* ptr = nullptr;
    rc = MPI_Win_shared_query(s->win_, r, &bytes, &disp, &ptr);
    if (rc != MPI_SUCCESS) return MpiError("ShmCollectives: MPI_Win_shared_query", rc);
    s->bases_[static_cast<size_t>(r)] = static_cast<unsigned char*>(ptr);
  }
  // A passive-target epoch for the window's lifetime makes direct loads / stores legal.
  rc = MPI_Win_lock_all(MPI_MODE_NOCHECK, s->win_);
  if (rc != MPI_SUCCESS) return MpiError("ShmCollectives: MPI_Win_lock_all", rc);
  s->locked_ = true;
  __atomic_store_n(const_cast<uint64_t*>(s->Counter(rank)), 0, __ATOMIC_RELEASE);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  // A few microseconds cover a peer that is running and nearly there; longer spins only burn
  // a core that a descheduled peer (or another job) needs.
  s->spin_s_ = (cores > 0 && size <= cores) ? 5e-6 : 0;
  // Then yield-polling: at 4 and 8 ranks on 2 cores, 64 B - 64 KiB allreduces ran 2-3.5x
  // faster with 100-400 us of it than with the futex sleep straight away (bench/RESULTS.md).
  s->yield_s_ = 200e-6;
  MPI_Win_sync(s->win_);
  // Everyone's counter is zero before anyone increments it.
  rc = MPI_Barrier(s->local_);
  if (rc != MPI_SUCCESS) return MpiError("ShmCollectives: MPI_Barrier", rc);
  return s;
}

ShmCollectives::~ShmCollectives() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (locked_) MPI_Win_unlock_all(win_);
  if (win_ != MPI_WIN_NULL) MPI_Win_free(&win_);
  if (local_ != MPI_COMM_NULL) MPI_Comm_free(&local_);
}

unsigned char* ShmCollectives::Slot(int rank, uint64_t stage) const {
  return bases_[static_cast<size_t>(rank)] + kControlBytes + (stage % kStages) * slot_bytes_;
}

volatile uint64_t* ShmCollectives::Counter(int rank) const {
  return reinterpret_cast<volatile uint64_t*>(bases_[static_cast<size_t>(rank)]);
}

ShmCollectives::Descriptor* ShmCollectives::Desc(int rank, uint64_t call) const {
  static_assert(sizeof(Descriptor) <= kDescBytes, "descriptor larger than its place");
  return reinterpret_cast<Descriptor*>(bases_[static_cast<size_t>(rank)] + kLineBytes +
                                       (call % 2) * kDescBytes);
}

Status ShmCollectives::CheckUsable(const char* call) const {
  if (failure_.ok()) return Status::Ok();
  return AbortedError(call, ": an earlier shared-memory collective on this communicator failed (",
                      failure_.ToString(),
                      "), so the node peers are in an unknown state; recreate the communicator");
}

// The arrival word of a rank: the low 32 bits of its arrival count (a futex word; compared
// with wrap-around) and, in the next word, how many peers sleep on it.
namespace {
inline uint32_t* Word(volatile uint64_t* counter) {
  return reinterpret_cast<uint32_t*>(const_cast<uint64_t*>(counter));
}
inline bool Reached(uint32_t value, uint32_t target) {
  return static_cast<int32_t>(value - target) >= 0;
}
// Shared (not FUTEX_PRIVATE) operations: the word lives in memory mapped by several processes.
inline void FutexWait(uint32_t* word, uint32_t expected, long timeout_ns) {
  timespec ts{0, timeout_ns};
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}
inline void FutexWakeAll(uint32_t* word) {
  syscall(SYS_futex, word, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}
}  // namespace

Status ShmCollectives::Sync(const char* call, const Interrupt* interrupt) {
  const uint32_t target = static_cast<uint32_t>(++arrivals_);
  if (separate_model_) MPI_Win_sync(win_);
  uint32_t* mine = Word(Counter(rank_));
  __atomic_store_n(mine, target, __ATOMIC_SEQ_CST);
  // Wake peers that went to sleep waiting for this arrival (seq_cst store, then load of the
  // sleeper count, pairs with the sleeper's increment-then-recheck: one side sees the other).
  if (__atomic_load_n(mine + 1, __ATOMIC_SEQ_CST) != 0) FutexWakeAll(mine);
  auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    uint32_t* word = Word(Counter(r));
    uint32_t seen = __atomic_load_n(word, __ATOMIC_ACQUIRE);
    // Spin briefly only when every rank has a core of its own: an oversubscribed rank that
    // spins steals the core from the very peer it waits for.
    if (spin_s_ > 0 && !Reached(seen, target)) {
      auto spin_start = std::chrono::steady_clock::now();
      do {
        for (int i = 0; i < 16 && !Reached(seen, target); ++i) {
          CpuRelax();
          seen = __atomic_load_n(word, __ATOMIC_ACQUIRE);
        }
      } while (!Reached(seen, target) && Seconds(spin_start) < spin_s_);
    }
    // Then yield the core while polling: a peer that is runnable gets it at once, and one that
    // arrives within yield_s_ is seen without a futex round trip (whose wake-up costs ~10 us on
    // a virtual machine).
    if (yield_s_ > 0 && !Reached(seen, target)) {
      auto yield_start = std::chrono::steady_clock::now();
      do {
        sched_yield();
        seen = __atomic_load_n(word, __ATOMIC_ACQUIRE);
      } while (!Reached(seen, target) && Seconds(yield_start) < yield_s_);
    }
    while (!Reached(seen, target)) {
      // Sleep in the kernel until the peer's arrival changes its word, or 50 ms pass to check
      // the timeout (10 ms under an interrupt, which must be seen soon after it fires).
      __atomic_fetch_add(word + 1, 1u, __ATOMIC_SEQ_CST);
      seen = __atomic_load_n(word, __ATOMIC_SEQ_CST);
      if (!Reached(seen, target)) FutexWait(word, seen, interrupt ? 10000000L : 50000000L);
      __atomic_fetch_sub(word + 1, 1u, __ATOMIC_SEQ_CST);
      seen = __atomic_load_n(word, __ATOMIC_ACQUIRE);
      if (Reached(seen, target)) break;
      if (interrupt != nullptr) {
        Status s = interrupt->Check();
        if (!s.ok()) {
          failure_ = s.WithPrefix(StrCat(call, ": "));
          return failure_;
        }
      }
      if (timeout_s_ > 0 && Seconds(start) > timeout_s_) {
        std::string missing;
        for (int q = 0; q < size_; ++q) {
          if (q != rank_ && !Reached(__atomic_load_n(Word(Counter(q)), __ATOMIC_ACQUIRE), target)) {
            missing += StrCat(missing.empty() ? "" : ", ", q);
          }
        }
        failure_ = TimeoutError(call, ": rank ", rank_, " waited ", timeout_s_,
                                " s (POSEIDON_SHM_TIMEOUT_S) at shared-memory step ", arrivals_,
                                " for node ranks ", missing,
                                "; a peer stopped calling the collective, is stuck or died");
        return failure_;
      }
    }
  }
  if (separate_model_) MPI_Win_sync(win_);
  return Status::Ok();
}

namespace {
void CopyString(char* dst, size_t cap, const char* src) {
  size_t n = std::min(cap - 1, std::strlen(src));
  std::memcpy(dst, src, n);
  dst[n] = '\0';
}
std::string ReadString(const char* src, size_t cap) { return std::string(src, strnlen(src, cap)); }

// This rank's own checks of a call with a counts vector, and its descriptor when the caller
// gave none (the hash of the counts is taken only then: the backend passes its own).
Status CheckCounted(const char* call, const std::vector<size_t>& counts, DType dtype, int world) {
  Status local = CheckDType(call, dtype);
  if (local.ok()) local = CheckCountsPerRank(call, counts, world);
  return local;
}
CollectiveArgs CountedArgs(const char* call, const std::vector<size_t>& counts, DType dtype,
                           const Status& local) {
  return {call, static_cast<int64_t>(SumCounts(counts)), static_cast<int64_t>(dtype), -1,
          HashCounts(counts), local};
}
}  // namespace

Status ShmCollectives::Enter(const CollectiveArgs& args, const Interrupt* interrupt) {
  const uint64_t call = calls_;
  Descriptor* mine = Desc(rank_, call);
  mine->record = RecordOf(args);
  CopyString(mine->call, sizeof(mine->call), args.call);
  if (!args.local.ok()) {
    CopyString(mine->message, sizeof(mine->message), args.local.message().c_str());
  }
  PSD_CHECK(Sync(args.call, interrupt));
  ++calls_;
  // Every rank reads the same descriptors, so every rank reaches the same verdict.
  const Descriptor* first = Desc(0, call);
  std::string differing;
  for (int r = 0; r < size_; ++r) {
    const Descriptor* d = Desc(r, call);
    records_[static_cast<size_t>(r)] = d->record;
    if (r == 0 || std::strncmp(d->call, first->call, sizeof(d->call)) != 0) {
      if (r != 0) differing += StrCat(", rank ", r, ": ", ReadString(d->call, sizeof(d->call)));
    }
  }
  if (!differing.empty()) {
    return MismatchError(args.call, ": ranks called different collectives (rank 0: ",
                         ReadString(first->call, sizeof(first->call)), differing,
                         "); expected the same call on every rank");
  }
  return ArgsVerdict(args, records_, [&](int r) {
    const Descriptor* d = Desc(r, call);
    return ReadString(d->message, sizeof(d->message));
  });
}

Status ShmCollectives::Agree(const CollectiveArgs& args, const Interrupt* interrupt) {
  PSD_CHECK(CheckUsable(args.call));
  return Enter(args, interrupt);
}

Status ShmCollectives::AllReduce(const void* send, void* recv, size_t count, DType dtype,
                                 const Interrupt* interrupt, const CollectiveArgs* args) {
  const char* call = "AllReduce";
  const CollectiveArgs own{call, static_cast<int64_t>(count), static_cast<int64_t>(dtype), -1, 0,
                           CheckDType(call, dtype)};
  const CollectiveArgs& a = args != nullptr ? *args : own;
  PSD_CHECK(CheckUsable(call));
  // A rank with bad arguments, or nothing to move, only takes part in the agreement.
  if (!a.local.ok() || count == 0) return Enter(a, interrupt);
  const size_t es = DTypeSize(dtype);
  const unsigned char* in = static_cast<const unsigned char*>(send);
  unsigned char* out = static_cast<unsigned char*>(recv);
  std::vector<const void*>& srcs = srcs_;

  if (count * es <= one_shot_bytes_) {
    std::memcpy(Slot(rank_, stage_), in, count * es);
    PSD_CHECK(Enter(a, interrupt));
    for (int r = 0; r < size_; ++r) {
      srcs[static_cast<size_t>(r)] = r == rank_ ? send : Slot(r, stage_);
    }
    ShmReduceSum(dtype, srcs.data(), size_, recv, count);
    ++stage_;
    return Status::Ok();
  }

  const size_t per_chunk = slot_bytes_ / es;
  const size_t chunks = (count + per_chunk - 1) / per_chunk;
  const bool stream = count * es >= kStreamOutputBytes;

  auto chunk_len = [&](size_t k) { return std::min(per_chunk, count - k * per_chunk); };
  // Step 1 / 2b: my input's chunk k into my slot, without my own shard.
  auto copy_in = [&](size_t k, uint64_t stage) {
    size_t len = chunk_len(k);
    size_t off = ShardOffset(len, size_, rank_), mine = ShardCount(len, size_, rank_);
    const unsigned char* src = in + k * per_chunk * es;
    unsigned char* slot = Slot(rank_, stage);
    std::memcpy(slot, src, off * es);
    std::memcpy(slot + (off + mine) * es, src + (off + mine) * es, (len - off - mine) * es);
  };

  const uint64_t first = stage_;
  copy_in(0, first);
  PSD_CHECK(Enter(a, interrupt));
  for (size_t k = 0; k < chunks; ++k) {
    const uint64_t stage = first + k;
    const size_t len = chunk_len(k);
    // 2a: reduce my shard of chunk k.
    size_t off = ShardOffset(len, size_, rank_), mine = ShardCount(len, size_, rank_);
    for (int r = 0; r < size_; ++r) {
      srcs[static_cast<size_t>(r)] =
          (r == rank_ ? in + k * per_chunk * es : Slot(r, stage)) + off * es;
    }
    ShmReduceSum(dtype, srcs.data(), size_, Slot(rank_, stage) + off * es, mine);
    // 2b: the next chunk, while slower peers still reduce this one.
    if (k + 1 < chunks) copy_in(k + 1, stage + 1);
    PSD_CHECK(Sync(call, interrupt));
    // 2d: every reduced shard out of its reducer's slot.
    unsigned char* dst = out + k * per_chunk * es;
    for (int r = 0; r < size_; ++r) {
      size_t o = ShardOffset(len, size_, r);
      CopyOut(dst + o * es, Slot(r, stage) + o * es, ShardCount(len, size_, r) * es, stream);
    }
  }
  if (stream) StreamFence();
  stage_ = first + chunks;
  return Status::Ok();
}

Status ShmCollectives::ReduceScatter(const void* send, void* recv,
                                     const std::vector<size_t>& counts, DType dtype,
                                     const Interrupt* interrupt, const CollectiveArgs* args) {
  const char* call = "ReduceScatter";
  const Status local = CheckCounted(call, counts, dtype, size_);
  const size_t total = SumCounts(counts);
  const CollectiveArgs own =
      args != nullptr ? CollectiveArgs{} : CountedArgs(call, counts, dtype, local);
  const CollectiveArgs& a = args != nullptr ? *args : own;
  PSD_CHECK(CheckUsable(call));
  if (!a.local.ok() || !local.ok() || total == 0) return Enter(a, interrupt);
  const size_t es = DTypeSize(dtype);
  const size_t piece = slot_bytes_ / es / static_cast<size_t>(size_);  // L, at least 8
  const std::vector<size_t> off = PrefixOffsets(counts);
  const size_t largest = *std::max_element(counts.begin(), counts.end());
  const size_t rounds = (largest + piece - 1) / piece;
  const unsigned char* in = static_cast<const unsigned char*>(send);
  unsigned char* out = static_cast<unsigned char*>(recv);
  std::vector<const void*>& srcs = srcs_;
  auto piece_len = [&](int q, size_t k) {
    size_t c = counts[static_cast<size_t>(q)], start = k * piece;
    return start >= c ? 0 : std::min(piece, c - start);
  };

  for (size_t k = 0; k < rounds; ++k) {
    const uint64_t stage = stage_ + k;
    unsigned char* slot = Slot(rank_, stage);
    for (int q = 0; q < size_; ++q) {
      size_t len = piece_len(q, k);
      if (q == rank_ || len == 0) continue;
      std::memcpy(slot + static_cast<size_t>(q) * piece * es,
                  in + (off[static_cast<size_t>(q)] + k * piece) * es, len * es);
    }
    PSD_CHECK(k == 0 ? Enter(a, interrupt) : Sync(call, interrupt));
    size_t mine = piece_len(rank_, k);
    if (mine == 0) continue;  // my slice is shorter than the longest: nothing left to sum
    for (int r = 0; r < size_; ++r) {
      srcs[static_cast<size_t>(r)] =
          r == rank_ ? in + (off[static_cast<size_t>(rank_)] + k * piece) * es
                     : Slot(r, stage) + static_cast<size_t>(rank_) * piece * es;
    }
    ShmReduceSum(dtype, srcs.data(), size_, out + k * piece * es, mine);
  }
  stage_ += rounds;
  return Status::Ok();
}

Status ShmCollectives::AllGather(const void* send, void* recv, size_t count, DType dtype,
                                 const Interrupt* interrupt, const CollectiveArgs* args) {
  const char* call = "AllGather";
  const CollectiveArgs own{call, static_cast<int64_t>(count), static_cast<int64_t>(dtype), -1, 0,
                           CheckDType(call, dtype)};
  return AllGatherV(send, recv, std::vector<size_t>(static_cast<size_t>(size_), count), dtype,
                    interrupt, args != nullptr ? args : &own);
}

Status ShmCollectives::AllGatherV(const void* send, void* recv, const std::vector<size_t>& counts,
                                  DType dtype, const Interrupt* interrupt,
                                  const CollectiveArgs* args) {
  const char* call = "AllGatherV";
  const Status local = CheckCounted(call, counts, dtype, size_);
  const size_t total = SumCounts(counts);
  const CollectiveArgs own =
      args != nullptr ? CollectiveArgs{} : CountedArgs(call, counts, dtype, local);
  const CollectiveArgs& a = args != nullptr ? *args : own;
  PSD_CHECK(CheckUsable(a.call));
  if (!a.local.ok() || !local.ok() || total == 0) return Enter(a, interrupt);
  const size_t es = DTypeSize(dtype);
  const size_t per_round = slot_bytes_ / es;
  const size_t largest = *std::max_element(counts.begin(), counts.end());
  const size_t rounds = (largest + per_round - 1) / per_round;
  const std::vector<size_t> off = PrefixOffsets(counts);
  const size_t count = counts[static_cast<size_t>(rank_)];
  const unsigned char* in = static_cast<const unsigned char*>(send);
  unsigned char* out = static_cast<unsigned char*>(recv);
  const bool stream = total * es >= kStreamOutputBytes;
  auto piece_len = [&](size_t c, size_t k) {
    size_t start = k * per_round;
    return start >= c ? 0 : std::min(per_round, c - start);
  };
  // My own part never goes through the window.
  unsigned char* my_out = out + off[static_cast<size_t>(rank_)] * es;
  if (count > 0 && my_out != in) std::memmove(my_out, in, count * es);
  for (size_t k = 0; k < rounds; ++k) {
    const uint64_t stage = stage_ + k;
    const size_t len = piece_len(count, k);
    if (len > 0) std::memcpy(Slot(rank_, stage), in + k * per_round * es, len * es);
    PSD_CHECK(k == 0 ? Enter(a, interrupt) : Sync(a.call, interrupt));
    for (int r = 0; r < size_; ++r) {
      const size_t n = piece_len(counts[static_cast<size_t>(r)], k);
      if (r == rank_ || n == 0) continue;
      CopyOut(out + (off[static_cast<size_t>(r)] + k * per_round) * es, Slot(r, stage), n * es,
              stream);
    }
  }
  if (stream) StreamFence();
  stage_ += rounds;
  return Status::Ok();
}

Status ShmCollectives::Broadcast(void* buf, size_t count, DType dtype, int root,
                                 const Interrupt* interrupt, const CollectiveArgs* args) {
  const char* call = "Broadcast";
  Status local = CheckDType(call, dtype);
  if (local.ok() && (root < 0 || root >= size_)) {
    local = InvalidArgument(call, ": root ", root, " is outside 0..", size_ - 1);
  }
  const CollectiveArgs own{call, static_cast<int64_t>(count), static_cast<int64_t>(dtype), root, 0,
                           local};
  const CollectiveArgs& a = args != nullptr ? *args : own;
  PSD_CHECK(CheckUsable(call));
  if (!a.local.ok() || !local.ok() || count == 0) return Enter(a, interrupt);
  const size_t es = DTypeSize(dtype);
  const size_t per_round = slot_bytes_ / es;
  const size_t rounds = (count + per_round - 1) / per_round;
  unsigned char* data = static_cast<unsigned char*>(buf);
  const bool stream = count * es >= kStreamOutputBytes;
  for (size_t k = 0; k < rounds; ++k) {
    const uint64_t stage = stage_ + k;
    const size_t start = k * per_round, len = std::min(per_round, count - start);
    if (rank_ == root) std::memcpy(Slot(rank_, stage), data + start * es, len * es);
    PSD_CHECK(k == 0 ? Enter(a, interrupt) : Sync(call, interrupt));
    if (rank_ != root) CopyOut(data + start * es, Slot(root, stage), len * es, stream);
  }
  if (stream) StreamFence();
  stage_ += rounds;
  return Status::Ok();
}

namespace {
// Copies elements [lo, hi) of the pieces' concatenation into dst (in) or from src (out).
void GatherPieces(const std::vector<SumPiece>& pieces, size_t es, size_t lo, size_t hi,
                  unsigned char* dst) {
  size_t base = 0;
  for (const SumPiece& p : pieces) {
    const size_t a = std::max(lo, base), b = std::min(hi, base + p.count);
    if (a < b) {
      std::memcpy(dst + (a - lo) * es, static_cast<const unsigned char*>(p.in) + (a - base) * es,
                  (b - a) * es);
    }
    base += p.count;
    if (base >= hi) return;
  }
}
void ScatterPieces(const std::vector<SumPiece>& pieces, size_t es, size_t lo, size_t hi,
                   const unsigned char* src) {
  size_t base = 0;
  for (const SumPiece& p : pieces) {
    const size_t a = std::max(lo, base), b = std::min(hi, base + p.count);
    if (a < b) {
      std::memcpy(static_cast<unsigned char*>(p.out) + (a - base) * es, src + (a - lo) * es,
                  (b - a) * es);
    }
    base += p.count;
    if (base >= hi) return;
  }
}
}  // namespace

Status ShmCollectives::AllReducePieces(const std::vector<SumPiece>& pieces, DType dtype,
                                       const Interrupt* interrupt, const CollectiveArgs& args,
                                       const SumCommit& commit, bool* committed) {
  const char* call = args.call;
  *committed = false;
  PSD_CHECK(CheckUsable(call));
  size_t count = 0;
  for (const SumPiece& p : pieces) count += p.count;
  if (!args.local.ok() || count == 0) {
    PSD_CHECK(Enter(args, interrupt));
    *committed = true;
    return Status::Ok();
  }
  const size_t es = DTypeSize(dtype);
  const size_t first = pieces.empty() ? 0 : pieces[0].count;  // the committed piece
  std::vector<const void*>& srcs = srcs_;
  // Sums elements [lo, hi) of a one-stage buffer whose element x is at Slot(r) + x (every
  // rank's whole input is there) into the outputs, piece by piece.
  auto sum_into_pieces = [&](uint64_t stage, size_t lo, size_t hi) {
    size_t base = 0;
    for (const SumPiece& p : pieces) {
      const size_t a = std::max(lo, base), b = std::min(hi, base + p.count);
      if (a < b) {
        for (int r = 0; r < size_; ++r) srcs[static_cast<size_t>(r)] = Slot(r, stage) + a * es;
        ShmReduceSum(dtype, srcs.data(), size_,
                     static_cast<unsigned char*>(p.out) + (a - base) * es, b - a);
      }
      base += p.count;
      if (base >= hi) return;
    }
  };

  if (count * es <= one_shot_bytes_) {
    GatherPieces(pieces, es, 0, count, Slot(rank_, stage_));
    PSD_CHECK(Enter(args, interrupt));
    sum_into_pieces(stage_, 0, first);
    if (commit && !commit(pieces[0].out)) {
      ++stage_;
      return Status::Ok();
    }
    sum_into_pieces(stage_, first, count);
    ++stage_;
    *committed = true;
    return Status::Ok();
  }

  const size_t per_chunk = slot_bytes_ / es;
  const size_t chunks = (count + per_chunk - 1) / per_chunk;
  if (first > per_chunk) {
    // Told to the peers through the agreement, so none is left waiting for this rank.
    CollectiveArgs bad = args;
    bad.local = InvalidArgument(call, ": the committed first piece holds ", first,
                                " elements; expected at most one slot (", per_chunk, ")");
    return Enter(bad, interrupt);
  }
  auto chunk_len = [&](size_t k) { return std::min(per_chunk, count - k * per_chunk); };
  // Copies the reduced shards of chunk k that fall in [lo, hi) (whole-buffer indices) out.
  auto copy_out = [&](uint64_t stage, size_t k, size_t lo, size_t hi) {
    const size_t start = k * per_chunk, len = chunk_len(k);
    for (int r = 0; r < size_; ++r) {
      const size_t o = start + ShardOffset(len, size_, r);
      const size_t a = std::max(lo, o), b = std::min(hi, o + ShardCount(len, size_, r));
      if (a < b) ScatterPieces(pieces, es, a, b, Slot(r, stage) + (a - start) * es);
    }
  };
  const uint64_t base_stage = stage_;
  GatherPieces(pieces, es, 0, chunk_len(0), Slot(rank_, base_stage));
  PSD_CHECK(Enter(args, interrupt));
  for (size_t k = 0; k < chunks; ++k) {
    const uint64_t stage = base_stage + k;
    const size_t len = chunk_len(k);
    const size_t off = ShardOffset(len, size_, rank_), mine = ShardCount(len, size_, rank_);
    for (int r = 0; r < size_; ++r) srcs[static_cast<size_t>(r)] = Slot(r, stage) + off * es;
    ShmReduceSum(dtype, srcs.data(), size_, Slot(rank_, stage) + off * es, mine);
    if (k + 1 < chunks) {
      GatherPieces(pieces, es, (k + 1) * per_chunk, (k + 1) * per_chunk + chunk_len(k + 1),
                   Slot(rank_, stage + 1));
    }
    PSD_CHECK(Sync(call, interrupt));
    const size_t start = k * per_chunk;
    if (k == 0 && commit) {
      copy_out(stage, 0, 0, first);
      if (!commit(pieces[0].out)) {
        // Every rank declines here alike. The next call writes stage + 1, which nobody reads
        // any more; slower peers may still be reading this stage.
        stage_ = base_stage + 1;
        return Status::Ok();
      }
      copy_out(stage, 0, first, len);
    } else {
      copy_out(stage, k, start, start + len);
    }
  }
  stage_ = base_stage + chunks;
  *committed = true;
  return Status::Ok();
}

}  // namespace poseidon
