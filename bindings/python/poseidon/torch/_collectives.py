"""Horovod's collectives on torch tensors over Poseidon's blocking collectives.

Every collective runs on the package's one worker thread, in the order this rank issued it
(blocking calls wait for it; the ``_async`` forms return a handle for ``synchronize`` /
``poll``), so every rank issues them in the same order. Calls match by that order: each call's
op, scale factors and name travel in its argument agreement (_terms), and one that differs on
a rank fails the call on every rank with MismatchError.

Dtypes: Poseidon moves float32, float64, float16, bfloat16, int32 and int64; uint8, int8,
int16 and bool travel widened to int32 and are narrowed back exactly (a sum wraps like the
narrow type's). Integer Average truncates toward zero. bool is refused by the reductions.
Ops: Sum and Average are Poseidon's allreduce; Min, Max and Product are an allgather of every
rank's tensor reduced locally with torch (size() times the bytes). Adasum is not supported.
allreduce, allgather, broadcast, alltoall and reducescatter are differentiable.
"""
import functools as _functools
import inspect as _inspect
import time as _time

import torch as _torch

import poseidon as _psd
from poseidon.torch._compression import Compression
from poseidon.torch._core import (Average, Sum, Adasum, Min, Max, Product, _comm, _lock,
                                  _run, _state, _executor_thread)
from poseidon.torch._process_sets import comm_of as _comm_of, global_process_set

_NATIVE = (_torch.float32, _torch.float64, _torch.float16, _torch.bfloat16, _torch.int32,
           _torch.int64)
_WIDENED = (_torch.uint8, _torch.int8, _torch.int16, _torch.bool)
_OPS = (Average, Sum, Min, Max, Product)


# -- refusals -----------------------------------------------------------------------------
def _refuse_peers(call, process_set, error):
    """This rank refuses a collective its peers are entering: it joins their argument agreement
    with its error (on the worker, after this rank's earlier calls), so their call fails at once
    naming this rank, instead of waiting for it until a timeout."""
    try:
        comm = _comm_of(process_set, call)
    except Exception:  # not initialized, or not a member of the set: no peer waits for us
        return
    _run(_refused, comm, call, error)


def _refused(comm, call, error):
    """On the worker: fails the peers' matching call with ``error`` (see _refuse_peers) and
    returns the error, marked so that no enclosing collective refuses again, for the caller to
    raise."""
    try:
        comm.fail_collective(call, str(error))
    except Exception:  # the agreement's own failure; this rank raises its own error
        pass
    try:
        error._psd_refused = True
    except AttributeError:
        pass
    return error


def _refusals(call):
    """A public collective whose own checks (tensor, dtype, op, root_rank, ...) fail on this
    rank before it starts moving data fails on every rank: see _refuse_peers. ``call`` is the
    Backend call the peers make first (AllReduce, AllGather, Broadcast, ReduceScatter)."""
    def wrap(fn):
        sig = _inspect.signature(fn)

        @_functools.wraps(fn)
        def checked(*args, **kwargs):
            outer = getattr(_executor_thread, "started", False)
            _executor_thread.started = False
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                if not _executor_thread.started and not getattr(e, "_psd_refused", False):
                    try:
                        process_set = sig.bind(*args, **kwargs).arguments.get(
                            "process_set", global_process_set)
                    except TypeError:
                        process_set = global_process_set
                    _refuse_peers(call, process_set, e)
                raise
            finally:
                _executor_thread.started = outer or _executor_thread.started
        return checked
    return wrap


# -- helpers ------------------------------------------------------------------------------
def _check_tensor(tensor, what, reduce=False):
    if not isinstance(tensor, _torch.Tensor):
        raise TypeError("%s: expected a torch.Tensor, got %s" % (what, type(tensor).__name__))
    if tensor.dtype not in _NATIVE and tensor.dtype not in _WIDENED:
        raise TypeError("%s: tensor dtype %s is not supported; expected uint8, int8, int16, "
                        "int32, int64, float16, bfloat16, float32, float64 or bool"
                        % (what, tensor.dtype))
    if tensor.is_sparse:
        raise TypeError("%s: sparse tensors are not supported (see sparse_allreduce_async)"
                        % what)
    if reduce and tensor.dtype == _torch.bool:
        raise TypeError("%s: bool tensors cannot be reduced; expected a number dtype" % what)


