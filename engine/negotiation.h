// Negotiation: how the engine threads of all ranks agree, each cycle, on what to run.
//
// Each cycle every rank's engine thread contributes one small vector of 64-bit words and the
// ranks reduce it with a single bitwise-OR allreduce (Controller, over the control channel):
//   1. ready mask      bit L set when this rank has a submission of layer L waiting;
//   2. its complement  ~mask, so that OR(~mask) = ~AND(mask): one bitwise-OR reduction yields
//                      both the layers ready somewhere (OR) and ready everywhere (AND);
//   3. flags           error, stall warn, stall abort, shutdown (any rank sets, all see);
//   4. per layer       the hash of the waiting submission's descriptor (layer, step, count,
//                      dtype, strategy, factors; no submission order: layers are matched by
//                      id) and its complement, or 0 / 0 when the layer is not ready here.
//                      For a layer ready everywhere all ranks hashed a descriptor, so
//                      OR(h) == ~OR(~h) holds exactly when every rank's hash is equal.
// These are the encodings of runtime/or_agreement.h, the one agreement protocol Poseidon uses
// (the collectives' argument check and the settings check at creation use it too), so one
// built-in reduction serves masks, flags and hashes.
// Everything after the reduction is decided from the reduced words alone, so every rank takes
// the same decision in the same cycle (which layers run, in which order, whether to fail).
//
// The helpers that turn gathered per-rank data into error messages are pure and tested alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace poseidon::engine {

// What every rank must agree on for one submission.
struct Descriptor {
  int64_t layer = 0;
  int64_t step = 0;      // the caller's step
  int64_t count = 0;     // elements the caller said the gradient holds
  int64_t dtype = 0;     // DType as int
  int64_t strategy = 0;  // StrategyKind as int (from the plan)
  int64_t factors = 0;   // 1 when sufficient factors (u, v) were handed over

  static constexpr int kWords = 6;
  void ToWords(int64_t* w) const;
  static Descriptor FromWords(const int64_t* w);
  // A 64-bit hash of every field (FNV-1a over the words, then a mixer); never 0 for a real
  // descriptor, so 0 can mean "not ready".
  uint64_t Hash() const;
  bool operator==(const Descriptor& o) const;
  // "step 0 count 100 float32 allreduce"
  std::string ToString() const;
};

enum Flag : uint64_t {
  kFlagError = 1u << 0,       // some rank has a local error to report
  kFlagStallWarn = 1u << 1,   // some rank's stall timer passed POSEIDON_STALL_WARN_S
  kFlagStallAbort = 1u << 2,  // ... passed POSEIDON_STALL_ABORT_S
  kFlagShutdown = 1u << 3,    // some rank called Engine::Shutdown
};

// The per-cycle vector (see the top of the file for the layout).
class NegotiationVector {
 public:
  explicit NegotiationVector(int num_layers);

  void Clear();
  void SetReady(int layer, uint64_t hash);
  void SetFlag(Flag f) { words_[FlagIndex()] |= f; }

  uint64_t* data() { return words_.data(); }
  const uint64_t* data() const { return words_.data(); }
  int size() const { return static_cast<int>(words_.size()); }
  int num_layers() const { return num_layers_; }

  // Read after the reduction.
  bool ReadyEverywhere(int layer) const;
  bool ReadySomewhere(int layer) const;
  bool HashAgrees(int layer) const;  // meaningful for layers ready everywhere
  bool flag(Flag f) const { return (words_[FlagIndex()] & f) != 0; }
  // This rank's own mask (before the reduction) as a list of words, for stall gathering.
  std::vector<uint64_t> MaskWords() const;

 private:
  int MaskWordCount() const { return (num_layers_ + 63) / 64; }
  int FlagIndex() const { return 2 * MaskWordCount(); }
  int HashIndex(int layer) const { return FlagIndex() + 1 + 2 * layer; }

  int num_layers_;
  std::vector<uint64_t> words_;
};

using LayerNamer = std::function<std::string(int layer)>;

// For layers ready everywhere whose hashes differ: groups the ranks by the descriptor they
// submitted and names the differing fields, e.g.
//   layer 3 (fc3): ranks disagree on the element count: ranks 0, 2 submitted step 0 count 9 ...;
//   rank 1 submitted step 0 count 8 ...
// per_rank[r] holds every descriptor rank r has waiting (any layer). Also lists layers waiting
// on some ranks only, since a skipped layer usually shows up there.
std::string DescribeMismatch(const std::vector<std::vector<Descriptor>>& per_rank,
                             const std::vector<int>& mismatched_layers, const LayerNamer& name);

// For stalled layers: "layer 2 (fc2) submitted on ranks 0, 2, missing on rank 1". masks[r] holds
// rank r's ready mask words.
std::string DescribeStall(const std::vector<std::vector<uint64_t>>& masks,
                          const std::vector<int>& layers, const LayerNamer& name);

}  // namespace poseidon::engine
