"""The poseidon module on numpy arrays and torch tensors under mpirun: exact collective results
(rank r contributes (r + 1) * f(i)), zero-copy in-place updates, submit/wait through the engine,
and the errors raised for bad arrays and arguments."""
import gc
import sys
import time
import weakref

import numpy as np

try:
    import torch
except ImportError:  # the tensor checks need PyTorch: skipped (ctest SKIP_RETURN_CODE 77)
    print("module_test: torch is not importable; skipped")
    sys.exit(77)

import poseidon

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def expect_error(exc, fn, texts):
    """fn() raises exc whose message contains each of texts (a string or a tuple)."""
    texts = (texts,) if isinstance(texts, str) else texts
    try:
        fn()
    except exc as e:
        for text in texts:
            check(text in str(e), "message %r lacks %r" % (str(e), text))
        return
    failures.append("no %s for %s" % (exc.__name__, texts))


comm = poseidon.init()
r, p = comm.rank, comm.size
tri = p * (p + 1) / 2
f = (np.arange(1001) % 7 + 1).astype(np.float64)

for dtype in (np.float32, np.float64, np.int32, np.int64, np.float16):
    x = ((r + 1) * f).astype(dtype)
    out = np.empty_like(x)
    comm.allreduce(x, out)
    check(np.array_equal(out, (tri * f).astype(dtype)), "allreduce %s" % dtype.__name__)
    comm.allreduce(x, x)  # in place, no copy: the caller's array changes
    check(np.array_equal(x, (tri * f).astype(dtype)), "in-place allreduce %s" % dtype.__name__)

t = torch.arange(10, dtype=torch.float32) * (r + 1)
comm.allreduce(t, t)
check(torch.equal(t, torch.arange(10, dtype=torch.float32) * tri), "torch allreduce")
tb = torch.ones(8, dtype=torch.bfloat16) * (r + 1)
comm.allreduce(tb, tb)
check(torch.equal(tb, torch.full((8,), tri, dtype=torch.bfloat16)), "bfloat16 allreduce")

send = ((r + 1) * np.arange(3 * p)).astype(np.float32)
recv = np.empty(3, np.float32)
comm.reduce_scatter(send, recv)
check(np.array_equal(recv, tri * np.arange(3 * r, 3 * r + 3, dtype=np.float32)),
      "reduce_scatter")
gathered = np.empty(2 * p, np.int64)
comm.allgather(np.array([r, -r], np.int64), gathered)
check(list(gathered) == [v for q in range(p) for v in (q, -q)], "allgather")
b = np.full(4, r, np.float64)
comm.broadcast(b, p - 1)
check(np.all(b == p - 1), "broadcast")

# Layers, plan and the engine.
dense = comm.register_layer("dense", [1000], strategy="allreduce")
fc = comm.register_layer("fc", [6, 5], kind="fc", strategy="sfb")
comm.build_plan(3)
check(comm.layer_strategy(fc) == "sfb" and comm.layer_strategy(dense) == "allreduce", "plan")
check("fc" in comm.plan() and comm.num_layers == 2, "plan text")
for step in range(3):
    g = ((r + 1) * f[:1000]).astype(np.float32)
    gt = torch.zeros(6, 5)
    u = torch.full((3, 6), float(r + 1))
    v = torch.ones(3, 5)
    h2 = comm.submit(fc, gt, u=u, v=v)
    h1 = comm.submit(dense, g)
    check(h1.wait() and h2.wait(timeout_ms=60000) and h2.test(), "wait")
    check(np.array_equal(g, ((p + 1) / 2 * f[:1000]).astype(np.float32)), "dense average")
    check(torch.equal(gt, torch.full((6, 5), 3 * (p + 1) / 2)), "sfb average")
check(comm.async_error() == "", "no async error")

