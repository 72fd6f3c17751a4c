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
// Calls of one step (an AllReduce of the one-Sync size, a ReduceScatter or AllGather(V) of one
// round) stamp their slot's head with the call's index and their descriptor's digest, as a
// broadcast root does, and wait for every peer's stamp instead of its arrival (EnterStamped):
// where every stamp carries the rank's own digest, a peer's call costs its stamp line and its
// data instead of its arrival line, its descriptor's two lines and its data. The smallest (an
// AllReduce of up to 48 bytes, a ReduceScatter of up to 48 bytes in all, an AllGather(V) of up to
// 48 bytes per rank: kInlineBytes) put the data on the stamp's line, so a peer's call costs one
// line. Measured at P = 2 on the development VM's family 25 AMD CPU, alternated launches of each
// build, `--no-peer` (bench/RESULTS.md nineteenth pass):
//   - data on the stamp's line, 16 launches each: the launches'
//     third quartile fell from 1.34-1.53 to 1.09-1.16 us (osu_allreduce 4-32 B), 1.23-1.32 to
//     0.78-0.84 us (osu_allgather 8-32 B) and 0.79-1.57 to 0.68-1.27 us (osu_reduce_scatter
//     4-16 B); the medians stayed within 0.12 us or fell;
//   - every call of one step, 12 launches each: the medians fell from
//     1.51-2.78 to 1.40-2.63 us (osu_reduce_scatter 64 B-4 KiB), from 1.34-2.48 to 1.10-2.41 us
//     (osu_allgather 128 B-4 KiB) and from 1.44-3.59 to 1.30-3.53 us (osu_allreduce 64 B-4 KiB).
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
// AllGatherV (AllGather: equal counts; rounds of at most 256 KiB per rank): my own part goes
// straight into recv; copy piece 0 of my input into my slot; Enter; then in round k: copy piece
// k + 1 into my slot and arrive for it, copy every peer's piece k out of its slot, wait for
// every peer's arrival for piece k + 1. A rank's next piece is in place before it reads the
// current one, so a slower peer never waits for a copy-out (on 2 cores at P = 2, 1-16 MiB ran
// up to 10% faster than copy in, Sync, copy out).
//
// Broadcast (pieces of at most 512 KiB, piece k in stage k): the root copies piece k into its
// slot (piece 0 then stamps the slot's head: SlotStamp) and arrives; a receiver arrives, waits
// for the root's arrival alone (for piece 0, or until the stamp is there) and copies piece k
// out. A broadcast of up to 48 bytes lies in the stamp's cache line: the root writes one line of
// its slot and a receiver reads one (at P = 4, 16 B-2 KiB took 0.097-0.144 us against
// 0.107-0.158 us with the whole Stamp on two lines and the data on the next, six alternated
// launches; at P = 2 the receiver's median 0.09-0.096 against 0.095-0.10 us, ten). Nobody waits for
// everybody, except once, before piece 1 (every rank checks every descriptor there, so a
// broadcast of several pieces fails in the call on every rank); the root waits for the
// receivers only before reusing a stage (piece k waits until every receiver has arrived for
// piece k - 2, i.e. is done with piece k - 3). The last piece is not waited for: the next
// call's Begin waits until every peer has arrived for it (except a receiver's next broadcast
// from the same root), and the root settles a one-piece broadcast's agreement there (see the
// header). On 2 cores root and receivers copy at the same time, each piece still in cache:
// 2-4x faster than whole slots in lockstep.
//
// Broadcast across the slots (more than two ranks per core, from kBroadcastPieceBytes up to P
// slots, across_bytes()): one piece, laid across every rank's slot of the stage (part j in the
// slot of rank root + j, each slot having room for the stamp besides its slot_bytes_). The
// root copies the whole buffer in and arrives once; a receiver waits for that arrival alone
// and copies it all out: the way, checks and stage of a broadcast of one piece. Every slot of
// a stage is free for it: when a call starts, every peer is done with the stage three before
// (the invariant that lets a root reuse its own slot). With 8 ranks on 2 cores a piecewise
// broadcast wakes each receiver once per piece and its root waits for the slowest receiver
// before reusing a stage; this wakes each rank once. Measured (osu_broadcast, alternated
// launches, bench/RESULTS.md fifteenth pass): at P = 8, 4 MiB 362-962 against 848-967 us and
// 1 MiB 56-98 against 95-109 us; at P = 4 (two ranks per core) slower, 4 MiB 385-634
// against 257-315 us, where the root's copy of the next piece still runs beside a receiver's.
//
// Single-copy AllGather(V) (from single_copy_bytes_ below kDirectGatherMaxBytes): every rank puts
// its input's address in its descriptor and copies its own part; Enter; each rank reads every
// peer's part with process_vm_readv, peers in the order rank+1, rank+2, ... so that they do not
// all start on the same one (from kGatherStreamBytes in 256 KiB blocks through a block of its
// own, written out with streaming stores); each rank records its outcome in its descriptor;
// Sync; every rank returns the first failure recorded, or OK. Two Syncs whatever the size.
//
// Single-copy AllReduce (from single_copy_reduce_bytes_, above one_shot_bytes_, below
// kDirectReduceMaxBytes): every rank puts its input's and its output's addresses in its
// descriptor; Enter; then per chunk of 1 MiB: (1) each rank sums its shard of the chunk in rank
// order into its output, reading each peer's part of it into a 64 KiB block of its own
// (process_vm_readv) and its own part from its input; Sync; (2) each rank reads every peer's
// summed shard of the chunk out of that peer's output. Then FinishSingleCopy as above. Per byte
// of the buffer a rank moves about 3 bytes instead of the window's 4.5-4.75 (copy in, sum,
// copy out). In place is safe: in (1) a rank writes only its own shard, which no peer reads,
// and in (2) it writes its peers' shards, which the Sync says every peer has summed.
//
// Which of the two ways is faster depends on the CPU and the kernel. Measured here (2 cores,
// bench/RESULTS.md): on the development VM's Intel CPU (2 ranks) the single copy ran gathers
// of 64 KiB-16 MiB 1.1-1.9x and allreduces of 512 KiB-8 MiB 1.25-1.6x faster than the window,
// although process_vm_readv moved 256 KiB 1.8x slower than memcpy did; on its AMD CPU the
// window's pipelined gather rounds ran 1.3-2x faster at 256 KiB-16 MiB. So by default
// (kSingleCopyAuto) Create times both ways of each call on every rank and keeps the faster.
// With ranks outnumbering cores (P = 4, 8 here) the single copy was no faster for gathers and
// up to 1.4x slower for allreduces, so kSingleCopyAuto keeps the window for them there and
// times the broadcast both ways instead.
//
// AllReduce between node-shared buffers (above one_shot_bytes_, where every rank's send and recv
// lie in SharedRegions memory: Backend::AllocShared): every rank publishes its buffers' codes
// in its descriptor (PublishShared) and skips the copy of chunk 0 into the window; Enter; where
// every rank published both codes, each rank sums its shard of the whole buffer in 16 KiB blocks
// straight from every rank's input (mapped here) into a block of its own, written out to every
// rank's output (streaming stores from kReduceStreamBytes); Sync (FinishSingleCopy: every rank
// has its output, no input is read any more). Per byte of the buffer a rank reads each input
// byte once and writes each output byte once, against the window's copy in, sum and copy out
// (2.75 bytes read and 2 written per byte at P = 4). Where only some ranks published codes, those
// copy chunk 0 in after Enter and every rank Syncs once more before the window's rounds. The same
// bits as the window (each element summed in rank order). In place is safe: a shard's input and
// output are touched by its reducer alone, each block read whole before it is written. It takes
// precedence over the single copy too (ReduceDirect checks the codes after its Enter).
// ReduceScatter and AllGather(V) of more than one round: every rank publishes its input's code
// alone (PublishSharedInput; kNoInput for an empty part), and skips the copy of round 0 into the
// window; Enter; where every rank published one, a reduce-scatter sums this rank's shard
// straight from every rank's input into its output (ReduceScatterShared: in rank order, the same
// bits as the window; streaming stores from kScatterStreamBytes of output), an allgather copies
// every peer's part straight out of its input (GatherShared), then FinishSingleCopy's Sync (no
// input is read any more). Per byte of a reduce-scatter's buffer a rank reads 1 / P of every
// input and writes its output, against the window's copy of (P - 1) / P of its input in first.
// Mixed ranks copy round 0 in after Enter, and every rank Syncs once more, as for the allreduce.
// An allgather that would read its peers with process_vm_readv reads node-shared inputs straight
// instead (GatherDirect checks the codes after its Enter).
//
// Single-copy Broadcast (kSingleCopyAuto: where ranks outnumber cores and it ran faster at
// creation, from kAutoBroadcastSingleCopyBytes up to kDirectBroadcastMaxBytes): the root puts its
// buffer's address in its descriptor and arrives; a receiver arrives, waits for the root's arrival
// alone, checks the root's descriptor against its own (as for a broadcast of one piece), reads the
// whole buffer with one process_vm_readv and marks its descriptor copied (waking the root). The
// root waits for every rank's arrival and checks every descriptor (a receiver that disagrees fails
// the call on the root and on itself), then for the mark of every receiver that matched its
// descriptor (those read whatever the verdict): its buffer is theirs until then. A receiver returns
// as soon as it has its data, and the receivers that matched the root learn of another rank's
// disagreement at their next call (Defer), as after a broadcast of one piece. A read that fails
// fails that receiver and the root, naming it; the receivers that read the data return OK. A root
// whose wait times out or is interrupted returns with its window broken (as any rank whose wait
// fails) while receivers may still be reading: if its caller then reuses the buffer, they return OK
// with data it overwrote; the broken root never arrives again, so their next call fails at its
// deadline naming it. Every rank arrives once per call whatever happens, as a broadcast through the
// window does when it fails, so ranks that took different ways because their counts differ all fail
// the call without waiting for a step another will not make. With P ranks on fewer cores this moves
// P - 1 copies of the buffer instead of the window's P, each in one piece instead of 512 KiB pieces
// in step with the root. Waiting for every rank before reading (Enter) made it 1.7-1.9x slower at P
// = 8, 1-4 MiB, and a form that also waited for every rank after reading ran 1.6-2.5x slower than
// the window: with more ranks than cores a receiver that is done should not wait for the others.
//
// Sync: store my arrival count in my control line, wake peers sleeping on it, then wait for
// every peer's count: spin for up to 5 us where ranks have cores and the peer last arrived on
// another core, then poll with sched_yield for up to 200 us (a runnable peer gets the core at
// once), then sleep on the peer's word with a futex (shared, not private: the word lives in a
// mapping of several processes), checking the caller's interrupt, if any, at every wake.
// Large outputs are written with streaming stores: an allreduce's from 16 MiB; a broadcast's and
// an allgather's from 16 MiB, or from where their buffers outgrow a large last-level cache, and
// an allgather's from 8 MiB where ranks outnumber cores (kBroadcastStreamBytes,
// kReduceStreamBytes, kGatherStreamBytes, kCrowdedGatherStreamBytes).
#include "runtime/shm_collectives.h"

#include <linux/futex.h>
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "runtime/agreement.h"
#include "runtime/log.h"
#include "runtime/mpi_backend.h"
#include "runtime/or_agreement.h"
#include "runtime/hash.h"
#include "runtime/shm_reduce.h"
#include "runtime/shm_regions.h"
#include "runtime/spin.h"
#include "runtime/shard.h"