def _wire(t):
    """A contiguous tensor of a dtype Poseidon moves, holding ``t``'s values (may be t)."""
    t = t.detach()
    if t.dtype in _WIDENED:
        return t.to(_torch.int32).contiguous()
    return t.contiguous()


def _resolve_op(average, op, what="allreduce"):
    if op is not None and average is not None:
        raise ValueError("%s: pass either op or the deprecated average, not both" % what)
    if op is None:
        op = Average if average is None or average else Sum
    if op == Adasum:
        raise _psd.UnimplementedError("%s: op=Adasum is not supported by Poseidon; expected "
                                      "Average, Sum, Min, Max or Product" % what)
    if op not in _OPS:
        raise ValueError("%s: op %r is unknown; expected Average, Sum, Min, Max or Product"
                         % (what, op))
    return op


def _scale(t, factor):
    """t times factor in t's dtype; integers truncate toward zero (as Horovod)."""
    if factor == 1.0:
        return t
    if t.dtype.is_floating_point:
        return t * factor
    return (t.to(_torch.float64) * factor).trunc().to(t.dtype)


def _named(name):
    """The ``name`` a caller gave a collective, as compared across ranks ("" for none): calls
    match by their order on each rank, so a name that differs means the ranks are exchanging
    different tensors in this call (where Horovod, which matches by name, would stall)."""
    return "" if name is None else "name %r" % (str(name),)


def _terms(op, prescale, postscale, name=None):
    """This rank's terms of a reduction beyond its tensor, which the ranks compare in the call's
    argument agreement (Comm's ``detail``): where one rank's op, scale factors or name differ,
    every rank raises MismatchError naming each rank's terms instead of returning different
    results."""
    terms = "op %s, prescale_factor %r, postscale_factor %r" % (op, prescale, postscale)
    return terms if name is None else terms + ", " + _named(name)


def _average_div(t, n, postscale):
    if not t.dtype.is_floating_point and postscale == 1.0:
        return _torch.div(t, n, rounding_mode="trunc")
    return _scale(t, postscale / n)


def _root_in(comm, process_set, root_rank, what):
    """The root's rank in the process set's communicator (root_rank is a global rank)."""
    if process_set is None or process_set is global_process_set or \
            process_set.process_set_id == 0:
        if not 0 <= root_rank < comm.size:
            raise ValueError("%s: root_rank %d is not in 0..%d" % (what, root_rank,
                                                                   comm.size - 1))
        return root_rank
    if root_rank not in process_set.ranks:
        raise ValueError("%s: root_rank %d is not in process set %d (ranks %r)"
                         % (what, root_rank, process_set.process_set_id, process_set.ranks))
    return process_set.ranks.index(root_rank)


def _gather_rows(comm, t, detail=""):
    """Every rank's tensor concatenated on dimension 0 (first dimensions may differ), and the
    row count of each rank. ``detail``: the caller's terms, compared across ranks (_terms)."""
    x = _wire(t)
    if x.dim() == 0:
        x = x.reshape(1)
    rows = _torch.tensor([x.shape[0]], dtype=_torch.int64)
    all_rows = _torch.empty(comm.size, dtype=_torch.int64)
    comm.allgather(rows, all_rows, detail)
    counts = [int(r) for r in all_rows]
    top = max(counts)
    rest = tuple(x.shape[1:])
    if top == 0:
        return _torch.empty((0,) + rest, dtype=t.dtype), counts
    padded = x if x.shape[0] == top else _torch.cat(
        [x, _torch.zeros((top - x.shape[0],) + rest, dtype=x.dtype)])
    out = _torch.empty((comm.size * top,) + rest, dtype=x.dtype)
    comm.allgather(padded, out)
    parts = [out[r * top:r * top + counts[r]] for r in range(comm.size)]
    return _torch.cat(parts, dim=0).to(t.dtype), counts