# Result codes: one class each, a poseidon.Error, carrying its psdResult_t.
codes = {"InvalidArgumentError": 1, "MismatchError": 2, "BackendError": 3, "TimeoutError": 4,
         "AbortedError": 5, "UnavailableError": 6, "InternalError": 7, "UnimplementedError": 8,
         "PeerLostError": 9}
for name, code in codes.items():
    cls = getattr(poseidon, name)
    check(issubclass(cls, poseidon.Error) and cls.code == code, "%s.code == %d" % (name, code))
    check(poseidon._ext._error_class(code) is cls, "code %d raises %s" % (code, name))
check(poseidon._ext._error_class(10) is poseidon.Error, "unknown code raises Error")


def dense_step(timeout, pending):
    """One exchange of the dense layer waited with `timeout`; with `pending`, rank 0 waits while
    the other ranks are 0.3 s from submitting (its handle is pending when the wait starts)."""
    if pending and r != 0:
        time.sleep(0.3)
    g = ((r + 1) * f[:1000]).astype(np.float32)
    h = comm.submit(dense, g)
    t0 = time.monotonic()
    check(h.wait(timeout) is True, "wait(%r) completes" % (timeout,))
    if pending and r == 0 and p > 1:
        check(time.monotonic() - t0 > 0.1, "wait(%r) waited for the pending handle" % (timeout,))
    check(np.array_equal(g, ((p + 1) / 2 * f[:1000]).astype(np.float32)),
          "dense average after wait(%r)" % (timeout,))
    check(h.wait(timeout) is True, "completed wait(%r)" % (timeout,))
    return h


# Timeouts too large for a clock duration wait for ever (they used to time out at once).
for timeout in (float("inf"), 1e13, 10**30, 2**63 - 1, 10**10 + 1, None, -1, -float("inf")):
    dense_step(timeout, pending=True).free()
h = dense_step(60000, pending=False)
expect_error(poseidon.InvalidArgumentError, lambda: h.wait(float("nan")), "timeout_ms is nan")
expect_error(poseidon.InvalidArgumentError, lambda: h.wait("soon"), "timeout_ms is a")
h.free()

# A re-plan, the ranks arriving one after the other: the first one's engine shutdown stops the
# others' engines while they poll async_error; that clean stop is no asynchronous error.
for first in range(min(p, 2)):
    if r != first:
        for _ in range(30):
            check(comm.async_error() == "", "no async error while a peer re-plans")
            time.sleep(0.01)
    comm.build_plan(3)
    dense_step(-1, pending=False).free()
    check(comm.async_error() == "", "no async error after a re-plan")

# Errors: bad arrays are refused before anything moves (the same on every rank).
x = np.zeros(4, np.float32)
expect_error(poseidon.InvalidArgumentError, lambda: comm.allreduce(x[::2], x[:2]),
             "not C-contiguous")
expect_error(ValueError, lambda: comm.allreduce(x, np.zeros(5, np.float32)),
             "recv has 5 elements; expected 4")
ro = np.zeros(4, np.float32)
ro.flags.writeable = False
expect_error(poseidon.InvalidArgumentError, lambda: comm.allreduce(x, ro), "read-only")
expect_error(poseidon.InvalidArgumentError, lambda: comm.allreduce(np.zeros(3, np.complex64),
                                                                   np.zeros(3, np.complex64)),
             "not supported")
expect_error(poseidon.InvalidArgumentError,
             lambda: comm.allreduce(torch.zeros(4, 4).t(), torch.zeros(4, 4)), "not contiguous")
expect_error(poseidon.InvalidArgumentError,
             lambda: comm.allreduce(torch.zeros(2, dtype=torch.bool), torch.zeros(2)),
             "torch.bool is not supported")
expect_error(poseidon.InvalidArgumentError, lambda: comm.allreduce([1.0, 2.0], x),
             "neither a buffer")
