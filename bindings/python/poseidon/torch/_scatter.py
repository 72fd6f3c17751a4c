"""alltoall and reducescatter: each rank gets its own rows of the result. Re-exported by
_collectives (see its docstring for dtypes, ops and ordering)."""
import torch as _torch

from poseidon.torch._collectives import (_average_div, _check_group, _check_tensor,
                                         _gather_rows, _named, _refusals, _refused,
                                         _resolve_op, _scale, _submit, _terms, _wire,
                                         allgather)
from poseidon.torch._compression import Compression
from poseidon.torch._core import Average, Sum, _run
from poseidon.torch._process_sets import comm_of as _comm_of, global_process_set


# -- alltoall -----------------------------------------------------------------------------
def _alltoall(comm, tensor, splits, name=None):
    """Rows splits[r] of ``tensor`` go to rank r (in order); returns the rows received from
    every rank (in rank order) and how many came from each. Moves every rank's whole tensor
    to every rank (an allgather): Poseidon has no alltoall."""
    n = comm.size
    x = tensor.detach()
    if x.dim() == 0:
        raise _refused(comm, "AllGather",
                       ValueError("alltoall: expected a tensor with at least one dimension"))
    if splits is None:
        if x.shape[0] % n:
            raise _refused(comm, "AllGather", ValueError(
                "alltoall: the first dimension (%d) is not divisible by the number of ranks "
                "(%d); pass splits" % (x.shape[0], n)))
        send = [x.shape[0] // n] * n
    else:
        send = [int(s) for s in (splits.tolist() if isinstance(splits, _torch.Tensor)
                                 else splits)]
        if len(send) != n or any(s < 0 for s in send) or sum(send) != x.shape[0]:
            raise _refused(comm, "AllGather", ValueError(
                "alltoall: splits %r must be %d non-negative counts summing to the first "
                "dimension (%d)" % (send, n, x.shape[0])))
    matrix, _ = _gather_rows(comm, _torch.tensor([send], dtype=_torch.int64), _named(name))
    data, counts = _gather_rows(comm, x)
    me = comm.rank
    parts = []
    start = 0
    for r in range(n):
        row = [int(v) for v in matrix[r]]
        offset = start + sum(row[:me])
        parts.append(data[offset:offset + row[me]])
        start += counts[r]
    received = _torch.tensor([int(matrix[r][me]) for r in range(n)], dtype=_torch.int32)
    return _torch.cat(parts, dim=0), received


class _Alltoall(_torch.autograd.Function):
    """alltoall; the gradient goes back with the received splits."""

    @staticmethod
    def forward(ctx, tensor, splits, process_set, name):
        out, received = _run(_alltoall, _comm_of(process_set, "alltoall"), tensor, splits,
                             name)
        ctx.process_set = process_set
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, _unused):
        back, _ = alltoall(grad.contiguous(), splits=ctx.received,
                           process_set=ctx.process_set)
        return back, None, None, None


@_refusals("AllGather")
def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends rows splits[r] (default: an equal share) of ``tensor`` to rank r; returns the
    rows received from every rank in rank order and, when ``splits`` is given, a tensor of
    how many rows came from each rank. Differentiable."""
    _check_tensor(tensor, "alltoall")
    out, received = _Alltoall.apply(tensor, splits, process_set, name)
    if splits is None:
        return out
    if isinstance(splits, _torch.Tensor):
        received = received.to(splits.dtype)
    return out, received


@_refusals("AllGather")
def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Handle whose synchronize() gives (output, received splits)."""
    _check_tensor(tensor, "alltoall_async")
    return _submit(_alltoall, _comm_of(process_set, "alltoall_async"),
                   tensor.detach().clone(), splits, name)


