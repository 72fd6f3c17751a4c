// The Handle and Comm classes of the _poseidon module and their bindings (BindComm).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings/c/binding_support.h"
#include "bindings/c/poseidon.h"
#include "bindings/python/module_common.h"

namespace poseidon::python {

namespace {

class Comm;
class SharedBuffer;

// What one submission borrows: the C handle and the Python objects whose memory the engine reads
// and writes (grad, params, u, v) until the exchange completes.
struct Inflight {
  psdHandle_t h = nullptr;
  std::vector<py::object> keep;
};

// True when the engine is done with the handle's arrays. Anything but "still running" (psdSuccess
// with done = 0) ends the borrowing: a failed exchange reports its error with done = 1, and a
// handle the registry no longer knows (its communicator was finalized) has nothing running.
bool Finished(psdHandle_t h) {
  int done = 0;
  return psdTest(h, &done) != psdSuccess || done != 0;
}

// Exchanges still running when a communicator went away without stopping them (it never
// happens after a clean destroy, which fails what is pending): their arrays stay referenced for
// the life of the process rather than be freed under the engine. Never freed.
std::vector<Inflight>& Abandoned() {
  static auto* abandoned = new std::vector<Inflight>();
  return *abandoned;
}

// A submission's Python face. While it lives it keeps its arrays; freed (del, free, garbage
// collection) before the exchange completes, it hands them and the C handle to its Comm, which
// lets them go, with the GIL held, once the exchange is done (Comm::Reap, at every submit, wait,
// test and destroy). It also holds its Comm's Python object, so the Comm outlives it.
class Handle {
 public:
  Handle(Comm* comm, py::object comm_obj, Inflight in)
      : comm_(comm), comm_obj_(std::move(comm_obj)), in_(std::move(in)) {}
  ~Handle() { Release(); }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  // True when complete; raises the exchange's error. See TimeoutMs for the timeout.
  bool Wait(py::handle timeout);
  // True when done (never blocks); raises the exchange's error.
  bool Test();
  // Frees the handle; an exchange still running keeps its arrays (in its Comm) until done.
  void Free() { Release(); }

 private:
  void Release();
  void Live(const char* what) const {
    if (in_.h == nullptr) BadArg(std::string("Handle.") + what + ": the handle was freed");
  }
  Comm* comm_;
  py::object comm_obj_;  // keeps comm_ alive
  Inflight in_;
};

// Every rank's `mine`, in rank order (an allgather over c, GIL released): how free() and
// destroy() learn which ranks still hold arrays over node-shared memory.
psdResult_t GatherPerRank(psdComm_t c, int64_t mine, std::vector<int64_t>* all) {
  int size = 1;
  psdResult_t r = psdCommSize(c, &size);
  if (r != psdSuccess) return r;
  all->assign(static_cast<size_t>(size), 0);
  py::gil_scoped_release release;
  return psdAllGather(c, &mine, all->data(), 1, psdInt64, psdMemHost, nullptr);
}

// Node-shared host memory from Python (Comm.alloc_shared, over psdMemAlloc): memory that every
// rank of the node maps, so that a collective whose arrays all lie in it reads its peers'
// inputs straight instead of copying through the shared-memory window. Its free is collective
// (psdMemFree) and unmaps it, so the numpy arrays made from it (array()) are counted: each holds,
// as its base, a capsule that keeps the SharedBuffer alive and takes one off the count when that
// array and every view of it are gone (torch.from_numpy keeps the array, so a tensor counts
// too). free() while some rank holds such an array refuses on every rank, naming it (the ranks
// exchange their counts first), and frees nothing; so does Comm.destroy(), which frees every
// allocation. A SharedBuffer collected without free() keeps its memory until its Comm is
// destroyed (a ResourceWarning says so): a free cannot run from the garbage collector, which
// runs at different times on different ranks. poseidon.finalize() (and so the interpreter's exit)
// destroys every communicator whatever arrays remain: it ends the use of the library.
class SharedBuffer {
 public:
  SharedBuffer(Comm* comm, py::object comm_obj, void* data, size_t bytes);
  ~SharedBuffer();
  SharedBuffer(const SharedBuffer&) = delete;
  SharedBuffer& operator=(const SharedBuffer&) = delete;
  // A numpy array over the memory (dtype, shape: C order, default 1-D over all of it).
  py::array Array(py::object self, py::handle dtype, py::handle shape);
  void Free();
  size_t nbytes() const { return bytes_; }
  size_t exports() const { return exports_; }
  bool freed() const { return data_ == nullptr; }