expect_error(poseidon.InvalidArgumentError, lambda: comm.broadcast(x, p), "root")
# A bad array on one rank only: that rank joins the peers' argument agreement, so every rank
# fails (the peers' message names the rank) instead of the peers waiting for it.
if p > 1:
    bad = p - 1
    recv = np.zeros(5 if r == bad else 4, np.float32)
    expect_error(poseidon.InvalidArgumentError, lambda: comm.allreduce(x, recv),
                 "recv has 5 elements" if r == bad else "rank %d passed an invalid argument" % bad)
    y = np.ones(4, np.float32)
    comm.allreduce(y, y)  # the communicator still works
    check(np.all(y == p), "allreduce after a one-rank error")
expect_error(poseidon.InvalidArgumentError,
             lambda: comm.register_layer("bad", [4], kind="sparse", density=2.0),
             "density 2 is out of range")
expect_error(poseidon.InvalidArgumentError, lambda: comm.register_layer("x", [4], kind="conv"),
             "layer kind 'conv' is unknown")
expect_error(poseidon.InvalidArgumentError, lambda: poseidon.set_setting("NOPE", "1"), "NOPE")
# Comm.submit, 1: a handle dropped (del, a collected reference cycle) while its exchange runs
# keeps its arrays in its Comm until the exchange is done (before, `del h` on a 16 MiB layer
# crashed every rank); the other handles' waits and a barrier still work, with exact results.
big = 4 * 1024 * 1024
avg = (p + 1) / 2
cA = poseidon.Comm()
cA.register_layer("big0", [big], strategy="allreduce")
cA.register_layer("big1", [big], strategy="allreduce")
cA.register_layer("small", [1000], strategy="allreduce")
cA.build_plan(8)
dropped = []
for it in range(4):
    # Rank 0 submits and drops its handle while the peers are 0.3 s from submitting: at np > 1
    # that exchange is certainly still running when the handle goes.
    held = p > 1 and it == 0
    if held and r != 0:
        time.sleep(0.3)
    a = np.full(big, r + 1.0, np.float32) if it % 2 == 0 else torch.full((big,), r + 1.0)
    dropped.append(weakref.ref(a))
    h0 = cA.submit(0, a)
    del a
    if it == 3:  # the handle in a reference cycle, freed by the cycle collector
        box = [h0]
        box.append(box)
        del box
    del h0
    gc.collect()
    if held and r == 0:
        check(dropped[-1]() is not None and cA._num_held >= 1,
              "a dropped handle's array is kept while its exchange runs")
    t1 = torch.full((big,), r + 1.0)
    h1 = cA.submit(1, t1)
    s = ((r + 1) * f[:1000]).astype(np.float32)
    h2 = cA.submit(2, s)
    junk = [np.full(big, -7.0, np.float32) for _ in range(2)]  # may reuse freed memory
    check(h1.wait(60000) and h2.wait(60000), "waits after a dropped handle complete")
    check(bool(torch.all(t1 == avg)), "big average after a dropped handle")
    check(np.array_equal(s, (avg * f[:1000]).astype(np.float32)),
          "small average after a dropped handle")
    del junk
    cA.barrier()
# Once their exchanges are done the dropped arrays are let go (reaped at submit / wait): the
# ranks agree on when to stop, so they make the same submissions.
for _ in range(500):
    g = np.ones(1000, np.float32)
    cA.submit(2, g).wait(60000)
    left = np.array([cA._num_held + sum(w() is not None for w in dropped)], np.int64)
    comm.allreduce(left, left)
    if left[0] == 0:
        break
    time.sleep(0.01)
check(left[0] == 0, "dropped arrays released once their exchanges are done (%d left)" % left[0])
hF = cA.submit(2, np.ones(1000, np.float32))
hF.wait()
hF.free()
expect_error(poseidon.InvalidArgumentError, lambda: hF.wait(), "the handle was freed")
cA.destroy()
expect_error(poseidon.InvalidArgumentError, lambda: cA.submit(2, np.ones(1000, np.float32)),
             "destroyed")
