// Shared-memory collectives for ranks that all live on one node: allreduce, reduce-scatter
// (uneven shards) and allgather over one MPI-3 shared window (MPI_Win_allocate_shared).
//
// Open MPI's host collectives move every byte through its own copies and rounds; here every
// rank can load and store its peers' memory directly, so a large sum costs about one copy in,
// one pass that reads every input once, and one copy out.
//
// Window layout: every rank owns one segment = [control area][3 stage slots of slot_bytes].
// The control area holds the rank's arrival counter (see Sync below) and three call
// descriptors. A "stage" is one buffer of the pipeline; rounds rotate through the 3 stages so
// that a rank may fill the next stage while slower peers still read the previous one.
//
// Agreement: every call writes its descriptor (the call's name, element count, dtype, root, a
// hash of its counts vector, and whether this rank's own argument checks failed, with the
// message) into the control area before its first step's Sync, and reads every peer's right
// after it, before touching any peer's data. Ranks whose descriptors differ, or where one rank's
// arguments are bad, all return the same error (runtime/arg_check.h, ArgsVerdict) at that point
// and the window stays usable; a rank with bad arguments is named first, even where its call's
// name differs from its peers' (Backend::FailTogether joins any call). Each descriptor also
// carries the settings the backend uses the window by (set_knobs), compared first. The check
// costs no extra round: the descriptor rides on the Sync the collective needs anyway. A call of
// one step (an allreduce of the one-Sync size, a reduce-scatter or allgather of one round) reads
// a digest of each peer's descriptor from the stamp on its slot's head instead, beside the data
// (EnterStamped), and every descriptor only where some digest differs. Descriptors
// rotate through four places by call, so a fast rank's next calls never overwrite one that a
// slow peer has yet to read (three would do, not two: receivers of broadcasts from one root
// may run two calls ahead of one another, see Broadcast; the fourth makes the place a mask).
//
// Synchronization: each Sync() bumps this rank's arrival counter and waits until every peer's
// counter has reached the same value. A waiter spins for up to 5 us where every rank can have a
// core and the awaited peer last arrived on another core than the waiter's (each arrival
// records its core), then polls with sched_yield for up to 200 us (a runnable peer gets the
// core at once), then sleeps on the peer's counter with a futex that the peer wakes when it
// arrives, so 8 ranks on 2 cores never burn for long the cores their peers need. An arrival
// is a plain store where every rank's kernel offers membarrier(2)'s global barrier (agreed at
// Create): the rank does not wait for its store to reach its peers (a broadcast root returns
// that much sooner), and a waiter about to sleep runs that barrier between announcing itself
// and its last look at the counter, so that the arrival and the sleeper still see each other.
// A wait longer than POSEIDON_SHM_TIMEOUT_S fails the call with kTimeout and marks the window
// unusable. A peer that frees its window (its communicator destroyed) while a rank waits for an
// arrival it never made fails that wait at once, with kAborted naming it: the destructor sets a
// "left" flag on its arrival line after its last arrival and wakes the sleepers. A call given
// an Interrupt checks it at every wake (the futex sleep is then cut to 10 ms) and, when it
// turns non-OK, returns its status ("AllReduce: <message>") and marks the window unusable as
// well: the peers are left mid-collective, in an unknown state.
//
// Single copy: AllGather(V) of at least single_copy_bytes (Create) and below 64 MiB skips the
// window. Every rank puts the address of its input in its call descriptor, and after the
// agreement each rank reads its peers' inputs straight into its output with process_vm_readv
// (Linux cross-memory attach: one copy in the kernel instead of a copy into the window and
// another out of it); a second Sync keeps every rank in the call until every peer has read its
// input. Create tries one such read between neighbours and leaves the path off on every rank
// when the kernel refuses it on any (ptrace rules, seccomp, separate pid namespaces). A read
// that fails mid-call is named in the descriptor before the second Sync, so every rank returns
// the same error. AllReduce of at least single_copy_bytes, above the one-Sync size and below
// 16 MiB, takes the same way: each rank sums its shard from its peers' inputs into its own
// output, then reads every peer's summed shard out of that peer's output (the same bits as the
// window's sums). With kSingleCopyAuto, Create times both ways of each (an allgather and an
// allreduce of 1 MiB, the two ways alternated after 0.1 s of untimed runs) and keeps the single
// copy for the ones it ran faster on every rank (single_copy_note says what it measured): on
// the development VM's Intel CPU it won for both; on its AMD CPU, once warm, the window ran
// both 1.3-1.5x faster. Where ranks outnumber cores kSingleCopyAuto
// instead leaves allgathers and allreduces to the window and times a broadcast of 2 MiB both
// ways; where reading the root's buffer ran faster (mean over ranks), broadcasts of 1-32 MiB
// take that way (see "Single-copy Broadcast" in shm_collectives.cc): a receiver returns once it
// has the data, the root once every receiver has read it. At P = 8 it won on both CPUs; at
// P = 4 on the AMD CPU the window won.
//
// Node-shared buffers (set_regions, Backend::AllocShared): an AllReduce above the one-Sync size
// whose send and recv lie in node-shared memory on every rank needs neither the window's copies
// nor the kernel's: each rank sums its shard straight from every rank's input into every rank's
// output, between the agreement's Sync and one more. A ReduceScatter or AllGather(V) of more
// than one round whose input lies there on every rank (the outputs may lie anywhere) reads it
// straight the same way: each rank sums its own shard from every rank's input, or copies every
// peer's part out of the peer's input. Every rank publishes where its buffers lie in its
// descriptor, so ranks whose buffers are private take the window with the others, alike.
//
// Broadcast: nobody waits for everybody in a broadcast of one piece (512 KiB or less: the usual
// parameter and object broadcasts, every small one; with more than two ranks per core, up to P
// slots laid across every rank's slot of the stage, across_bytes()). The root copies its buffer
// into its slot, stamps the slot's head with its call's index and a 64-bit digest of its name,
// arguments and settings (its descriptor's first part; a head holds stamps only), publishes its
// descriptor and its arrival, and returns; a receiver publishes its own, waits for the root's
// arrival alone (or sees the stamp, written after the data), compares the root's digest with its
// own descriptor's (the stamp shares the cache line of the smallest broadcasts' data; a root
// that failed before moving data leaves an older stamp, whose index never matches; two
// descriptors that differ in one word always differ in their digests, in several a 2^-64
// chance of the same) and copies the data out. So the root runs ahead of slow
// receivers, and receivers never wait for one another (Open MPI's eager broadcast behaves alike).
// The full check still happens on every rank: a receiver whose descriptor differs from the root's
// stamp waits for every rank and fails with the verdict Enter would give; every other rank compares
// every rank's descriptor of the broadcast at the start of its next call (Begin, after waiting for
// every peer to have entered the broadcast; the root reads only its receivers' confirmations where
// all of them matched). Where that verdict is a failure, the rank fails that next call with it as
// its own bad argument, so the next call fails on every rank, naming the broadcast's failure (with
// its code); the root learns of a broadcast its peers refused one call late. A failure is carried
// once: a rank that finds its early return refused only by peers that were carrying such a failure
// (which it failed itself in the call before) does not carry it further. Such a broadcast's stage
// stays moved on every rank, failed or not (the ranks that matched the root may still be copying
// out of its slot when the root's next call begins), and every call that fails in the call moves
// one stage on every rank too (a receiver may still be reading the stamp of a broadcast whose root
// failed its arguments and wrote nothing). A broadcast of several pieces is paced by its root the
// same way, but every rank checks every descriptor before the second piece, so it fails in the call
// itself. Where ranks outnumber cores, or at P = 2, a ReduceScatter of one round returns the same
// way on the ranks whose share is empty (most of them in a reduce-scatter of a few elements), its
// stage kept moved alike. Waiting at Begin also keeps the window's invariant: when a call starts,
// every peer has arrived for the previous one's last step, as after a Sync. One exception: a
// receiver whose next call is another broadcast from the same root skips Begin (it waited for the
// root's last arrival in the call; the root checks the receivers and, where one refused, fails its
// next call through Enter, which writes no stamp, so every receiver fails that call too). The
// root's Begin still waits for every rank, so a receiver is never more than two calls ahead of
// another: it cannot pass the root's arrival for call c + 2 before every rank has arrived for call
// c + 1, which each rank does only after it has finished reading the descriptors of call c.
//
// Determinism: every output element is summed by exactly one rank, in rank order 0..P-1
// (float16 / bfloat16 widened to float32, rounded once), so results are bitwise identical on
// every rank and do not depend on the chunk size.
//
// Threading: one call at a time per object (the backend's owner serializes calls).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/arg_check.h"
#include "runtime/backend.h"
#include "runtime/dtype.h"
#include "runtime/status.h"

