#include "engine/response_cache.h"

#include <cmath>

#include "runtime/hash.h"

namespace poseidon::engine {

namespace {

bool SameIgnoringStep(const Descriptor& a, const Descriptor& b) {
  Descriptor x = a, y = b;
  x.step = y.step = 0;
  return x == y;
}

}  // namespace

bool CachedOp::operator==(const CachedOp& o) const {
  if (layers != o.layers || elems != o.elems || descs.size() != o.descs.size()) return false;
  for (size_t i = 0; i < descs.size(); ++i) {
    if (!SameIgnoringStep(descs[i], o.descs[i])) return false;
  }
  return true;
}

void ScheduleRecorder::Record(bool cacheable, const std::vector<Descriptor>& descs,
                              size_t elems) {
  if (descs.empty()) return;
  const int64_t step = descs.front().step;
  for (const Descriptor& d : descs) {
    if (d.step != step) cacheable = false;  // an op mixing steps never repeats reliably
  }
  if (step < cur_.step) {
    Reset();  // steps went backwards: start over
  }
  if (step > cur_.step) {
    prev2_ = std::move(prev_);
    prev_ = std::move(cur_);
    cur_ = StepRecord();
    cur_.step = step;
  }
  CachedOp op;
  for (const Descriptor& d : descs) op.layers.push_back(static_cast<int>(d.layer));
  op.descs = descs;
  op.elems = elems;
  cur_.cacheable = cur_.cacheable && cacheable;
  cur_.ops.push_back(std::move(op));
}

bool ScheduleRecorder::Ready(std::vector<CachedOp>* schedule, size_t* next_op) const {
  if (prev_.ops.empty() || !prev_.cacheable || !prev2_.cacheable || !cur_.cacheable) return false;
  if (prev_.step != prev2_.step + 1 || cur_.step != prev_.step + 1) return false;
  if (!(prev_.ops == prev2_.ops)) return false;
  if (cur_.ops.size() > prev_.ops.size()) return false;
  for (size_t i = 0; i < cur_.ops.size(); ++i) {
    if (!(cur_.ops[i] == prev_.ops[i])) return false;
  }
  // A layer may appear once per step only (its queue head is the op's input).
  std::vector<int> seen;
  for (const CachedOp& op : prev_.ops) {
    for (int l : op.layers) {
      for (int s : seen) {
        if (s == l) return false;
      }
      seen.push_back(l);
    }
  }
  *schedule = prev_.ops;
  *next_op = cur_.ops.size() % prev_.ops.size();
  return true;
}

void ScheduleRecorder::Reset() { cur_ = prev_ = prev2_ = StepRecord(); }

void EncodeTrailer(bool ready, bool error, bool shutdown, uint64_t hash, std::vector<float>* out) {
  std::vector<float>& t = *out;
  t.assign(kTrailerFloats, 0.0f);
  t[0] = ready ? 1.0f : 0.0f;
  t[1] = error ? 1.0f : 0.0f;
  t[2] = shutdown ? 1.0f : 0.0f;
  for (int i = 0; i < kHashPieces; ++i) {
    const float x = static_cast<float>((hash >> (8 * i)) & 0xff);
    t[3 + 2 * i] = x;
    t[4 + 2 * i] = x * x;
  }
}

TrailerVerdict DecodeTrailer(const float* sum, int world) {
  TrailerVerdict v;
  v.all_ready = std::lround(sum[0]) == world;
  v.error = sum[1] > 0.5f;
  v.shutdown = sum[2] > 0.5f;
  v.agree = true;
  for (int i = 0; i < kHashPieces; ++i) {
    const long long s = std::llround(sum[3 + 2 * i]);
    const long long s2 = std::llround(sum[4 + 2 * i]);
    if (s2 * world != s * s) v.agree = false;
  }
  return v;
}

uint64_t CachedOpHash(size_t index, const std::vector<Descriptor>& heads) {
  const uint64_t i = index;
  uint64_t h = HashWords(&i, 1);
  for (const Descriptor& d : heads) {
    const uint64_t dh = d.Hash();
    h = HashWords(&dh, 1, h);
  }
  h = Mix64(h);
  return h ^ (h >> 48);  // the trailer carries the low 48 bits: fold the high ones in
}

}  // namespace poseidon::engine
