// HybridCollective::ExchangeDense: the engine's batched dense sum.
//   1. kFused, host memory: the backend's piecewise allreduce ([trailer][parts]) reads the
//      parts in place and writes their sums back in place, no packing copy; `commit` reads the
//      trailer's sum before any part is written and may decline (every part keeps its input, so
//      the engine can run it again). Where the backend has no piecewise path (across nodes,
//      device memory): pack every part (and the trailer) into the fusion buffer; one
//      allreduce; commit as above; unpack.
//      In the piecewise form, a whole layer with an optimizer gives its piece a sink: the
//      optimizer step (the 1/P average fused in) runs range by range on the window's sum as
//      the backend hands it over, so the sum is never copied into grad.
//      kInPlace: one allreduce on the part itself.
//      kChunked: allreduce i+1 is posted before chunk i is averaged (PHub-style pipeline).
//   2. Each part's tail: a part that ends its layer finishes the whole layer (the 1/P average,
//      or the optimizer step with the average fused in, FinishDenseSum) unless its sink took
//      the step or it is a slice of a layer without an optimizer, which was averaged slice by
//      slice; then the traffic.
// The average of a slice and of the whole layer is the same element-wise 1/P scale, so fused,
// sliced, chunked and unfused exchanges give bitwise identical results.
#include <algorithm>
#include <chrono>

#include "collectives/hybrid.h"