# -- allreduce ----------------------------------------------------------------------------
def _reduce(comm, tensor, op, prescale, postscale, name=None):
    """A new tensor: op over the ranks of ``comm`` of ``tensor`` (which is not modified)."""
    if tensor.dtype == _torch.bool:
        raise TypeError("allreduce: bool tensors cannot be reduced; expected a number dtype")
    dtype = tensor.dtype
    x = _scale(tensor.detach(), prescale)
    if op in (Sum, Average):
        wire = _wire(x)
        if wire is x or wire.data_ptr() == tensor.data_ptr():
            wire = wire.clone()
        comm.allreduce(wire, wire, _terms(op, prescale, postscale, name))
        out = wire.to(dtype)  # a widened sum wraps like the narrow type's
        if op == Average:
            return _average_div(out, comm.size, postscale)
        return _scale(out, postscale)
    shape = x.shape
    every, _ = _gather_rows(comm, x.reshape(1, -1), _terms(op, prescale, postscale, name))
    acc = every[0].clone()
    for r in range(1, comm.size):
        if op == Min:
            acc = _torch.minimum(acc, every[r])
        elif op == Max:
            acc = _torch.maximum(acc, every[r])
        else:
            acc = acc * every[r]
    return _scale(acc.reshape(shape).to(dtype), postscale)


class _Allreduce(_torch.autograd.Function):
    """allreduce; the gradient is the allreduce of the output's gradient with the same op."""

    @staticmethod
    def forward(ctx, tensor, op, prescale, postscale, process_set, name):
        ctx.args = (op, prescale, postscale, process_set)
        return _run(_reduce, _comm_of(process_set, "allreduce"), tensor, op, prescale,
                    postscale, name)

    @staticmethod
    def backward(ctx, grad):
        op, prescale, postscale, process_set = ctx.args
        return (allreduce(grad, op=op, prescale_factor=prescale, postscale_factor=postscale,
                          process_set=process_set), None, None, None, None, None)


@_refusals("AllReduce")
def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """A new tensor: the average (default), sum, min, max or product over ranks of
    ``tensor`` (unchanged). Differentiable."""
    op = _resolve_op(average, op)
    _check_tensor(tensor, "allreduce", reduce=True)
    _comm_of(process_set, "allreduce")
    wire, ctx = compression.compress(tensor)
    out = _Allreduce.apply(wire, op, float(prescale_factor), float(postscale_factor),
                           process_set, name)
    return compression.decompress(out, ctx)


def _reduce_into(comm, tensor, op, prescale, postscale, name=None):
    out = _reduce(comm, tensor, op, prescale, postscale, name)
    with _torch.no_grad():
        tensor.copy_(out)
    return tensor


@_refusals("AllReduce")
def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set,
               compression=Compression.none):
    """In place: ``tensor`` becomes the average (default), sum, min, max or product."""
    op = _resolve_op(average, op)
    _check_tensor(tensor, "allreduce_", reduce=True)
    comm = _comm_of(process_set, "allreduce_")
    if compression is Compression.none:
        return _run(_reduce_into, comm, tensor, op, float(prescale_factor),
                    float(postscale_factor), name)
    wire, ctx = compression.compress(tensor.detach())
    out = _run(_reduce, comm, wire, op, float(prescale_factor), float(postscale_factor), name)
    with _torch.no_grad():
        tensor.copy_(compression.decompress(out, ctx))
    return tensor


def _submit(fn, *args):
    _comm()
    _executor_thread.started = True
    with _lock:
        handle = _state["next"]
        _state["next"] += 1
        _state["handles"][handle] = _state["executor"].submit(fn, *args)
    return handle


@_refusals("AllReduce")
def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    op = _resolve_op(average, op)
    _check_tensor(tensor, "allreduce_async_", reduce=True)
    return _submit(_reduce_into, _comm_of(process_set, "allreduce_async_"), tensor, op,
                   float(prescale_factor), float(postscale_factor), name)