namespace poseidon {
namespace {

constexpr size_t kLineBytes = 128;  // the arrival counter, alone on its cache lines
constexpr uint64_t kStages = 3;
constexpr size_t kOneShotMaxBytes = size_t{32} << 10;
constexpr size_t kOneShotPairBytes = size_t{256} << 10;
// AllGather(V)'s largest round per rank. With the 1 MiB slot, a P = 2 allgather of 2 MiB ran
// at 173-396 us against 84 us in 256 KiB rounds (np 4: 418 against 231 us); 128 KiB rounds
// were slower again.
constexpr size_t kGatherRoundBytes = size_t{256} << 10;
constexpr size_t kMinChunkBytes = 4096;
// ReduceDirect reads its peers' inputs in blocks of this size, one block per peer held at once
// (448 KiB at P = 8: within a core's L2 cache).
constexpr size_t kDirectBlockBytes = size_t{64} << 10;
// ReduceDirect's chunk: every rank's shard of one chunk is summed, then read by its peers, while
// it is still in the caches.
constexpr size_t kDirectChunkBytes = size_t{1} << 20;
// GatherDirect runs below this size (of the gathered buffer). At P = 2 on the development VM's
// older Intel CPU (osu_allgather, both ways alternated, every size's buffers settled first) a
// gather of 32 MiB took 3065-3093 us in single copy against 3687-3849 us through the window's
// streaming rounds (Open MPI's two_proc: 2984-3175 us), and one of 64 MiB 9346-12120 against
// 8671-8709 us; on its family 6 model 207 Intel CPU (osu_allgather -np 2 --no-peer, launches
// alternated, median of the pairs' ratios, bench/RESULTS.md twenty-sixth pass) the single copy
// took 0.84-1.02x the window's time at 64 MiB (faster in 14 of 26 pairs, two sets of launches)
// and 0.88-0.95x at 128 MiB (faster in 22 of 26). Beyond 256 MiB, unmeasured: the window.
constexpr size_t kDirectGatherMaxBytes = size_t{256} << 20;
// GatherDirect from kGatherStreamBytes reads each peer's part in blocks of this size into a
// block of its own, then writes it out with streaming stores.
constexpr size_t kGatherBounceBytes = size_t{256} << 10;
// ReduceDirect runs below this size: at 16 MiB it ran no faster than the window at P = 2 here,
// at 32 and 64 MiB 1.1-1.4x slower (the window's streaming stores move fewer bytes to memory).
constexpr size_t kDirectReduceMaxBytes = size_t{16} << 20;
// TimeSingleCopy's calls: bytes of the allgather's gathered buffer and of the allreduce where
// every rank has a core, of the broadcast where ranks outnumber cores, and the timed runs of
// each way (alternated with the other's, after kWarmUpSeconds of untimed runs).
constexpr size_t kAutoProbeBytes = size_t{1} << 20;
constexpr size_t kAutoBroadcastProbeBytes = size_t{2} << 20;
constexpr int kTimedRuns = 5;
// Untimed runs of both ways come first, for at least this long (and two runs): on the
// development VM's AMD CPU (P = 2, bench/RESULTS.md thirteenth pass) the window's allgather of
// 1 MiB took 120-250 us in the first runs after start-up and 55-65 us after some hundreds of
// them, against 80-95 us in single copy, so that two untimed runs chose the single copy at
// every creation.
constexpr double kWarmUpSeconds = 0.1;
// Where ranks outnumber cores, broadcasts from ShmCollectives::kAutoBroadcastSingleCopyBytes
// (1 MiB) up to kDirectBroadcastMaxBytes may read the root's buffer (see "Single-copy Broadcast"),
// where a broadcast of kAutoBroadcastProbeBytes ran faster that way at creation. Measured
// (4 and 8 ranks on 2 cores, osu_broadcast, mean over ranks, alternated runs, bench/RESULTS.md
// tenth and twelfth passes): on the development VM's Intel CPU, at 1-16 MiB the single copy
// ran 1.03-2.1x faster than the window at P = 8, and at P = 4 even at 1-8 MiB and 1.2-1.3x
// faster at 16 MiB; on its AMD CPU, where process_vm_readv moves a byte 2.5-3x as slowly as
// memcpy (1.4-1.8x on the Intel), the window ran 1.3-1.8x faster at P = 4, 1-16 MiB, and the
// single copy 1.1-1.6x faster at P = 8, 2-8 MiB (1 MiB even, 16 MiB 1.2x slower). At 512 KiB
// the window was as fast at P = 8 and 1.4x faster at P = 4; at 32 and 64 MiB the window, with
// its streaming stores, ran 1.2-1.85x faster: the single copy stops below this size.
constexpr size_t kDirectBroadcastMaxBytes = size_t{32} << 20;
// A broadcast moves pieces of at most this size, paced by its root (see Broadcast). On the
// development VM (2 cores, osu_broadcast --no-peer, 3-5 runs each, bench/RESULTS.md) 512 KiB
// pieces against whole 1 MiB slots: P = 2 at 2 / 8 MiB 62-119 / 234-295 us against 256-266 /
// 995-1030 us; P = 4 at 4 / 16 MiB 324-355 / 1971-2425 against 611-653 / 3132-3399 us;
// 256 KiB pieces were no better.
constexpr size_t kBroadcastPieceBytes = size_t{512} << 10;
// A broadcast through the window writes receivers' outputs of this size and more with streaming
// stores. On the development VM's AMD CPU (osu_broadcast
// --no-peer, alternated runs, bench/RESULTS.md twelfth pass), 16 MiB took 1.9-2.1 against
// 2.6-4.0 ms at P = 2 and 12.8-15.8 against 17.7-21.1 ms at P = 8 (the window's way), at P = 4
// 5.9-10.2 against 6.9-9.7 ms (the runs' spread); from 1 MiB it was slower at 1-4 MiB.
constexpr size_t kBroadcastStreamBytes = size_t{16} << 20;
// Where every rank has a core, a broadcast streams from kBroadcastStreamBytes only once 3 x P
// buffers of its size exceed the last-level cache as sysconf reports it (where it reports none,
// from kBroadcastStreamBytes; Create sets bcast_stream_bytes_): the root's buffer and the
// receivers' outputs, P of them, stay in a cache some times their size, and plain stores into
// it cost less than streaming ones do. The factor 3 is where the measured crossing lies: on the
// development VM's Intel CPU (260 MiB L3 as the guest sees it; osu_broadcast -np 2 --no-peer,
// 12 launches each alternated, median of the pairs' ratios, bench/RESULTS.md twenty-sixth pass)
// plain stores took 0.83x the time of streaming ones at 16 MiB (11 of 12 pairs), 0.92x at
// 32 MiB and 1.17x at 64 MiB (12 of 12); with the AMD CPU's 32 MiB L3 the rule keeps
// kBroadcastStreamBytes.
// An allgather through the window writes its gathered output with streaming stores from this
// size. On the development VM's AMD CPU (osu_allgather --no-peer, alternated runs, the window
// forced, bench/RESULTS.md thirteenth pass) 16 MiB took 3200-3830 against 4360-7470 us at P = 2
// and 13110-13740 against 15380-18900 us at P = 8, at P = 4 6120-8920 against 7380-7580 us
// (the runs' spread); at 8 MiB (P = 2) 1350-1760 against 1590-1840 us, one set of runs.
// From this size a rank's own part is copied with streaming stores too, and the single copy
// reads each peer's part in blocks and writes them out with streaming stores (GatherDirect). On
// the VM's family 25 AMD CPU (osu_allgather --no-peer, launches alternated, median of the pairs'
// ratios, bench/RESULTS.md twenty-first pass) that ran 1.04 / 1.13 / 1.23x as fast as plain
// stores at 16 / 32 / 64 MiB at P = 2 (30 launches), 1.04-1.12x at P = 4 and 1.02-1.06x at P = 8
// (own part only: the window).
constexpr size_t kGatherStreamBytes = size_t{16} << 20;
// Where ranks outnumber cores, from this size instead: the slots of all ranks share the caches
// too. There 8 MiB ran 1.19x (P = 4, 12 launches) and 1.20x (P = 8, 10) as fast with streaming
// stores; at P = 2, each rank on a core, 0.82x (30 launches), where the two outputs and inputs
// (24 MiB) stay in the 32 MiB L3.
constexpr size_t kCrowdedGatherStreamBytes = size_t{8} << 20;
// Where every rank has a core, an allgather streams from kGatherStreamBytes only once the
// node's outputs and inputs, (P + 1) x the gathered bytes, exceed the last-level cache as
// sysconf reports it (where it reports none, from kGatherStreamBytes; Create sets
// gather_stream_bytes_). In single copy, streaming costs a second copy (the kernel's into a
// block of this rank's, then out), which plain stores into a cache that holds it all do not
// repay. On the development VM's Intel CPU (family 6 model 207, 260 MiB L3 as the guest sees
// it; osu_allgather -np 2 --no-peer, launches alternated, medians, bench/RESULTS.md
// twenty-sixth pass) plain stores took 1787-2074 against 2678-2987 us with streaming at 16 MiB
// per rank, were even at 32 MiB per rank (through the window) and 1.15x slower at 64 MiB; with
// the AMD CPU's 32 MiB L3 the rule keeps kGatherStreamBytes.
// An allreduce through the window writes its output with streaming stores from this size. From
// 16 MiB a rank's output cannot be in the last-level cache by the time it is read: the ranks'
// outputs together fill the 32 MiB one at P = 2 and exceed it beyond. Below it, plain stores: the
// output is read soon (the caller's next step) and may still be in that cache; on the 2-core VM
// (bench/RESULTS.md twelfth pass) streaming from 4 MiB made 4-8 MiB 1.2-1.9x slower. On the VM's
// family 25 AMD CPU (osu_allreduce --no-peer, launches alternated, bench/RESULTS.md twentieth
// pass), 16 MiB took in the median of 8 launches 7.9 against 10.9 ms at P = 2, 15.8 against
// 21.0 ms at P = 4 and 46.6 against 55.4 ms at P = 8 (6 launches); at 2-8 MiB streaming was
// within the runs' spread at P = 2 and 4. On its family 26 CPU 16 MiB at P = 4 was within the
// spread (4100-6410 against 4280-4960 us, seventeenth pass).
constexpr size_t kReduceStreamBytes = size_t{16} << 20;
// A reduce-scatter summed straight from node-shared inputs writes its output with streaming
// stores from this size (of the output).
constexpr size_t kScatterStreamBytes = size_t{8} << 20;
// Where ranks outnumber cores, an allgather of more than this many bytes (the gathered buffer)
// takes the window even from node-shared inputs. On the development VM's family 25 AMD CPU
// (osu_allgather --no-peer, launches alternated, bench/RESULTS.md twenty-fourth pass) reading
// them straight ran 1.1-1.4x faster at 4-16 MiB at P = 4, even at 32 MiB, and 1.05x slower at
// 64 MiB (15.5-15.9 against 14.6-14.8 ms); at P = 8 even at 4-32 MiB, 1.08x slower at 64 MiB.
constexpr size_t kCrowdedGatherSharedMaxBytes = size_t{32} << 20;
// An allreduce through the window moves chunks of at most this size (of each rank's slot), one
// pipeline stage each. A rank's step reads a whole chunk (its shard from every rank, then every
// reduced shard): at 512 KiB it stays in a core's L2 on the VM's family 25 AMD CPU (512 KiB),
// at 1 MiB it does not. There (osu_allreduce --no-peer, launches alternated, medians,
// bench/RESULTS.md twentieth pass) 512 KiB chunks against 1 MiB took 13.6 against 18.9 ms at
// 16 MiB and P = 4, 4.1 against 5.6 ms at 4 MiB, 56.5 against 73.8 ms at 64 MiB (10 launches);
// at P = 2 7.1 against 11.0 ms at 16 MiB and 1.8 against 2.3 ms at 4 MiB; at P = 8 32.2
// against 40.6 ms at 16 MiB, within the spread at 1-4 MiB (6 launches). On its family 26 CPU
// (1 MiB L2) the two were even (seventeenth pass: 16 / 32 / 64 MiB at P = 4 in 3576-4632 /
// 7466-7715 / 14516-14916 us against 3781-3842 / 7348-9258 / 14593-16399 us).
constexpr size_t kReducePieceBytes = size_t{512} << 10;
// ReduceShared sums a rank's shard in blocks of this size, each written out to every rank.
constexpr size_t kSharedBlockBytes = size_t{16} << 10;
// A descriptor's copy_errno where ReduceShared could not map a peer's buffers.
constexpr int32_t kUnknownRegion = -1;
// A descriptor's shared_source where the rank gives no input (an AllGatherV count of 0): never a
// code (SharedRegions's codes are at least 2^40).
constexpr uint64_t kNoInput = 1;
// Whether [a, a + an) and [b, b + bn) share no byte.
inline bool Disjoint(const void* a, size_t an, const void* b, size_t bn) {
  const auto* x = static_cast<const unsigned char*>(a);
  const auto* y = static_cast<const unsigned char*>(b);
  return x + an <= y || y + bn <= x;
}

// ceil(n / per), without the division in the common case of one part: a 64-bit division
// costs tens of cycles, on the path of every small call before its data moves.
inline size_t Parts(size_t n, size_t per) {
  return n <= per ? (n > 0 ? 1 : 0) : (n + per - 1) / per;
}

}  // namespace

// What identifies a call on a rank: its name and argument record. A rank's descriptor starts
// with it, and a broadcast root stamps it at the head of its slot, beside the data, so that a
// receiver checks the call on the cache lines it reads anyway (see Broadcast).
struct ShmCollectives::Stamp {
  ArgRecord record;
  char call[24];
  // The call's index (calls_, the same on every rank): a stamp left in a slot by an earlier
  // call never passes for this one's (a root that fails before its data moves writes none).
  uint64_t index;
  uint64_t knobs_hash;  // the publishing rank's knobs_hash_ (see set_knobs)
  // The same call with the same arguments (and the same "bad" flag) and settings: the same
  // bytes, since Publish pads the name with zeros and the fields leave no padding between them.
  bool Alike(const Stamp& o) const {
    static_assert(sizeof(Stamp) ==
                      sizeof(ArgRecord) + sizeof(call) + sizeof(index) + sizeof(knobs_hash),
                  "Stamp::Alike compares bytes: no padding allowed");
    return std::memcmp(this, &o, sizeof(Stamp)) == 0;
  }
  // 64 bits of everything but the index, for a broadcast's slot head (SlotStamp): each word
  // times its own odd constant, xored, then mixed (independent multiplies, no chain). Stamps
  // that differ in one word always differ here (each product is a bijection of its word);
  // two that differ in several words collide with a chance of about 2^-64.
  uint64_t Digest() const {
    constexpr size_t kWords = sizeof(Stamp) / 8;
    static_assert(sizeof(Stamp) % 8 == 0, "whole words");
    uint64_t w[kWords];
    std::memcpy(w, this, sizeof(Stamp));
    w[offsetof(Stamp, index) / 8] = 0;
    uint64_t h = 0;
    for (size_t i = 0; i < kWords; ++i) h ^= w[i] * (0x9e3779b97f4a7c15ull * (2 * i + 1));
    return Mix64(h);
  }
};

namespace {
// The head of a broadcast's slot (piece 0), written by the root after the data: the call's
// index + 1 (never 0, never an earlier call's: a root that fails before its data moves writes
// none), last and with release order, so a receiver that reads it there has the data, and the
// digest of the root's Stamp, which a receiver compares with its own instead of the whole Stamp.
// The data of a broadcast of up to kInlineBytes shares its cache line (see Broadcast).
struct SlotStamp {
  uint64_t mark;
  uint64_t digest;
};
}  // namespace

// One call's descriptor as a rank publishes it (plain data: it lives in the shared window).
struct ShmCollectives::Descriptor : Stamp {
  char message[216];  // this rank's own argument error when record.bad, else its detail
  // Single copy: the address of this rank's source buffer in its own address space, then the
  // outcome of its reads (an errno, 0 when all succeeded, and the rank it failed to read).
  uint64_t source;
  uint64_t target;  // AllReduce only: the address of this rank's output
  // AllReduce above the one-Sync size: the codes of this rank's input and output in node-shared
  // memory (SharedRegions::Encode), 0 where they lie elsewhere.
  uint64_t shared_source;
  uint64_t shared_target;
  int32_t copy_errno;
  int32_t copy_from;
  // Broadcast in single copy: a receiver's mark that it has read the root's buffer in this
  // call (Copied(index)), once copy_errno and copy_from hold its outcome.
  uint32_t copied;
  // 1 where this rank's bad status is a failure it carries from its previous call (Enter),
  // not its own arguments' (see Begin). Not compared.
  int32_t carried;
  Knobs knobs;  // the values knobs_hash stands for, for the error that names them
};

namespace {
// The control area: the counter line, then kDescPlaces descriptors; slots start 64-byte
// aligned.
constexpr size_t kDescBytes = 384;  // one descriptor's place
// Call c's descriptor lives in place c % 4: three are needed (see the header), a fourth makes
// the place a mask of the index instead of a division.
constexpr uint64_t kDescPlaces = 4;
static_assert((kDescPlaces & (kDescPlaces - 1)) == 0, "a power of two");
constexpr size_t kControlBytes = (kLineBytes + kDescPlaces * kDescBytes + 63) / 64 * 64;
// A broadcast piece's data starts this far into its slot, on the line after the root's
// SlotStamp (piece 0's only; the others leave it unused), except in a broadcast of one piece of
// up to kInlineBytes, whose data follows the SlotStamp on its line: a receiver then reads one
// line of the root's slot, and the root writes one.
constexpr size_t kStampBytes = 64;
constexpr size_t kInlineBytes = kStampBytes - sizeof(SlotStamp);
// A call's own input up to this size goes from the core's caches to the shared one once written
// to the window (Demote), for the peers to read.
constexpr size_t kDemoteBytes = 1024;
}  // namespace

// The arrival word of a rank: the low 32 bits of its arrival count (a futex word; compared
// with wrap-around), in the next word how many peers sleep on it, then the core it last
// arrived on (where waiters may spin), then 1 once the rank has left (its window freed: see
// Left); at byte 16 of the same line, Confirmed.
namespace {
inline uint32_t* Word(volatile uint64_t* counter) {
  return reinterpret_cast<uint32_t*>(const_cast<uint64_t*>(counter));
}
// Moves the cache lines of [p, p + bytes) out of this core's own caches into the cache the cores
// share (CLDEMOTE), so that a peer that reads them later takes them from there instead of from
// this core. A hint: a processor without the instruction runs it as a NOP.
inline void Demote(const void* p, size_t bytes) {
#if defined(__x86_64__)
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + bytes;
  for (uintptr_t line = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63}; line < end; line += 64) {
    asm volatile("cldemote %0" : : "m"(*reinterpret_cast<const char*>(line)));
  }
#else
  (void)p;
  (void)bytes;
#endif
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
// The barrier a sleeper runs for light arrivals (see ShmCollectives::Arrive): a full memory
// barrier on every core that runs a thread of a registered process (membarrier(2), Linux 4.16
// and later). Registration is per process and permanent; it fails where the kernel or a
// seccomp filter refuses the call.
inline bool RegisterForWaiterBarrier() {
  static const bool registered = [] {
    long supported = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    if (supported < 0 || !(supported & MEMBARRIER_CMD_GLOBAL_EXPEDITED)) return false;
    return syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0, 0) == 0;
  }();
  return registered;
}
inline bool WaiterBarrier() {
  return syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0) == 0;
}
// The rank has left for good: set after its last arrival, so an arrival it has not reached
// when this reads true will never come.
inline bool Left(uint32_t* word) { return __atomic_load_n(word + 3, __ATOMIC_ACQUIRE) != 0; }
// A waiter's second phase: yields the core while polling `word` (seen: its last value) until
// done(value), until the rank whose arrival word is `arrivals` has left, or for `seconds`.
// A peer that is runnable gets the core at once, and one that gets there within `seconds` is
// seen without a futex round trip (whose wake-up costs ~10 us on a virtual machine). Returns
// the last value read.
template <typename Done>
uint32_t YieldPoll(uint32_t* word, uint32_t seen, uint32_t* arrivals, double seconds, Done done) {
  if (seconds <= 0 || done(seen)) return seen;
  const auto start = std::chrono::steady_clock::now();
  do {
    sched_yield();
    seen = __atomic_load_n(word, __ATOMIC_ACQUIRE);
  } while (!done(seen) && !Left(arrivals) && SecondsSince(start) < seconds);
  return seen;
}
// The ranks in [lo, hi) for which waiting(rank) holds, as "1, 4, 5" (a timeout's message).
template <typename Waiting>
std::string RanksWhere(int lo, int hi, Waiting waiting) {
  std::string out;
  for (int r = lo; r < hi; ++r) {
    if (waiting(r)) out += StrCat(out.empty() ? "" : ", ", r);
  }
  return out;
}
}  // namespace

