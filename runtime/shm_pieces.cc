// ShmCollectives::AllReducePieces (shm_collectives.h): the allreduce of several pieces as if
// they were one buffer, their concatenation, gathered into the window straight from the pieces
// and scattered back, with the first piece's sum committed before any other is written. The
// one-Sync and the pipelined forms are those of AllReduce (shm_collectives.cc).
#include <algorithm>
#include <cstring>
#include <vector>

#include "runtime/shard.h"
#include "runtime/shm_collectives.h"
#include "runtime/shm_reduce.h"

namespace poseidon {

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
    if (a < b && p.sink != nullptr) {
      (*p.sink)(a - base, b - a, src + (a - lo) * es);
    } else if (a < b) {
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
  PSD_CHECK(Begin(call, interrupt));
  size_t count = 0;
  for (const SumPiece& p : pieces) count += p.count;
  if (!args.local.ok() || count == 0) {
    PSD_CHECK(Enter(args, interrupt));
    *committed = true;
    return Status::Ok();
  }
  const size_t es = DTypeSize(dtype);
  const size_t first = pieces.empty() ? 0 : pieces[0].count;  // the committed piece
  if (size_ == 1) {
    // The sum of one rank is its input: no slot, only the pieces not summed in place move.
    PSD_CHECK(Enter(args, interrupt));
    auto move = [&](size_t i) {
      const SumPiece& p = pieces[i];
      if (p.count == 0) return;
      if (i > 0 && p.sink != nullptr) {
        (*p.sink)(0, p.count, p.in);
      } else if (p.out != p.in) {
        std::memmove(p.out, p.in, p.count * es);
      }
    };
    move(0);
    if (commit && !commit(pieces[0].out)) return Status::Ok();
    for (size_t i = 1; i < pieces.size(); ++i) move(i);
    *committed = true;
    return Status::Ok();
  }
  std::vector<const void*>& srcs = srcs_;
  // Sums elements [lo, hi) of the pieces' concatenation from every rank's slot of `stage`,
  // whose first element is element `slot_start` (this rank's own contribution is read from
  // the piece itself, as AllReduce reads `send`), into the pieces' outputs or, into_slot, into
  // this rank's slot; split at the pieces' boundaries.
  auto reduce = [&](uint64_t stage, size_t slot_start, size_t lo, size_t hi, bool into_slot) {
    size_t base = 0;
    for (const SumPiece& p : pieces) {
      const size_t a = std::max(lo, base), b = std::min(hi, base + p.count);
      if (a < b) {
        for (int r = 0; r < size_; ++r) {
          srcs[static_cast<size_t>(r)] = Slot(r, stage) + (a - slot_start) * es;
        }
        srcs[static_cast<size_t>(rank_)] =
            static_cast<const unsigned char*>(p.in) + (a - base) * es;
        void* dst = into_slot ? static_cast<void*>(Slot(rank_, stage) + (a - slot_start) * es)
                              : static_cast<unsigned char*>(p.out) + (a - base) * es;
        ShmReduceSum(dtype, srcs.data(), size_, dst, b - a);
      }
      base += p.count;
      if (base >= hi) return;
    }
  };

  if (count * es <= one_shot_bytes_) {
    GatherPieces(pieces, es, 0, count, Slot(rank_, stage_));
    PSD_CHECK(Enter(args, interrupt));
    reduce(stage_, 0, 0, first, false);
    if (commit && !commit(pieces[0].out)) {
      ++stage_;
      return Status::Ok();
    }
    reduce(stage_, 0, first, count, false);
    ++stage_;
    // Summed into the outputs above (scratch for a piece with a sink): hand those over.
    for (size_t i = 1; i < pieces.size(); ++i) {
      const SumPiece& p = pieces[i];
      if (p.sink != nullptr && p.count > 0) (*p.sink)(0, p.count, p.out);
    }
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
  // As AllReduce: chunk k goes into my slot without my own shard, which `reduce` reads from
  // the pieces themselves.
  auto copy_in = [&](size_t k, uint64_t stage) {
    const size_t start = k * per_chunk, len = chunk_len(k);
    const size_t off = ShardOffset(len, size_, rank_), mine = ShardCount(len, size_, rank_);
    unsigned char* slot = Slot(rank_, stage);
    GatherPieces(pieces, es, start, start + off, slot);
    GatherPieces(pieces, es, start + off + mine, start + len, slot + (off + mine) * es);
  };
  const uint64_t base_stage = stage_;
  copy_in(0, base_stage);
  PSD_CHECK(Enter(args, interrupt));
  for (size_t k = 0; k < chunks; ++k) {
    const uint64_t stage = base_stage + k;
    const size_t len = chunk_len(k);
    const size_t mine_lo = k * per_chunk + ShardOffset(len, size_, rank_);
    reduce(stage, k * per_chunk, mine_lo, mine_lo + ShardCount(len, size_, rank_), true);
    if (k + 1 < chunks) copy_in(k + 1, stage + 1);
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