@_refusals("AllReduce")
def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    op = _resolve_op(average, op)
    _check_tensor(tensor, "allreduce_async", reduce=True)
    return _submit(_reduce, _comm_of(process_set, "allreduce_async"), tensor.detach().clone(),
                   op, float(prescale_factor), float(postscale_factor), name)


def poll(handle):
    """True when the asynchronous operation finished (never blocks)."""
    if callable(handle):
        return True
    future = _state["handles"].get(handle)
    if future is None:
        raise ValueError("poll: handle %r is unknown or already synchronized" % (handle,))
    return future.done()


def synchronize(handle):
    """Waits for an asynchronous operation and returns its output (a tensor; alltoall: the
    tensor and the received splits; grouped: a list). A callable handle (sparse) is called."""
    if callable(handle):
        return handle()
    with _lock:
        future = _state["handles"].pop(handle, None)
    if future is None:
        raise ValueError("synchronize: handle %r is unknown or already synchronized" % (handle,))
    return future.result()


# -- grouped allreduce --------------------------------------------------------------------
def _reduce_group(comm, tensors, op, prescale, postscale, name=None):
    """New tensors: one fused reduction per dtype of the flattened tensors."""
    outs = [None] * len(tensors)
    by_dtype = {}
    for i, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(i)
    for idx in by_dtype.values():
        flat = _torch.cat([tensors[i].detach().reshape(-1) for i in idx])
        red = _reduce(comm, flat, op, prescale, postscale, name)
        offset = 0
        for i in idx:
            n = tensors[i].numel()
            outs[i] = red[offset:offset + n].reshape(tensors[i].shape)
            offset += n
    return outs


def _reduce_group_into(comm, tensors, op, prescale, postscale, name=None):
    outs = _reduce_group(comm, tensors, op, prescale, postscale, name)
    with _torch.no_grad():
        for t, o in zip(tensors, outs):
            t.copy_(o)
    return list(tensors)


class _GroupedAllreduce(_torch.autograd.Function):
    @staticmethod
    def forward(ctx, op, prescale, postscale, process_set, name, *tensors):
        ctx.args = (op, prescale, postscale, process_set)
        return tuple(_run(_reduce_group, _comm_of(process_set, "grouped_allreduce"),
                          list(tensors), op, prescale, postscale, name))

    @staticmethod
    def backward(ctx, *grads):
        op, prescale, postscale, process_set = ctx.args
        return (None, None, None, None, None) + tuple(grouped_allreduce(
            list(grads), op=op, prescale_factor=prescale, postscale_factor=postscale,
            process_set=process_set))


def _check_group(tensors, what, reduce=False):
    tensors = list(tensors)
    if not tensors:
        raise ValueError("%s: expected a non-empty list of tensors" % what)
    for t in tensors:
        _check_tensor(t, what, reduce)
    return tensors


@_refusals("AllReduce")
def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none,
                      op=None, prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set):
    """allreduce of each tensor of a list, fused per dtype; returns new tensors.
    Differentiable."""
    op = _resolve_op(average, op, "grouped_allreduce")
    tensors = _check_group(tensors, "grouped_allreduce", reduce=True)
    _comm_of(process_set, "grouped_allreduce")
    pairs = [compression.compress(t) for t in tensors]
    outs = _GroupedAllreduce.apply(op, float(prescale_factor), float(postscale_factor),
                                   process_set, name, *[w for w, _ in pairs])
    return [compression.decompress(o, c) for o, (_, c) in zip(outs, pairs)]


@_refusals("AllReduce")
def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    op = _resolve_op(average, op, "grouped_allreduce_")
    tensors = _check_group(tensors, "grouped_allreduce_", reduce=True)
    return _run(_reduce_group_into, _comm_of(process_set, "grouped_allreduce_"), tensors, op,
                float(prescale_factor), float(postscale_factor), name)


