"""poseidon.torch's Horovod API, case by case, against values computed locally from every
rank's known input. Run under mpirun (np 2 and 4); rank 0 prints one line per case and the
exit status is 0 only when every case passed on every rank."""
import sys
import threading
import time
import traceback

import numpy as np

try:
    import torch
except ImportError:
    print("torch is not importable; skipped")
    sys.exit(77)

import poseidon
import poseidon.torch as hvd

HOROVOD_NAMES = """allgather_object broadcast_object broadcast_optimizer_state broadcast_parameters
allreduce allreduce_async allreduce_ allreduce_async_ grouped_allreduce grouped_allreduce_async
grouped_allreduce_ grouped_allreduce_async_ sparse_allreduce_async allgather allgather_async
grouped_allgather grouped_allgather_async broadcast broadcast_async broadcast_ broadcast_async_
alltoall alltoall_async reducescatter reducescatter_async grouped_reducescatter
grouped_reducescatter_async join barrier poll synchronize init shutdown is_initialized
start_timeline stop_timeline size local_size cross_size rank local_rank cross_rank
is_homogeneous mpi_threads_supported mpi_enabled mpi_built gloo_enabled gloo_built nccl_built
ddl_built ccl_built cuda_built rocm_built ProcessSet global_process_set add_process_set
remove_process_set Average Sum Adasum Min Max Product HorovodInternalError Compression
DistributedOptimizer SyncBatchNorm""".split()

INTS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def close(a, b, what, tol=1e-6):
    a = a.to(torch.float64) if a.dtype != torch.bool else a
    b = b.to(torch.float64) if b.dtype != torch.bool else b
    if a.shape != b.shape or not torch.allclose(a, b, rtol=tol, atol=tol):
        raise AssertionError("%s: got %s, expected %s" % (what, a.tolist(), b.tolist()))


def same(a, b, what):
    if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
        raise AssertionError("%s: got %s %s, expected %s %s"
                             % (what, a.dtype, a.tolist(), b.dtype, b.tolist()))


def data(r, dtype, n=6):
    """Rank r's input: mixed signs for signed types, values that overflow a uint8 sum."""
    if dtype == torch.uint8:
        return (torch.arange(n, dtype=torch.int64) * 40 + 7 * r + 90).to(dtype)
    if dtype == torch.bool:
        return (torch.arange(n) + r) % 3 == 0
    v = torch.arange(n, dtype=torch.int64) * (r + 1) - 3 * r - 1
    if dtype.is_floating_point:
        return (v.to(torch.float64) * 0.25).to(dtype)
    return v.to(dtype)


def expected_reduce(op, dtype, inputs, size):
    """Horovod's result: a sum in the type (wrapping), Average truncating toward zero."""
    if op in ("sum", "average"):
        if dtype.is_floating_point:
            s = torch.stack([x.to(torch.float64) for x in inputs]).sum(0)
            return (s / size if op == "average" else s).to(dtype)
        s = torch.stack([x.to(torch.int64) for x in inputs]).sum(0).to(dtype)
        if op == "average":
            s = torch.div(s.to(torch.int64), size, rounding_mode="trunc").to(dtype)
        return s
    acc = inputs[0].clone()
    for x in inputs[1:]:
        acc = torch.minimum(acc, x) if op == "min" else torch.maximum(acc, x) \
            if op == "max" else acc * x
    return acc


def tol_of(dtype):
    return {torch.float16: 1e-2, torch.bfloat16: 5e-2}.get(dtype, 1e-6)


# -- cases --------------------------------------------------------------------------------
def case_names(r, n):
    missing = [x for x in HOROVOD_NAMES if not hasattr(hvd, x)]
    check(not missing, "missing names %s" % missing)
    check(set(HOROVOD_NAMES) <= set(hvd.__all__), "__all__ lacks %s"
          % sorted(set(HOROVOD_NAMES) - set(hvd.__all__)))


def case_basics(r, n):
    check(hvd.rank() == r and hvd.size() == n, "rank/size")
    check(0 <= hvd.cross_rank() < hvd.cross_size(), "cross_rank in range")
    check(hvd.cross_size() * hvd.local_size() == n or not hvd.is_homogeneous(), "cross_size")
    check(hvd.mpi_built() and hvd.mpi_enabled() and not hvd.gloo_enabled(), "built flags")
    check(hvd.HorovodInternalError is poseidon.PeerLostError, "HorovodInternalError")
    check(hvd.global_process_set.ranks == list(range(n)), "global_process_set ranks")


