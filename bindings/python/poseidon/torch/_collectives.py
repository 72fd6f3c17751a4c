"""Horovod's collectives on torch tensors over Poseidon's blocking collectives; the ``_async``
forms run in order on one background thread (the same order on every rank)."""
import pickle as _pickle

import numpy as _np
import torch as _torch

import poseidon as _psd
from poseidon.torch._compression import Compression
from poseidon.torch._core import Average, Sum, Adasum, _comm, _lock, _state, rank, size


def join(device=-1):
    """Horovod's join for uneven data: here a barrier (every rank must call it)."""
    _comm().barrier()
    return -1


def _resolve_op(average, op):
    if op is not None and average is not None:
        raise ValueError("allreduce: pass either op or the deprecated average, not both")
    if op is None:
        op = Average if average is None or average else Sum
    if op == Adasum:
        raise _psd.UnimplementedError("allreduce: op=Adasum is not supported by Poseidon; "
                                      "expected Average or Sum")
    if op not in (Average, Sum):
        raise ValueError("allreduce: op %r is unknown; expected Average or Sum" % (op,))
    return op


def _check_tensor(tensor, what):
    if not isinstance(tensor, _torch.Tensor):
        raise TypeError("%s: expected a torch.Tensor, got %s" % (what, type(tensor).__name__))
    if not tensor.is_contiguous():
        raise _psd.InvalidArgumentError("%s: tensor is not contiguous; expected a contiguous "
                                        "tensor" % what)


def _allreduce_inplace(tensor, op, prescale, postscale, compression):
    _check_tensor(tensor, "allreduce")
    wire, ctx = compression.compress(tensor)
    with _torch.no_grad():
        if prescale != 1.0:
            wire.mul_(prescale)
        _comm().allreduce(wire, wire)
        out = compression.decompress(wire, ctx)
        scale = postscale / size() if op == Average else postscale
        if scale != 1.0:
            if out.dtype.is_floating_point:
                out.mul_(scale)
            else:
                out.div_(int(round(1.0 / scale)), rounding_mode="floor")
        if out is not tensor:
            tensor.copy_(out)
    return tensor


def allreduce_(tensor, average=None, name=None, compression=Compression.none, op=None,
               prescale_factor=1.0, postscale_factor=1.0):
    """In place: ``tensor`` becomes the sum (op=Sum) or average (default) over ranks."""
    return _allreduce_inplace(tensor, _resolve_op(average, op), prescale_factor,
                              postscale_factor, compression)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0):
    """Returns a new tensor with the sum or average over ranks (``tensor`` is unchanged)."""
    return allreduce_(tensor.detach().clone().contiguous(), average, name, compression, op,
                      prescale_factor, postscale_factor)


def _submit(fn, *args):
    with _lock:
        handle = _state["next"]
        _state["next"] += 1
        _state["handles"][handle] = _state["executor"].submit(fn, *args)
    return handle


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0):
    op = _resolve_op(average, op)
    _check_tensor(tensor, "allreduce_async_")
    return _submit(_allreduce_inplace, tensor, op, prescale_factor, postscale_factor,
                   Compression.none)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0):
    return allreduce_async_(tensor.detach().clone().contiguous(), average, name, op,
                            prescale_factor, postscale_factor)


def poll(handle):
    """True when the asynchronous operation finished (never blocks)."""
    future = _state["handles"].get(handle)
    if future is None:
        raise ValueError("poll: handle %r is unknown or already synchronized" % (handle,))
    return future.done()


def synchronize(handle):
    """Waits for an asynchronous operation and returns its output tensor."""
    with _lock:
        future = _state["handles"].pop(handle, None)
    if future is None:
        raise ValueError("synchronize: handle %r is unknown or already synchronized" % (handle,))
    return future.result()


def _broadcast_inplace(tensor, root_rank):
    _check_tensor(tensor, "broadcast")
    with _torch.no_grad():
        _comm().broadcast(tensor, root_rank)
    return tensor


def broadcast_(tensor, root_rank, name=None):
    return _broadcast_inplace(tensor, root_rank)


def broadcast(tensor, root_rank, name=None):
    return _broadcast_inplace(tensor.detach().clone().contiguous(), root_rank)


def broadcast_async_(tensor, root_rank, name=None):
    _check_tensor(tensor, "broadcast_async_")
    return _submit(_broadcast_inplace, tensor, root_rank)


def broadcast_async(tensor, root_rank, name=None):
    return broadcast_async_(tensor.detach().clone().contiguous(), root_rank)