# -- reducescatter ------------------------------------------------------------------------
def _split_rows(total, n):
    """Horovod's split of ``total`` rows over n ranks: the first total % n get one more."""
    return [total // n + (1 if r < total % n else 0) for r in range(n)]


def _reducescatter(comm, tensor, op, prescale, postscale, name=None):
    if op not in (Average, Sum):
        raise _refused(comm, "ReduceScatter",
                       ValueError("reducescatter: op must be Average or Sum"))
    if tensor.dtype == _torch.bool:
        raise _refused(comm, "ReduceScatter",
                       TypeError("reducescatter: bool tensors cannot be reduced"))
    x = _scale(tensor.detach(), prescale)
    if x.dim() == 0:
        raise _refused(comm, "ReduceScatter", ValueError(
            "reducescatter: expected a tensor with at least one dimension"))
    n = comm.size
    rows = _split_rows(x.shape[0], n)
    rest = tuple(x.shape[1:])
    top = max(rows)
    if top == 0:
        return x.clone()
    wire = _wire(x)
    chunks = []
    start = 0
    for r in range(n):
        part = wire[start:start + rows[r]]
        start += rows[r]
        if rows[r] < top:
            part = _torch.cat([part, _torch.zeros((top - rows[r],) + rest, dtype=wire.dtype)])
        chunks.append(part)
    send = _torch.cat(chunks).contiguous()
    recv = _torch.empty((top,) + rest, dtype=wire.dtype)
    comm.reduce_scatter(send, recv, _terms(op, prescale, postscale, name))
    out = recv[:rows[comm.rank]].to(tensor.dtype)
    if op == Average:
        return _average_div(out, n, postscale)
    return _scale(out, postscale)


class _Reducescatter(_torch.autograd.Function):
    """reducescatter; the gradient is the allgather of the output gradients (scaled like the
    forward)."""

    @staticmethod
    def forward(ctx, tensor, op, prescale, postscale, process_set, name):
        comm = _comm_of(process_set, "reducescatter")
        ctx.args = (op, prescale, postscale, process_set, comm.size)
        return _run(_reducescatter, comm, tensor, op, prescale, postscale, name)

    @staticmethod
    def backward(ctx, grad):
        op, prescale, postscale, process_set, n = ctx.args
        full = allgather(grad.contiguous(), process_set=process_set)
        factor = prescale * postscale / (n if op == Average else 1)
        return _scale(full, factor), None, None, None, None, None


@_refusals("ReduceScatter")
def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces (Average or Sum) ``tensor`` over ranks and returns this rank's rows of the
    result: rank r gets rows // size() rows, one more when r < rows % size() (Horovod's
    split). Differentiable."""
    op = _resolve_op(None, op, "reducescatter")
    _check_tensor(tensor, "reducescatter")
    wire, ctx = compression.compress(tensor)
    out = _Reducescatter.apply(wire, op, float(prescale_factor), float(postscale_factor),
                               process_set, name)
    return compression.decompress(out, ctx)


@_refusals("ReduceScatter")
def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    op = _resolve_op(None, op, "reducescatter_async")
    _check_tensor(tensor, "reducescatter_async")
    return _submit(_reducescatter, _comm_of(process_set, "reducescatter_async"),
                   tensor.detach().clone(), op, float(prescale_factor), float(postscale_factor),
                   name)


def _reducescatter_group(comm, tensors, op, prescale, postscale, name=None):
    return [_reducescatter(comm, t, op, prescale, postscale, name) for t in tensors]


@_refusals("ReduceScatter")
def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """reducescatter of each tensor of a list; returns a list. Differentiable."""
    tensors = _check_group(tensors, "grouped_reducescatter")
    return [reducescatter(t, name=name, compression=compression, op=op,
                          process_set=process_set, prescale_factor=prescale_factor,
                          postscale_factor=postscale_factor)
            for t in tensors]


@_refusals("ReduceScatter")
def grouped_reducescatter_async(tensors, name=None, op=Average,
                                process_set=global_process_set, prescale_factor=1.0,
                                postscale_factor=1.0):
    op = _resolve_op(None, op, "grouped_reducescatter_async")
    tensors = _check_group(tensors, "grouped_reducescatter_async")
    return _submit(_reducescatter_group, _comm_of(process_set, "grouped_reducescatter_async"),
                   [t.detach().clone() for t in tensors], op, float(prescale_factor),
                   float(postscale_factor), name)