Result<std::unique_ptr<ShmCollectives>> ShmCollectives::Create(MPI_Comm comm, size_t chunk_bytes,
                                                               double timeout_s,
                                                               size_t single_copy_bytes) {
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

  // Agree on the chunk size and the single-copy threshold before anyone allocates
  // (runtime/or_agreement.h).
  // The same round says whether every rank can take part in light arrivals (see Arrive): a
  // waiter's barrier reaches only the processes that registered for it.
  uint64_t agreed[5];
  or_agreement::PutValue(agreed, chunk_bytes);
  or_agreement::PutValue(agreed + 2, single_copy_bytes);
  agreed[4] = RegisterForWaiterBarrier() ? 0 : 1;
  PSD_CHECK(or_agreement::OrAllReduce(s->local_, agreed, 5,
                                      MpiWait{nullptr, "ShmCollectives::Create"}, nullptr));
  s->light_arrivals_ = agreed[4] == 0 && size > 1;
  for (int i = 0; i < 2; ++i) {
    if (or_agreement::AllSame(agreed + 2 * i)) continue;
    // Rare: gather every rank's value to name them.
    const uint64_t mine = i == 0 ? chunk_bytes : single_copy_bytes;
    const char* name = i == 0 ? "POSEIDON_SHM_CHUNK_BYTES" : "POSEIDON_SHM_SINGLE_COPY_BYTES";
    std::vector<uint64_t> all(static_cast<size_t>(size));
    rc = MPI_Allgather(&mine, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, s->local_);
    if (rc != MPI_SUCCESS) {
      return MpiError(StrCat("ShmCollectives: MPI_Allgather(", name, ")").c_str(), rc);
    }
    std::vector<std::optional<std::string>> values;
    for (uint64_t v : all) values.push_back(std::to_string(v));
    return MismatchError("ShmCollectives: ", name, " differs across ranks (",
                         GroupRanksByValue(values), "); expected the same value on every rank");
  }
  PSD_REQUIRE_ARG(chunk_bytes >= kMinChunkBytes, "ShmCollectives: POSEIDON_SHM_CHUNK_BYTES is ",
                  chunk_bytes, "; expected at least ", kMinChunkBytes);
  s->chunk_bytes_ = chunk_bytes;
  // Room for one 8-byte element per rank region (reduce-scatter), 64-byte aligned slots.
  size_t slot = std::max(chunk_bytes, static_cast<size_t>(size) * 64);
  s->slot_bytes_ = (slot + 63) / 64 * 64;
  // Each slot has a head for a broadcast's stamp besides its slot_bytes_ (SlotHead).
  s->slot_stride_ = s->slot_bytes_ + kStampBytes;
  size_t segment = kControlBytes + kStages * s->slot_stride_;
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
  PSD_ASSIGN_OR_RETURN(bool any_failed,
                       or_agreement::RaisedAnywhere(s->local_, rc != MPI_SUCCESS,
                                                    "ShmCollectives: window allocation check"));
  if (any_failed) {
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
  __atomic_store_n(Word(s->Counter(rank)) + 3, 0u, __ATOMIC_RELEASE);
  __atomic_store_n(s->Confirmed(rank), 0, __ATOMIC_RELEASE);
  // A few microseconds of plain spinning cover a peer that is running on another core and
  // nearly there (P = 2 here, 4-64 B: some runs 0.43-0.47 us with it, none below 0.63 us with
  // yield-polling alone); only where every rank can have a core, and only while the awaited
  // peer last arrived on another core than the waiter's: where the scheduler has put two
  // ranks on one core, a spinning waiter holds the core its peer needs (4.3-4.6 us against
  // 1.75-1.97 us; Open MPI's allreduce took 1.7-1.8 us there).
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  s->spin_s_ = (cores > 0 && size <= cores) ? 5e-6 : 0;
  // Then yield-polling: at 4 and 8 ranks on 2 cores, 64 B - 64 KiB allreduces ran 2-3.5x
  // faster with 100-400 us of it than with the futex sleep straight away (bench/RESULTS.md).
  s->yield_s_ = 200e-6;
  s->single_copy_requested_ = single_copy_bytes;
  const bool automatic = single_copy_bytes == kSingleCopyAuto;
  // Every rank of the window counts the same cores (one node, one count for the system).
  const bool crowded = cores > 0 && size > cores;
  s->crowded_ = crowded;
  // Streaming stores from `least` bytes, or where every rank has a core, from the smallest size
  // of which `buffers` buffers exceed the last-level cache, if that is more (see
  // kGatherStreamBytes and kBroadcastStreamBytes).
  const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  auto stream_from = [&](size_t least, size_t buffers) {
    if (crowded || llc <= 0) return least;
    return std::max(least, static_cast<size_t>(llc) / buffers + 1);
  };
  s->gather_stream_bytes_ = stream_from(crowded ? kCrowdedGatherStreamBytes : kGatherStreamBytes,
                                        static_cast<size_t>(size) + 1);
  s->bcast_stream_bytes_ = stream_from(kBroadcastStreamBytes, 3 * static_cast<size_t>(size));
  if (cores > 0 && size > 2 * cores) {
    s->across_bytes_ = std::min(static_cast<size_t>(size) * s->slot_bytes_,
                                kBroadcastStreamBytes - 1);
  }
  if (single_copy_bytes > 0 && size > 1) {
    PSD_CHECK(s->ProbeSingleCopy());
    if (!s->single_copy_note_.empty()) {
      // The probe turned it off (the note says why).
    } else if (!automatic) {
      s->single_copy_bytes_ = single_copy_bytes;
      s->single_copy_reduce_bytes_ = single_copy_bytes;
      s->single_copy_bcast_bytes_ = single_copy_bytes;
    } else if (crowded) {
      // With more ranks than cores the single-copy allgather and allreduce were no faster than
      // the window (up to 1.4x slower); the broadcast is timed both ways (TimeSingleCopy).
      s->single_copy_bcast_bytes_ = kAutoBroadcastSingleCopyBytes;
    } else {
      s->single_copy_bytes_ = kAutoGatherSingleCopyBytes;
      s->single_copy_reduce_bytes_ = kAutoSingleCopyBytes;
    }
  }
  MPI_Win_sync(s->win_);
  // Everyone's counter is zero before anyone increments it.
  rc = MPI_Barrier(s->local_);
  if (rc != MPI_SUCCESS) return MpiError("ShmCollectives: MPI_Barrier", rc);
  if (automatic && (s->single_copy_bytes_ > 0 || s->single_copy_bcast_bytes_ > 0)) {
    PSD_CHECK(s->TimeSingleCopy());
  }
  return s;
}

ShmCollectives::~ShmCollectives() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (pending_ && failure_.ok()) {
    // The last call returned early: its verdict has nowhere to go but the log.
    Status settled = Begin("ShmCollectives", nullptr);
    if (!settled.ok()) {
      PSD_LOG(kWarn, "ShmCollectives: ", settled.ToString());
    } else if (!deferred_.ok()) {
      PSD_LOG(kWarn, "ShmCollectives: the last collective on this communicator",
              deferred_.message());
    }
  }
  if (locked_) {
    // Leaving: a peer still waiting for an arrival of this rank would wait in vain (this rank
    // skipped a call its peers made), so it fails at once instead of at its timeout. Every
    // arrival this rank made comes before the flag; sleepers on the word wake to see it.
    uint32_t* mine = Word(Counter(rank_));
    __atomic_store_n(mine + 3, 1u, __ATOMIC_SEQ_CST);
    FutexWakeAll(mine);
    MPI_Win_unlock_all(win_);
  }
  if (win_ != MPI_WIN_NULL) MPI_Win_free(&win_);
  if (local_ != MPI_COMM_NULL) MPI_Comm_free(&local_);
}

unsigned char* ShmCollectives::SlotHead(int rank, uint64_t stage) const {
  return bases_[static_cast<size_t>(rank)] + kControlBytes + (stage % kStages) * slot_stride_;
}

unsigned char* ShmCollectives::Slot(int rank, uint64_t stage) const {
  return SlotHead(rank, stage) + kStampBytes;
}

unsigned char* ShmCollectives::InlineData(int rank, uint64_t stage) const {
  return SlotHead(rank, stage) + sizeof(SlotStamp);
}

volatile uint64_t* ShmCollectives::Counter(int rank) const {
  return reinterpret_cast<volatile uint64_t*>(bases_[static_cast<size_t>(rank)]);
}

uint64_t* ShmCollectives::Confirmed(int rank) const {
  return reinterpret_cast<uint64_t*>(bases_[static_cast<size_t>(rank)] + 16);
}

uint64_t ShmCollectives::Confirmation(uint64_t call, int root) {
  return ((call + 1) << 24) | static_cast<uint64_t>(root);
}

ShmCollectives::Descriptor* ShmCollectives::Desc(int rank, uint64_t call) const {
  static_assert(sizeof(Descriptor) <= kDescBytes, "descriptor larger than its place");
  return reinterpret_cast<Descriptor*>(bases_[static_cast<size_t>(rank)] + kLineBytes +
                                       (call & (kDescPlaces - 1)) * kDescBytes);
}

Status ShmCollectives::Unusable(const char* call) const {
  return AbortedError(call, ": an earlier shared-memory collective on this communicator failed (",
                      failure_.ToString(),
                      "), so the node peers are in an unknown state; recreate the communicator");
}

