"""Objects and model state across ranks: broadcast_object, allgather_object,
broadcast_parameters, broadcast_optimizer_state.

Objects are serialized with cloudpickle when it is installed (lambdas, local classes), plain
pickle otherwise. A rank that cannot serialize its object does not leave the others waiting:
a status travels first, and every rank raises InvalidArgumentError naming the failing rank and
the cause."""
import pickle as _pickle

import numpy as _np
import torch as _torch

import poseidon as _psd
from poseidon.torch._core import _run
from poseidon.torch._collectives import _broadcast_into, _named, _root_in
from poseidon.torch._process_sets import comm_of as _comm_of, global_process_set

try:
    import cloudpickle as _serializer
except ImportError:
    _serializer = _pickle


def _dumps(obj):
    """(bytes, None) or (None, 'Type: message')."""
    try:
        return _serializer.dumps(obj), None
    except Exception as e:  # noqa: BLE001 (any failure of the user's object)
        return None, "%s: %s" % (type(e).__name__, e)


def _to_words(data, nbytes):
    """Bytes in int32 words (the collectives have no byte type), zero padded."""
    words = _np.zeros((nbytes + 3) // 4, dtype=_np.int32)
    if data:
        words.view(_np.uint8)[:len(data)] = _np.frombuffer(data, dtype=_np.uint8)
    return words


def _bcast_bytes(comm, data, root, detail=""):
    """``data`` (bytes, on root) on every rank; ``detail`` is compared across ranks in the
    broadcast of the bytes themselves."""
    length = _np.array([len(data) if comm.rank == root else 0], dtype=_np.int64)
    comm.broadcast(length, root)
    n = int(length[0])
    words = _to_words(data if comm.rank == root else b"", n)
    comm.broadcast(words, root, detail)
    return words.view(_np.uint8)[:n].tobytes()


def _gather_bytes(comm, data):
    """Every rank's bytes, in rank order."""
    lengths = _np.zeros(comm.size, dtype=_np.int64)
    comm.allgather(_np.array([len(data)], dtype=_np.int64), lengths)
    top = (int(lengths.max()) + 3) // 4
    mine = _np.zeros(top, dtype=_np.int32)
    mine.view(_np.uint8)[:len(data)] = _np.frombuffer(data, dtype=_np.uint8)
    every = _np.zeros(top * comm.size, dtype=_np.int32)
    comm.allgather(mine, every)
    raw = every.view(_np.uint8)
    return [raw[r * top * 4:r * top * 4 + int(lengths[r])].tobytes() for r in range(comm.size)]


def _broadcast_object(comm, obj, root, global_root, name):
    payload, error = _dumps(obj) if comm.rank == root else (b"", None)
    status = _np.array([0 if error is None else 1], dtype=_np.int64)
    comm.broadcast(status, root)
    if status[0]:
        cause = _bcast_bytes(comm, error.encode() if comm.rank == root else b"", root)
        raise _psd.InvalidArgumentError(
            "broadcast_object: the root (rank %d) could not serialize the object: %s"
            % (global_root, cause.decode(errors="replace")))
    # The name rides on the last broadcast, as on broadcast_(..., name=): one that differs on a
    # rank fails there, and a small object fails the next collective on the ranks that agree
    # with the root (see poseidon.torch.broadcast_).
    data = _bcast_bytes(comm, payload, root, _named(name))
    return obj if comm.rank == root else _serializer.loads(data)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """root_rank's ``obj`` on every rank (serialized there, deserialized elsewhere). ``name``
    is compared across ranks, as on broadcast_: one that differs raises MismatchError."""
    comm = _comm_of(process_set, "broadcast_object")
    root = _root_in(comm, process_set, root_rank, "broadcast_object")
    return _run(_broadcast_object, comm, obj, root, root_rank, name)


def _allgather_object(comm, obj, ranks, name):
    payload, error = _dumps(obj)
    failed = _np.zeros(comm.size, dtype=_np.int64)
    # The name is compared in the first exchange: one that differs fails it on every rank.
    comm.allgather(_np.array([0 if error is None else 1], dtype=_np.int64), failed,
                   _named(name))
    if failed.any():
        causes = _gather_bytes(comm, (error or "").encode())
        text = "; ".join("rank %d: %s" % (ranks[r], causes[r].decode(errors="replace"))
                         for r in range(comm.size) if failed[r])
        raise _psd.InvalidArgumentError(
            "allgather_object: a rank could not serialize its object: %s" % text)
    return [obj if r == comm.rank else _serializer.loads(b)
            for r, b in enumerate(_gather_bytes(comm, payload))]


def allgather_object(obj, name=None, process_set=global_process_set):
    """The list of every rank's ``obj``, in rank order. ``name`` is compared across ranks: one
    that differs raises MismatchError on every rank."""
    comm = _comm_of(process_set, "allgather_object")
    ranks = process_set.ranks if process_set is not None else list(range(comm.size))
    return _run(_allgather_object, comm, obj, ranks, name)


def _broadcast_all(comm, tensors, root, names=None):
    for i, t in enumerate(tensors):
        _broadcast_into(comm, t, root, None if names is None else names[i])


def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Copies root_rank's parameters to every rank, in place. ``params``: a state_dict (any
    dict, broadcast in sorted key order), named_parameters() pairs, or parameters / tensors.
    Every rank must pass the same entries in the same order: where entries are named (a dict,
    or pairs), a name that differs on one rank fails every rank with MismatchError naming it."""
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, (list, tuple)) or hasattr(params, "__iter__"):
        items = [(p[0], p[1]) if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError("broadcast_parameters: invalid params of type %s; expected a dict or "
                         "a list of tensors or (name, tensor) pairs" % type(params).__name__)
    tensors, names = [], []
    for name, p in items:
        if p is None:
            continue
        if not isinstance(p, _torch.Tensor):
            raise ValueError("broadcast_parameters: expected tensors, got %s"
                             % type(p).__name__)
        tensors.append(p.data if isinstance(p, _torch.nn.Parameter) else p)
        names.append(name)
    comm = _comm_of(process_set, "broadcast_parameters")
    _run(_broadcast_all, comm, tensors, _root_in(comm, process_set, root_rank,
                                                 "broadcast_parameters"), names)


def _initialize_state(optimizer, model):
    """Horovod's zero-gradient step on an optimizer without state, so that it has every state
    entry; the parameters and gradients are put back as they were."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if model is not None:
        known = {id(p) for p in params}
        params += [p for p in model.parameters() if id(p) not in known]
    saved = [(p, p.detach().clone(), p.grad) for p in params]
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = _torch.zeros_like(p)
    cls = type(optimizer)
    if cls.__module__ == "poseidon.torch._optimizer":
        # A DistributedOptimizer's step would exchange gradients: step the wrapped class.
        super(cls, optimizer).step()
    else:
        optimizer.step()
    with _torch.no_grad():
        for p, value, grad in saved:
            p.copy_(value)
            p.grad = grad