def case_allreduce_dtypes(r, n):
    for dtype in INTS + FLOATS:
        inputs = [data(k, dtype) for k in range(n)]
        for op in (hvd.Sum, hvd.Average):
            want = expected_reduce(op, dtype, inputs, n)
            x = data(r, dtype)
            got = hvd.allreduce(x, op=op)
            same(x, inputs[r], "allreduce leaves its input")
            close(got, want, "allreduce %s %s" % (op, dtype), tol_of(dtype))
            check(got.dtype == dtype, "allreduce keeps %s" % dtype)
            y = data(r, dtype)
            hvd.allreduce_(y, op=op)
            close(y, want, "allreduce_ %s %s" % (op, dtype), tol_of(dtype))
            h = hvd.allreduce_async(data(r, dtype), op=op)
            close(hvd.synchronize(h), want, "allreduce_async %s" % dtype, tol_of(dtype))
            z = data(r, dtype)
            h = hvd.allreduce_async_(z, op=op)
            hvd.synchronize(h)
            close(z, want, "allreduce_async_ %s" % dtype, tol_of(dtype))
    # Integer Average truncates toward zero: (-3 + -2) / 2 = -2 (floor would give -3).
    v = torch.tensor([-3 + r], dtype=torch.int32)
    s = sum(-3 + k for k in range(n))
    want = int(s / n)
    check(int(hvd.allreduce(v, op=hvd.Average)) == want, "int Average truncates to %d" % want)
    try:
        hvd.allreduce(torch.ones(2, dtype=torch.bool))
        raise AssertionError("bool allreduce accepted")
    except TypeError:
        pass


def case_min_max_product(r, n):
    for dtype in (torch.int8, torch.int32, torch.int64, torch.float32, torch.float64,
                  torch.float16):
        inputs = [data(k, dtype) for k in range(n)]
        for op in (hvd.Min, hvd.Max, hvd.Product):
            want = expected_reduce(op, dtype, inputs, n)
            close(hvd.allreduce(data(r, dtype), op=op), want, "%s %s" % (op, dtype),
                  tol_of(dtype))
    x = torch.tensor([float(r + 1)], requires_grad=True)
    y = hvd.allreduce(x, op=hvd.Max)
    check(float(y) == float(n), "Max value")


def case_scale_factors(r, n):
    x = torch.full((3,), float(r + 1))
    got = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    close(got, torch.full((3,), float(sum(range(1, n + 1)))), "pre/post scale")
    got = hvd.allreduce(torch.full((2,), 7, dtype=torch.int32), op=hvd.Sum,
                        postscale_factor=0.5)
    close(got, torch.full((2,), float(int(7 * n * 0.5))), "int postscale truncates")
    try:
        hvd.allreduce(x, op=hvd.Adasum)
        raise AssertionError("Adasum accepted")
    except poseidon.UnimplementedError as e:
        check("Adasum" in str(e), "Adasum error names it")


def case_grouped_allreduce(r, n):
    ts = [data(r, torch.float32), data(r, torch.int32, 4), data(r, torch.float64, 3)]
    wants = [expected_reduce("sum", t.dtype, [data(k, t.dtype, t.numel()) for k in range(n)],
                             n) for t in ts]
    for got, want in zip(hvd.grouped_allreduce(ts, op=hvd.Sum), wants):
        close(got, want, "grouped_allreduce")
    h = hvd.grouped_allreduce_async(ts, op=hvd.Sum)
    for got, want in zip(hvd.synchronize(h), wants):
        close(got, want, "grouped_allreduce_async")
    copies = [t.clone() for t in ts]
    hvd.grouped_allreduce_(copies, op=hvd.Sum)
    for got, want in zip(copies, wants):
        close(got, want, "grouped_allreduce_")
    copies = [t.clone() for t in ts]
    hvd.synchronize(hvd.grouped_allreduce_async_(copies, op=hvd.Sum))
    for got, want in zip(copies, wants):
        close(got, want, "grouped_allreduce_async_")


