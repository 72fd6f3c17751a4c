"""The poseidon module on numpy arrays and torch tensors under mpirun: exact collective results
(rank r contributes (r + 1) * f(i)), zero-copy in-place updates, submit/wait through the engine,
and the errors raised for bad arrays and arguments."""
import sys

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


def expect_error(exc, fn, text):
    try:
        fn()
    except exc as e:
        check(text in str(e), "message %r lacks %r" % (str(e), text))
        return
    failures.append("no %s for %s" % (exc.__name__, text))


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