def broadcast_optimizer_state(optimizer, root_rank, model=None,
                              process_set=global_process_set):
    """Copies root_rank's optimizer state (every group's hyperparameters and each parameter's
    state, e.g. momentum buffers) to every rank. An optimizer without state first takes a step
    with zero gradients (as in Horovod) so that every rank has the entries; ``model`` adds
    parameters to restore after that step."""
    if isinstance(optimizer, _torch.optim.LBFGS):
        raise ValueError("broadcast_optimizer_state: LBFGS is not supported")
    if len(optimizer.state_dict()["state"]) == 0:
        _initialize_state(optimizer, model)
    state_dict = optimizer.state_dict()
    comm = _comm_of(process_set, "broadcast_optimizer_state")
    root = _root_in(comm, process_set, root_rank, "broadcast_optimizer_state")
    # Tensors travel through broadcasts in place (no pickling); the rest in a skeleton.
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

    skeleton = broadcast_object(strip(state_dict), root_rank, process_set=process_set)
    if comm.rank == root:
        _run(_broadcast_all, comm, [t.contiguous() for t in tensors], root)
        return
    received = []

    def fill(obj):
        if isinstance(obj, tuple) and len(obj) == 4 and obj[0] == "__psd_tensor__":
            t = _torch.empty(obj[2], dtype=getattr(_torch, obj[3].split(".")[-1]))
            received.append(t)
            return t
        if isinstance(obj, dict):
            return {k: fill(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(fill(v) for v in obj)
        return obj

    new_state = fill(skeleton)
    _run(_broadcast_all, comm, received, root)
    optimizer.load_state_dict(new_state)
