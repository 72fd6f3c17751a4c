// Agreement: every rank of a communicator must hold the same values for what shapes the
// collectives it issues (the Agreed settings of settings.def: fusion and chunk sizes, strategy,
// shared-memory threshold, ...). A rank that differs exchanges messages of other sizes or in
// another order, which ends in wrong values, a hang or a smashed stack far from the cause; one
// check at Communicator::Create turns that into the same clear error on every rank.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/status.h"

namespace poseidon {

struct AgreedValue {
  std::string name;   // e.g. "POSEIDON_FUSION_BYTES"
  std::string value;  // as text; one spelling per meaning (AgreedSettings writes "4M" as 4194304)
};

// Collective over comm: every rank calls it, with its own values, before any other collective
// on comm. Ok when every rank passed the same list (same names and values, in the same order).
// Costs one bitwise-OR allreduce of four words (the list's length and its hash as agreed values,
// runtime/or_agreement.h); only when they differ, a second round (MPI_Allgather of lengths,
// MPI_Allgatherv of the lists) gathers every rank's list, so that every rank returns the same
// kMismatch naming each differing value with its ranks grouped by value, e.g.
//   "Communicator::Create: POSEIDON_FUSION_BYTES differs across ranks (rank 0: 0; ranks 1-3:
//    4194304); expected the same value on every rank (set it alike for all ranks, e.g.
//    mpirun -x POSEIDON_FUSION_BYTES)"
// A list of another length (a different build) is a mismatch too. call names the caller in
// the message. An MPI failure returns kBackendError.
Status AgreeOnValues(MPI_Comm comm, const std::vector<AgreedValue>& values, const char* call);

// Collective over comm: every rank's host name (MPI_Get_processor_name), indexed by rank, for
// counting nodes and for naming a rank's host in messages. call names the caller in the error
// (kBackendError) when MPI fails.
Result<std::vector<std::string>> GatherHostNames(MPI_Comm comm, const char* call);

// The current value of every Agreed setting, in declaration order (name = the POSEIDON_*
// variable). Values are written in one canonical form per type (bool 1/0, int in decimal, the
// shortest double text that reads back exactly), so that "4M" and "4194304" agree; a value
// that does not parse is kept as written (Settings::Validate reports it).
std::vector<AgreedValue> AgreedSettings();

// How every cross-rank error names ranks: "rank 3", "ranks 1-3", "ranks 0, 2, 4-6" (ranks
// ascending), "no rank" for none.
std::string FormatRanks(const std::vector<int>& ranks);
// "rank 0: 0; ranks 1-3: 4194304": per_rank[r] is rank r's value; one group per distinct value,
// in order of its lowest rank, at most 8 groups shown (then "; and N more values"). A value a
// rank does not hold at all (nullopt) reads "(absent)", an empty one "''".
std::string GroupRanksByValue(const std::vector<std::optional<std::string>>& per_rank);

// 64-bit FNV-1a hash of a list (its length, then each name and value, length-prefixed).
uint64_t HashAgreedValues(const std::vector<AgreedValue>& values);
// HashAgreedValues(AgreedSettings()), for callers that carry it in a round they already have.
uint64_t AgreedSettingsHash();

}  // namespace poseidon