def case_allgather_dtypes(r, n):
    for dtype in INTS + FLOATS + [torch.bool]:
        rows = [data(k, dtype, 2 * (k + 1)).reshape(k + 1, 2) for k in range(n)]
        want = torch.cat(rows)
        same(hvd.allgather(rows[r]), want, "allgather %s" % dtype)
        same(hvd.synchronize(hvd.allgather_async(rows[r])), want, "allgather_async")
    got = hvd.grouped_allgather([torch.full((1,), r), torch.full((r + 1, 2), float(r))])
    same(got[0], torch.arange(n), "grouped_allgather 0")
    check(got[1].shape == (n * (n + 1) // 2, 2), "grouped_allgather 1 shape")
    same(hvd.synchronize(hvd.grouped_allgather_async([torch.full((1,), r)]))[0],
         torch.arange(n), "grouped_allgather_async")


def case_broadcast_dtypes(r, n):
    root = n - 1
    for dtype in INTS + FLOATS + [torch.bool]:
        want = data(root, dtype)
        same(hvd.broadcast(data(r, dtype), root), want, "broadcast %s" % dtype)
        t = data(r, dtype)
        hvd.broadcast_(t, root)
        same(t, want, "broadcast_ %s" % dtype)
        same(hvd.synchronize(hvd.broadcast_async(data(r, dtype), root)), want, "async")
        t = data(r, dtype)
        hvd.synchronize(hvd.broadcast_async_(t, root))
        same(t, want, "broadcast_async_")
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).t() * (r + 1)
    hvd.broadcast_(t, 0)  # not contiguous
    same(t, torch.arange(12, dtype=torch.float32).reshape(3, 4).t(), "non-contiguous")


def case_reducescatter(r, n):
    rows = 2 * n + 1  # uneven: the first rank gets one more row
    share = [rows // n + (1 if k < rows % n else 0) for k in range(n)]
    start = sum(share[:r])
    for dtype in (torch.float32, torch.int32, torch.int8, torch.float64):
        inputs = [data(k, dtype, rows * 2).reshape(rows, 2) for k in range(n)]
        for op in (hvd.Sum, hvd.Average):
            want = expected_reduce(op, dtype, inputs, n)[start:start + share[r]]
            got = hvd.reducescatter(inputs[r], op=op)
            close(got, want, "reducescatter %s %s" % (op, dtype), tol_of(dtype))
            got = hvd.synchronize(hvd.reducescatter_async(inputs[r], op=op))
            close(got, want, "reducescatter_async %s" % op, tol_of(dtype))
    inputs = [data(k, torch.float32, rows).reshape(rows, 1) for k in range(n)]
    got = hvd.grouped_reducescatter([inputs[r], inputs[r] * 2], op=hvd.Sum)
    want = expected_reduce("sum", torch.float32, inputs, n)[start:start + share[r]]
    close(got[0], want, "grouped_reducescatter 0")
    close(got[1], want * 2, "grouped_reducescatter 1")
    got = hvd.synchronize(hvd.grouped_reducescatter_async([inputs[r]], op=hvd.Sum))
    close(got[0], want, "grouped_reducescatter_async")
    # Autograd: the gradient is the allgather of the output gradients (Average: / n).
    x = inputs[r].clone().requires_grad_(True)
    (hvd.reducescatter(x, op=hvd.Average) * (r + 1)).sum().backward()
    wantg = torch.cat([torch.full((share[k], 1), (k + 1) / n) for k in range(n)])
    close(x.grad, wantg, "reducescatter grad")


def case_alltoall(r, n):
    def rows(src, dst):
        return (src + dst) % 3  # uneven, some empty

    splits = [rows(r, j) for j in range(n)]
    x = torch.cat([torch.full((rows(r, j), 2), float(100 * r + j)) for j in range(n)]) \
        if sum(splits) else torch.zeros(0, 2)
    out, recv = hvd.alltoall(x, splits=torch.tensor(splits, dtype=torch.int32))
    want = torch.cat([torch.full((rows(k, r), 2), float(100 * k + r)) for k in range(n)])
    same(out, want, "alltoall output")
    same(recv, torch.tensor([rows(k, r) for k in range(n)], dtype=torch.int32), "recv splits")
    out2, recv2 = hvd.synchronize(hvd.alltoall_async(x, splits=splits))
    same(out2, want, "alltoall_async")
    even = torch.arange(2 * n, dtype=torch.int16) + 10 * r
    got = hvd.alltoall(even)
    same(got, torch.tensor([10 * k + v for k in range(n) for v in (2 * r, 2 * r + 1)],
                           dtype=torch.int16), "alltoall even split")
    # Autograd: the gradient travels back with the received splits.
    xg = x.clone().requires_grad_(True)
    o, _ = hvd.alltoall(xg, splits=splits)
    (o * (r + 1)).sum().backward()
    wantg = torch.cat([torch.full((rows(r, j), 2), float(j + 1)) for j in range(n)]) \
        if sum(splits) else torch.zeros(0, 2)
    close(xg.grad, wantg, "alltoall grad")


def case_autograd_allreduce(r, n):
    w = [float(k + 1) for k in range(n)]
    for op, factor in ((hvd.Sum, sum(w)), (hvd.Average, sum(w) / n)):
        x = torch.full((3,), float(r), requires_grad=True)
        (hvd.allreduce(x, op=op) * w[r]).sum().backward()
        close(x.grad, torch.full((3,), factor), "allreduce grad %s" % op)
    x = torch.full((2,), float(r), requires_grad=True)
    y = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16)
    y.sum().backward()
    close(x.grad, torch.full((2,), float(n)), "allreduce fp16 grad")
    x = torch.ones(2, requires_grad=True)
    ys = hvd.grouped_allreduce([x, x * 2], op=hvd.Sum)
    (ys[0] + ys[1]).sum().backward()
    close(x.grad, torch.full((2,), 3.0 * n), "grouped_allreduce grad")


def case_autograd_allgather(r, n):
    x = torch.full((r + 1, 2), float(r), requires_grad=True)
    y = hvd.allgather(x)
    total = n * (n + 1) // 2
    coeff = [torch.arange(total * 2, dtype=torch.float32).reshape(total, 2) * (k + 1)
             for k in range(n)]
    (y * coeff[r]).sum().backward()
    start = r * (r + 1) // 2
    want = sum(c[start:start + r + 1] for c in coeff)
    close(x.grad, want, "allgather grad")


def case_autograd_broadcast(r, n):
    root = n - 1
    x = torch.full((3,), float(r), requires_grad=True)
    y = hvd.broadcast(x, root)
    close(y.detach(), torch.full((3,), float(root)), "broadcast value")
    (y * (r + 1)).sum().backward()
    want = float(sum(range(1, n + 1))) if r == root else 0.0
    close(x.grad, torch.full((3,), want), "broadcast grad")


def case_objects(r, n):
    root = n - 1
    got = hvd.broadcast_object({"from": r, "list": [1, 2]}, root_rank=root)
    check(got == {"from": root, "list": [1, 2]}, "broadcast_object value %r" % (got,))
    check(hvd.allgather_object(("r", r, "x" * r)) ==
          [("r", k, "x" * k) for k in range(n)], "allgather_object")
    # A root that cannot serialize: every rank raises, naming the root and the cause.
    unpicklable = threading.Lock()
    try:
        hvd.broadcast_object(unpicklable if r == root else None, root_rank=root)
        raise AssertionError("broadcast_object of a lock did not raise")
    except poseidon.InvalidArgumentError as e:
        check("rank %d" % root in str(e) and "lock" in str(e), "root error text: %s" % e)
    import poseidon.torch._functions as f
    if f._serializer.__name__ == "pickle":
        try:
            hvd.broadcast_object((lambda v: v) if r == 0 else None, root_rank=0)
            raise AssertionError("broadcast_object of a lambda did not raise without "
                                 "cloudpickle")
        except poseidon.InvalidArgumentError as e:
            check("rank 0" in str(e), "lambda error names the root: %s" % e)
    try:
        hvd.allgather_object(unpicklable if r == 1 else r)
        raise AssertionError("allgather_object of a lock did not raise")
    except poseidon.InvalidArgumentError as e:
        check("rank 1" in str(e), "allgather_object error names rank 1: %s" % e)
    # Still in step afterwards.
    check(hvd.broadcast_object(r, root_rank=0) == 0, "in step after errors")


def case_parameters_and_optimizer(r, n):
    torch.manual_seed(r)
    model = torch.nn.Linear(3, 2)
    hvd.broadcast_parameters(list(model.parameters()), root_rank=0)
    torch.manual_seed(0)
    ref = torch.nn.Linear(3, 2)
    same(model.weight.data, ref.weight.data, "broadcast_parameters(list)")
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_parameters(list(model.named_parameters()), root_rank=0)
    opt = torch.optim.Adam(model.parameters(), lr=0.1 * (r + 1))
    if r == 0:  # the root has taken a real step; the others are fresh
        model.weight.grad = torch.ones_like(model.weight)
        model.bias.grad = torch.ones_like(model.bias)
        opt.step()
    before = model.weight.detach().clone()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    if r != 0:
        same(model.weight.data, before, "the zero-gradient step leaves the parameters")
    check(abs(opt.param_groups[0]["lr"] - 0.1) < 1e-12, "lr from the root")
    st = opt.state[model.weight]
    every = hvd.allgather(st["exp_avg"].reshape(1, -1))
    for k in range(n):
        same(every[k], every[0], "exp_avg equal to the root's")
    check(float(every[0].abs().sum()) > 0, "root's exp_avg is nonzero")


def case_process_set(r, n):
    half = list(range(n // 2))
    ps = hvd.add_process_set(half)
    check(ps.process_set_id is not None and ps.size() == len(half), "process set size")
    check(ps.included() == (r in half), "included")
    if r in half:
        check(ps.rank() == half.index(r), "process set rank")
        got = hvd.allreduce(torch.tensor([float(r + 1)]), op=hvd.Sum, process_set=ps)
        close(got, torch.tensor([float(sum(k + 1 for k in half))]), "allreduce in the set")
        got = hvd.allgather(torch.tensor([r]), process_set=ps)
        same(got, torch.tensor(half), "allgather in the set")
        got = hvd.broadcast(torch.tensor([r]), root_rank=half[-1], process_set=ps)
        same(got, torch.tensor([half[-1]]), "broadcast in the set")
        check(hvd.broadcast_object(r, root_rank=half[-1], process_set=ps) == half[-1],
              "broadcast_object in the set")
        hvd.barrier(process_set=ps)
    else:
        check(ps.rank() == -1, "rank outside the set")
        try:
            hvd.allreduce(torch.ones(1), process_set=ps)
            raise AssertionError("a rank outside the set ran a collective on it")
        except ValueError as e:
            check("not in process set" in str(e), "outside error text: %s" % e)
    others = hvd.add_process_set(hvd.ProcessSet(range(n // 2, n)))
    if r in others.ranks:
        got = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum, process_set=others)
        close(got, torch.tensor([float(len(others.ranks))]), "second set")
    check(hvd.remove_process_set(ps) and hvd.remove_process_set(others), "remove")
    check(not hvd.remove_process_set(hvd.global_process_set), "global set stays")
    hvd.barrier()


def case_optimizer_process_set(r, n):
    """Last: its engine keeps running (start_timeline refuses to open a trace after that)."""
    half = list(range(max(1, n // 2)))
    ps = hvd.add_process_set(half)
    if r in half:
        # Averages over the set's members only: the gradient on rank k is (k + 1) * ones,
        # SGD lr 0.5, two steps.
        w = torch.nn.Parameter(torch.zeros(3))
        opt = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=0.5),
                                       named_parameters=[("w", w)], process_set=ps)
        for _ in range(2):
            opt.zero_grad()
            (w * float(r + 1)).sum().backward()
            opt.step()
        mean = sum(k + 1 for k in half) / len(half)
        close(w.detach(), torch.full((3,), -2 * 0.5 * mean), "DistributedOptimizer in the set")
    else:
        try:
            hvd.DistributedOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))],
                                                     lr=0.1), process_set=ps)
            raise AssertionError("a rank outside the set made its DistributedOptimizer")
        except ValueError as e:
            check("not in process set" in str(e), "outside error text: %s" % e)
    hvd.barrier()


def case_sync_batch_norm(r, n):
    channels = 4
    gen = torch.Generator().manual_seed(7)
    xs = [torch.randn(3 + k, channels, 5, generator=gen, dtype=torch.float64)
          for k in range(n)]
    gs = [torch.randn(3 + k, channels, 5, generator=gen, dtype=torch.float64)
          for k in range(n)]
    sbn = hvd.SyncBatchNorm(channels).double()
    ref = torch.nn.BatchNorm1d(channels).double()
    with torch.no_grad():
        w = torch.linspace(0.5, 2.0, channels, dtype=torch.float64)
        b = torch.linspace(-1.0, 1.0, channels, dtype=torch.float64)
        for m in (sbn, ref):
            m.weight.copy_(w)
            m.bias.copy_(b)
    x = xs[r].clone().requires_grad_(True)
    out = sbn(x)
    xall = torch.cat(xs).requires_grad_(True)
    rout = ref(xall)
    start = sum(3 + k for k in range(r))
    close(out, rout[start:start + 3 + r], "SyncBatchNorm forward", 1e-5)
    (out * gs[r]).sum().backward()
    (rout * torch.cat(gs)).sum().backward()
    close(x.grad, xall.grad[start:start + 3 + r], "SyncBatchNorm input grad", 1e-5)
    gw = hvd.allreduce(sbn.weight.grad, op=hvd.Sum)
    gb = hvd.allreduce(sbn.bias.grad, op=hvd.Sum)
    close(gw, ref.weight.grad, "SyncBatchNorm weight grad", 1e-5)
    close(gb, ref.bias.grad, "SyncBatchNorm bias grad", 1e-5)
    close(sbn.running_mean, ref.running_mean, "running_mean", 1e-5)
    close(sbn.running_var, ref.running_var, "running_var", 1e-5)
    sbn.eval()
    ref.eval()
    close(sbn(xs[r]), ref(xs[r]), "eval mode", 1e-5)


def case_sparse(r, n):
    idx = torch.tensor([[r % 3, (r + 1) % 4]])
    val = torch.tensor([float(r + 1), 2.0])
    t = torch.sparse_coo_tensor(idx, val, (4,))
    want = torch.zeros(4)
    for k in range(n):
        want[k % 3] += k + 1
        want[(k + 1) % 4] += 2.0
    got = hvd.synchronize(hvd.sparse_allreduce_async(t, op=hvd.Sum))
    close(got.to_dense(), want, "sparse Sum")
    got = hvd.sparse_allreduce_async(t, op=hvd.Average)()
    close(got.to_dense(), want / n, "sparse Average")


def case_sync_points(r, n):
    hvd.barrier()
    last = hvd.join()
    check(0 <= last < n, "join returns a rank")
    h = hvd.allreduce_async(torch.ones(1))
    hvd.synchronize(h)
    try:
        hvd.poll(h)
        raise AssertionError("poll of a synchronized handle")
    except ValueError:
        pass
    path = "/tmp/psd_hvd_api_timeline.json"
    hvd.start_timeline(path)
    check(poseidon.get_setting("POSEIDON_TIMELINE") == path, "timeline setting")
    hvd.stop_timeline()
    check(poseidon.get_setting("POSEIDON_TIMELINE") == "", "timeline cleared")


def case_refusal_on_one_rank(r, n):
    """A bad argument on the last rank only fails the collective on every rank at once: the
    last rank raises its own error, the others an InvalidArgumentError naming it (they do not
    wait for it until a timeout). Then the next collective works.

    The one exception is a small broadcast: its root, and the ranks that agree with the root,
    return before the others have checked it. The failure then comes with the next collective,
    on every rank (so the last rank fails that one too, naming the root)."""
    odd = r == n - 1
    calls = [
        ("broadcast_ root_rank", lambda: hvd.broadcast_(torch.ones(3), root_rank=n if odd else 0),
         ValueError),
        ("allreduce of bool", lambda: hvd.allreduce(
            torch.ones(3, dtype=torch.bool) if odd else torch.ones(3)), TypeError),
        ("allgather of a list", lambda: hvd.allgather([1.0] if odd else torch.ones(1)),
         TypeError),
        ("alltoall splits", lambda: hvd.alltoall(torch.ones(n, 1), splits=[n + 1] * n if odd
                                                 else [1] * n), ValueError),
        ("reducescatter of a scalar", lambda: hvd.reducescatter(
            torch.ones(()) if odd else torch.ones(n)), ValueError),
        ("grouped_allreduce_async op", lambda: hvd.synchronize(hvd.grouped_allreduce_async(
            [torch.ones(2)], op=hvd.Adasum if odd else hvd.Sum)), Exception),
    ]
    for what, call, own in calls:
        start = time.time()
        late = what.startswith("broadcast")
        try:
            call()
            if not late or odd:
                raise AssertionError("%s: returned on rank %d; expected an error" % (what, r))
        except AssertionError:
            raise
        except Exception as e:  # noqa: BLE001
            if odd:
                check(isinstance(e, own), "%s: %s on the bad rank; expected %s"
                      % (what, type(e).__name__, own.__name__))
            else:
                check(not late, "%s: raised %s on rank %d; expected it to return" % (what, e, r))
                check(isinstance(e, poseidon.InvalidArgumentError),
                      "%s: %s: %s; expected InvalidArgumentError" % (what, type(e).__name__, e))
                check("rank %d passed an invalid argument" % (n - 1) in str(e),
                      "%s: %s does not name rank %d" % (what, e, n - 1))
        if late:
            try:
                hvd.allreduce(torch.ones(1))
                raise AssertionError("the collective after %s returned on rank %d" % (what, r))
            except poseidon.InvalidArgumentError as e:
                check("returned here before its peers found" in str(e)
                      and "root_rank %d is not in" % n in str(e),
                      "the collective after %s: %s" % (what, e))
                check(not odd or "rank 0 passed an invalid argument" in str(e),
                      "the collective after %s: %s does not name rank 0" % (what, e))
        check(time.time() - start < 20, "%s took %.1f s" % (what, time.time() - start))
    close(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(n)), "usable after")