 private:
  // What an array's capsule holds. GIL held wherever it is made or dropped.
  struct Export {
    SharedBuffer* buf;
    py::object owner;  // the SharedBuffer's Python object
  };
  static void Unexport(void* p) {
    auto* e = static_cast<Export*>(p);
    --e->buf->exports_;  // before owner goes: it may be the buffer's last reference
    delete e;
  }
  Comm* comm_;
  py::object comm_obj_;  // keeps comm_ alive
  void* data_;
  size_t bytes_;
  size_t exports_ = 0;  // live arrays over data_ (GIL held)
};

class Comm {
 public:
  // mpi_comm: 0 for MPI_COMM_WORLD, else an MPI_Comm handle value (mpi4py: MPI._handleof).
  explicit Comm(uintptr_t mpi_comm) {
    if (mpi_comm == 0) {
      Check(psdCommInitWorld(&c_));
    } else {
      // Open MPI's MPI_Comm is a pointer; MPICH's an int: both travel as an integer.
      // A C-style cast converts to either representation.
      MPI_Comm mc = (MPI_Comm)mpi_comm;  // NOLINT(google-readability-casting)
      Check(psdCommInitFromMpi(mc, &c_));
    }
  }
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  ~Comm() {
    // No Handle is left (each holds this Comm); destroying fails what the engine still has.
    if (c_ != nullptr) psdCommDestroy(c_);
    Reap();
    for (Inflight& in : orphans_) Abandoned().push_back(std::move(in));
    orphans_.clear();
  }
  void Destroy() {
    if (c_ == nullptr) {
      Reap();
      return;
    }
    if (live_allocs_ > 0) RefuseWhileShared();
    psdComm_t c = c_;
    c_ = nullptr;
    psdResult_t r;
    {
      py::gil_scoped_release release;
      r = psdCommDestroy(c);
    }
    Reap();  // the engine failed what was pending: those arrays can go
    Check(r);
  }
  // Node-shared memory (see SharedBuffer): collective, like psdMemAlloc. A bad nbytes on one
  // rank joins the allocation with a size every rank refuses, so the peers fail with it.
  std::unique_ptr<SharedBuffer> AllocShared(py::object self, py::handle nbytes) {
    psdComm_t c = get();
    long long n = 0;
    std::string bad;
    if (!py::isinstance<py::int_>(nbytes) || py::isinstance<py::bool_>(nbytes)) {
      bad = "is a " + py::str(py::type::of(nbytes)).cast<std::string>() + "; expected an int";
    } else {
      try {
        n = nbytes.cast<long long>();
      } catch (const py::cast_error&) {
        bad = "is out of range; expected 1..2**63 - 1";
      }
      if (bad.empty() && n <= 0) bad = "is " + std::to_string(n) + "; expected at least 1";
    }
    void* p = nullptr;
    psdResult_t r;
    {
      py::gil_scoped_release release;
      r = psdMemAlloc(c, bad.empty() ? static_cast<size_t>(n) : 0, &p);
    }
    if (!bad.empty()) BadArg("Comm.alloc_shared: nbytes " + bad);
    Check(r, c);
    ++live_allocs_;
    return std::make_unique<SharedBuffer>(this, std::move(self), p, static_cast<size_t>(n));
  }
  // What SharedBuffer tells its Comm.
  void AddShared(SharedBuffer* b) { shared_.push_back(b); }
  void DropShared(SharedBuffer* b) {
    shared_.erase(std::remove(shared_.begin(), shared_.end(), b), shared_.end());
  }
  void Freed() { --live_allocs_; }
  // Raises unless the C communicator is still live (finalize() destroys it under this object).
  void RequireLive(const char* what) const {
    int rank = 0;
    if (c_ == nullptr || psdCommRank(c_, &rank) != psdSuccess) {
      BadArg(std::string(what) + ": its communicator was destroyed (with its memory)");
    }
  }
  // Takes over the arrays of a freed handle whose exchange still runs.
  void Adopt(Inflight in) { orphans_.push_back(std::move(in)); }
  // Lets go of the arrays (and C handles) of freed handles whose exchange is done. GIL held.
  void Reap() {
    for (size_t i = 0; i < orphans_.size();) {
      if (Finished(orphans_[i].h)) {
        psdHandleFree(orphans_[i].h);
        orphans_.erase(orphans_.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }
  // Freed handles whose arrays are still held (tests).
  size_t NumHeld() const { return orphans_.size(); }
  psdComm_t get() const {
    if (c_ == nullptr) BadArg("the communicator was destroyed");
    return c_;
  }

  int Int(psdResult_t (*fn)(psdComm_t, int*)) const {
    int v = 0;
    Check(fn(get(), &v), get());
    return v;
  }

  void AllReduce(py::handle send, py::handle recv, const std::string& detail) {
    View s, r;
    LocalChecks("psdAllReduce", "AllReduce", [&] {
      s = ToView(send, "allreduce: send", false);
      r = ToView(recv, "allreduce: recv", true);
      RequireSame(s, r, "allreduce");
      if (s.count != r.count) {
        BadArg("allreduce: recv has " + std::to_string(r.count) + " elements; expected " +
               std::to_string(s.count) + " (as send)");
      }
    });
    Blocking([&](psdComm_t c) {
      return poseidon::capi::AllReduce(c, s.data, r.data, s.count, s.dtype, s.memory, nullptr,
                                       detail.c_str());
    });
  }
  void ReduceScatter(py::handle send, py::handle recv, const std::string& detail) {
    View s, r;
    size_t world = static_cast<size_t>(Int(psdCommSize));
    LocalChecks("psdReduceScatter", "ReduceScatter", [&] {
      s = ToView(send, "reduce_scatter: send", false);
      r = ToView(recv, "reduce_scatter: recv", true);
      RequireSame(s, r, "reduce_scatter");
      if (s.count != r.count * world) {
        BadArg("reduce_scatter: send has " + std::to_string(s.count) + " elements; expected " +
               std::to_string(world) + " ranks x " + std::to_string(r.count) + " (recv)");
      }
    });
    Blocking([&](psdComm_t c) {
      return poseidon::capi::ReduceScatter(c, s.data, r.data, r.count, s.dtype, s.memory,
                                           nullptr, detail.c_str());
    });
  }
  void AllGather(py::handle send, py::handle recv, const std::string& detail) {
    View s, r;
    size_t world = static_cast<size_t>(Int(psdCommSize));
    LocalChecks("psdAllGather", "AllGather", [&] {
      s = ToView(send, "allgather: send", false);
      r = ToView(recv, "allgather: recv", true);
      RequireSame(s, r, "allgather");
      if (r.count != s.count * world) {
        BadArg("allgather: recv has " + std::to_string(r.count) + " elements; expected " +
               std::to_string(world) + " ranks x " + std::to_string(s.count) + " (send)");
      }
    });
    Blocking([&](psdComm_t c) {
      return poseidon::capi::AllGather(c, s.data, r.data, s.count, s.dtype, s.memory, nullptr,
                                       detail.c_str());
    });
  }
  void Broadcast(py::handle buf, int root, const std::string& detail) {
    View b;
    LocalChecks("psdBroadcast", "Broadcast", [&] { b = ToView(buf, "broadcast: buf", true); });
    Blocking([&](psdComm_t c) {
      return poseidon::capi::Broadcast(c, b.data, b.count, b.dtype, root, b.memory, nullptr,
                                       detail.c_str());
    });
  }
  void Barrier() {
    Blocking([&](psdComm_t c) { return psdBarrier(c); });
  }
  // A binding's own refusal of a collective (Python-level checks that fail on this rank only):
  // joins the peers' argument agreement with the message, so that their call fails at once
  // naming this rank instead of waiting for it. `call` is the peers' Backend call.
  void FailCollective(const std::string& call, const std::string& message) {
    static const char* const kCalls[] = {"AllReduce", "ReduceScatter", "AllGather",
                                         "AllGatherV", "Broadcast"};
    const char* backend_call = nullptr;
    for (const char* k : kCalls) {
      if (call == k) backend_call = k;
    }
    if (backend_call == nullptr) {
      BadArg("fail_collective: call '" + call +
             "' is unknown; expected AllReduce, ReduceScatter, AllGather, AllGatherV or Broadcast");
    }
    psdComm_t c = get();
    py::gil_scoped_release release;
    (void)poseidon::capi::FailBlockingCollective(c, "fail_collective", backend_call, message);
  }

  int RegisterLayer(const std::string& name, const std::vector<size_t>& shape,
                    const std::string& kind, const std::string& strategy, double density,
                    std::optional<std::string> candidates, std::optional<py::dict> optimizer) {
    psdLayerConfig_t cfg;
    Check(psdLayerConfigInit(&cfg));
    cfg.name = name.c_str();
    cfg.ndim = static_cast<int>(shape.size());
    cfg.shape = shape.data();
    cfg.kind = ParseKind(kind);
    cfg.strategy = ParseStrategy(strategy);
    cfg.density = density;
    if (candidates) cfg.candidates = candidates->c_str();
    if (optimizer) {
      for (auto item : *optimizer) {
        std::string key = py::str(item.first);
        py::handle val = item.second;
        if (key == "kind") {
          std::string k = py::str(val);
          if (k == "none")
            cfg.optimizer.kind = psdOptimizerNone;
          else if (k == "sgd")
            cfg.optimizer.kind = psdOptimizerSgd;
          else if (k == "adam")
            cfg.optimizer.kind = psdOptimizerAdam;
          else
            BadArg("optimizer kind '" + k + "' is unknown; expected none, sgd or adam");
        } else if (key == "lr") {
          cfg.optimizer.lr = val.cast<float>();
        } else if (key == "momentum") {
          cfg.optimizer.momentum = val.cast<float>();
        } else if (key == "nesterov") {
          cfg.optimizer.nesterov = val.cast<bool>() ? 1 : 0;
        } else if (key == "beta1") {
          cfg.optimizer.beta1 = val.cast<float>();
        } else if (key == "beta2") {
          cfg.optimizer.beta2 = val.cast<float>();
        } else if (key == "eps") {
          cfg.optimizer.eps = val.cast<float>();
        } else if (key == "weight_decay") {
          cfg.optimizer.weight_decay = val.cast<float>();
        } else {
          BadArg("optimizer option '" + key +
                 "' is unknown; expected kind, lr, momentum, "
                 "nesterov, beta1, beta2, eps or weight_decay");
        }
      }
    }
    int id = -1;
    Check(psdRegisterLayer(get(), &cfg, &id), get());
    if (id >= 0) {
      if (layers_.size() <= static_cast<size_t>(id)) layers_.resize(static_cast<size_t>(id) + 1);
      size_t count = 1;
      for (size_t d : shape) count *= d;
      layers_[static_cast<size_t>(id)] = LayerShape{true, name, shape, count, cfg.kind};
    }
    return id;
  }
  void BuildPlan(size_t batch) {
    Blocking([&](psdComm_t c) { return psdBuildPlan(c, batch); });
  }
  std::string Plan() const {
    size_t need = 0;
    Check(psdGetPlan(get(), nullptr, &need), get());
    std::string text(need, '\0');
    Check(psdGetPlan(get(), text.data(), &need), get());
    text.resize(need - 1);
    return text;
  }
  std::string LayerStrategy(int id) const {
    psdStrategy_t s;
    Check(psdGetLayerStrategy(get(), id, &s), get());
    return StrategyName(s);
  }
  int NumLayers() const { return Int(psdNumLayers); }

  // Checks what the C API cannot see, every array against the layer (dtype, memory, layout,
  // element count, factor shapes: a short array would be overrun by the engine on every rank),
  // before anything reaches it; a refused argument fails the engine on every rank
  // (SubmitChecks) and raises InvalidArgumentError here. What psdSubmit checks itself (the
  // layer id, a missing grad, params or factor, factors on a layer that is not fully connected)
  // goes to it as is (None as NULL) and raises with its message.
  std::unique_ptr<Handle> Submit(py::object self, int layer, py::handle grad, py::handle params,
                                 py::handle u, py::handle v) {
    psdComm_t c = get();
    Reap();
    Inflight in;
    float *g = nullptr, *p = nullptr;
    const float *uu = nullptr, *vv = nullptr;
    size_t batch = 0;
    const bool known = layer >= 0 && static_cast<size_t>(layer) < layers_.size() &&
                       layers_[static_cast<size_t>(layer)].known;
    if (known) {
      SubmitChecks([&] {
        const LayerShape& want = layers_[static_cast<size_t>(layer)];
        const std::string at =
            "Comm.submit(layer " + std::to_string(layer) + " '" + want.name + "'): ";
        auto f32 = [&](py::handle obj, const char* name, bool writable) -> View {
          const std::string what = at + name;
          View view = ToView(obj, what.c_str(), writable);
          if (view.dtype != psdFloat32) {
            BadArg(what + " has dtype " + DTypeName(view.dtype) + "; expected float32 elements");
          }
          if (view.memory != psdMemHost) {
            BadArg(what + " is a tensor on " + view.device +
                   "; expected host memory (a CPU array or tensor): the engine exchanges host "
                   "buffers, so copy it with .cpu() and back");
          }
          in.keep.push_back(py::reinterpret_borrow<py::object>(obj));
          return view;
        };
        auto count_is = [&](const View& view, const char* name) {
          if (view.count != want.count) {
            BadArg(at + name + " has " + std::to_string(view.count) + " elements; expected " +
                   std::to_string(want.count) + " (layer shape " + ShapeText(want.shape) + ")");
          }
        };
        if (!grad.is_none()) {
          View gv = f32(grad, "grad", true);
          count_is(gv, "grad");
          g = static_cast<float*>(gv.data);
        }
        if (!params.is_none()) {
          View pv = f32(params, "params", true);
          count_is(pv, "params");
          p = static_cast<float*>(pv.data);
        }
        // Factors: K x M and K x N for an M x N fc layer (K from whichever is given).
        const bool fc = want.kind == psdLayerFullyConnected && want.shape.size() == 2;
        const size_t m = fc ? want.shape[0] : 0, n = fc ? want.shape[1] : 0;
        if (!u.is_none()) {
          View uv = f32(u, "u", false);
          if (fc && (uv.shape.size() != 2 || uv.shape[1] != m)) {
            BadArg(at + "u has shape " + ShapeText(uv.shape) + "; expected K x " +
                   std::to_string(m) + " (K x M for layer shape " + ShapeText(want.shape) + ")");
          }
          batch = uv.shape.empty() ? 0 : uv.shape[0];
          uu = static_cast<const float*>(uv.data);
        }
        if (!v.is_none()) {
          View vv2 = f32(v, "v", false);
          if (u.is_none()) batch = vv2.shape.empty() ? 0 : vv2.shape[0];
          if (fc && (vv2.shape.size() != 2 || vv2.shape[0] != batch || vv2.shape[1] != n)) {
            BadArg(at + "v has shape " + ShapeText(vv2.shape) + "; expected " +
                   std::to_string(batch) + " x " + std::to_string(n) + " (K x N, K = " +
                   std::to_string(batch) + " as u, for layer shape " + ShapeText(want.shape) + ")");
          }
          vv = static_cast<const float*>(vv2.data);
        }
      });
    }
    psdResult_t r;
    {
      py::gil_scoped_release release;
      r = psdSubmit(c, layer, g, p, uu, vv, batch, &in.h);
    }
    Check(r, c);
    return std::make_unique<Handle>(this, std::move(self), std::move(in));
  }

  std::string AsyncError() const {
    psdResult_t r;
    Check(psdCommGetAsyncError(get(), &r));
    return r == psdSuccess ? "" : psdGetLastError(get());
  }

 private:
  // Runs the argument checks of a blocking collective; when one fails on this rank, this rank
  // joins the peers' argument agreement with the error (so they fail instead of waiting for
  // it), then raises the error here.
  template <typename F>
  void LocalChecks(const char* c_call, const char* backend_call, F&& checks) {
    try {
      checks();
    } catch (py::error_already_set& e) {
      std::string message = e.what();
      psdComm_t c = get();
      {
        py::gil_scoped_release release;
        (void)poseidon::capi::FailBlockingCollective(c, c_call, backend_call, message);
      }
      throw;
    }
  }
  // Runs Comm.submit's array checks; when one fails on this rank, the engine fails on every
  // rank (the peers would wait for this submission until the stall abort), then the error is
  // raised here.
  template <typename F>
  void SubmitChecks(F&& checks) {
    try {
      checks();
    } catch (py::error_already_set& e) {
      ReportSubmitError(py::str(e.value()).cast<std::string>());
      throw;
    } catch (const std::exception& e) {  // e.g. a pybind11 cast error on an odd tensor
      ReportSubmitError(e.what());
      throw;
    }
  }
  void ReportSubmitError(const std::string& message) {
    if (c_ == nullptr) return;  // destroyed: no engine to tell
    psdComm_t c = c_;
    py::gil_scoped_release release;
    (void)poseidon::capi::FailSubmit(c, message);
  }
  template <typename F>
  void Blocking(F&& f) {
    psdComm_t c = get();
    psdResult_t r;
    {
      py::gil_scoped_release release;
      r = f(c);
    }
    Check(r, c);
  }
  // Destroying frees every node-shared allocation: arrays made from one on any rank would point
  // at unmapped memory. live_allocs_ is the same on every rank (allocations and frees succeed or
  // fail on every rank alike), so every rank with some comes here and learns every rank's count
  // of live arrays; all raise, destroying nothing, where some rank holds one. Where the
  // exchange itself fails (a peer is gone), a rank that holds none destroys anyway.
  void RefuseWhileShared() {
    int64_t mine = 0;
    for (const SharedBuffer* b : shared_) mine += static_cast<int64_t>(b->exports());
    std::vector<int64_t> all;
    const psdResult_t r = GatherPerRank(c_, mine, &all);
    const int size = static_cast<int>(all.size());
    if (r != psdSuccess) {
      if (mine == 0) return;
      const std::string why = psdGetLastError(c_);
      BadArg("Comm.destroy: " + std::to_string(mine) +
             " arrays made by SharedBuffer.array() are alive on this rank (and the ranks could "
             "not compare theirs: " + why + "); nothing was destroyed");
    }
    std::string holders;
    for (int q = 0; q < size; ++q) {
      if (all[static_cast<size_t>(q)] == 0) continue;
      holders += (holders.empty() ? "rank " : ", rank ") + std::to_string(q) + " (" +
                 std::to_string(all[static_cast<size_t>(q)]) + ")";
    }
    if (!holders.empty()) {
      BadArg("Comm.destroy: arrays made by SharedBuffer.array() are alive on " + holders +
             "; destroying would unmap the memory under them: drop them and free() each "
             "buffer first (nothing was destroyed, on any rank)");
    }
  }
  psdComm_t c_ = nullptr;
  // Live SharedBuffer objects (each holds this Comm's Python object), and the allocations not
  // freed (a collected SharedBuffer's memory stays allocated until destroy).
  std::vector<SharedBuffer*> shared_;
  size_t live_allocs_ = 0;
  // What register_layer was given, by layer id: submit checks the arrays against it.
  struct LayerShape {
    bool known = false;
    std::string name;
    std::vector<size_t> shape;
    size_t count = 0;
    psdLayerKind_t kind = psdLayerDense;
  };
  std::vector<LayerShape> layers_;
  // Freed handles whose exchange still ran: their C handles and arrays, until Reap sees them
  // done.
  std::vector<Inflight> orphans_;
};

bool Handle::Wait(py::handle timeout) {
  Live("wait");
  comm_->Reap();
  const long long timeout_ms = TimeoutMs(timeout);
  psdResult_t r;
  {
    py::gil_scoped_release release;
    r = psdWait(in_.h, timeout_ms);
  }
  if (r == psdTimeout) return false;
  Check(r);
  return true;
}

bool Handle::Test() {
  Live("test");
  comm_->Reap();
  int done = 0;
  Check(psdTest(in_.h, &done));
  return done != 0;
}

void Handle::Release() {
  if (in_.h == nullptr) return;
  if (Finished(in_.h)) {
    psdHandleFree(in_.h);  // done: the arrays go with in_ below
  } else {
    comm_->Adopt(std::move(in_));  // still running: the Comm keeps the arrays until done
  }
  in_ = Inflight{};
  comm_->Reap();
}

SharedBuffer::SharedBuffer(Comm* comm, py::object comm_obj, void* data, size_t bytes)
    : comm_(comm), comm_obj_(std::move(comm_obj)), data_(data), bytes_(bytes) {
  comm_->AddShared(this);
}

SharedBuffer::~SharedBuffer() {
  comm_->DropShared(this);
  if (data_ != nullptr && Py_IsInitialized()) {
    // Its memory stays allocated until the Comm is destroyed.
    if (PyErr_WarnEx(PyExc_ResourceWarning,
                     "poseidon.SharedBuffer collected without free(): its node-shared memory "
                     "stays allocated until its Comm is destroyed",
                     1) != 0) {
      PyErr_Clear();
    }
  }
}

py::array SharedBuffer::Array(py::object self, py::handle dtype, py::handle shape) {
  if (data_ == nullptr) BadArg("SharedBuffer.array: the buffer was freed");
  comm_->RequireLive("SharedBuffer.array");
  py::dtype dt = py::dtype::from_args(py::reinterpret_borrow<py::object>(dtype));
  const size_t item = static_cast<size_t>(dt.itemsize());
  std::vector<py::ssize_t> dims;
  size_t count = 1;
  if (shape.is_none()) {
    if (item == 0 || bytes_ % item != 0) {
      BadArg("SharedBuffer.array: " + std::to_string(bytes_) + " bytes are not a whole number of " +
             py::str(dt).cast<std::string>() + " elements; give a shape");
    }
    count = bytes_ / item;
    dims.push_back(static_cast<py::ssize_t>(count));
  } else {
    std::vector<long long> asked;
    if (py::isinstance<py::int_>(shape)) {
      asked.push_back(shape.cast<long long>());
    } else {
      for (py::handle d : shape) asked.push_back(d.cast<long long>());
    }
    for (long long d : asked) {
      if (d < 0) BadArg("SharedBuffer.array: shape has " + std::to_string(d) +
                        "; expected sizes of at least 0");
      dims.push_back(static_cast<py::ssize_t>(d));
      count *= static_cast<size_t>(d);
    }
    if (count != 0 && (count > bytes_ || count * item > bytes_)) {
      BadArg("SharedBuffer.array: shape of " + std::to_string(count) + " " +
             py::str(dt).cast<std::string>() + " elements needs more than the buffer's " +
             std::to_string(bytes_) + " bytes");
    }
  }
  py::capsule keep(new Export{this, std::move(self)}, &SharedBuffer::Unexport);
  ++exports_;
  return py::array(dt, dims, {}, data_, keep);
}

void SharedBuffer::Free() {
  psdComm_t c = comm_->get();
  // Every rank says first whether it can free (0), was freed already (-1) or holds arrays over
  // the memory (their count): a refusal on one rank fails the free on every rank, naming it,
  // and nothing is freed anywhere.
  const int64_t mine = data_ == nullptr ? -1 : static_cast<int64_t>(exports_);
  std::vector<int64_t> all;
  psdResult_t r = GatherPerRank(c, mine, &all);
  Check(r, c);
  const int size = static_cast<int>(all.size());
  std::string refusals;
  for (int q = 0; q < size; ++q) {
    const int64_t v = all[static_cast<size_t>(q)];
    if (v == 0) continue;
    refusals += refusals.empty() ? "" : "; ";
    refusals += "rank " + std::to_string(q) +
                (v < 0 ? " freed it already"
                       : " holds " + std::to_string(v) +
                             " arrays made by array() (a view or a tensor over one counts)");
  }
  if (!refusals.empty()) {
    BadArg("SharedBuffer.free: " + refusals + "; nothing was freed, on any rank");
  }
  {
    py::gil_scoped_release release;
    r = psdMemFree(c, data_);
  }
  Check(r, c);
  data_ = nullptr;
  comm_->Freed();
}

}  // namespace

void BindComm(py::module_& m) {
  py::class_<Handle>(m, "Handle")
      .def("wait", &Handle::Wait, py::arg("timeout_ms") = py::none(),
           "Waits up to timeout_ms milliseconds (None, < 0, inf or beyond 1e10: for ever; 0 only "
           "checks); True when done, False on timeout; raises the exchange's error.")
      .def("test", &Handle::Test, "True when done (never blocks); raises the exchange's error.")
      .def("free", &Handle::Free);

  py::class_<SharedBuffer>(m, "SharedBuffer")
      .def(
          "array",
          [](py::object self, py::handle dtype, py::handle shape) {
            return self.cast<SharedBuffer&>().Array(self, dtype, shape);
          },
          py::arg("dtype") = "float32", py::arg("shape") = py::none(),
          "A numpy array over the memory, in C order (default: 1-D over all of it). Counted: "
          "free() refuses while it, a view of it or a tensor made from it lives.")
      .def("free", &SharedBuffer::Free,
           "Collective, like alloc_shared: frees the memory on every rank. Refused on every "
           "rank while some rank still holds an array over it.")
      .def_property_readonly("nbytes", &SharedBuffer::nbytes)
      .def_property_readonly("exports", &SharedBuffer::exports,
                             "Arrays made by array() that are still alive on this rank.")
      .def_property_readonly("freed", &SharedBuffer::freed);

  static const char* const kDetailDoc =
      "detail: the caller's own terms of the call beyond its arrays (e.g. the op it applies to "
      "the result), compared across ranks like the element count: where it differs, every rank "
      "raises MismatchError naming each rank's text.";
  py::class_<Comm>(m, "Comm")
      .def(py::init<uintptr_t>(), py::arg("mpi_comm") = 0)
      .def_property_readonly("rank", [](const Comm& c) { return c.Int(psdCommRank); })
      .def_property_readonly("size", [](const Comm& c) { return c.Int(psdCommSize); })
      .def_property_readonly("local_rank", [](const Comm& c) { return c.Int(psdCommLocalRank); })
      .def_property_readonly("local_size", [](const Comm& c) { return c.Int(psdCommLocalSize); })
      .def("allreduce", &Comm::AllReduce, py::arg("send"), py::arg("recv"),
           py::arg("detail") = "", kDetailDoc)
      .def("reduce_scatter", &Comm::ReduceScatter, py::arg("send"), py::arg("recv"),
           py::arg("detail") = "", kDetailDoc)
      .def("allgather", &Comm::AllGather, py::arg("send"), py::arg("recv"),
           py::arg("detail") = "", kDetailDoc)
      .def("broadcast", &Comm::Broadcast, py::arg("buf"), py::arg("root") = 0,
           py::arg("detail") = "", kDetailDoc)
      .def("barrier", &Comm::Barrier)
      .def("fail_collective", &Comm::FailCollective, py::arg("call"), py::arg("message"),
           "Joins the peers' matching collective with this rank's refusal (message), so that it "
           "fails on every rank at once; returns nothing (the caller raises its own error).")
      .def("register_layer", &Comm::RegisterLayer, py::arg("name"), py::arg("shape"),
           py::arg("kind") = "dense", py::arg("strategy") = "auto", py::arg("density") = 0.0,
           py::arg("candidates") = py::none(), py::arg("optimizer") = py::none())
      .def_property_readonly("num_layers", &Comm::NumLayers)
      .def("build_plan", &Comm::BuildPlan, py::arg("batch"))
      .def("plan", &Comm::Plan)
      .def("layer_strategy", &Comm::LayerStrategy, py::arg("layer"))
      .def(
          "submit",
          [](py::object self, int layer, py::handle grad, py::handle params, py::handle u,
             py::handle v) {
            Comm& comm = self.cast<Comm&>();
            return comm.Submit(self, layer, grad, params, u, v);
          },
          py::arg("layer"), py::arg("grad"), py::arg("params") = py::none(),
          py::arg("u") = py::none(), py::arg("v") = py::none())
      .def(
          "alloc_shared",
          [](py::object self, py::handle nbytes) {
            Comm& comm = self.cast<Comm&>();
            return comm.AllocShared(self, nbytes);
          },
          py::arg("nbytes"),
          "Collective: nbytes of host memory that every rank of the node maps (psdMemAlloc), "
          "as a SharedBuffer; make numpy arrays over it with its array(). A collective whose "
          "arrays all lie in such memory on every rank reads its peers' inputs straight. Every "
          "rank calls alloc_shared and SharedBuffer.free in the same order (sizes may differ).")
      .def("async_error", &Comm::AsyncError)
      .def_property_readonly("_num_held", &Comm::NumHeld,
                             "Freed handles whose exchange still runs (their arrays are held).")
      .def("destroy", &Comm::Destroy);
}

}  // namespace poseidon::python