# A handle keeps its Comm: the last reference to the Comm dropped while an exchange runs.
cB = poseidon.Comm()
cB.register_layer("big", [big], strategy="allreduce")
cB.build_plan(8)
gB = np.full(big, r + 1.0, np.float32)
hB = cB.submit(0, gB)
del cB
gc.collect()
check(hB.wait(60000) and np.all(gB == avg), "a handle keeps its Comm alive")
del hB  # the Comm's last reference: destroyed here, at the same point on every rank


# Comm.submit, 2: every array is checked against the layer before anything reaches the C API,
# the rest (layer id, a missing grad or factor, factors on a layer that is not fc) by psdSubmit;
# the caller gets an InvalidArgumentError naming the call, the argument, its value and what was
# expected. A bad argument on every rank: each rank raises (its engine fails everywhere; a
# re-plan starts a new one).
class FakeCudaTensor:
    """Looks like a CUDA float32 torch tensor (this build and machine have no GPU)."""

    def __init__(self, n):
        self.shape = (n,)
        self.dtype = torch.float32
        self.device = torch.device("cuda", 0)

    def data_ptr(self):
        return 0

    def is_contiguous(self):
        return True

    def numel(self):
        return self.shape[0]


cC = poseidon.Comm()
cC.register_layer("big", [big], strategy="allreduce")
cC.register_layer("fc", [64, 32], kind="fc", strategy="sfb")
cC.register_layer("w2d", [64, 32], strategy="allreduce")
cC.build_plan(8)
ro = np.zeros(big, np.float32)
ro.flags.writeable = False
g2k = np.zeros(64 * 32, np.float32)
u8, v8 = np.zeros((8, 64), np.float32), np.zeros((8, 32), np.float32)
at0, at1 = "Comm.submit(layer 0 'big'): ", "Comm.submit(layer 1 'fc'): "
bad_args = [
    (lambda: cC.submit(0, np.zeros(10, np.float32)),
     at0 + "grad has 10 elements; expected %d (layer shape %d)" % (big, big)),
    (lambda: cC.submit(0, np.zeros(big, np.float32), params=np.zeros(big - 1, np.float32)),
     at0 + "params has %d elements; expected %d" % (big - 1, big)),
    (lambda: cC.submit(0, np.zeros(big, np.float64)),
     at0 + "grad has dtype float64; expected float32"),
    (lambda: cC.submit(0, torch.zeros(big, dtype=torch.float16)),
     at0 + "grad has dtype float16; expected float32"),
    (lambda: cC.submit(0, np.zeros(2 * big, np.float32)[::2]),
     at0 + "grad: array is not C-contiguous"),
    (lambda: cC.submit(1, torch.zeros(64, 32).t()), at1 + "grad: tensor is not contiguous"),
    (lambda: cC.submit(0, ro), at0 + "grad: array is read-only; expected a writable array"),
    (lambda: cC.submit(0, np.zeros(big, np.float32), params=ro),
     at0 + "params: array is read-only"),
    (lambda: cC.submit(0, FakeCudaTensor(big)),
     at0 + "grad is a tensor on cuda; expected host memory"),
    (lambda: cC.submit(0, None), "psdSubmit: layer 0 step 0: layer 'big': grad is null; "
     "expected %d floats" % big),
    (lambda: cC.submit(0, [0.0] * 10), at0 + "grad: <class 'list'> is neither a buffer"),
    (lambda: cC.submit(7, np.zeros(10, np.float32)),
     "psdSubmit: layer id 7 is out of range; expected 0..2"),
    (lambda: cC.submit(1, g2k, u=np.zeros((8, 32), np.float32), v=v8),
     at1 + "u has shape 8 x 32; expected K x 64 (K x M for layer shape 64 x 32)"),
    (lambda: cC.submit(1, g2k, u=np.zeros(64, np.float32), v=v8), at1 + "u has shape 64;"),
    (lambda: cC.submit(1, g2k, u=u8, v=np.zeros((4, 32), np.float32)),
     at1 + "v has shape 4 x 32; expected 8 x 32 (K x N, K = 8 as u"),
    (lambda: cC.submit(1, g2k, u=u8), "psdSubmit: layer 1 step 0: layer 'fc': only one of u"),
    (lambda: cC.submit(1, g2k, v=v8), "psdSubmit: layer 1 step 0: layer 'fc': only one of u"),
    (lambda: cC.submit(1, g2k, u=u8.astype(np.float64), v=v8), at1 + "u has dtype float64"),
    (lambda: cC.submit(2, g2k, u=u8, v=v8),
     "psdSubmit: layer 2 step 0: layer 'w2d' is dense; sufficient factors (u, v) need a fully "
     "connected layer"),
]
for call, text in bad_args:
    expect_error(poseidon.InvalidArgumentError, call, text)
    cC.build_plan(8)