namespace poseidon {

class SharedRegions;

class ShmCollectives {
 public:
  static constexpr size_t kSingleCopyAuto = SIZE_MAX;
  // kSingleCopyAuto where every rank has a core: the smallest allreduce, and the smallest
  // allgather (bytes of the gathered buffer), that may take the single copy. At P = 2 here a
  // gather of 32 KiB took 2.9-3.0 us that way against 4.3-4.4 us through the window (16 KiB:
  // 2.3 against 2.4 us).
  static constexpr size_t kAutoSingleCopyBytes = size_t{64} << 10;
  static constexpr size_t kAutoGatherSingleCopyBytes = size_t{32} << 10;
  // kSingleCopyAuto where ranks outnumber cores: the smallest broadcast read from the root,
  // where Create measured that way faster.
  static constexpr size_t kAutoBroadcastSingleCopyBytes = size_t{1} << 20;
  // Collective over comm (every rank must call it). Returns kUnavailable on every rank when
  // comm spans more than one node (the caller then uses plain MPI), kInvalidArgument when
  // chunk_bytes < 4096, kMismatch when ranks pass different chunk sizes or single-copy
  // thresholds, kBackendError when MPI cannot allocate the window. timeout_s <= 0 waits forever.
  // single_copy_bytes: the smallest AllGather(V) (bytes of the gathered buffer), AllReduce and
  // Broadcast read straight from the peers' memory (see "Single copy" above); 0: never;
  // kSingleCopyAuto: where every rank has a core, from kAutoGatherSingleCopyBytes (allgathers)
  // and kAutoSingleCopyBytes (allreduces) for the calls on which Create measured it faster;
  // where ranks outnumber cores, broadcasts from kAutoBroadcastSingleCopyBytes if Create
  // measured them faster that way.
  static Result<std::unique_ptr<ShmCollectives>> Create(MPI_Comm comm, size_t chunk_bytes,
                                                        double timeout_s,
                                                        size_t single_copy_bytes = 0);
  // Frees the window and the node communicator; collective (every rank destroys its object at
  // the same point, as the backend destructor does). Does nothing after MPI_Finalize.
  ~ShmCollectives();
  ShmCollectives(const ShmCollectives&) = delete;
  ShmCollectives& operator=(const ShmCollectives&) = delete;