@_refusals("AllReduce")
def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    op = _resolve_op(average, op, "grouped_allreduce_async")
    tensors = _check_group(tensors, "grouped_allreduce_async", reduce=True)
    return _submit(_reduce_group, _comm_of(process_set, "grouped_allreduce_async"),
                   [t.detach().clone() for t in tensors], op, float(prescale_factor),
                   float(postscale_factor), name)


@_refusals("AllReduce")
def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    op = _resolve_op(average, op, "grouped_allreduce_async_")
    tensors = _check_group(tensors, "grouped_allreduce_async_", reduce=True)
    return _submit(_reduce_group_into, _comm_of(process_set, "grouped_allreduce_async_"),
                   tensors, op, float(prescale_factor), float(postscale_factor), name)


@_refusals("AllGather")
def sparse_allreduce_async(tensor, name=None, op=Average, process_set=global_process_set):
    """A sparse COO tensor's allreduce: the indices and values of every rank are allgathered
    and form one (uncoalesced) sparse tensor; op Average divides the values by the number of
    ranks. Returns a callable handle (``synchronize(handle)`` or ``handle()``)."""
    op = _resolve_op(None, op, "sparse_allreduce_async")
    if op not in (Average, Sum):
        raise ValueError("sparse_allreduce_async: op must be Average or Sum")
    if not tensor.is_sparse:
        raise TypeError("sparse_allreduce_async: expected a sparse COO tensor")
    t = tensor.coalesce()
    _check_tensor(t.values(), "sparse_allreduce_async")
    comm = _comm_of(process_set, "sparse_allreduce_async")
    # The op (applied here, after the gathers) and the name travel in the first gather's
    # agreement, as every reduction's do.
    indices = _submit(_gather_detail, comm, t.indices().t().contiguous(),
                      _terms(op, 1.0, 1.0, name))
    values = _submit(_gather_detail, comm, t.values().contiguous(), _named(name))
    n = comm.size

    def handle():
        vals = synchronize(values)
        idx = synchronize(indices)
        if op == Average:
            vals = vals / n if vals.dtype.is_floating_point else _torch.div(
                vals, n, rounding_mode="trunc")
        return _torch.sparse_coo_tensor(idx.t(), vals, t.shape)

    return handle


# -- allgather ----------------------------------------------------------------------------
class _Allgather(_torch.autograd.Function):
    """allgather; the gradient is this rank's rows of the summed output gradient."""

    @staticmethod
    def forward(ctx, tensor, process_set, name):
        comm = _comm_of(process_set, "allgather")
        out, counts = _run(_gather_rows, comm, tensor, _named(name))
        ctx.process_set = process_set
        ctx.rows = counts
        ctx.rank = comm.rank
        ctx.scalar = tensor.dim() == 0
        return out

    @staticmethod
    def backward(ctx, grad):
        summed = allreduce(grad.contiguous(), op=Sum, process_set=ctx.process_set)
        offset = sum(ctx.rows[:ctx.rank])
        mine = summed.narrow(0, offset, ctx.rows[ctx.rank])
        return (mine.reshape(()) if ctx.scalar else mine), None, None


@_refusals("AllGather")
def allgather(tensor, name=None, process_set=global_process_set):
    """Every rank's tensor concatenated on dimension 0 (first dimensions may differ).
    Differentiable."""
    _check_tensor(tensor, "allgather")
    return _Allgather.apply(tensor, process_set, name)


def _gather_detail(comm, tensor, detail):
    return _gather_rows(comm, tensor, detail)[0]


def _gather_only(comm, tensor, name=None):
    return _gather_detail(comm, tensor, _named(name))


@_refusals("AllGather")
def allgather_async(tensor, name=None, process_set=global_process_set):
    _check_tensor(tensor, "allgather_async")
    return _submit(_gather_only, _comm_of(process_set, "allgather_async"),
                   tensor.detach().clone(), name)


def _gather_group(comm, tensors, name=None):
    return [_gather_only(comm, t, name) for t in tensors]


@_refusals("AllGather")
def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """allgather of each tensor of a list; returns a list. Differentiable."""
    tensors = _check_group(tensors, "grouped_allgather")
    return [allgather(t, name=name, process_set=process_set) for t in tensors]


