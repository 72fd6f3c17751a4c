// Negotiation vector layout and the messages built from gathered per-rank data.
#include "engine/negotiation.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "collectives/layer.h"
#include "runtime/agreement.h"
#include "runtime/dtype.h"
#include "runtime/hash.h"
#include "runtime/or_agreement.h"

namespace poseidon::engine {

uint64_t Descriptor::Hash() const {
  int64_t w[kWords];
  ToWords(w);
  // (uint64_t may alias int64_t.)
  const uint64_t h = Mix64(HashWords(reinterpret_cast<const uint64_t*>(w), kWords));
  return h == 0 ? 1 : h;
}

void Descriptor::ToWords(int64_t* w) const {
  w[0] = layer;
  w[1] = step;
  w[2] = count;
  w[3] = dtype;
  w[4] = strategy;
  w[5] = factors;
}

Descriptor Descriptor::FromWords(const int64_t* w) {
  Descriptor d;
  d.layer = w[0];
  d.step = w[1];
  d.count = w[2];
  d.dtype = w[3];
  d.strategy = w[4];
  d.factors = w[5];
  return d;
}

bool Descriptor::operator==(const Descriptor& o) const {
  return layer == o.layer && step == o.step && count == o.count &&
         dtype == o.dtype && strategy == o.strategy && factors == o.factors;
}

std::string Descriptor::ToString() const {
  return StrCat("step ", step, " count ", count, " ",
                DTypeName(static_cast<DType>(dtype)), " ",
                (strategy >= 0 && strategy < kNumStrategies)
                    ? StrategyName(static_cast<StrategyKind>(strategy))
                    : "?",
                factors ? " (factors)" : "");
}

NegotiationVector::NegotiationVector(int num_layers)
    : num_layers_(num_layers), words_(static_cast<size_t>(HashIndex(num_layers)), 0) {
  Clear();
}

void NegotiationVector::Clear() {
  std::fill(words_.begin(), words_.end(), 0);
  or_agreement::ClearBits(&words_[0], &words_[static_cast<size_t>(MaskWordCount())],
                          MaskWordCount(), num_layers_);
}

void NegotiationVector::SetReady(int layer, uint64_t hash) {
  or_agreement::SetBit(&words_[0], &words_[static_cast<size_t>(MaskWordCount())], layer);
  or_agreement::PutValue(&words_[static_cast<size_t>(HashIndex(layer))], hash);
}

bool NegotiationVector::ReadySomewhere(int layer) const {
  return or_agreement::SetSomewhere(words_.data(), layer);
}

bool NegotiationVector::ReadyEverywhere(int layer) const {
  return or_agreement::SetEverywhere(&words_[static_cast<size_t>(MaskWordCount())], layer);
}

bool NegotiationVector::HashAgrees(int layer) const {
  return or_agreement::AllSame(&words_[static_cast<size_t>(HashIndex(layer))]);
}

std::vector<uint64_t> NegotiationVector::MaskWords() const {
  return std::vector<uint64_t>(words_.begin(), words_.begin() + MaskWordCount());
}

namespace {

std::string LayerLabel(int layer, const LayerNamer& name) {
  return StrCat("layer ", layer, " (", name(layer), ")");
}

// Which fields differ among the distinct descriptors, and the likely cause.
std::string DifferingFields(const std::vector<Descriptor>& d) {
  std::vector<std::string> fields;
  auto differs = [&](auto get) {
    for (const auto& x : d) {
      if (get(x) != get(d[0])) return true;
    }
    return false;
  };
  if (differs([](const Descriptor& x) { return x.count; })) fields.push_back("element count");
  if (differs([](const Descriptor& x) { return x.dtype; })) fields.push_back("dtype");
  if (differs([](const Descriptor& x) { return x.strategy; })) fields.push_back("strategy");
  if (differs([](const Descriptor& x) { return x.step; })) fields.push_back("step");
  if (differs([](const Descriptor& x) { return x.factors; })) fields.push_back("factors");
  std::string out;
  for (size_t i = 0; i < fields.size(); ++i) out += (i ? ", " : "") + fields[i];
  return out.empty() ? "descriptor" : out;
}

}  // namespace

std::string DescribeMismatch(const std::vector<std::vector<Descriptor>>& per_rank,
                             const std::vector<int>& mismatched_layers, const LayerNamer& name) {
  const int world = static_cast<int>(per_rank.size());
  std::ostringstream os;
  bool first = true;
  for (int layer : mismatched_layers) {
    // Group ranks by the descriptor they have waiting for this layer (in first-seen order).
    std::vector<Descriptor> distinct;
    std::vector<std::vector<int>> ranks;
    for (int r = 0; r < world; ++r) {
      for (const Descriptor& d : per_rank[static_cast<size_t>(r)]) {
        if (d.layer != layer) continue;
        size_t i = 0;
        while (i < distinct.size() && !(distinct[i] == d)) ++i;
        if (i == distinct.size()) {
          distinct.push_back(d);
          ranks.emplace_back();
        }
        ranks[i].push_back(r);
      }
    }
    os << (first ? "" : "; ") << LayerLabel(layer, name) << ": ranks disagree on the "
       << DifferingFields(distinct) << ":";
    first = false;
    for (size_t i = 0; i < distinct.size(); ++i) {
      os << (i ? ";" : "") << " " << FormatRanks(ranks[i]) << " submitted "
         << distinct[i].ToString();
    }
  }
  // Layers waiting on some ranks only: usually the layer a rank skipped or reordered.
  std::map<int64_t, std::set<int>> waiting;
  for (int r = 0; r < world; ++r) {
    for (const Descriptor& d : per_rank[static_cast<size_t>(r)]) waiting[d.layer].insert(r);
  }
  for (const auto& [layer, have] : waiting) {
    if (static_cast<int>(have.size()) == world) continue;
    std::vector<int> yes(have.begin(), have.end()), no;
    for (int r = 0; r < world; ++r) {
      if (!have.count(r)) no.push_back(r);
    }
    os << "; " << LayerLabel(static_cast<int>(layer), name) << " is waiting on "
       << FormatRanks(yes) << " but was not submitted by " << FormatRanks(no);
  }
  return os.str();
}

std::string DescribeStall(const std::vector<std::vector<uint64_t>>& masks,
                          const std::vector<int>& layers, const LayerNamer& name) {
  std::ostringstream os;
  for (size_t i = 0; i < layers.size(); ++i) {
    const int layer = layers[i];
    std::vector<int> yes, no;
    for (size_t r = 0; r < masks.size(); ++r) {
      const auto& m = masks[r];
      bool ready = static_cast<size_t>(layer / 64) < m.size() &&
                   ((m[static_cast<size_t>(layer / 64)] >> (layer % 64)) & 1);
      (ready ? yes : no).push_back(static_cast<int>(r));
    }
    os << (i ? "; " : "") << LayerLabel(layer, name) << " submitted on " << FormatRanks(yes)
       << ", missing on " << FormatRanks(no);
  }
  return os.str();
}

}  // namespace poseidon::engine