def case_terms_differ_on_one_rank(r, n):
    """An op, scale factor or name that differs on the last rank only fails the call on every
    rank with MismatchError naming each rank's terms, where it would otherwise return a
    different result on that rank (a sum there, an average elsewhere; another tensor's values).
    Then the next collective works. A small broadcast fails the next collective instead, on
    every rank (see case_refusal_on_one_rank)."""
    odd = r == n - 1
    x = torch.ones(4)
    calls = [
        ("allreduce op", lambda: hvd.allreduce(x, op=hvd.Sum if odd else hvd.Average),
         ("op sum", "op average")),
        ("allreduce_ prescale", lambda: hvd.allreduce_(x.clone(), op=hvd.Sum,
                                                       prescale_factor=2.0 if odd else 1.0),
         ("prescale_factor 2.0", "prescale_factor 1.0")),
        ("allreduce postscale", lambda: hvd.allreduce(x, op=hvd.Sum,
                                                      postscale_factor=0.5 if odd else 1.0),
         ("postscale_factor 0.5", "postscale_factor 1.0")),
        ("allreduce min / max", lambda: hvd.allreduce(x, op=hvd.Max if odd else hvd.Min),
         ("op max", "op min")),
        ("grouped_allreduce average", lambda: hvd.grouped_allreduce(
            [x, x.double()], average=not odd), ("op sum", "op average")),
        ("allreduce_async op", lambda: hvd.synchronize(hvd.allreduce_async(
            x, op=hvd.Sum if odd else hvd.Average)), ("op sum", "op average")),
        ("reducescatter op", lambda: hvd.reducescatter(torch.ones(n, 2),
                                                       op=hvd.Sum if odd else hvd.Average),
         ("op sum", "op average")),
        # Calls match by their order on each rank: a name that differs means the ranks are
        # exchanging different tensors in this call.
        ("allreduce name", lambda: hvd.allreduce(x, name="acc" if odd else "loss"),
         ("name 'acc'", "name 'loss'")),
        ("grouped_allreduce_ name", lambda: hvd.grouped_allreduce_(
            [x.clone()], name="b" if odd else "a"), ("name 'b'", "name 'a'")),
        ("reducescatter name", lambda: hvd.reducescatter(torch.ones(n, 2),
                                                         name="b" if odd else "a"),
         ("name 'b'", "name 'a'")),
        ("allgather name", lambda: hvd.allgather(x, name="b" if odd else "a"),
         ("name 'b'", "name 'a'")),
        ("allgather_async named on one rank", lambda: hvd.synchronize(hvd.allgather_async(
            x, name="b" if odd else None)), ("name 'b'", "(none)")),
        ("alltoall name", lambda: hvd.alltoall(torch.ones(n, 1), name="b" if odd else "a"),
         ("name 'b'", "name 'a'")),
        ("broadcast_ name", lambda: hvd.broadcast_(x.clone(), 0, name="b" if odd else "a"),
         ("name 'b'", "name 'a'")),
        ("sparse_allreduce_async op", lambda: hvd.synchronize(hvd.sparse_allreduce_async(
            torch.eye(3).to_sparse(), op=hvd.Sum if odd else hvd.Average)),
         ("op sum", "op average")),
        # Another rank's text is cut at a byte limit, in one of these two inside a two-byte
        # character: the error is still MismatchError (the cut character decoded as U+FFFD).
        ("long non-ASCII name", lambda: hvd.allreduce(x, name="\u00e9" * 150 + ("b" if odd
                                                                              else "a")),
         ("name '\u00e9\u00e9", "differing past the part shown")),
        ("long non-ASCII name, odd cut", lambda: hvd.allreduce(
            x, name="x" + "\u00e9" * 150 + ("b" if odd else "a")),
         ("name 'x\u00e9\u00e9", "differing past the part shown")),
        ("broadcast_object name", lambda: hvd.broadcast_object(
            {"step": 3}, 0, name="b" if odd else "a"), ("name 'b'", "name 'a'")),
        ("allgather_object name", lambda: hvd.allgather_object(r, name="b" if odd else "a"),
         ("name 'b'", "name 'a'")),
        ("broadcast_parameters keys", lambda: hvd.broadcast_parameters(
            {"fc.bias" if odd else "fc.weight": x.clone()}, root_rank=0),
         ("name 'fc.bias'", "name 'fc.weight'")),
    ]
    for what, call, (theirs, ours) in calls:
        start = time.time()
        # A small broadcast returns on its root and on the ranks that agree with it before the
        # last rank's terms are checked: the next collective fails on every rank instead.
        late = what.startswith("broadcast")
        try:
            call()
            if not late or odd:
                raise AssertionError("%s: returned on rank %d; expected MismatchError"
                                     % (what, r))
        except poseidon.MismatchError as e:
            msg = str(e)
            check("differ across ranks" in msg, "%s: %s" % (what, msg))
            check(theirs in msg and ours in msg, "%s: %s does not name %r and %r"
                  % (what, msg, theirs, ours))
            if "differing past the part shown" not in msg:  # else every rank's text looks alike
                check("rank %d" % (n - 1) in msg, "%s: %s does not name rank %d"
                      % (what, msg, n - 1))
        if late:
            try:
                hvd.allreduce(torch.ones(1))
                raise AssertionError("the collective after %s returned on rank %d" % (what, r))
            except (poseidon.MismatchError, poseidon.InvalidArgumentError) as e:
                msg = str(e)
                check("returned here before its peers found" in msg,
                      "the collective after %s: %s" % (what, msg))
                # The last rank reads rank 0's message, cut to the window's message size.
                check(("rank 0 failed the call" in msg and isinstance(e, poseidon.MismatchError))
                      if odd
                      else (theirs in msg and ours in msg and isinstance(e, poseidon.MismatchError)),
                      "the collective after %s: %s" % (what, msg))
        check(time.time() - start < 20, "%s took %.1f s" % (what, time.time() - start))
    # Equal terms spelled alike on every rank pass (average=True is op=Average).
    close(hvd.allreduce(x, average=True) if odd else hvd.allreduce(x, op=hvd.Average), x,
          "same terms")
    close(hvd.allreduce(x, name="loss", op=hvd.Sum), x * n, "same name")
    params = {"fc.weight": torch.full((3,), float(r)), "fc.bias": torch.full((2,), float(r))}
    hvd.broadcast_parameters(params, root_rank=0)
    same(params["fc.bias"], torch.zeros(2), "broadcast_parameters with the same keys")
    close(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(n)), "usable after")