def _allgather(tensor):
    _check_tensor(tensor, "allgather")
    comm = _comm()
    t = tensor.detach().contiguous()
    if t.dim() == 0:
        t = t.reshape(1)
    # First dimensions may differ per rank (as in Horovod): agree on them, pad to the largest.
    rows = _torch.tensor([t.shape[0]], dtype=_torch.int64)
    all_rows = _torch.empty(comm.size, dtype=_torch.int64)
    comm.allgather(rows, all_rows)
    top = int(all_rows.max())
    padded = _torch.zeros((top,) + tuple(t.shape[1:]), dtype=t.dtype)
    padded[:t.shape[0]] = t
    out = _torch.empty((comm.size * top,) + tuple(t.shape[1:]), dtype=t.dtype)
    comm.allgather(padded, out)
    parts = [out[r * top:r * top + int(all_rows[r])] for r in range(comm.size)]
    return _torch.cat(parts, dim=0)


def allgather(tensor, name=None):
    """Concatenates every rank's tensor along the first dimension (sizes may differ)."""
    return _allgather(tensor)


def allgather_async(tensor, name=None):
    return _submit(_allgather, tensor)


def broadcast_object(obj, root_rank=0, name=None):
    """Pickles ``obj`` on root_rank and returns it on every rank."""
    comm = _comm()
    payload = _pickle.dumps(obj) if comm.rank == root_rank else b""
    length = _np.array([len(payload)], dtype=_np.int64)
    comm.broadcast(length, root_rank)
    buf = _np.zeros(int(length[0]), dtype=_np.uint8) if comm.rank != root_rank else \
        _np.frombuffer(bytearray(payload), dtype=_np.uint8)
    # uint8 travels as int32 words (the collectives have no byte type).
    words = _np.zeros((int(length[0]) + 3) // 4, dtype=_np.int32)
    words.view(_np.uint8)[:len(buf)] = buf
    comm.broadcast(words, root_rank)
    return _pickle.loads(words.view(_np.uint8)[:int(length[0])].tobytes())


def broadcast_parameters(params, root_rank):
    """Copies root_rank's parameters (a state_dict or named_parameters) to every rank, in
    place. Every rank must pass the same names in the same order."""
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, list) or hasattr(params, "__iter__"):
        items = list(params)
        if items and not isinstance(items[0], tuple):
            raise ValueError("broadcast_parameters: expected a dict or (name, tensor) pairs")
    else:
        raise ValueError("broadcast_parameters: invalid params of type %s" % type(params))
    for name, p in items:
        if p is None:
            continue
        tensor = p.data if isinstance(p, _torch.nn.Parameter) else p
        if not isinstance(tensor, _torch.Tensor):
            continue
        if tensor.is_contiguous():
            broadcast_(tensor, root_rank)
        else:
            tensor.copy_(broadcast(tensor.contiguous(), root_rank))


def broadcast_optimizer_state(optimizer, root_rank):
    """Copies root_rank's optimizer state (hyperparameters of every group and per-parameter
    state such as momentum buffers) to every rank."""
    if isinstance(optimizer, _torch.optim.LBFGS):
        raise ValueError("broadcast_optimizer_state: LBFGS is not supported")
    state_dict = optimizer.state_dict()
    # Tensors travel through broadcast_ (in place, no pickling); the rest through pickle.
    tensors = []

    def strip(obj):
        if isinstance(obj, _torch.Tensor):
            tensors.append(obj)
            return ("__psd_tensor__", len(tensors) - 1, tuple(obj.shape), str(obj.dtype))
        if isinstance(obj, dict):
            return {k: strip(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(strip(v) for v in obj)
        return obj

    skeleton = broadcast_object(strip(state_dict), root_rank)
    if rank() == root_rank:
        for t in tensors:
            broadcast_(t.contiguous(), root_rank)
        return
    dtypes = {str(d): d for d in (_torch.float32, _torch.float64, _torch.float16,
                                  _torch.bfloat16, _torch.int32, _torch.int64)}
    received = []

    def fill(obj):
        if isinstance(obj, tuple) and len(obj) == 4 and obj[0] == "__psd_tensor__":
            t = _torch.empty(obj[2], dtype=dtypes[obj[3]])
            received.append(t)
            return t
        if isinstance(obj, dict):
            return {k: fill(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(fill(v) for v in obj)
        return obj

    new_state = fill(skeleton)
    for t in received:
        broadcast_(t, root_rank)
    optimizer.load_state_dict(new_state)