  // Same contracts as Backend::AllReduce / ReduceScatter / AllGather / AllGatherV / Broadcast /
  // Barrier on host memory, each checked across ranks as "Agreement" above says. args: the
  // descriptor to compare, with this rank's own validation in args->local (a rank whose local
  // status is not OK moves no data and fails with its own message, the others with
  // "rank r passed an invalid argument: ...", see ArgsVerdict); null: one built from the call's
  // own arguments.
  // AllReduce may run in place (send == recv). interrupt (may be null) is polled while waiting
  // for peers; see the top of this file.
  Status AllReduce(const void* send, void* recv, size_t count, DType dtype,
                   const Interrupt* interrupt = nullptr, const CollectiveArgs* args = nullptr);
  Status ReduceScatter(const void* send, void* recv, const std::vector<size_t>& counts, DType dtype,
                       const Interrupt* interrupt = nullptr, const CollectiveArgs* args = nullptr);
  Status AllGather(const void* send, void* recv, size_t count, DType dtype,
                   const Interrupt* interrupt = nullptr, const CollectiveArgs* args = nullptr);
  Status AllGatherV(const void* send, void* recv, const std::vector<size_t>& counts, DType dtype,
                    const Interrupt* interrupt = nullptr, const CollectiveArgs* args = nullptr);
  Status Broadcast(void* buf, size_t count, DType dtype, int root,
                   const Interrupt* interrupt = nullptr, const CollectiveArgs* args = nullptr);
  // Backend::AllReducePieces: the pieces' concatenation summed as AllReduce sums one buffer
  // (same bits), read straight from the pieces and written straight into them; commit sees the
  // first piece's sum before any other output is written (the first piece must fit one slot;
  // kInvalidArgument otherwise). Declining returns OK with *committed false on every rank.
  // A piece with a sink gets its sum handed over range by range after the commit (from the
  // slots, or from its output used as scratch in the one-Sync form); the first piece must have
  // none (MpiBackend refuses one before the call).
  Status AllReducePieces(const std::vector<SumPiece>& pieces, DType dtype,
                         const Interrupt* interrupt, const CollectiveArgs& args,
                         const SumCommit& commit, bool* committed);
  // The node-shared memory (SharedRegions over the same ranks, numbered alike) whose buffers
  // AllReduce reads and writes in place of the window's copies: where every rank's send and
  // recv lie in it, above the one-Sync size, each rank sums its shard of every rank's input
  // straight into every rank's output (one read of each input byte, one write of each output
  // byte, two Syncs). Null (the default): never. Every rank sets it alike (MpiBackend does).
  void set_regions(const SharedRegions* regions) { regions_ = regions; }
  // ReduceScatter and AllGather(V) of more than one round (an allgather's part above 256 KiB, a
  // reduce-scatter's shard above a round's share of the slot) read their peers' inputs straight where every rank's input lies in it (the outputs may lie
  // anywhere): no copy into the window.
  // How many calls took such a way (an allreduce summed straight between node-shared buffers,
  // a reduce-scatter or an allgather read straight from them).
  uint64_t shared_calls() const { return shared_calls_; }
  // Only the agreement: one Sync that carries args (for calls whose data moves another way,
  // and for Barrier). OK on every rank or the same error on every rank.
  Status Agree(const CollectiveArgs& args, const Interrupt* interrupt = nullptr);