CASES = [case_names, case_basics, case_allreduce_dtypes, case_min_max_product,
         case_scale_factors, case_grouped_allreduce, case_allgather_dtypes,
         case_broadcast_dtypes, case_reducescatter, case_alltoall, case_autograd_allreduce,
         case_autograd_allgather, case_autograd_broadcast, case_objects,
         case_parameters_and_optimizer, case_process_set, case_sync_batch_norm, case_sparse,
         case_sync_points, case_optimizer_process_set, case_refusal_on_one_rank,
         case_terms_differ_on_one_rank]


def main():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    if n < 2:
        print("hvd_api_test needs at least 2 ranks; skipped")
        hvd.shutdown()
        return 77
    world = poseidon.world()
    failed = 0
    for case in CASES:
        try:
            case(r, n)
            ok, why = 1, ""
        except Exception as e:  # noqa: BLE001
            ok, why = 0, "%s: %s" % (type(e).__name__, e)
            traceback.print_exc()
            print("rank %d %s: FAIL %s" % (r, case.__name__, why), flush=True)
        flags = np.zeros(n, dtype=np.int64)
        world.allgather(np.array([ok], dtype=np.int64), flags)
        bad = [k for k in range(n) if not flags[k]]
        if bad:
            failed += 1
        if r == 0:
            print("%-32s %s" % (case.__name__[5:], "ok" if not bad else
                                "FAIL on ranks %s" % bad), flush=True)
    hvd.shutdown()
    if r == 0:
        print("hvd_api_test np %d: %s" % (n, "passed" if not failed else "%d cases failed"
                                          % failed), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