namespace poseidon {

namespace {

double ClockUs() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Status HybridCollective::ReserveFusion(size_t bytes) {
  // At least one float, so the buffer exists (non-null) once reserved.
  return fusion_buf_.Grow(*ctx_.kernels, std::max<size_t>(bytes, 4));
}

void HybridCollective::SinkRange(size_t part, size_t offset, size_t count, const void* sum) {
  SinkPart& sp = sink_parts_[part];
  if (!sp.began) {
    sp.opt->BeginStep();
    sp.began = true;
  }
  if (!sp.status.ok()) return;
  const float inv = 1.0f / static_cast<float>(world());
  sp.status = sp.opt->ApplyRange(sp.params, static_cast<const float*>(sum), inv, offset, count,
                                 ctx_);
}

DenseBatchReport HybridCollective::ExchangeDense(const DenseBatch& batch) {
  DenseBatchReport rep;
  ExchangeDense(batch, &rep);
  return rep;
}

void HybridCollective::ExchangeDense(const DenseBatch& batch, DenseBatchReport* out) {
  DenseBatchReport& rep = *out;
  const size_t nparts = batch.parts.size();
  rep.status.assign(nparts, Status::Ok());
  rep.committed = true;
  rep.trailer_sum.clear();
  rep.chunks = 0;
  rep.pack_us = rep.reduce_us = rep.finish_us = 0;
  const Kernels& k = *ctx_.kernels;
  auto now_us = [timed = batch.timed] { return timed ? ClockUs() : 0.0; };
  CallOptions call = ctx_.call;
  call.agreed = true;  // the engine's negotiation agreed on the parts
  const float inv = 1.0f / static_cast<float>(world());
  auto fail_all = [&](const Status& s) {
    for (auto& st : rep.status) st = s;
  };

  // 1. The sum.
  const double t0 = now_us();
  std::vector<float*>& summed = summed_;  // parts whose sum stays in the fusion buffer
  summed.assign(nparts, nullptr);
  std::vector<const float*> unpacked;
  bool by_pieces = false;
  if (batch.kind == DenseBatchKind::kFused && call.memory == MemoryKind::kHost) {
    // Host memory: offer the backend the pieces themselves ([trailer][parts or pad]), summed
    // in place with no packing copy; a backend without that path answers kUnimplemented on
    // every rank alike and the packed form below runs instead.
    std::vector<SumPiece>& pieces = pieces_;
    pieces.clear();
    rep.trailer_sum.resize(batch.trailer.size());
    pieces.push_back({batch.trailer.data(), rep.trailer_sum.data(), batch.trailer.size()});
    // A whole layer with an optimizer takes its step range by range as the backend hands
    // over the sum (a sink): the sum goes straight into the optimizer's pass, never written
    // into grad and read back. Its moments are reserved here, before the collective, so the
    // sink itself cannot fail on allocation; where that fails the tail below steps as usual.
    sink_parts_.assign(nparts, SinkPart{});
    for (size_t i = sinks_.size(); i < nparts; ++i) {
      sinks_.emplace_back([this, i](size_t offset, size_t n, const void* sum) {
        SinkRange(i, offset, n, sum);
      });
    }
    for (size_t i = 0; i < nparts; ++i) {
      const DensePart& p = batch.parts[i];
      SumPiece piece{p.grad + p.begin, p.grad + p.begin, p.end - p.begin};
      OptimizerState* opt = nullptr;
      if (p.begin == 0 && p.last && !p.sum_only && p.end > 0) opt = SumOptimizerOf(p.layer);
      if (opt != nullptr && opt->Reserve(p.end, ctx_).ok()) {
        sink_parts_[i].opt = opt;
        sink_parts_[i].params = p.params;
        piece.sink = &sinks_[i];
      }
      pieces.push_back(piece);
    }
    Status s;
    if (batch.pad > 0) {
      // Zeros for a rank without the data: summed into the fusion buffer and dropped.
      if (fusion_buf_.bytes() < batch.pad * sizeof(float)) {
        s = InternalError("ExchangeDense: padding of ", batch.pad * sizeof(float),
                          " bytes outgrew the reserved fusion buffer");
      } else {
        s = k.Fill(fusion_buf_.as<float>(), batch.pad, 0.0f, call.stream);
      }
      if (s.ok()) pieces.push_back({fusion_buf_.as<float>(), fusion_buf_.as<float>(), batch.pad});
    }
    if (s.ok()) {
      SumCommit commit;
      if (!batch.trailer.empty() && batch.commit) {
        commit = [&](const void* sum) { return batch.commit(static_cast<const float*>(sum)); };
      }
      bool committed = false;
      s = ctx_.backend->AllReducePieces(pieces, DType::kFloat32, call, commit, &committed);
      if (s.code() != StatusCode::kUnimplemented) {
        by_pieces = true;
        rep.reduce_us = now_us() - t0;
        if (!s.ok()) {
          rep.trailer_sum.clear();
          fail_all(s.WithPrefix("fused allreduce: "));
          return;
        }
        rep.committed = committed;
        if (!committed) return;
      }
    } else {
      // Never expected (the buffer is reserved at engine creation): still meet the peers in
      // the packed form below, which reports the same error after taking part.
      rep.trailer_sum.clear();
    }
  }
  if (by_pieces) {
    // Summed in place above.
  } else if (batch.kind == DenseBatchKind::kFused) {
    rep.trailer_sum.clear();
    size_t total = batch.trailer.size() + batch.pad;
    std::vector<ConstByteRange> in;
    std::vector<ByteRange> out;
    std::vector<size_t> offset;  // of each part in the buffer
    for (const DensePart& p : batch.parts) {
      const size_t bytes = (p.end - p.begin) * sizeof(float);
      in.push_back(ConstByteRange{p.grad + p.begin, bytes});
      offset.push_back(total - batch.trailer.size() - batch.pad);
      total += p.end - p.begin;
    }
    // The buffer is reserved at engine creation for the largest fused group, so this never
    // allocates on one rank only; a group that outgrew it is a planning bug, and failing here
    // would leave the peers in the allreduce, so it is reported after taking part.
    Status s;
    if (fusion_buf_.bytes() < total * sizeof(float)) {
      s = InternalError("ExchangeDense: a fused group of ", total * sizeof(float),
                        " bytes outgrew the reserved fusion buffer (",
                        fusion_buf_.bytes(), " bytes)");
    }
    if (!s.ok()) {
      fail_all(s);
      return;
    }
    float* buf = fusion_buf_.as<float>();
    const size_t data_elems = total - batch.trailer.size();
    for (size_t i = 0; i < nparts; ++i) {
      const DensePart& p = batch.parts[i];
      // A whole layer with an optimizer steps straight from the buffer (its gradient buffer
      // is scratch): no copy back.
      if (p.begin == 0 && p.last && !p.sum_only &&
          layers_[static_cast<size_t>(p.layer)].spec.optimizer.enabled()) {
        summed[i] = buf + offset[i];
      } else {
        out.push_back(ByteRange{p.grad + p.begin, (p.end - p.begin) * sizeof(float)});
        unpacked.push_back(buf + offset[i]);
      }
    }
    s = k.Pack(in, buf, call.stream);
    if (s.ok() && batch.pad > 0) {
      s = k.Fill(buf + data_elems - batch.pad, batch.pad, 0.0f, call.stream);
    }
    if (s.ok() && !batch.trailer.empty()) {
      s = k.Copy(buf + data_elems, batch.trailer.data(), batch.trailer.size() * sizeof(float),
                 call.stream);
    }
    const double t1 = now_us();
    rep.pack_us = t1 - t0;
    // A local pack failure still joins the allreduce (the peers are in it); its result is then
    // not unpacked here.
    Status sum = ctx_.backend->AllReduce(buf, buf, total, DType::kFloat32, call);
    const double t2 = now_us();
    rep.reduce_us = t2 - t1;
    if (!sum.ok()) {
      fail_all(sum.WithPrefix("fused allreduce: "));
      return;
    }
    if (!batch.trailer.empty()) {
      rep.trailer_sum.resize(batch.trailer.size());
      Status c = k.Copy(rep.trailer_sum.data(), buf + data_elems,
                        batch.trailer.size() * sizeof(float), call.stream);
      if (c.ok()) c = k.Synchronize(call.stream);
      if (!c.ok()) s = s.ok() ? c : s;
      rep.committed = batch.commit ? batch.commit(rep.trailer_sum.data()) : true;
      if (!rep.committed) return;
    }
    for (size_t j = 0; j < out.size() && s.ok(); ++j) {
      s = k.Copy(out[j].data, unpacked[j], out[j].bytes, call.stream);
    }
    if (!s.ok()) {
      fail_all(s.WithPrefix("fused allreduce: "));
      return;
    }
  } else if (batch.kind == DenseBatchKind::kInPlace) {
    const DensePart& p = batch.parts.at(0);
    Status s;
    if (p.end > p.begin) {
      s = ctx_.backend->AllReduce(p.grad + p.begin, p.grad + p.begin, p.end - p.begin,
                              DType::kFloat32, call);
    }
    rep.reduce_us = now_us() - t0;
    if (!s.ok()) {
      fail_all(s.WithPrefix("allreduce: "));
      return;
    }
  } else {
    const DensePart& p = batch.parts.at(0);
    float* data = p.grad + p.begin;
    const size_t n = p.end - p.begin;
    const size_t chunk = std::max<size_t>(1, batch.chunk_bytes / sizeof(float));
    const bool optimizer = layers_[static_cast<size_t>(p.layer)].spec.optimizer.enabled();
    // A local failure (the scale) must not stop this rank from posting the remaining chunks:
    // the peers are in those collectives. Only a failed post ends the pipeline early.
    Status s;
    std::unique_ptr<Request> current, next;
    auto post = [&](size_t begin) -> Status {
      auto r = ctx_.backend->IAllReduce(data + begin, data + begin, std::min(chunk, n - begin),
                                    DType::kFloat32, call);
      if (!r.ok()) return r.status();
      next = std::move(*r);
      return Status::Ok();
    };
    if (n > 0) {
      s = post(0);
      current = std::move(next);
    }
    for (size_t begin = 0; begin < n && current; begin += chunk) {
      if (begin + chunk < n) {
        Status ps = post(begin + chunk);
        if (s.ok()) s = ps;
      }
      Status w = current->Wait(call.interrupt);
      if (s.ok()) s = w;
      if (!w.ok()) break;  // abandoned: MPI owns the rest, the peers are being torn down
      if (s.ok() && !optimizer) {
        s = k.Scale(data + begin, std::min(chunk, n - begin), inv, nullptr);
      }
      rep.chunks += 1;
      current = std::move(next);
    }
    rep.reduce_us = now_us() - t0;
    if (!s.ok()) {
      fail_all(s.WithPrefix("chunked allreduce: "));
      return;
    }
  }

  // 2. Tails.
  const double t3 = now_us();
  for (size_t i = 0; i < nparts; ++i) {
    const DensePart& p = batch.parts[i];
    if (p.sum_only) continue;
    const bool whole = p.begin == 0 && p.last;
    const bool optimizer = layers_[static_cast<size_t>(p.layer)].spec.optimizer.enabled();
    Status s;
    // Slices of layers without an optimizer are averaged on their own (chunks already were).
    if (!whole && !optimizer && batch.kind != DenseBatchKind::kChunked) {
      s = k.Scale(p.grad + p.begin, p.end - p.begin, inv, call.stream);
    }
    // Stepped by its sink, range by range (sink_parts_ describes this batch when by_pieces).
    const bool stepped = by_pieces && sink_parts_[i].opt != nullptr;
    if (stepped) {
      s = sink_parts_[i].status;
      if (s.ok() && !sink_parts_[i].began) {
        s = InternalError("ExchangeDense: layer ", p.layer, ": the backend handed over none of "
                          "the sum to the layer's optimizer");
      }
    }
    if (p.last && s.ok()) {
      const bool chunk_averaged = batch.kind == DenseBatchKind::kChunked && !optimizer;
      if (!stepped && ((whole && !chunk_averaged) || optimizer)) {
        ExchangeBuffers b;
        b.grad = summed[i] != nullptr ? summed[i] : p.grad;
        b.params = p.params;
        s = FinishDenseSum(p.layer, b, p.step);
      }
      if (s.ok()) {
        const Layer& l = layers_[static_cast<size_t>(p.layer)];
        const double bytes = CostModel::WireBytes(
            CollectiveKind::kAllReduce, world(), 4.0 * static_cast<double>(l.spec.NumElements()));
        AddTraffic(p.layer, bytes, bytes);
      }
    }
    rep.status[i] = s;
  }
  rep.finish_us = now_us() - t3;
}

}  // namespace poseidon