  // The settings that decide how a backend uses this window (MpiBackend: the
  // POSEIDON_SHM_THRESHOLD_BYTES, _CHUNK_BYTES and _SINGLE_COPY_BYTES it read). Every call
  // publishes them with its descriptor and every rank compares them before the arguments:
  // ranks that hold different ones (an agreed setting changed on some ranks only, after the
  // communicator was created) fail the call with kMismatch naming the values, where one rank
  // would otherwise move data through the window while another waited in Open MPI. All zero
  // until set (alike on every rank of a window nobody sets them on).
  struct Knobs {
    long long threshold = 0;
    long long chunk = 0;
    long long single_copy = 0;
    bool operator==(const Knobs& o) const {
      return threshold == o.threshold && chunk == o.chunk && single_copy == o.single_copy;
    }
    bool operator!=(const Knobs& o) const { return !(*this == o); }
  };
  void set_knobs(const Knobs& k);
  const Knobs& knobs() const { return knobs_; }

  // True once a call timed out or was interrupted: every later call fails with kAborted.
  bool broken() const { return !failure_.ok(); }
  size_t chunk_bytes() const { return chunk_bytes_; }
  // The largest broadcast laid across every rank's slot in one piece (more than two ranks per
  // core: see "Broadcast across the slots" in shm_collectives.cc); 0 where broadcasts of more
  // than kBroadcastPieceBytes go in pieces.
  size_t across_bytes() const { return across_bytes_; }
  // The single-copy threshold asked of Create, and the one in force: 0 when none was asked, or
  // when the probe turned it off (single_copy_note() then says why).
  size_t single_copy_requested() const { return single_copy_requested_; }
  size_t single_copy_bytes() const { return single_copy_bytes_; }
  size_t single_copy_bcast_bytes() const { return single_copy_bcast_bytes_; }
  // The smallest allgather (of the gathered bytes) that writes its output with streaming stores:
  // kCrowdedGatherStreamBytes where ranks outnumber cores, else kGatherStreamBytes or, where
  // more, the size from which P + 1 gathered buffers exceed the last-level cache.
  size_t gather_stream_bytes() const { return gather_stream_bytes_; }
  // The smallest broadcast that writes the receivers' outputs with streaming stores:
  // kBroadcastStreamBytes, or where every rank has a core and more, the size from which 3 x P
  // buffers of it exceed the last-level cache.
  size_t bcast_stream_bytes() const { return bcast_stream_bytes_; }
  // The smallest AllReduce read straight from the peers (0: never).
  size_t single_copy_reduce_bytes() const { return single_copy_reduce_bytes_; }
  const std::string& single_copy_note() const { return single_copy_note_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  ShmCollectives() = default;

  struct Stamp;
  struct Descriptor;
  // A rank's slot of a stage: slot_bytes_ of data, after the slot's head (SlotHead).
  unsigned char* Slot(int rank, uint64_t stage) const;
  // The head before a slot's data: a broadcast root's stamp (and the data of the smallest
  // broadcasts) and nothing else, so no other call's data can pass for a stamp.
  unsigned char* SlotHead(int rank, uint64_t stage) const;
  volatile uint64_t* Counter(int rank) const;
  Descriptor* Desc(int rank, uint64_t call) const;
  // Waits until every rank has reached this rank's next arrival; call names the collective.
  Status Sync(const char* call, const Interrupt* interrupt);
  // Sync's halves: publish this rank's next arrival (returns it); wait until every peer
  // (only < 0) or peer `only` has reached arrival `target`.
  uint32_t Arrive();
  Status Await(const char* call, const Interrupt* interrupt, uint32_t target, int only);
  // A waiter's check between sleeps: OK, or the interrupt's failure (kept in failure_, with
  // call's name in front) when it has fired.
  Status Interrupted(const char* call, const Interrupt* interrupt);
  // Whether peer has reached arrival target already (Await's answer without its set-up).
  bool Arrived(int peer, uint32_t target) const;
  // Whether every peer has (loads only, no branch per peer: the loads overlap).
  bool AllArrived(uint32_t target) const;
  // A call's first step: publish args, Sync, compare every rank's descriptor (see the top).
  Status Enter(const CollectiveArgs& args, const Interrupt* interrupt);
  // Enter for a call of one step whose data for the peers is in place (in this rank's slot of
  // stage_, or, at most kInlineBytes, after the SlotStamp on its head's line: InlineData):
  // publish args, stamp the head (StampHead), arrive, and wait for every peer's stamp of this
  // call alone, or for its arrival where the stamp is not there yet. Where every peer's stamp
  // carries this rank's digest, OK: a peer then reads this rank's stamp line (and its data)
  // instead of its arrival line, its descriptor's two lines and its data. Otherwise (a peer
  // disagrees, or took Enter, which stamps nothing) it waits for every rank and returns
  // Enter's verdict, which every rank reaches alike. Mixes with Enter on other ranks.
  Status EnterStamped(const CollectiveArgs& args, const Interrupt* interrupt);
  // The data beside the stamp in a rank's head of a stage (kInlineBytes of room).
  unsigned char* InlineData(int rank, uint64_t stage) const;
  // Stamps this rank's head of stage_ with the digest of its published descriptor of call
  // `index` and, last, the mark of that call (release: a peer that reads the mark has the data
  // and the digest). Returns the digest.
  uint64_t StampHead(uint64_t index);
  // Waits until `peer` has stamped its head of stage_ for call `index` or, where it has not,
  // has reached arrival `target` (a peer that took Enter stamps nothing; its stamp comes before
  // its arrival). Sets *alike to whether that stamp is there and carries `digest`.
  Status AwaitStamp(const char* call, const Interrupt* interrupt, int peer, uint64_t index,
                    uint64_t digest, uint32_t target, bool* alike);
  // Enter's halves: write this rank's descriptor of the next call; the verdict every rank
  // reaches from every rank's descriptor of call `call` (all of them published).
  void Publish(const CollectiveArgs& args);
  Status Verdict(const CollectiveArgs& args, uint64_t call);
  // Every call's start: fails once the window is broken, and settles a call that returned
  // early (see "Broadcast" above); a failure found there goes out with this call's Enter.
  // receive_from: this call is a broadcast that this rank receives from that root (else -1).
  Status Begin(const char* call, const Interrupt* interrupt, int receive_from = -1) {
    if (!failure_.ok()) return Unusable(call);
    if (!pending_) return Status::Ok();
    if (receive_from >= 0 && receive_from == pending_root_ && receive_from != rank_) {
      // A receiver's broadcast after one it received from the same root: it waited for that
      // root's last arrival in the call, and a receiver checks no other receiver (the root
      // does, and tells every rank in its next call, this one). The root waited for every rank
      // before its arrival for this call, which bounds how far a receiver can run ahead of the
      // others: see "Broadcast" above.
      pending_ = false;
      return Status::Ok();
    }
    return Settle(call, interrupt);
  }
  // Begin's other case: waits for every peer's last arrival in the pending call, and settles
  // its verdict where it is still to be checked.
  Status Settle(const char* call, const Interrupt* interrupt);
  // Leaves call `index` (its last arrival `arrival`) for the next call's Begin to settle: wait
  // for every peer's arrival, and check its agreement if `verdict`. root: a broadcast's root,
  // whose receivers confirm (Confirmed); -1 for other calls. confirmer: a peer that checks
  // every descriptor of the call in the call itself and confirms when all agree (kAllAlike),
  // which settles the verdict without reading them; -1 for none.
  void Defer(uint32_t arrival, uint64_t index, bool verdict, int root, int confirmer = -1);
  // A verdict reached in the call itself, passed through: where it is a failure, moves one
  // stage, as every rank that returned early from the call moved one (so every rank keeps the
  // same stage, and no slot that a peer may still read is written next; see Broadcast).
  Status FailedStages(Status verdict);
  // Every rank whose descriptor of call `index` is bad carries a failure from its previous call
  // (and at least one is bad), and every other rank's descriptor is this rank's.
  bool OnlyCarriers(uint64_t index) const;
  // On a rank's arrival line: the last one-piece broadcast whose root's descriptor this rank
  // (a receiver) found equal to its own, as Confirmation(call index, root), or the last
  // reduce-scatter in which it found every descriptor alike while a peer may have returned
  // early, as Confirmation(call index, kAllAlike).
  uint64_t* Confirmed(int rank) const;
  static uint64_t Confirmation(uint64_t call, int root);
  static constexpr int kAllAlike = 0xFFFFFF;  // never a rank: Confirmation keeps 24 bits of it
  Status CheckUsable(const char* call) const {
    return failure_.ok() ? Status::Ok() : Unusable(call);
  }
  Status Unusable(const char* call) const;

  // Create's probe: one read of a neighbour's memory; the path stays on only where every rank's
  // read succeeds.
  Status ProbeSingleCopy();
  // kSingleCopyAuto: where every rank has a core, times an allgather and an allreduce both ways
  // on every rank and keeps the single copy for each where it was faster (the slowest rank's
  // best of several runs); where ranks outnumber cores, a broadcast (the mean over ranks).
  Status TimeSingleCopy();
  // Times call() with *threshold at 0 (best[0]) and at its value (best[1]), alternated: this
  // rank's best of several runs each, after untimed runs of both for a while. Leaves
  // *threshold as it was.
  template <typename Call>
  Status TimeBothWays(size_t* threshold, const Call& call, double* best);
  // After a single-copy call's reads: record this rank's outcome (err: an errno, 0 when every
  // read succeeded; from: the rank it failed to read), Sync so that no sender leaves while a
  // receiver still reads, then the same verdict on every rank from every rank's outcome.
  Status FinishSingleCopy(const char* call, const Interrupt* interrupt, int err, int from);
  // Where each rank's part of an AllGather(V) lies: counts == nullptr gives every rank
  // `uniform` elements at offset r * uniform; otherwise counts[r] at offsets[r].
  struct GatherLayout {
    size_t uniform;
    const size_t* counts;
    const size_t* offsets;
    size_t count(int r) const { return counts ? counts[r] : uniform; }
    size_t offset(int r) const { return offsets ? offsets[r] : static_cast<size_t>(r) * uniform; }
  };
  // AllGather(V)'s data path, after the checks: copies this rank's own part, then moves the
  // peers' parts through the window in rounds, or hands them to GatherDirect (single copy)
  // where that applies.
  Status GatherRounds(const void* send, void* recv, const GatherLayout& layout, DType dtype,
                      const Interrupt* interrupt, const CollectiveArgs& a);
  Status GatherDirect(const void* send, void* recv, const GatherLayout& layout, DType dtype,
                      bool stream, const Interrupt* interrupt, const CollectiveArgs& a);
  // AllReduce in single copy (see the top of shm_collectives.cc): each rank sums its shard
  // from its peers' inputs, read in blocks with process_vm_readv, into its own output; Sync;
  // each rank reads every peer's summed shard out of that peer's output.
  // Single-copy Broadcast (see "Single-copy Broadcast" in shm_collectives.cc): every receiver
  // reads the root's buffer with process_vm_readv; the root waits until every receiver is done.
  Status BroadcastDirect(void* buf, size_t bytes, int root, const Interrupt* interrupt,
                         const CollectiveArgs& a);
  // A broadcast of one piece laid across every rank's slot of this stage (see "Broadcast
  // across the slots" in shm_collectives.cc): copies `bytes` of data into the slots (in) or
  // out of them.
  void MoveAcross(unsigned char* data, size_t bytes, int root, bool in) const;
  // A receiver's end of a broadcast whose root's buffer is node-shared (its code): copies it
  // straight, marks its descriptor of call calls_ - 1 copied (the root waits for that mark),
  // moves one stage and leaves the other receivers' descriptors to its next call (Defer).
  Status ReceiveShared(unsigned char* data, size_t bytes, int root, uint64_t code,
                       uint32_t arrival, bool stream, const char* call);
  // The root's wait in BroadcastDirect: until every receiver whose descriptor of call `index`
  // is the root's has marked it copied.
  Status AwaitCopied(const char* call, const Interrupt* interrupt, uint64_t index, int root);
  // The first read failure a rank recorded in its descriptor of call `index`, or OK.
  Status CopyOutcome(const char* call, uint64_t index) const;
  // AllReduce: writes the codes of send's and recv's `bytes` in node-shared memory into this
  // rank's descriptor of the next call (0 where they are not there); whether both are.
  bool PublishShared(const void* send, const void* recv, size_t bytes);
  // How many ranks published both codes for call `index`.
  int SharedRanks(uint64_t index) const;
  // ReduceScatter and AllGather(V) of more than one round, whose peers read this rank's input
  // alone: writes the code of send's `bytes` in node-shared memory into this rank's descriptor
  // of the next call (kNoInput where bytes is 0, 0 where the input lies elsewhere or where
  // `safe` is false: its output overlaps it otherwise than in place), and no output code.
  // Whether the code is there.
  bool PublishSharedInput(const void* send, size_t bytes, bool safe);
  // How many ranks published an input code for call `index`.
  int SharedInputs(uint64_t index) const;
  // Every rank's input of call calls_ - 1 mapped here (shared_ins_), this rank's own as send;
  // the first rank whose code this rank cannot map, or -1.
  int MapSharedInputs(const void* send);
  // ReduceScatter where every rank's input lies in node-shared memory: this rank sums its shard
  // (`mine` elements from element `at`) straight from every rank's input into its output, then
  // Syncs (no input is read any more); the same bits as the window.
  Status ReduceScatterShared(const void* send, void* recv, size_t at, size_t mine, DType dtype,
                             const char* call, const Interrupt* interrupt);
  // AllGather(V) where every rank's input lies in node-shared memory: this rank copies every
  // peer's part straight out of the peer's input, then Syncs.
  Status GatherShared(void* recv, const GatherLayout& layout, DType dtype, bool stream,
                      const char* call, const Interrupt* interrupt);
  // AllReduce where every rank's send and recv lie in node-shared memory (set_regions; the
  // descriptors of call calls_ - 1 carry their codes): each rank sums its shard straight from
  // every rank's input into every rank's output, then Syncs; the same bits as the window.
  Status ReduceShared(const void* send, void* recv, size_t count, DType dtype, const char* call,
                      const Interrupt* interrupt);
  Status ReduceDirect(const void* send, void* recv, size_t count, DType dtype,
                      const Interrupt* interrupt, const CollectiveArgs& a);

  MPI_Comm local_ = MPI_COMM_NULL;
  MPI_Win win_ = MPI_WIN_NULL;
  bool locked_ = false;
  bool separate_model_ = false;  // MPI_WIN_SEPARATE: MPI_Win_sync needed around each Sync
  int rank_ = 0;
  int size_ = 1;
  std::vector<const void*> srcs_;  // one source per rank, for the sums (no per-call allocation)
  std::vector<size_t> offsets_;    // a counts vector's prefix sums (ReduceScatter, AllGatherV)
  size_t chunk_bytes_ = 0;
  size_t slot_bytes_ = 0;
  size_t slot_stride_ = 0;  // slot_bytes_ and the room for a stamp (see MoveAcross)
  size_t single_copy_requested_ = 0;
  Knobs knobs_;
  uint64_t knobs_hash_ = 0;  // of knobs_, in every descriptor (0 while knobs_ is all zero)
  size_t single_copy_bytes_ = 0;  // AllGather(V); 0: the single-copy path is off
  size_t single_copy_reduce_bytes_ = 0;  // AllReduce; 0: off
  size_t single_copy_bcast_bytes_ = 0;  // Broadcast; 0: off
  std::string single_copy_note_;
  std::vector<int> pids_;  // every node rank's process id (single copy only)
  std::vector<unsigned char> direct_blocks_;  // ReduceDirect: one block per peer; GatherDirect
  double timeout_s_ = 0;
  bool crowded_ = false;  // more ranks than cores (the same count on every rank)
  size_t gather_stream_bytes_ = 0;  // an allgather's streaming stores from this size (gathered)
  size_t bcast_stream_bytes_ = 0;   // a broadcast's streaming stores from this size
  size_t across_bytes_ = 0;  // see across_bytes()
  double spin_s_ = 0;  // seconds of plain spinning first (0 when ranks outnumber cores)
  double yield_s_ = 0;  // then seconds of polling with sched_yield before the futex sleep
  bool light_arrivals_ = false;  // plain arrival stores; sleepers run a barrier (see Arrive)
  std::vector<unsigned char*> bases_;  // every rank's segment, mapped here
  uint64_t arrivals_ = 0;              // Sync() calls made so far (same on every rank)
  uint64_t stage_ = 0;                 // pipeline rounds run so far (same on every rank)
  uint64_t calls_ = 0;                 // calls entered so far (same on every rank)
  size_t one_shot_bytes_ = 0;          // AllReduce of at most this many bytes: one Sync
  std::vector<ArgRecord> records_;     // every rank's descriptor of the current call
  // A call that returned before every peer had entered it (a broadcast, see Broadcast): its
  // last arrival and its index (its name is in this rank's descriptor), settled by the next
  // call's Begin.
  bool pending_ = false;
  uint32_t pending_arrival_ = 0;
  uint64_t pending_call_ = 0;
  int pending_root_ = -1;
  int pending_confirmer_ = -1;  // a peer whose confirmation settles the verdict (see Defer)
  bool pending_verdict_ = false;  // its agreement is still to be checked (else only its arrival)
  Status deferred_;  // the settled call failed on the peers: the next Enter tells them
  Status failure_;  // the Sync that timed out or was interrupted: peers in an unknown state
  // Last, so that the members every small call touches keep their places (moving them by 88
  // bytes made a 4-byte allreduce at P = 2 about 0.02 us slower, 10 launches each).
  const SharedRegions* regions_ = nullptr;  // set_regions
  uint64_t shared_calls_ = 0;
  std::vector<const unsigned char*> shared_ins_;  // ReduceShared: every rank's input, mapped
  std::vector<unsigned char*> shared_outs_;       // and output
  std::vector<unsigned char> shared_block_;       // ReduceShared: one block of sums
};

}  // namespace poseidon
