// The one agreement protocol: every cross-rank check in Poseidon (a collective's arguments,
// the settings at Communicator creation, the engine's per-cycle negotiation) is one bitwise-OR
// allreduce of 64-bit words, each rank contributing words encoded here, and every rank deciding
// from the reduced words alone (so every rank decides alike):
//   - a value every rank must hold alike:  (v, ~v). After the OR, v_or == ~(~v)_or exactly when
//     every rank put in the same v (the OR of v is then v, the OR of ~v is ~v; any differing
//     bit sets a bit in both, breaking the equality).
//   - a flag any rank may raise:           one word, non-zero on the ranks that raise it.
//   - a bit set (one bit per item):        (mask, ~mask). OR(mask) has the items set somewhere;
//                                           OR(~mask) has the bit clear only where every rank
//                                           set it (AND through one OR).
// Only when the words say something differs does a second, rarer round (an allgather of every
// rank's values or messages) find out who differs, so the error can name the ranks and values.
//
// The transports: OrAllReduce below (blocking, or polled under an interrupt) on the
// communicator of the call being checked, and ControlChannel::PostOr / TestOr (non-blocking,
// the engine's private channel). Both reduce with MPI_BOR over MPI_UINT64_T.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "runtime/mpi_wait.h"
#include "runtime/status.h"

namespace poseidon::or_agreement {

// Writes the two words of a value: w[0] = v, w[1] = ~v.
inline void PutValue(uint64_t* w, uint64_t v) {
  w[0] = v;
  w[1] = ~v;
}
// After the reduction: whether every rank put in the same value at w (written by PutValue).
inline bool AllSame(const uint64_t* w) { return w[0] == ~w[1]; }
// After the reduction: the value every rank put in, when AllSame(w).
inline uint64_t Value(const uint64_t* w) { return w[0]; }

// Writes an empty bit set of `bits` items over `words` words at mask (and its complement at
// complement): all zeros, and all ones in the used bits of the complement (so that OR(~mask)
// stays exact for the unused bits too).
void ClearBits(uint64_t* mask, uint64_t* complement, int words, int bits);
// Sets item i in a bit set cleared by ClearBits.
inline void SetBit(uint64_t* mask, uint64_t* complement, int i) {
  const uint64_t bit = uint64_t{1} << (i % 64);
  mask[i / 64] |= bit;
  complement[i / 64] &= ~bit;
}
// After the reduction: item i set on some rank / on every rank.
inline bool SetSomewhere(const uint64_t* mask, int i) { return (mask[i / 64] >> (i % 64)) & 1; }
inline bool SetEverywhere(const uint64_t* complement, int i) {
  return !((complement[i / 64] >> (i % 64)) & 1);
}

// Whether any rank of comm raised its flag: one bitwise-OR allreduce of one flag word
// (blocking). Every rank calls it alike; an MPI failure returns kBackendError naming `what`.
Result<bool> RaisedAnywhere(MPI_Comm comm, bool raised, const char* what);

// words[0..n) = bitwise OR over the ranks of comm, in place. Blocking when how.interrupt is
// null; else posted and polled under it (RunMpi: an interrupt abandons the exchange, and
// `keep`, which must own `words`, stays alive with MPI). Every rank passes the same n.
Status OrAllReduce(MPI_Comm comm, uint64_t* words, size_t n, const MpiWait& how,
                   std::shared_ptr<void> keep);

}  // namespace poseidon::or_agreement