# Read-only factors are fine (only read); the sfb exchange averages u^T v over the ranks.
u_ro, v_ro = np.full((8, 64), r + 1.0, np.float32), np.ones((8, 32), np.float32)
u_ro.flags.writeable = v_ro.flags.writeable = False
gfc = np.zeros((64, 32), np.float32)
check(cC.submit(1, gfc, u=u_ro, v=v_ro).wait(60000) and np.all(gfc == 8 * avg),
      "sfb with read-only factors")

# Comm.submit, 3: a bad argument on one rank only fails every rank within seconds (not at the
# stall abort): the peers' pending handles raise InvalidArgumentError naming that rank and the
# problem, and so does their async_error (the bad rank's names the problem).
one_rank = [
    (lambda: cC.submit(0, np.zeros(10, np.float32)), "grad has 10 elements; expected %d" % big),
    (lambda: cC.submit(0, np.zeros(big, np.float64)), "grad has dtype float64"),
    (lambda: cC.submit(0, np.zeros(2 * big, np.float32)[::2]), "grad: array is not C-contiguous"),
    (lambda: cC.submit(0, ro), "grad: array is read-only"),
    (lambda: cC.submit(0, FakeCudaTensor(big)), "grad is a tensor on cuda"),
]
for i, (call, text) in enumerate(one_rank):
    bad = (p - 1 - i) % p
    t0 = time.monotonic()
    if r == bad:
        expect_error(poseidon.InvalidArgumentError, call, text)
    else:
        gp = np.ones(big, np.float32)
        hp = cC.submit(0, gp)
        expect_error(poseidon.InvalidArgumentError, lambda: hp.wait(30000),
                     ("failed on rank %d" % bad, text))
        del hp
    msg = cC.async_error()
    while msg == "" and time.monotonic() - t0 < 10:
        time.sleep(0.01)
        msg = cC.async_error()
    check(text in msg and (r == bad or "failed on rank %d" % bad in msg),
          "async error %r names rank %d and %r" % (msg, bad, text))
    check(time.monotonic() - t0 < 10, "one rank's refused submit failed every rank fast")
    cC.build_plan(8)
gC = np.full(big, r + 1.0, np.float32)
check(cC.submit(0, gC).wait(60000) and np.all(gC == avg), "an exchange after the errors")
cC.destroy()


c2 = poseidon.Comm()
c2.destroy()
expect_error(poseidon.InvalidArgumentError, lambda: c2.barrier(), "destroyed")
check(poseidon.version() == poseidon.VERSION_CODE, "version")

bad = np.array([len(failures)], np.int64)
comm.allreduce(bad, bad)
for msg in failures:
    print("rank %d: FAIL %s" % (r, msg), file=sys.stderr)
if r == 0:
    print("module_test: %s" % ("PASSED" if bad[0] == 0 else "FAILED"))
sys.exit(0 if bad[0] == 0 else 1)