uint32_t ShmCollectives::Arrive() {
  const uint32_t target = static_cast<uint32_t>(++arrivals_);
  if (separate_model_) MPI_Win_sync(win_);
  uint32_t* mine = Word(Counter(rank_));
  if (spin_s_ > 0) {
    __atomic_store_n(mine + 2, static_cast<uint32_t>(sched_getcpu()), __ATOMIC_RELAXED);
  }
  // Then wake the peers that went to sleep waiting for this arrival. The store of the arrival
  // and the load of the sleeper count must not pass each other, against the sleeper's
  // increment-then-recheck, or each side could miss the other. A light arrival orders them
  // for the compiler only: the store is a plain one, which the core does not wait for (a
  // seq_cst store waits until every peer's copy of the line is gone: a root that broadcasts
  // returns that much later). The sleeper makes up for it with a barrier on every core that
  // runs a rank (WaiterBarrier) between its increment and its recheck: a store still pending
  // when its load ran has landed by then, and a load that runs after the barrier sees the
  // increment.
  if (light_arrivals_) {
    __atomic_store_n(mine, target, __ATOMIC_RELEASE);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(mine + 1, __ATOMIC_RELAXED) != 0) FutexWakeAll(mine);
  } else {
    __atomic_store_n(mine, target, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(mine + 1, __ATOMIC_SEQ_CST) != 0) FutexWakeAll(mine);
  }
  // Every peer reads this line next; one that comes later takes it from the shared cache.
  Demote(mine, 1);
  return target;
}

bool ShmCollectives::Arrived(int peer, uint32_t target) const {
  if (separate_model_) return false;
  return Reached(__atomic_load_n(Word(Counter(peer)), __ATOMIC_ACQUIRE), target);
}

bool ShmCollectives::AllArrived(uint32_t target) const {
  if (separate_model_) return false;
  bool all = true;
  for (int r = 0; r < size_; ++r) {
    all &= r == rank_ || Reached(__atomic_load_n(Word(Counter(r)), __ATOMIC_ACQUIRE), target);
  }
  return all;
}

Status ShmCollectives::Sync(const char* call, const Interrupt* interrupt) {
  return Await(call, interrupt, Arrive(), -1);
}

Status ShmCollectives::Interrupted(const char* call, const Interrupt* interrupt) {
  if (interrupt == nullptr) return Status::Ok();
  Status s = interrupt->Check();
  if (s.ok()) return s;
  failure_ = s.WithPrefix(StrCat(call, ": "));
  return failure_;
}