@_refusals("AllGather")
def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    tensors = _check_group(tensors, "grouped_allgather_async")
    return _submit(_gather_group, _comm_of(process_set, "grouped_allgather_async"),
                   [t.detach().clone() for t in tensors], name)


# -- broadcast ----------------------------------------------------------------------------
def _broadcast_into(comm, tensor, root, name=None):
    wire = _wire(tensor)
    if wire.data_ptr() == tensor.data_ptr() and wire.is_contiguous() and \
            tensor.is_contiguous():
        comm.broadcast(wire, root, _named(name))
        return tensor
    comm.broadcast(wire, root, _named(name))
    with _torch.no_grad():
        tensor.copy_(wire.to(tensor.dtype))
    return tensor


def _broadcast_new(comm, tensor, root, name=None):
    return _broadcast_into(comm, tensor.detach().clone(), root, name)


class _Broadcast(_torch.autograd.Function):
    """broadcast; the gradient is the output gradients summed over ranks on the root, zero
    elsewhere."""

    @staticmethod
    def forward(ctx, tensor, root_rank, process_set, name):
        comm = _comm_of(process_set, "broadcast")
        root = _root_in(comm, process_set, root_rank, "broadcast")
        ctx.process_set = process_set
        ctx.is_root = comm.rank == root
        return _run(_broadcast_new, comm, tensor, root, name)

    @staticmethod
    def backward(ctx, grad):
        summed = allreduce(grad.contiguous(), op=Sum, process_set=ctx.process_set)
        if not ctx.is_root:
            summed = _torch.zeros_like(summed)
        return summed, None, None, None


@_refusals("Broadcast")
def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """A new tensor holding root_rank's ``tensor`` (root_rank: a global rank).
    Differentiable."""
    _check_tensor(tensor, "broadcast")
    return _Broadcast.apply(tensor, root_rank, process_set, name)


@_refusals("Broadcast")
def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """In place: ``tensor`` becomes root_rank's."""
    _check_tensor(tensor, "broadcast_")
    comm = _comm_of(process_set, "broadcast_")
    return _run(_broadcast_into, comm, tensor, _root_in(comm, process_set, root_rank,
                                                        "broadcast_"), name)


@_refusals("Broadcast")
def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    _check_tensor(tensor, "broadcast_async")
    comm = _comm_of(process_set, "broadcast_async")
    return _submit(_broadcast_new, comm, tensor,
                   _root_in(comm, process_set, root_rank, "broadcast_async"), name)


@_refusals("Broadcast")
def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    _check_tensor(tensor, "broadcast_async_")
    comm = _comm_of(process_set, "broadcast_async_")
    return _submit(_broadcast_into, comm, tensor,
                   _root_in(comm, process_set, root_rank, "broadcast_async_"), name)


# -- synchronization ----------------------------------------------------------------------
def barrier(process_set=global_process_set):
    """Returns when every rank of the process set has called it."""
    comm = _comm_of(process_set, "barrier")
    _run(comm.barrier)


def _join(comm):
    arrived = _torch.tensor([_time.time()], dtype=_torch.float64)
    every = _torch.empty(comm.size, dtype=_torch.float64)
    comm.allgather(arrived, every)
    return int(_torch.argmax(every))


def join(device=-1):
    """Horovod's join for uneven data: this rank has run out of data. With a live
    DistributedOptimizer, this rank keeps taking part in its exchanges with zero gradients
    until every rank has joined (the optimizer's _join_optimizers); without one it is a
    barrier. Every rank calls it; returns the rank that joined last."""
    from poseidon.torch import _optimizer
    joiner = getattr(_optimizer, "_join_optimizers", None)
    last = joiner() if joiner is not None else None
    if last is not None:
        return int(last)
    return _run(_join, _comm())


# alltoall and reducescatter live in _scatter; importable from here as before.
from poseidon.torch._scatter import (  # noqa: E402,F401
    alltoall, alltoall_async, reducescatter, reducescatter_async, grouped_reducescatter,
    grouped_reducescatter_async)