Status ShmCollectives::Await(const char* call, const Interrupt* interrupt, uint32_t target,
                             int only) {
  // The clock is read only once a peer is found missing: a Sync whose peers are all there
  // already (the common case of small back-to-back calls) reads none.
  std::chrono::steady_clock::time_point start;
  bool started = false;
  const int lo = only < 0 ? 0 : only, hi = only < 0 ? size_ : only + 1;  // the ranks awaited
  for (int r = lo; r < hi; ++r) {
    if (r == rank_) continue;
    uint32_t* word = Word(Counter(r));
    uint32_t seen = __atomic_load_n(word, __ATOMIC_ACQUIRE);
    if (!started && !Reached(seen, target)) {
      start = std::chrono::steady_clock::now();
      started = true;
    }
    // Spin briefly where the peer runs on another core (see Create).
    if (spin_s_ > 0 && !Reached(seen, target) &&
        __atomic_load_n(word + 2, __ATOMIC_RELAXED) != static_cast<uint32_t>(sched_getcpu())) {
      auto spin_start = std::chrono::steady_clock::now();
      do {
        for (int i = 0; i < 16 && !Reached(seen, target); ++i) {
          CpuRelax();
          seen = __atomic_load_n(word, __ATOMIC_ACQUIRE);
        }
      } while (!Reached(seen, target) && SecondsSince(spin_start) < spin_s_);
    }
    // Then yield the core while polling.
    auto reached = [target](uint32_t v) { return Reached(v, target); };
    seen = YieldPoll(word, seen, word, yield_s_, reached);
    while (!Reached(seen, target)) {
      if (Left(word)) {
        // Its arrivals all come before the flag: read the word once more after seeing it.
        seen = __atomic_load_n(word, __ATOMIC_ACQUIRE);
        if (Reached(seen, target)) break;
        failure_ = AbortedError(call, ": node rank ", r, " left (freed its shared-memory window: "
                                "its communicator or backend was destroyed) while rank ", rank_,
                                " waited for it at shared-memory step ", target,
                                "; it skipped a collective that this rank called");
        return failure_;
      }
      // Sleep in the kernel until the peer's arrival changes its word, or 50 ms pass to check
      // the timeout (10 ms under an interrupt, which must be seen soon after it fires).
      __atomic_fetch_add(word + 1, 1u, __ATOMIC_SEQ_CST);
      long sleep_ns = interrupt ? 10000000L : 50000000L;
      // A light arrival needs the barrier (see Arrive); where it fails, a missed wake-up
      // costs at most a short sleep.
      if (light_arrivals_ && !WaiterBarrier()) sleep_ns = 1000000L;
      seen = __atomic_load_n(word, __ATOMIC_SEQ_CST);
      if (!Reached(seen, target)) FutexWait(word, seen, sleep_ns);
      __atomic_fetch_sub(word + 1, 1u, __ATOMIC_SEQ_CST);
      seen = __atomic_load_n(word, __ATOMIC_ACQUIRE);
      if (Reached(seen, target)) break;
      if (Status st = Interrupted(call, interrupt); !st.ok()) return st;
      if (timeout_s_ > 0 && SecondsSince(start) > timeout_s_) {
        const std::string missing = RanksWhere(lo, hi, [&](int q) {
          return q != rank_ &&
                 !Reached(__atomic_load_n(Word(Counter(q)), __ATOMIC_ACQUIRE), target);
        });
        failure_ = TimeoutError(call, ": rank ", rank_, " waited ", timeout_s_,
                                " s (POSEIDON_SHM_TIMEOUT_S) at shared-memory step ", target,
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
// A call's name into its place, the rest of the place zeros (Stamp::Alike compares bytes).
template <size_t N>
void CopyName(char (&dst)[N], const char* src) {
  char padded[N] = {};
  std::memcpy(padded, src, std::min(N - 1, std::strlen(src)));
  std::memcpy(dst, padded, N);
}
std::string ReadString(const char* src, size_t cap) { return std::string(src, strnlen(src, cap)); }
std::string KnobsText(const ShmCollectives::Knobs& k) {
  return StrCat(k.threshold, " / ", k.chunk, " / ", k.single_copy);
}

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
// Whether the caller's description of a call with a counts vector vouches for the counts: its
// own checks passed on the same world (the backend's CheckCounted: one entry per rank, a sum
// that fits) and its count is their sum (DescribeCounted), so neither is done twice.
bool Described(const CollectiveArgs* args, const std::vector<size_t>& counts, int world) {
  return args != nullptr && args->local.ok() && counts.size() == static_cast<size_t>(world);
}
}  // namespace

void ShmCollectives::set_knobs(const Knobs& k) {
  knobs_ = k;
  const uint64_t words[3] = {static_cast<uint64_t>(k.threshold), static_cast<uint64_t>(k.chunk),
                             static_cast<uint64_t>(k.single_copy)};
  knobs_hash_ = k == Knobs{} ? 0 : Mix64(HashWords(words, 3));
}

void ShmCollectives::Publish(const CollectiveArgs& args) {
  Descriptor* mine = Desc(rank_, calls_);
  mine->record = RecordOf(args);
  mine->index = calls_;
  mine->knobs_hash = knobs_hash_;
  mine->knobs = knobs_;
  mine->carried = 0;
  CopyName(mine->call, args.call);
  if (!args.local.ok()) {
    CopyString(mine->message, sizeof(mine->message), args.local.message().c_str());
  } else if (mine->record.detail_hash != 0) {
    CopyString(mine->message, sizeof(mine->message), args.detail);
  }
}

Status ShmCollectives::Enter(const CollectiveArgs& args, const Interrupt* interrupt) {
  const uint64_t call = calls_;
  if (!deferred_.ok() && !args.local.ok()) {
    // This call fails on every rank anyway, with this rank's own error, which its caller needs
    // more; the earlier failure has already reached every rank (see Broadcast).
    PSD_LOG(kWarn, args.call, ": the previous collective on this communicator",
            deferred_.message());
    deferred_ = Status::Ok();
  }
  if (!deferred_.ok()) {
    // This rank's previous call failed on its peers after it had returned (see Broadcast):
    // this call carries that failure to every rank as this rank's own bad argument.
    CollectiveArgs failed = args;
    failed.local =
        deferred_.WithPrefix(StrCat(args.call, ": the previous collective on this communicator"));
    deferred_ = Status::Ok();
    Publish(failed);
    Desc(rank_, calls_)->carried = 1;
    PSD_CHECK(Sync(args.call, interrupt));
    ++calls_;
    return FailedStages(Verdict(failed, call));
  }
  Publish(args);
  const uint32_t target = Arrive();
  // Every peer compares this descriptor's stamp with its own next (Verdict).
  Demote(Desc(rank_, call), sizeof(Stamp));
  PSD_CHECK(Await(args.call, interrupt, target, -1));
  ++calls_;
  return FailedStages(Verdict(args, call));
}

uint64_t ShmCollectives::StampHead(uint64_t index) {
  SlotStamp* stamp = reinterpret_cast<SlotStamp*>(SlotHead(rank_, stage_));
  const uint64_t digest = Desc(rank_, index)->Digest();
  stamp->digest = digest;
  __atomic_store_n(&stamp->mark, index + 1, __ATOMIC_RELEASE);
  return digest;
}

Status ShmCollectives::AwaitStamp(const char* call, const Interrupt* interrupt, int peer,
                                  uint64_t index, uint64_t digest, uint32_t target, bool* alike) {
  // Once the peer has arrived, its stamp is there if it wrote one.
  const SlotStamp* theirs = reinterpret_cast<const SlotStamp*>(SlotHead(peer, stage_));
  if (__atomic_load_n(&theirs->mark, __ATOMIC_ACQUIRE) != index + 1 && !Arrived(peer, target)) {
    PSD_CHECK(Await(call, interrupt, target, peer));
  }
  *alike = __atomic_load_n(&theirs->mark, __ATOMIC_ACQUIRE) == index + 1 &&
           theirs->digest == digest;
  return Status::Ok();
}

Status ShmCollectives::EnterStamped(const CollectiveArgs& args, const Interrupt* interrupt) {
  // A failure to carry, or this rank's own bad arguments: Enter, which stamps nothing, so that
  // every peer takes the long way below.
  if (!deferred_.ok() || !args.local.ok()) return Enter(args, interrupt);
  const uint64_t index = calls_;
  Publish(args);
  const uint64_t digest = StampHead(index);
  const uint32_t target = Arrive();
  Demote(SlotHead(rank_, stage_), kStampBytes);
  bool alike = true;
  for (int r = 0; r < size_ && alike; ++r) {
    if (r != rank_) PSD_CHECK(AwaitStamp(args.call, interrupt, r, index, digest, target, &alike));
  }
  if (!alike) {
    // If every stamp carried this rank's digest, every rank's is the same: a rank that finds
    // one that differs knows every rank finds one. All reach the verdict from the descriptors.
    PSD_CHECK(Await(args.call, interrupt, target, -1));
    ++calls_;
    return FailedStages(Verdict(args, index));
  }
  ++calls_;
  return Status::Ok();
}

Status ShmCollectives::Verdict(const CollectiveArgs& args, uint64_t call) {
  // Every rank reads the same descriptors, so every rank reaches the same verdict. The common
  // case first: every descriptor the same as this rank's, none bad.
  const Descriptor* own = Desc(rank_, call);
  bool alike = own->record.bad == 0;
  for (int r = 0; r < size_ && alike; ++r) alike = r == rank_ || Desc(r, call)->Alike(*own);
  if (alike) return Status::Ok();
  const Descriptor* first = Desc(0, call);
  // Settings first: ranks that hold different ones may have called differently because of them.
  std::string knobs;
  for (int r = 1; r < size_; ++r) {
    const Descriptor* d = Desc(r, call);
    if (d->knobs_hash != first->knobs_hash) {
      knobs += StrCat("; rank ", r, ": ", KnobsText(d->knobs));
    }
  }
  if (!knobs.empty()) {
    return MismatchError(args.call, ": the ranks' shared-memory settings differ "
                         "(POSEIDON_SHM_THRESHOLD_BYTES / _CHUNK_BYTES / _SINGLE_COPY_BYTES in "
                         "force, rank 0: ", KnobsText(first->knobs), knobs,
                         "); expected the same on every rank: they are agreed settings, so set "
                         "them on every rank alike, between the same two calls");
  }
  std::string differing;
  bool any_bad = false;
  for (int r = 0; r < size_; ++r) {
    const Descriptor* d = Desc(r, call);
    records_[static_cast<size_t>(r)] = d->record;
    any_bad = any_bad || d->record.bad != 0;
    if (r != 0 && std::strncmp(d->call, first->call, sizeof(d->call)) != 0) {
      differing += StrCat(", rank ", r, ": ", ReadString(d->call, sizeof(d->call)));
    }
  }
  // A rank that failed its own checks (or joined through FailTogether, whatever its peers
  // called) is the cause: ArgsVerdict names it and its message first.
  if (!differing.empty() && !any_bad) {
    return MismatchError(args.call, ": ranks called different collectives (rank 0: ",
                         ReadString(first->call, sizeof(first->call)), differing,
                         "); expected the same call on every rank");
  }
  return ArgsVerdict(args, records_, [&](int r) {
    const Descriptor* d = Desc(r, call);
    return ReadString(d->message, sizeof(d->message));
  });
}

Status ShmCollectives::Settle(const char* call, const Interrupt* interrupt) {
  // The previous call returned before its peers had checked it (see Broadcast): wait until
  // every peer has entered it, then reach the verdict they reached. Until then no peer can
  // have moved past it, so its descriptors are still in place.
  if (!AllArrived(pending_arrival_)) PSD_CHECK(Await(call, interrupt, pending_arrival_, -1));
  pending_ = false;
  if (!pending_verdict_) return Status::Ok();
  if (pending_root_ >= 0) {
    // A broadcast: every receiver that found the root's descriptor equal to its own said so
    // on its arrival line (after its arrival: one that has not yet is read as not confirmed,
    // which only takes the longer way below). Where all did, every descriptor is the root's:
    // the verdict is OK without reading them.
    const uint64_t expected = Confirmation(pending_call_, pending_root_);
    bool all = true;
    for (int r = 0; r < size_ && all; ++r) {
      if (r == rank_ || r == pending_root_) continue;
      all = __atomic_load_n(Confirmed(r), __ATOMIC_ACQUIRE) == expected;
    }
    if (all) return Status::Ok();
  } else if (pending_confirmer_ >= 0 &&
             __atomic_load_n(Confirmed(pending_confirmer_), __ATOMIC_ACQUIRE) ==
                 Confirmation(pending_call_, kAllAlike)) {
    // A reduce-scatter this rank left early: a rank that sums found every descriptor alike
    // and said so on the arrival line just read (one that has not yet takes the longer way).
    return Status::Ok();
  }
  // Its name as this rank published it (the call that returned early).
  const Descriptor* own = Desc(rank_, pending_call_);
  const std::string name = ReadString(own->call, sizeof(own->call));
  CollectiveArgs mine;
  mine.call = name.c_str();
  Status verdict = Verdict(mine, pending_call_);
  if (!verdict.ok() && OnlyCarriers(pending_call_)) {
    // The ranks that refused the call were carrying an earlier call's failure into it; this
    // rank, which returned early from it, failed that earlier call itself (else it would be
    // carrying too), and every other rank failed this one. Carrying it on would fail one more
    // call, and with roots that rotate, one more after that for ever.
    PSD_LOG(kInfo, name, ": the peers refused this call, carrying the failure of the one "
            "before; every rank has failed one of the two");
    return Status::Ok();
  }
  if (!verdict.ok()) {
    // The stage it moved stays moved: the peers that failed it moved one too (FailedStages).
    deferred_ = Status(verdict.code(), StrCat(" (", name,
                                              ") returned here before its peers found: ",
                                              verdict.message()));
  }
  return Status::Ok();
}

namespace {
// Copies n bytes at `remote` in process pid to `local` with process_vm_readv, in as many calls
// as it takes (the kernel may move fewer bytes than asked). Returns 0, or the errno of the
// failed call (EFAULT for a read that moved nothing).
int ReadPeer(int pid, void* local, uint64_t remote, size_t n) {
  unsigned char* dst = static_cast<unsigned char*>(local);
  while (n > 0) {
    iovec to{dst, n};
    iovec from{reinterpret_cast<void*>(static_cast<uintptr_t>(remote)), n};
    ssize_t got = process_vm_readv(pid, &to, 1, &from, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return errno;
    if (got == 0) return EFAULT;
    dst += got;
    remote += static_cast<uint64_t>(got);
    n -= static_cast<size_t>(got);
  }
  return 0;
}
uint64_t ProbeValue(int rank) { return 0x5053445052424F45ull ^ static_cast<uint64_t>(rank); }
}  // namespace

Status ShmCollectives::ProbeSingleCopy() {
  // Every rank's process id and the address of a word holding a value only it has; each rank
  // reads its next neighbour's word. The word outlives every peer's read: a rank leaves this
  // function only after the agreement below, which needs every rank's outcome.
  volatile uint64_t word = ProbeValue(rank_);
  uint64_t mine[2] = {static_cast<uint64_t>(getpid()),
                      static_cast<uint64_t>(reinterpret_cast<uintptr_t>(&word))};
  std::vector<uint64_t> all(2 * static_cast<size_t>(size_));
  int rc = MPI_Allgather(mine, 2, MPI_UINT64_T, all.data(), 2, MPI_UINT64_T, local_);
  if (rc != MPI_SUCCESS) return MpiError("ShmCollectives: MPI_Allgather(process ids)", rc);
  pids_.resize(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) pids_[static_cast<size_t>(r)] = static_cast<int>(all[2 * r]);
  const int next = (rank_ + 1) % size_;
  uint64_t got = 0;
  int err = ReadPeer(pids_[static_cast<size_t>(next)], &got, all[2 * next + 1], sizeof(got));
  // Another process with the peer's pid (ranks in separate pid namespaces) holds another value.
  const bool failed = err != 0 || got != ProbeValue(next);
  PSD_ASSIGN_OR_RETURN(bool any_failed,
                       or_agreement::RaisedAnywhere(local_, failed,
                                                    "ShmCollectives: single-copy probe"));
  if (!any_failed) return Status::Ok();
  if (failed) {
    single_copy_note_ = StrCat("process_vm_readv of node rank ", next, " failed here (",
                               err != 0 ? std::strerror(err) : "another process has its pid", ")");
  } else {
    single_copy_note_ = "the probe failed on another node rank";
  }
  PSD_LOG(kInfo, "ShmCollectives: single-copy allgathers are off: ",
          single_copy_note_, "; the window carries them");
  return Status::Ok();
}

template <typename Call>
Status ShmCollectives::TimeBothWays(size_t* threshold, const Call& call, double* best) {
  const size_t on = *threshold;
  best[0] = best[1] = 1e30;
  const auto start = std::chrono::steady_clock::now();
  for (int timed = 0, run = 0; timed < kTimedRuns; ++run) {
    // The two ways alternate run by run, so that neither has the machine's quieter moments to
    // itself. Each call starts on every rank at once, after an allreduce of one element (back
    // to back, a broadcast's root runs ahead of its receivers into the next call), which also
    // says whether any rank has warmed up for kWarmUpSeconds: the same answer on every rank.
    bool timing = false;
    for (int way = 0; way < 2; ++way) {
      *threshold = way == 1 ? on : 0;
      float past = run >= 2 && SecondsSince(start) >= kWarmUpSeconds ? 1.0f : 0.0f, any = 0.0f;
      Status st = AllReduce(&past, &any, 1, DType::kFloat32);
      if (way == 0) timing = any > 0;
      if (st.ok()) {
        const auto begin = std::chrono::steady_clock::now();
        st = call();
        if (timing) best[way] = std::min(best[way], SecondsSince(begin));
      }
      if (!st.ok()) {
        *threshold = on;
        return st.WithPrefix("ShmCollectives: timing the single-copy path");
      }
    }
    if (timing) ++timed;
  }
  *threshold = on;
  return Status::Ok();
}

Status ShmCollectives::TimeSingleCopy() {
  // Per call, this rank's best time through the window, then in single copy.
  double best[4] = {0, 0, 0, 0};
  if (crowded_) {
    const size_t n = kAutoBroadcastProbeBytes / sizeof(float);
    std::vector<float> buf(n, 1.0f);
    PSD_CHECK(TimeBothWays(
        &single_copy_bcast_bytes_,
        [&] { return Broadcast(buf.data(), n, DType::kFloat32, 0); }, best));
  } else {
    const size_t n = kAutoProbeBytes / sizeof(float);
    const size_t per_rank = n / static_cast<size_t>(size_);
    std::vector<float> in(n, 1.0f), out(n);
    PSD_CHECK(TimeBothWays(
        &single_copy_bytes_,
        [&] { return AllGather(in.data(), out.data(), per_rank, DType::kFloat32); }, best));
    PSD_CHECK(TimeBothWays(
        &single_copy_reduce_bytes_,
        [&] { return AllReduce(in.data(), out.data(), n, DType::kFloat32); }, best + 2));
  }
  // Every rank's times through the window (its deadline, and a peer that stops answering
  // named): every rank holds the same, so keeps the same ways.
  const size_t gather = std::exchange(single_copy_bytes_, 0);
  std::vector<double> all(4 * static_cast<size_t>(size_));
  Status st = AllGather(best, all.data(), 4, DType::kFloat64);
  if (!st.ok()) return st.WithPrefix("ShmCollectives: gathering the single-copy times");
  double slowest[4] = {0, 0, 0, 0}, mean[4] = {0, 0, 0, 0};
  for (size_t i = 0; i < all.size(); ++i) {
    slowest[i % 4] = std::max(slowest[i % 4], all[i]);
    mean[i % 4] += all[i] / size_;
  }
  auto way = [](size_t on) { return on > 0 ? "single copy" : "window"; };
  if (crowded_) {
    // A broadcast's receivers return at different times (in single copy each as soon as it
    // has read the root's buffer): what callers wait on is the mean over ranks.
    if (mean[1] >= mean[0]) single_copy_bcast_bytes_ = 0;
    single_copy_note_ = StrCat(
        "ranks outnumber cores: allgathers and allreduces through the window; broadcast of ",
        kAutoBroadcastProbeBytes >> 20, " MiB measured at creation (mean over ranks) ",
        static_cast<int>(mean[0] * 1e6), " us through the window, ",
        static_cast<int>(mean[1] * 1e6), " us in single copy: ", way(single_copy_bcast_bytes_),
        single_copy_bcast_bytes_ > 0 ? StrCat(" from ", single_copy_bcast_bytes_ >> 20, " MiB")
                                     : std::string());
  } else {
    single_copy_bytes_ = slowest[1] < slowest[0] ? gather : 0;
    if (slowest[3] >= slowest[2]) single_copy_reduce_bytes_ = 0;
    single_copy_note_ = StrCat(
        "measured at creation (", kAutoProbeBytes >> 10, " KiB, slowest rank): allgather ",
        static_cast<int>(slowest[0] * 1e6), " us through the window, ",
        static_cast<int>(slowest[1] * 1e6), " us in single copy: ", way(single_copy_bytes_),
        "; allreduce ", static_cast<int>(slowest[2] * 1e6), " / ",
        static_cast<int>(slowest[3] * 1e6), " us: ", way(single_copy_reduce_bytes_));
  }
  PSD_LOG(kInfo, "ShmCollectives: ", single_copy_note_);
  return Status::Ok();
}

Status ShmCollectives::FinishSingleCopy(const char* call, const Interrupt* interrupt, int err,
                                        int from) {
  const uint64_t index = calls_ - 1;  // the call Enter has just agreed on
  Descriptor* mine = Desc(rank_, index);
  mine->copy_errno = err;
  mine->copy_from = from;
  PSD_CHECK(Sync(call, interrupt));
  // Every rank reads the same outcomes, so every rank returns the same status.
  return CopyOutcome(call, index);
}

namespace {
// A single-copy read that failed: node rank `reader` could not read node rank `from`'s buffer.
Status CopyError(const char* call, int reader, int from, int err) {
  return BackendError(call, ": node rank ", reader, " could not read node rank ", from,
                      "'s buffer (process_vm_readv: ", std::strerror(err),
                      "); expected a buffer of the agreed size on every rank");
}
}  // namespace

Status ShmCollectives::CopyOutcome(const char* call, uint64_t index) const {
  for (int r = 0; r < size_; ++r) {
    const Descriptor* d = Desc(r, index);
    if (d->copy_errno == kUnknownRegion) {
      return InvalidArgument(call, ": node rank ", r, " cannot map node rank ", d->copy_from,
                             "'s buffers in node-shared memory (AllocShared / FreeShared must "
                             "be called on every rank alike, in the same order)");
    }
    if (d->copy_errno != 0) return CopyError(call, r, d->copy_from, d->copy_errno);
  }
  return Status::Ok();
}

Status ShmCollectives::Agree(const CollectiveArgs& args, const Interrupt* interrupt) {
  PSD_CHECK(Begin(args.call, interrupt));
  return Enter(args, interrupt);
}

Status ShmCollectives::AllReduce(const void* send, void* recv, size_t count, DType dtype,
                                 const Interrupt* interrupt, const CollectiveArgs* args) {
  const char* call = "AllReduce";
  const CollectiveArgs own{call, static_cast<int64_t>(count), static_cast<int64_t>(dtype), -1, 0,
                           CheckDType(call, dtype)};
  const CollectiveArgs& a = args != nullptr ? *args : own;
  PSD_CHECK(Begin(call, interrupt));
  // A rank with bad arguments, or nothing to move, only takes part in the agreement.
  if (!a.local.ok() || count == 0) return Enter(a, interrupt);
  const size_t es = DTypeSize(dtype);
  const unsigned char* in = static_cast<const unsigned char*>(send);
  unsigned char* out = static_cast<unsigned char*>(recv);
  std::vector<const void*>& srcs = srcs_;

  if (count * es <= one_shot_bytes_) {
    // The smallest lie beside the stamp, on the one line a peer reads (EnterStamped).
    const bool inline_data = count * es <= kInlineBytes;
    auto place = [&](int r) { return inline_data ? InlineData(r, stage_) : Slot(r, stage_); };
    std::memcpy(place(rank_), in, count * es);
    if (!inline_data && count * es <= kDemoteBytes) Demote(place(rank_), count * es);
    PSD_CHECK(EnterStamped(a, interrupt));
    for (int r = 0; r < size_; ++r) {
      srcs[static_cast<size_t>(r)] = r == rank_ ? send : place(r);
    }
    ShmReduceSum(dtype, srcs.data(), size_, recv, count);
    ++stage_;
    return Status::Ok();
  }

  if (single_copy_reduce_bytes_ > 0 && count * es >= single_copy_reduce_bytes_ &&
      count * es < kDirectReduceMaxBytes) {
    PublishShared(send, recv, count * es);
    return ReduceDirect(send, recv, count, dtype, interrupt, a);
  }
  const size_t per_chunk = std::min(slot_bytes_, kReducePieceBytes) / es;
  const size_t chunks = (count + per_chunk - 1) / per_chunk;
  const bool stream = count * es >= kReduceStreamBytes;

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

  const bool mine_shared = PublishShared(send, recv, count * es);
  const uint64_t first = stage_;
  if (!mine_shared) copy_in(0, first);
  PSD_CHECK(Enter(a, interrupt));
  const int shared = SharedRanks(calls_ - 1);
  if (shared == size_) return ReduceShared(send, recv, count, dtype, call, interrupt);
  if (shared > 0) {
    // Some ranks' buffers are shared and some not: the window, its first chunk copied in by
    // every rank before anyone reduces it.
    if (mine_shared) copy_in(0, first);
    PSD_CHECK(Sync(call, interrupt));
  }
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

namespace {
// The first rank with something to receive (there is one: the caller checks the total).
int FirstSumming(const std::vector<size_t>& counts) {
  int q = 0;
  while (counts[static_cast<size_t>(q)] == 0) ++q;
  return q;
}
}  // namespace

Status ShmCollectives::ReduceScatter(const void* send, void* recv,
                                     const std::vector<size_t>& counts, DType dtype,
                                     const Interrupt* interrupt, const CollectiveArgs* args) {
  const char* call = "ReduceScatter";
  const bool described = Described(args, counts, size_);
  const Status local = described ? Status::Ok() : CheckCounted(call, counts, dtype, size_);
  const size_t total = described ? static_cast<size_t>(args->count) : SumCounts(counts);
  const CollectiveArgs own =
      args != nullptr ? CollectiveArgs{} : CountedArgs(call, counts, dtype, local);
  const CollectiveArgs& a = args != nullptr ? *args : own;
  PSD_CHECK(Begin(call, interrupt));
  if (!a.local.ok() || !local.ok() || total == 0) return Enter(a, interrupt);
  const size_t es = DTypeSize(dtype);
  // Where ranks outnumber cores, a round moves at most kReducePieceBytes of the slot in all: two
  // ranks share a core's L2. On the development VM's family 25 AMD CPU (osu_reduce_scatter
  // --no-peer, launches alternated, bench/RESULTS.md twentieth pass) that ran 1.14-1.36x faster
  // at P = 4, 2-64 MiB (10 launches), and 1.35-1.62x at P = 8, 2-32 MiB (8 launches), in the
  // pairs' median; at P = 2 (a core each) 512 KiB slots were no faster.
  const size_t round_bytes = crowded_ ? std::min(slot_bytes_, kReducePieceBytes) : slot_bytes_;
  const size_t piece = round_bytes / es / static_cast<size_t>(size_);  // L, at least 8
  PrefixOffsets(counts, &offsets_);  // in place: no allocation per call
  const std::vector<size_t>& off = offsets_;
  const size_t largest = *std::max_element(counts.begin(), counts.end());
  const size_t rounds = Parts(largest, piece);
  // The smallest: my whole input beside my stamp, on the one line a peer reads (EnterStamped).
  const bool inline_data = rounds == 1 && total * es <= kInlineBytes;
  const bool demote = rounds == 1 && total * es <= kDemoteBytes;
  const unsigned char* in = static_cast<const unsigned char*>(send);
  unsigned char* out = static_cast<unsigned char*>(recv);
  std::vector<const void*>& srcs = srcs_;
  auto piece_len = [&](int q, size_t k) {
    size_t c = counts[static_cast<size_t>(q)], start = k * piece;
    return start >= c ? 0 : std::min(piece, c - start);
  };

  // Ranks with nothing to receive return once their pieces are in place (see below) in a call
  // of one round where ranks outnumber cores or at P = 2.
  const bool empty_leave_early = rounds == 1 && (crowded_ || size_ == 2);
  // Round k's pieces of my input for my peers into my slot of its stage.
  auto copy_in = [&](size_t k) {
    unsigned char* slot = Slot(rank_, stage_ + k);
    for (int q = 0; q < size_; ++q) {
      size_t len = piece_len(q, k);
      if (q == rank_ || len == 0) continue;
      std::memcpy(slot + static_cast<size_t>(q) * piece * es,
                  in + (off[static_cast<size_t>(q)] + k * piece) * es, len * es);
      if (demote) Demote(slot + static_cast<size_t>(q) * piece * es, len * es);
    }
  };
  // More than one round: every rank says where its input lies (see "Node-shared buffers" in
  // shm_collectives.cc). In place (my output is my shard of my input), or an output apart from
  // the input, the peers may read my input while I write my output.
  const size_t my_count = counts[static_cast<size_t>(rank_)];
  const bool mine_shared =
      rounds > 1 &&
      PublishSharedInput(send, total * es,
                         out == in + off[static_cast<size_t>(rank_)] * es ||
                             Disjoint(in, total * es, out, my_count * es));
  for (size_t k = 0; k < rounds; ++k) {
    const uint64_t stage = stage_ + k;
    if (inline_data) {
      std::memcpy(InlineData(rank_, stage), in, total * es);
    } else if (k > 0 || !mine_shared) {
      copy_in(k);
    }
    if (empty_leave_early && counts[static_cast<size_t>(rank_)] == 0 && deferred_.ok()) {
      // Nothing comes to me, and ranks outnumber cores or my only peer does all the summing:
      // once my pieces are in place I go, as a broadcast's root does (the verdict and my peers'
      // reads are settled at my next call), leaving the core to the ranks that sum. At P = 4
      // on 2 cores, going through Enter made 4 and 8 B 1.2-2.5x slower. At P = 2 (counts
      // {1, 0}) returning early took 0.22-0.55 us against 0.60-1.12 us through Enter
      // (osu_reduce_scatter -m 4:16 -i 20000 with a barrier after each run, four alternated
      // launches, bench/RESULTS.md fifteenth pass; before that barrier it measured slower, its
      // next call paying the settling). With more than two ranks on their own cores, the
      // ranks that sum wait for every peer anyway.
      const uint64_t index = calls_;
      Publish(a);
      StampHead(index);
      const uint32_t arrival = Arrive();
      Demote(SlotHead(rank_, stage_), kStampBytes);
      ++calls_;
      ++stage_;
      // The first rank that sums confirms the call for me (below) if every descriptor, mine
      // included, is alike: mine says which rank that is only if it is.
      Defer(arrival, index, true, -1, FirstSumming(counts));
      return Status::Ok();
    }
    PSD_CHECK(k > 0 ? Sync(call, interrupt)
                    : rounds == 1 ? EnterStamped(a, interrupt) : Enter(a, interrupt));
    if (k == 0 && rounds > 1) {
      const int shared = SharedInputs(calls_ - 1);
      if (shared == size_) {
        return ReduceScatterShared(send, recv, off[static_cast<size_t>(rank_)], my_count, dtype,
                                   call, interrupt);
      }
      if (shared > 0) {
        // Some inputs are shared and some not: the window, its first round copied in by every
        // rank before anyone sums it.
        if (mine_shared) copy_in(0);
        PSD_CHECK(Sync(call, interrupt));
      }
    }
    if (empty_leave_early && FirstSumming(counts) == rank_ &&
        std::find(counts.begin(), counts.end(), size_t{0}) != counts.end()) {
      // Every descriptor is alike (Enter): the ranks with nothing to receive, which returned
      // early (above), settle the verdict at their next call by this mark on the line they
      // read for my arrival anyway, instead of reading every descriptor's lines.
      __atomic_store_n(Confirmed(rank_), Confirmation(calls_ - 1, kAllAlike), __ATOMIC_RELEASE);
    }
    size_t mine = piece_len(rank_, k);
    if (mine == 0) continue;  // my slice is shorter than the longest: nothing left to sum
    for (int r = 0; r < size_; ++r) {
      srcs[static_cast<size_t>(r)] =
          r == rank_     ? in + (off[static_cast<size_t>(rank_)] + k * piece) * es
          : inline_data ? InlineData(r, stage) + off[static_cast<size_t>(rank_)] * es
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
  const CollectiveArgs& a = args != nullptr ? *args : own;
  PSD_CHECK(Begin(a.call, interrupt));
  if (!a.local.ok() || !own.local.ok() || count == 0) return Enter(a, interrupt);
  // Every rank's count is this one: no counts vector, no offsets (small gathers are all
  // per-call overhead).
  return GatherRounds(send, recv, {count, nullptr, nullptr}, dtype, interrupt, a);
}

Status ShmCollectives::AllGatherV(const void* send, void* recv, const std::vector<size_t>& counts,
                                  DType dtype, const Interrupt* interrupt,
                                  const CollectiveArgs* args) {
  const char* call = "AllGatherV";
  const bool described = Described(args, counts, size_);
  const Status local = described ? Status::Ok() : CheckCounted(call, counts, dtype, size_);
  const size_t total = described ? static_cast<size_t>(args->count) : SumCounts(counts);
  const CollectiveArgs own =
      args != nullptr ? CollectiveArgs{} : CountedArgs(call, counts, dtype, local);
  const CollectiveArgs& a = args != nullptr ? *args : own;
  PSD_CHECK(Begin(a.call, interrupt));
  if (!a.local.ok() || !local.ok() || total == 0) return Enter(a, interrupt);
  PrefixOffsets(counts, &offsets_);  // in place: no allocation per call
  const std::vector<size_t>& off = offsets_;
  return GatherRounds(send, recv, {0, counts.data(), off.data()}, dtype, interrupt, a);
}

Status ShmCollectives::GatherRounds(const void* send, void* recv, const GatherLayout& layout,
                                    DType dtype, const Interrupt* interrupt,
                                    const CollectiveArgs& a) {
  size_t largest = 0, total = 0;
  for (int r = 0; r < size_; ++r) {
    largest = std::max(largest, layout.count(r));
    total += layout.count(r);
  }
  const size_t es = DTypeSize(dtype);
  const size_t count = layout.count(rank_);
  const unsigned char* in = static_cast<const unsigned char*>(send);
  unsigned char* out = static_cast<unsigned char*>(recv);
  // My own part never goes through the window.
  unsigned char* my_out = out + layout.offset(rank_) * es;
  const bool stream = total * es >= gather_stream_bytes_;
  if (count > 0 && my_out != in) {
    const size_t n = count * es;
    if (stream && (in + n <= my_out || my_out + n <= in)) {
      CopyOut(my_out, in, n, true);
    } else {
      std::memmove(my_out, in, n);
    }
  }
  // Rounds of at most kGatherRoundBytes per rank, whatever the slot: a round's copies (mine
  // in, every peer's out) then stay within a core's L2 cache.
  const size_t per_round = std::min(slot_bytes_, kGatherRoundBytes) / es;
  const size_t rounds = Parts(largest, per_round);
  const bool direct = single_copy_bytes_ > 0 && total * es >= single_copy_bytes_ &&
                      total * es < kDirectGatherMaxBytes;
  // More than one round: every rank says where its input lies (see "Node-shared buffers" in
  // shm_collectives.cc); in place, or an output apart from the input, the peers may read it
  // while this rank writes its output.
  // Where ranks outnumber cores, gathers beyond kCrowdedGatherSharedMaxBytes take the window
  // even so (below).
  const bool mine_shared =
      (direct || rounds > 1) &&
      PublishSharedInput(send, count * es,
                         (in == my_out || Disjoint(in, count * es, out, total * es)) &&
                             !(crowded_ && total * es > kCrowdedGatherSharedMaxBytes));
  if (direct) return GatherDirect(send, recv, layout, dtype, stream, interrupt, a);
  auto piece_len = [&](size_t c, size_t k) {
    size_t start = k * per_round;
    return start >= c ? 0 : std::min(per_round, c - start);
  };
  // The smallest: every rank's part beside its stamp, on the one line a peer reads
  // (EnterStamped).
  const bool inline_data = rounds == 1 && largest * es <= kInlineBytes;
  auto place = [&](int r, uint64_t stage) {
    return inline_data ? InlineData(r, stage) : Slot(r, stage);
  };
  auto copy_in = [&](size_t k) {
    const size_t len = piece_len(count, k);
    if (len > 0) std::memcpy(place(rank_, stage_ + k), in + k * per_round * es, len * es);
  };
  if (!mine_shared) copy_in(0);
  if (rounds == 1 && !inline_data && count * es <= kDemoteBytes) {
    Demote(Slot(rank_, stage_), count * es);
  }
  PSD_CHECK(rounds == 1 ? EnterStamped(a, interrupt) : Enter(a, interrupt));
  if (rounds > 1) {
    const int shared = SharedInputs(calls_ - 1);
    if (shared == size_) return GatherShared(recv, layout, dtype, stream, a.call, interrupt);
    if (shared > 0) {
      // Some inputs are shared and some not: the window, its first round copied in by every
      // rank before anyone reads it.
      if (mine_shared) copy_in(0);
      PSD_CHECK(Sync(a.call, interrupt));
    }
  }
  uint32_t next = 0;
  for (size_t k = 0; k < rounds; ++k) {
    const uint64_t stage = stage_ + k;
    if (k > 0) PSD_CHECK(Await(a.call, interrupt, next, -1));
    // My next piece goes in before I read this round's: peers that are waiting for it can go
    // on while I copy. Its stage last held round k - 2, which every peer is done with: it has
    // arrived for round k.
    if (k + 1 < rounds) {
      copy_in(k + 1);
      next = Arrive();
    }
    for (int r = 0; r < size_; ++r) {
      const size_t n = piece_len(layout.count(r), k);
      if (r == rank_ || n == 0) continue;
      CopyOut(out + (layout.offset(r) + k * per_round) * es, place(r, stage), n * es, stream);
    }
  }
  if (stream) StreamFence();
  stage_ += rounds;
  return Status::Ok();
}

Status ShmCollectives::GatherDirect(const void* send, void* recv, const GatherLayout& layout,
                                    DType dtype, bool stream, const Interrupt* interrupt,
                                    const CollectiveArgs& a) {
  const size_t es = DTypeSize(dtype);
  unsigned char* out = static_cast<unsigned char*>(recv);
  // The descriptor Enter publishes carries my input's address.
  Desc(rank_, calls_)->source = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(send));
  PSD_CHECK(Enter(a, interrupt));
  const uint64_t index = calls_ - 1;
  if (SharedInputs(index) == size_) {
    return GatherShared(recv, layout, dtype, stream, a.call, interrupt);
  }
  if (stream && direct_blocks_.size() < kGatherBounceBytes) {
    direct_blocks_.resize(kGatherBounceBytes);
  }
  int err = 0, from = -1;
  for (int j = 1; j < size_ && err == 0; ++j) {
    const int r = (rank_ + j) % size_;
    const size_t n = layout.count(r) * es;
    unsigned char* dst = out + layout.offset(r) * es;
    const uint64_t src = Desc(r, index)->source;
    if (!stream) {
      if (n > 0) err = ReadPeer(pids_[static_cast<size_t>(r)], dst, src, n);
    } else {
      // Through a block that stays in this core's cache, then out with streaming stores.
      for (size_t b = 0; b < n && err == 0; b += kGatherBounceBytes) {
        const size_t len = std::min(kGatherBounceBytes, n - b);
        err = ReadPeer(pids_[static_cast<size_t>(r)], direct_blocks_.data(), src + b, len);
        if (err == 0) CopyOut(dst + b, direct_blocks_.data(), len, true);
      }
    }
    if (err != 0) from = r;
  }
  if (stream) StreamFence();
  return FinishSingleCopy(a.call, interrupt, err, from);
}

bool ShmCollectives::PublishShared(const void* send, const void* recv, size_t bytes) {
  // A rank whose send and recv overlap without being the same buffer takes the other ways,
  // where that is safe.
  const auto* in = static_cast<const unsigned char*>(send);
  const auto* out = static_cast<const unsigned char*>(recv);
  uint64_t send_code = 0, recv_code = 0;
  if (regions_ != nullptr && (in == out || Disjoint(in, bytes, out, bytes))) {
    send_code = regions_->Encode(send, bytes);
    recv_code = send_code != 0 ? regions_->Encode(recv, bytes) : 0;
  }
  Descriptor* own = Desc(rank_, calls_);
  own->shared_source = send_code;
  own->shared_target = recv_code;
  return send_code != 0 && recv_code != 0;
}

int ShmCollectives::SharedRanks(uint64_t index) const {
  int shared = 0;
  for (int r = 0; r < size_; ++r) {
    const Descriptor* d = Desc(r, index);
    shared += d->shared_source != 0 && d->shared_target != 0 ? 1 : 0;
  }
  return shared;
}

bool ShmCollectives::PublishSharedInput(const void* send, size_t bytes, bool safe) {
  uint64_t code = 0;
  if (bytes == 0) {
    code = kNoInput;
  } else if (regions_ != nullptr && safe) {
    code = regions_->Encode(send, bytes);
  }
  Descriptor* own = Desc(rank_, calls_);
  own->shared_source = code;
  own->shared_target = 0;
  return code != 0;
}

int ShmCollectives::SharedInputs(uint64_t index) const {
  int shared = 0;
  for (int r = 0; r < size_; ++r) shared += Desc(r, index)->shared_source != 0 ? 1 : 0;
  return shared;
}

int ShmCollectives::MapSharedInputs(const void* send) {
  const uint64_t index = calls_ - 1;
  std::vector<const unsigned char*>& ins = shared_ins_;
  ins.resize(static_cast<size_t>(size_));
  int unknown = -1;
  for (int r = 0; r < size_; ++r) {
    const uint64_t code = Desc(r, index)->shared_source;
    const size_t i = static_cast<size_t>(r);
    if (r == rank_) {
      ins[i] = static_cast<const unsigned char*>(send);
    } else if (code == kNoInput) {
      ins[i] = nullptr;  // nothing to read there
    } else {
      ins[i] = regions_ != nullptr ? regions_->Address(code, r) : nullptr;
      if (ins[i] == nullptr && unknown < 0) unknown = r;
    }
  }
  return unknown;
}

Status ShmCollectives::ReduceScatterShared(const void* send, void* recv, size_t at, size_t mine,
                                           DType dtype, const char* call,
                                           const Interrupt* interrupt) {
  // Regions are allocated and freed collectively, so every rank maps every live one: a code this
  // rank cannot map means the ranks did not allocate or free alike (every rank returns that
  // error, CopyOutcome).
  const int unknown = MapSharedInputs(send);
  if (unknown >= 0) return FinishSingleCopy(call, interrupt, kUnknownRegion, unknown);
  ++shared_calls_;
  if (mine > 0) {
    // Every rank's part of my shard, summed in rank order (the window's order) straight into my
    // output. In place (my output is my input's shard) is safe: no peer reads my shard of my
    // input, and each element is read before it is written.
    const size_t es = DTypeSize(dtype);
    std::vector<const void*>& srcs = srcs_;
    if (mine * es < kScatterStreamBytes) {
      for (int r = 0; r < size_; ++r) {
        srcs[static_cast<size_t>(r)] = shared_ins_[static_cast<size_t>(r)] + at * es;
      }
      ShmReduceSum(dtype, srcs.data(), size_, recv, mine);
    } else {
      // Summed block by block into a block of mine (it stays in this core's L1), written out
      // with streaming stores.
      if (shared_block_.size() < kSharedBlockBytes) shared_block_.resize(kSharedBlockBytes);
      unsigned char* out = static_cast<unsigned char*>(recv);
      const size_t per_block = kSharedBlockBytes / es;
      for (size_t b = 0; b < mine; b += per_block) {
        const size_t n = std::min(per_block, mine - b);
        for (int r = 0; r < size_; ++r) {
          srcs[static_cast<size_t>(r)] = shared_ins_[static_cast<size_t>(r)] + (at + b) * es;
        }
        ShmReduceSum(dtype, srcs.data(), size_, shared_block_.data(), n);
        CopyOut(out + b * es, shared_block_.data(), n * es, true);
      }
      StreamFence();
    }
  }
  // Nobody returns (and reuses its input) before every peer has read it.
  return FinishSingleCopy(call, interrupt, 0, -1);
}

Status ShmCollectives::GatherShared(void* recv, const GatherLayout& layout, DType dtype,
                                    bool stream, const char* call, const Interrupt* interrupt) {
  // This rank's own part is in place already (GatherRounds).
  const int unknown = MapSharedInputs(nullptr);
  if (unknown >= 0) return FinishSingleCopy(call, interrupt, kUnknownRegion, unknown);
  ++shared_calls_;
  const size_t es = DTypeSize(dtype);
  unsigned char* out = static_cast<unsigned char*>(recv);
  // Every peer's part, a round of kGatherRoundBytes at a time: every rank goes through the
  // inputs in the same order of rounds, so a peer's round that one rank fetched from memory is
  // still in the shared cache for the other readers of it (part by part, each part was fetched
  // once per reader: at P = 4, 32-64 MiB, about 1.1x slower than the window's copies).
  size_t largest = 0;
  for (int r = 0; r < size_; ++r) largest = std::max(largest, layout.count(r) * es);
  for (size_t b = 0; b < largest; b += kGatherRoundBytes) {
    for (int j = 1; j < size_; ++j) {
      const int r = (rank_ + j) % size_;
      const size_t n = layout.count(r) * es;
      if (b >= n) continue;
      CopyOut(out + layout.offset(r) * es + b, shared_ins_[static_cast<size_t>(r)] + b,
              std::min(kGatherRoundBytes, n - b), stream);
    }
  }
  if (stream) StreamFence();
  return FinishSingleCopy(call, interrupt, 0, -1);
}

Status ShmCollectives::ReduceShared(const void* send, void* recv, size_t count, DType dtype,
                                    const char* call, const Interrupt* interrupt) {
  const size_t es = DTypeSize(dtype);
  const uint64_t index = calls_ - 1;
  std::vector<const unsigned char*>& ins = shared_ins_;
  std::vector<unsigned char*>& outs = shared_outs_;
  ins.resize(static_cast<size_t>(size_));
  outs.resize(static_cast<size_t>(size_));
  int unknown = -1;
  for (int r = 0; r < size_; ++r) {
    const Descriptor* d = Desc(r, index);
    const size_t i = static_cast<size_t>(r);
    ins[i] = r == rank_ ? static_cast<const unsigned char*>(send)
                        : regions_->Address(d->shared_source, r);
    outs[i] = r == rank_ ? static_cast<unsigned char*>(recv)
                         : regions_->Address(d->shared_target, r);
    if (ins[i] == nullptr || outs[i] == nullptr) unknown = r;
  }
  if (unknown >= 0) {
    // Regions are allocated and freed collectively, so every rank maps every live one: a code
    // this rank cannot map means the ranks did not allocate or free alike. This rank sums
    // nothing and says so in its descriptor; every rank returns that error (CopyOutcome).
    return FinishSingleCopy(call, interrupt, kUnknownRegion, unknown);
  }
  // My shard, block by block: every rank's part summed in rank order into a block of mine
  // (it stays in this core's L1), then written to every rank's output, peers in the order
  // rank+1, rank+2, ... In place is safe: a shard is read and written by its reducer alone,
  // each block read whole before it is written.
  ++shared_calls_;
  const size_t off = ShardOffset(count, size_, rank_), mine = ShardCount(count, size_, rank_);
  const size_t per_block = kSharedBlockBytes / es;
  const bool stream = count * es >= kReduceStreamBytes;
  if (shared_block_.size() < kSharedBlockBytes) shared_block_.resize(kSharedBlockBytes);
  std::vector<const void*>& srcs = srcs_;
  for (size_t b = 0; b < mine; b += per_block) {
    const size_t n = std::min(per_block, mine - b);
    const size_t at = (off + b) * es;
    for (int r = 0; r < size_; ++r) srcs[static_cast<size_t>(r)] = ins[static_cast<size_t>(r)] + at;
    ShmReduceSum(dtype, srcs.data(), size_, shared_block_.data(), n);
    for (int j = 0; j < size_; ++j) {
      const size_t r = static_cast<size_t>((rank_ + j) % size_);
      CopyOut(outs[r] + at, shared_block_.data(), n * es, stream);
    }
  }
  if (stream) StreamFence();
  // Nobody returns (and reuses its input or reads its output) before every shard is written.
  return FinishSingleCopy(call, interrupt, 0, -1);
}

Status ShmCollectives::ReduceDirect(const void* send, void* recv, size_t count, DType dtype,
                                    const Interrupt* interrupt, const CollectiveArgs& a) {
  const size_t es = DTypeSize(dtype);
  const unsigned char* in = static_cast<const unsigned char*>(send);
  unsigned char* out = static_cast<unsigned char*>(recv);
  // The descriptor Enter publishes carries my input's and my output's addresses.
  Descriptor* own = Desc(rank_, calls_);
  own->source = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(send));
  own->target = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(recv));
  PSD_CHECK(Enter(a, interrupt));
  const uint64_t index = calls_ - 1;
  if (SharedRanks(index) == size_) return ReduceShared(send, recv, count, dtype, a.call, interrupt);
  const size_t peers = static_cast<size_t>(size_ - 1);
  if (direct_blocks_.size() < peers * kDirectBlockBytes) {
    direct_blocks_.resize(peers * kDirectBlockBytes);
  }
  std::vector<const void*>& srcs = srcs_;
  int err = 0, from = -1;
  const size_t per_chunk = kDirectChunkBytes / es;
  const size_t per_block = kDirectBlockBytes / es;
  for (size_t c = 0; c < count; c += per_chunk) {
    const size_t len = std::min(per_chunk, count - c);
    // 1. My shard of the chunk, block by block: every peer's block read into a block of mine
    // (the blocks stay in this core's cache), summed in rank order with my own input's into my
    // output.
    const size_t off = c + ShardOffset(len, size_, rank_), mine = ShardCount(len, size_, rank_);
    for (size_t b = 0; b < mine && err == 0; b += per_block) {
      const size_t n = std::min(per_block, mine - b);
      const size_t at = (off + b) * es;
      for (int j = 1; j < size_ && err == 0; ++j) {
        const int r = (rank_ + j) % size_;
        unsigned char* block =
            direct_blocks_.data() + static_cast<size_t>(j - 1) * kDirectBlockBytes;
        err = ReadPeer(pids_[static_cast<size_t>(r)], block, Desc(r, index)->source + at, n * es);
        if (err != 0) from = r;
        srcs[static_cast<size_t>(r)] = block;
      }
      if (err != 0) break;
      srcs[static_cast<size_t>(rank_)] = in + at;
      ShmReduceSum(dtype, srcs.data(), size_, out + at, n);
    }
    // 2. Once every shard of the chunk is summed (and nobody reads the chunk's inputs any
    // more: with send == recv a rank writes its peers' shards over its input now), every
    // peer's shard out of its output.
    PSD_CHECK(Sync(a.call, interrupt));
    for (int j = 1; j < size_ && err == 0; ++j) {
      const int r = (rank_ + j) % size_;
      const size_t n = ShardCount(len, size_, r);
      if (n == 0) continue;
      const size_t at = (c + ShardOffset(len, size_, r)) * es;
      err = ReadPeer(pids_[static_cast<size_t>(r)], out + at, Desc(r, index)->target + at, n * es);
      if (err != 0) from = r;
    }
  }
  return FinishSingleCopy(a.call, interrupt, err, from);
}

Status ShmCollectives::Broadcast(void* buf, size_t count, DType dtype, int root,
                                 const Interrupt* interrupt, const CollectiveArgs* args) {
  const char* call = "Broadcast";
  // The common case tests two predicates and builds nothing: a small broadcast is a few
  // hundred instructions in all.
  Status local;
  if (!IsValidDType(dtype)) {
    local = DTypeError(call, dtype);
  } else if (root < 0 || root >= size_) {
    local = InvalidArgument(call, ": root ", root, " is outside 0..", size_ - 1);
  }
  std::optional<CollectiveArgs> own;  // the caller's description, when it gave none
  if (args == nullptr) {
    own.emplace(CollectiveArgs{call, static_cast<int64_t>(count), static_cast<int64_t>(dtype),
                               root, 0, local});
  }
  const CollectiveArgs& a = args != nullptr ? *args : *own;
  PSD_CHECK(Begin(call, interrupt, local.ok() && root != rank_ ? root : -1));
  // A failure carried from this rank's previous call fails this one on every rank (Enter).
  if (!a.local.ok() || !local.ok() || count == 0 || !deferred_.ok()) return Enter(a, interrupt);
  const size_t bytes = count * DTypeSize(dtype);
  if (single_copy_bcast_bytes_ > 0 && bytes >= single_copy_bcast_bytes_ &&
      bytes < kDirectBroadcastMaxBytes) {
    return BroadcastDirect(buf, bytes, root, interrupt, a);
  }
  static_assert(sizeof(SlotStamp) <= kStampBytes, "stamp larger than its place");
  // Crowded, a broadcast of up to P slots is one piece, laid across every rank's slot of the
  // stage (see "Broadcast across the slots" above).
  const bool across = bytes > kBroadcastPieceBytes && bytes <= across_bytes_;
  const size_t piece =
      across ? bytes : std::min(slot_bytes_, kBroadcastPieceBytes);
  const size_t pieces = Parts(bytes, piece);
  // The smallest broadcasts' data follows the stamp on its line (SlotHead), the others' goes
  // in the slot.
  const bool inline_data = bytes <= kInlineBytes;
  unsigned char* data = static_cast<unsigned char*>(buf);
  const bool stream = bytes >= bcast_stream_bytes_;
  const uint64_t index = calls_;
  // More than one piece from a root whose buffer lies in node-shared memory: every receiver
  // copies it straight out of the root's buffer (see "Node-shared buffers" above). The root
  // says so in its descriptor; every rank clears its outcome and mark first.
  const bool may_share = pieces > 1 && !across && regions_ != nullptr;
  bool root_shared = false;
  if (may_share) {
    Descriptor* own = Desc(rank_, index);
    own->shared_source = rank_ == root ? regions_->Encode(buf, bytes) : 0;
    own->copy_errno = 0;
    own->copy_from = -1;
    __atomic_store_n(&own->copied, 0u, __ATOMIC_RELAXED);
    root_shared = own->shared_source != 0;
  }
  uint32_t first = 0, arrival = 0;
  for (size_t k = 0; k < pieces; ++k) {
    const size_t start = k * piece, len = std::min(piece, bytes - start);
    unsigned char* head = SlotHead(root, stage_ + k);
    unsigned char* slot = inline_data ? InlineData(root, stage_ + k) : Slot(root, stage_ + k);
    if (k == 1) {
      // Every rank checks every rank's descriptor before the second piece moves, so a call
      // of several pieces fails in the call itself, on every rank.
      PSD_CHECK(Await(call, interrupt, first, -1));
      Status verdict = FailedStages(Verdict(a, index));
      if (!verdict.ok()) return verdict;
    }
    if (rank_ == root) {
      // The stage of piece k last held piece k - 3, which a receiver is done with once it has
      // arrived for piece k - 2.
      if (k >= 2) PSD_CHECK(Await(call, interrupt, first + static_cast<uint32_t>(k - 2), -1));
      if (across) {
        MoveAcross(data, bytes, root, true);
      } else if (!root_shared) {
        std::memcpy(slot, data + start, len);
      }
      if (k == 0) {
        Publish(a);
        StampHead(index);
      }
      arrival = Arrive();
      if (root_shared) {
        // Every descriptor first (a receiver that disagrees fails the call here and on
        // itself), then the copies of every receiver that matched this rank's descriptor,
        // which copy whatever the verdict: the buffer is theirs until they are done.
        ++calls_;
        PSD_CHECK(Await(call, interrupt, arrival, -1));
        Status verdict = Verdict(a, index);
        PSD_CHECK(AwaitCopied(call, interrupt, index, root));
        if (!verdict.ok()) return FailedStages(verdict);
        ++shared_calls_;
        ++stage_;
        return CopyOutcome(call, index);
      }
      if (pieces == 1 && len <= kDemoteBytes) {
        Demote(head, sizeof(SlotStamp));
        if (!inline_data) Demote(slot, len);
      }
    } else {
      if (k == 0) Publish(a);
      arrival = Arrive();
      if (k == 0) {
        // Piece 0's stamp is written after its data: once it is there, the root's arrival need
        // not be read (one cache line fewer to fetch). The stamp shares a cache line with the
        // data (the smallest broadcasts) or sits on the line before it.
        bool alike = false;
        PSD_CHECK(AwaitStamp(call, interrupt, root, index, Desc(rank_, index)->Digest(), arrival,
                             &alike));
        if (!alike) {
          // Rare: wait for every rank and reach the verdict the others reach.
          PSD_CHECK(Await(call, interrupt, arrival, -1));
          ++calls_;
          return FailedStages(Verdict(a, index));
        }
        if (pieces == 1) {
          __atomic_store_n(Confirmed(rank_), Confirmation(index, root), __ATOMIC_RELEASE);
          if (len <= kDemoteBytes) Demote(Confirmed(rank_), 8);
        }
        if (may_share) {
          // Published before the stamp, which this rank has seen.
          const uint64_t code = Desc(root, index)->shared_source;
          if (code != 0) {
            ++calls_;
            return ReceiveShared(data, bytes, root, code, arrival, stream, call);
          }
        }
      } else if (!Arrived(root, arrival)) {
        PSD_CHECK(Await(call, interrupt, arrival, root));
      }
      if (across) {
        MoveAcross(data, bytes, root, false);
      } else if (stream) {
        CopyOut(data + start, slot, len, stream);
      } else {
        std::memcpy(data + start, slot, len);
      }
    }
    if (k == 0) {
      first = arrival;
      ++calls_;
    }
  }
  if (stream) StreamFence();
  stage_ += pieces;
  // The next call starts once every peer has arrived for the last piece (Begin), except a
  // receiver's next broadcast from the same root; a broadcast of one piece is checked there
  // too, except by a receiver whose only peer is the root.
  Defer(arrival, index, pieces == 1 && (rank_ == root || size_ > 2), root);
  return Status::Ok();
}

void ShmCollectives::MoveAcross(unsigned char* data, size_t bytes, int root, bool in) const {
  // Part j in the slot of rank root + j (mod P) of this stage (its slot_bytes_ of data; the
  // root's head holds the stamp).
  size_t done = 0;
  for (int j = 0; done < bytes; ++j) {
    unsigned char* part = Slot((root + j) % size_, stage_);
    const size_t n = std::min(bytes - done, slot_bytes_);
    if (in) {
      std::memcpy(part, data + done, n);
    } else {
      std::memcpy(data + done, part, n);
    }
    done += n;
  }
}

namespace {
// A receiver's mark in its descriptor of call `index` (never 0, and never an earlier call's
// mark left in the same place).
uint32_t Copied(uint64_t index) { return static_cast<uint32_t>(index) + 1; }
}  // namespace

Status ShmCollectives::ReceiveShared(unsigned char* data, size_t bytes, int root, uint64_t code,
                                     uint32_t arrival, bool stream, const char* call) {
  const uint64_t index = calls_ - 1;
  const unsigned char* src = regions_->Address(code, root);
  Descriptor* own = Desc(rank_, index);
  if (src != nullptr) {
    CopyOut(data, src, bytes, stream);
    if (stream) StreamFence();
    ++shared_calls_;
  }
  own->copy_errno = src != nullptr ? 0 : kUnknownRegion;
  own->copy_from = src != nullptr ? -1 : root;
  __atomic_store_n(&own->copied, Copied(index), __ATOMIC_RELEASE);
  FutexWakeAll(&own->copied);
  ++stage_;
  // The other receivers' descriptors are checked at the next call (the root checks them in
  // this one), as after a single-copy broadcast.
  Defer(arrival, index, true, -1);
  if (src != nullptr) return Status::Ok();
  return InvalidArgument(call, ": node rank ", rank_, " cannot map node rank ", root,
                         "'s buffer in node-shared memory (AllocShared / FreeShared must be "
                         "called on every rank alike, in the same order)");
}

Status ShmCollectives::BroadcastDirect(void* buf, size_t bytes, int root,
                                       const Interrupt* interrupt, const CollectiveArgs& a) {
  const uint64_t index = calls_;
  Descriptor* own = Desc(rank_, index);
  own->source = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(buf));
  own->shared_source = rank_ == root && regions_ != nullptr ? regions_->Encode(buf, bytes) : 0;
  own->copy_errno = 0;
  own->copy_from = -1;
  __atomic_store_n(&own->copied, 0u, __ATOMIC_RELAXED);
  Publish(a);
  const uint32_t arrival = Arrive();
  ++calls_;
  if (rank_ == root) {
    // Every descriptor first (the verdict: a receiver that disagrees fails the call here and
    // on itself), then the reads of every receiver that matched this rank's descriptor, which
    // read whatever the verdict: the buffer is theirs until they are done.
    PSD_CHECK(Await(a.call, interrupt, arrival, -1));
    Status verdict = Verdict(a, index);
    PSD_CHECK(AwaitCopied(a.call, interrupt, index, root));
    if (!verdict.ok()) return FailedStages(verdict);
    if (own->shared_source != 0) ++shared_calls_;
    ++stage_;
    return CopyOutcome(a.call, index);
  }
  if (!Arrived(root, arrival)) PSD_CHECK(Await(a.call, interrupt, arrival, root));
  const Descriptor* from = Desc(root, index);
  if (!from->Alike(*own)) {
    // Rare: wait for every rank and reach the verdict the others reach (a failure: the root's
    // descriptor differs from this one). Should every argument agree after all, only the
    // call's index can differ, which no rank can recover from: fail, without reading (the
    // root does not wait for a rank whose descriptor differs from its own).
    PSD_CHECK(Await(a.call, interrupt, arrival, -1));
    Status verdict = Verdict(a, index);
    if (verdict.ok()) {
      verdict = InternalError(a.call, ": node rank ", root, "'s call descriptor differs from "
                              "this rank's although the arguments agree (call index ", index,
                              "); expected the same calls in the same order on every rank");
    }
    return FailedStages(verdict);
  }
  if (from->shared_source != 0) {
    // The root's buffer is node-shared: copied straight, without the kernel.
    return ReceiveShared(static_cast<unsigned char*>(buf), bytes, root, from->shared_source,
                         arrival, bytes >= bcast_stream_bytes_, a.call);
  }
  const int err = ReadPeer(pids_[static_cast<size_t>(root)], buf, from->source, bytes);
  own->copy_errno = err;
  own->copy_from = err != 0 ? root : -1;
  __atomic_store_n(&own->copied, Copied(index), __ATOMIC_RELEASE);
  FutexWakeAll(&own->copied);
  ++stage_;
  // The other receivers' descriptors are checked at the next call (the root checks them in
  // this one): the way of a broadcast of one piece.
  Defer(arrival, index, true, -1);
  return err != 0 ? CopyError(a.call, rank_, root, err) : Status::Ok();
}

Status ShmCollectives::AwaitCopied(const char* call, const Interrupt* interrupt, uint64_t index,
                                   int root) {
  const uint32_t want = Copied(index);
  const Descriptor* own = Desc(root, index);
  // The receivers that read: those whose descriptor is the root's (the receiver's own test).
  auto reads = [&](int r) { return r != root && Desc(r, index)->Alike(*own); };
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < size_; ++r) {
    if (!reads(r)) continue;
    uint32_t* word = &Desc(r, index)->copied;
    // A read of megabytes takes a while: yield the core to the readers, then sleep.
    uint32_t seen = YieldPoll(word, __atomic_load_n(word, __ATOMIC_ACQUIRE), Word(Counter(r)),
                              yield_s_, [want](uint32_t v) { return v == want; });
    while (seen != want) {
      if (Left(Word(Counter(r)))) {
        // Its mark comes before the flag: read the mark once more after seeing it (a receiver
        // may read, return and destroy its window before this rank looks again).
        seen = __atomic_load_n(word, __ATOMIC_ACQUIRE);
        if (seen == want) break;
        failure_ = AbortedError(call, ": node rank ", r, " left (freed its shared-memory window) "
                                "while rank ", rank_, " waited for it to read this rank's "
                                "broadcast buffer");
        return failure_;
      }
      if (timeout_s_ > 0 && SecondsSince(start) > timeout_s_) {
        const std::string missing = RanksWhere(0, size_, [&](int q) {
          return reads(q) && __atomic_load_n(&Desc(q, index)->copied, __ATOMIC_ACQUIRE) != want;
        });
        failure_ = TimeoutError(call, ": rank ", rank_, " waited ", timeout_s_,
                                " s (POSEIDON_SHM_TIMEOUT_S) for node ranks ", missing,
                                " to read its broadcast buffer; a peer is stuck or died");
        return failure_;
      }
      // The receiver wakes every sleeper on the word after marking it; 50 ms bounds a missed
      // wake-up (10 ms under an interrupt).
      FutexWait(word, seen, interrupt ? 10000000L : 50000000L);
      seen = __atomic_load_n(word, __ATOMIC_ACQUIRE);
      if (seen == want) break;
      if (Status st = Interrupted(call, interrupt); !st.ok()) return st;
    }
  }
  return Status::Ok();
}

bool ShmCollectives::OnlyCarriers(uint64_t index) const {
  const Descriptor* own = Desc(rank_, index);
  bool any = false;
  for (int r = 0; r < size_; ++r) {
    const Descriptor* d = Desc(r, index);
    if (d->record.bad == 0) {
      if (!d->Alike(*own)) return false;  // a failure of its own, besides
      continue;
    }
    if (d->carried == 0) return false;
    any = true;
  }
  return any;
}

Status ShmCollectives::FailedStages(Status verdict) {
  if (verdict.ok()) return verdict;
  // Every rank that fails a call in the call moves one stage, whatever it called, and so does
  // every rank that returned from it before anyone checked it (a broadcast root of one piece,
  // with the receivers that matched it, which may still be copying out of the root's slot
  // after this failure; a reduce-scatter rank with nothing to receive, where ranks outnumber
  // cores): every rank leaves the call one stage on. Neither may stay: a broadcast's receivers
  // read the root's stamp before they know the verdict, and a root that failed its call (its
  // arguments, moving no data) and kept its stage would write its next broadcast's stamp into
  // the slot they may still be comparing (np 7: the compare, glibc's memcmp, found the first
  // differing byte in the old contents and re-read it from the new stamp, equal, so a receiver
  // returned OK from a call that failed everywhere else). The next broadcast writes into the stage
  // after, whose last readers have all arrived for a later call since.
  ++stage_;
  return verdict;
}

void ShmCollectives::Defer(uint32_t arrival, uint64_t index, bool verdict, int root,
                           int confirmer) {
  pending_root_ = root;
  pending_confirmer_ = confirmer;
  pending_ = true;
  pending_arrival_ = arrival;
  pending_call_ = index;
  pending_verdict_ = verdict;
}

}  // namespace poseidon
