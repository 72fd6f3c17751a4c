"""Horovod's PyTorch API over Poseidon: change ``import horovod.torch as hvd`` to
``import poseidon.torch as hvd``.

How it maps:
  * init / rank / size / local_rank / local_size: the Poseidon world communicator.
  * allreduce, broadcast, allgather (and their in-place ``_`` and ``_async`` forms): Poseidon's
    blocking collectives on the tensor's own memory. The ``_async`` forms run them in order on
    one background thread (so every rank issues them in the same order) and return a handle for
    ``synchronize`` / ``poll``.
  * DistributedOptimizer: wait-free backprop. Each parameter is registered as a Poseidon layer;
    a hook on its gradient accumulator submits the gradient to the engine the moment autograd
    has produced it, while the backward pass goes on; ``step()`` waits for every handle and then
    lets the wrapped torch optimizer apply the update. The hybrid planner picks a strategy per
    parameter among allreduce, sfb and topk:
      - sfb (sufficient-factor broadcasting) for nn.Linear weights when ``model`` is given: a
        forward hook keeps the layer's input and a hook on its output keeps the output
        gradient, so the factors (batch x out, batch x in) are sent instead of the gradient;
      - topk for parameters marked sparse (``sparse=True`` or a list of names), with residuals
        kept inside Poseidon;
      - allreduce otherwise.
    ps (the sharded parameter server) applies the optimizer inside Poseidon on the shard owner,
    which would bypass the torch optimizer: it is therefore not a candidate here (use the C/C++
    or low-level Python API with a Poseidon optimizer for it).
"""
import concurrent.futures as _futures
import pickle as _pickle
import threading as _threading

import numpy as _np
import torch as _torch

import poseidon as _psd

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "Average", "Sum", "Adasum", "Compression",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "synchronize", "poll",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "allgather",
    "allgather_async", "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
    "DistributedOptimizer", "join", "mpi_threads_supported",
]

Average = "average"
Sum = "sum"
Adasum = "adasum"

_state = {"comm": None, "mpi_comm": None, "executor": None, "handles": {}, "next": 0,
          "optimizer_comms": []}
_lock = _threading.Lock()


def init(comm=None):
    """Initializes Poseidon (and MPI unless mpi4py already did). ``comm``: an optional mpi4py
    communicator to work on instead of the world."""
    if _state["comm"] is not None:
        return
    _state["comm"] = _psd.init(comm)
    _state["mpi_comm"] = comm
    # One worker: asynchronous collectives run in submission order, the same on every rank.
    _state["executor"] = _futures.ThreadPoolExecutor(max_workers=1,
                                                     thread_name_prefix="poseidon-async")


def shutdown():
    if _state["comm"] is None:
        return
    _state["executor"].shutdown(wait=True)
    _state["handles"].clear()
    # Destroying a communicator stops its engine, which is collective: done here, in creation
    # order on every rank, never from the garbage collector at a different moment per rank.
    for c in _state["optimizer_comms"]:
        c.destroy()
    _state["optimizer_comms"] = []
    comm = _state["comm"]
    _state["comm"] = None
    _state["executor"] = None
    if comm is not _psd.world():
        comm.destroy()


def is_initialized():
    return _state["comm"] is not None


def _comm():
    if _state["comm"] is None:
        raise ValueError("poseidon.torch has not been initialized; call poseidon.torch.init()")
    return _state["comm"]


def rank():
    return _comm().rank


def size():
    return _comm().size


def local_rank():
    return _comm().local_rank


def local_size():
    return _comm().local_size


def mpi_threads_supported():
    return True


def join(device=-1):
    """Horovod's join for uneven data: here a barrier (every rank must call it)."""
    _comm().barrier()
    return -1


class Compression:
    """Gradient compression for allreduce, as in Horovod (fp16 halves the bytes)."""

    class none:  # noqa: N801 (Horovod's spelling)
        @staticmethod
        def compress(tensor):
            return tensor, None

        @staticmethod
        def decompress(tensor, ctx):
            return tensor

    class fp16:  # noqa: N801
        @staticmethod
        def compress(tensor):
            if tensor.dtype.is_floating_point and tensor.dtype != _torch.float16:
                return tensor.to(_torch.float16), tensor.dtype
            return tensor, None

        @staticmethod
        def decompress(tensor, ctx):
            return tensor if ctx is None else tensor.to(ctx)


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


class _DistributedOptimizer(_torch.optim.Optimizer):
    """Mixed into the wrapped optimizer's class (see DistributedOptimizer)."""

    def __init__(self, params, named_parameters, model, compression, backward_passes_per_step,
                 op, strategy, sparse, density, batch_size):
        super(self.__class__, self).__init__(params)
        if op not in (Average, Sum):
            raise ValueError("DistributedOptimizer: op %r is not supported; expected Average "
                             "or Sum" % (op,))
        if compression is not Compression.none:
            raise _psd.UnimplementedError(
                "DistributedOptimizer: compression is chosen per parameter by the planner "
                "(topk via sparse=..., sfb via model=...); expected Compression.none")
        if backward_passes_per_step < 1:
            raise ValueError("DistributedOptimizer: backward_passes_per_step must be >= 1")
        # Each optimizer has its own communicator: its own layers, plan and engine. It lives
        # until shutdown() (see there).
        _comm()
        self._comm = _psd.init(_state["mpi_comm"]) if _state["mpi_comm"] is not None \
            else _psd.Comm(0)
        _state["optimizer_comms"].append(self._comm)
        self._op = op
        self._passes = backward_passes_per_step
        all_params = [p for g in self.param_groups for p in g["params"]]
        if named_parameters is None:
            named = [("param.%d" % i, p) for i, p in enumerate(all_params)]
        else:
            named = list(named_parameters)
            if any(not isinstance(x, tuple) for x in named):
                raise ValueError("DistributedOptimizer: named_parameters must be (name, "
                                 "parameter) pairs, e.g. model.named_parameters()")
            names = [n for n, _ in named]
            if len(set(names)) != len(names):
                raise ValueError("DistributedOptimizer: parameter names are not unique")
            known = {id(p) for _, p in named}
            missing = [p for p in all_params if id(p) not in known]
            if missing:
                raise ValueError("DistributedOptimizer: %d optimizer parameters are missing "
                                 "from named_parameters" % len(missing))
            in_opt = {id(p) for p in all_params}
            named = [(n, p) for n, p in named if id(p) in in_opt]
        self._named = [(n, p) for n, p in named if p.requires_grad]

        # Linear modules whose weight can travel as sufficient factors.
        self._factors = {}  # id(weight) -> [input, grad_output]
        self._hook_handles = []
        linear_weights = set()
        if model is not None:
            for module in model.modules():
                if isinstance(module, _torch.nn.Linear):
                    linear_weights.add(id(module.weight))
                    self._hook_linear(module)
        sparse_names = set()
        if sparse is True:
            sparse_names = {n for n, _ in self._named}
        elif sparse:
            sparse_names = set(sparse)
            unknown = sparse_names - {n for n, _ in self._named}
            if unknown:
                raise ValueError("DistributedOptimizer: sparse names %s are not parameters"
                                 % sorted(unknown))

        # Register one Poseidon layer per parameter (the same order on every rank).
        self._layers = {}   # id(p) -> layer id
        self._names = {}    # id(p) -> name
        for name, p in self._named:
            if p.dtype != _torch.float32 or p.device.type != "cpu":
                raise _psd.InvalidArgumentError(
                    "DistributedOptimizer: parameter %s is %s on %s; expected float32 on cpu"
                    % (name, p.dtype, p.device))
            # A parameter the user marked sparse may use topk; a Linear weight may use sfb
            # (the layer kinds are exclusive: an explicit sparse wins).
            kind = "dense"
            if name in sparse_names:
                kind = "sparse"
            elif id(p) in linear_weights:
                kind = "fc"
            forced = strategy.get(name, "auto") if isinstance(strategy, dict) else strategy
            layer_name = name.replace(" ", "_") or "param"
            self._layers[id(p)] = self._comm.register_layer(
                layer_name, list(p.shape), kind=kind, strategy=forced, density=density,
                candidates="allreduce,sfb,topk")
            self._names[id(p)] = name
        self._batch_size = batch_size
        self._planned = False
        self._handles = {}  # id(p) -> poseidon.Handle
        self._counts = {}   # id(p) -> backward passes since the last step
        self._strategies = {}
        self._register_hooks()

    # -- hooks ---------------------------------------------------------------------------
    def _hook_linear(self, module):
        slot = self._factors.setdefault(id(module.weight), [None, None])

        def forward_hook(mod, inputs, output):
            if not _torch.is_grad_enabled():
                return
            x = inputs[0]
            slot[0] = x.detach().reshape(-1, x.shape[-1])
            slot[1] = None

            def grad_hook(grad):
                slot[1] = grad.detach().reshape(-1, grad.shape[-1])

            if output.requires_grad:
                output.register_hook(grad_hook)

        self._hook_handles.append(module.register_forward_hook(forward_hook))

    def _register_hooks(self):
        self._grad_accs = []
        for _, p in self._named:
            # The gradient accumulator of p runs right after p.grad is written: submit there.
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            acc.register_hook(self._make_hook(p))
            self._grad_accs.append(acc)

    def _make_hook(self, p):
        def hook(*_):
            if id(p) in self._handles:
                raise AssertionError(
                    "DistributedOptimizer: gradient of %s was computed twice before step(); "
                    "use backward_passes_per_step for gradient accumulation" % self._names[id(p)])
            count = self._counts.get(id(p), 0) + 1
            self._counts[id(p)] = count
            if count < self._passes:
                return
            self._submit(p)
        return hook

    def _plan(self):
        batch = self._batch_size
        if batch is None:
            rows = [s[0].shape[0] for s in self._factors.values() if s[0] is not None]
            batch = max(rows) if rows else 1
        # Collective, at the same point of the first backward pass on every rank.
        self._comm.build_plan(int(batch))
        self._strategies = {pid: self._comm.layer_strategy(lid)
                            for pid, lid in self._layers.items()}
        self._planned = True

    def _submit(self, p):
        if not self._planned:
            self._plan()
        if p.grad is None:
            p.grad = _torch.zeros_like(p)
        grad = p.grad
        if not grad.is_contiguous():
            p.grad = grad = grad.contiguous()
        if self._passes > 1:
            grad.div_(self._passes)
        layer = self._layers[id(p)]
        slot = self._factors.get(id(p))
        if self._strategies[id(p)] == "sfb" and slot and slot[0] is not None \
                and slot[1] is not None:
            u = slot[1].contiguous()
            v = slot[0].contiguous()
            if self._passes > 1:
                u = u / self._passes
            self._handles[id(p)] = self._comm.submit(layer, grad, u=u, v=v)
        else:
            self._handles[id(p)] = self._comm.submit(layer, grad)
        self._counts[id(p)] = 0

    # -- Horovod's optimizer API -----------------------------------------------------------
    def synchronize(self):
        """Waits for every parameter's exchange (submitting zeros for parameters that got no
        gradient this step, so every rank submits the same layers)."""
        for _, p in self._named:
            if id(p) not in self._handles:
                self._submit(p)
        for _, p in self._named:
            h = self._handles.pop(id(p))
            h.wait()
            if self._op == Sum:
                p.grad.mul_(self._comm.size)
        self._counts.clear()

    def step(self, closure=None):
        self.synchronize()
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError("DistributedOptimizer: zero_grad() while exchanges are in "
                                 "flight; call step() (or synchronize()) first")
        return super(self.__class__, self).zero_grad(*args, **kwargs)

    def plan(self):
        """The planner's table (after the first backward pass)."""
        return self._comm.plan() if self._planned else ""

    def strategies(self):
        """{parameter name: strategy} once planned."""
        return {self._names[pid]: s for pid, s in self._strategies.items()}


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, model=None, strategy="auto",
                         sparse=None, density=0.0, batch_size=None):
    """Wraps a torch optimizer for data-parallel training over Poseidon (Horovod's signature,
    plus Poseidon's options):
      model      a module whose nn.Linear weights may travel as sufficient factors (sfb);
      strategy   "auto" (the planner chooses), or "allreduce" / "sfb" / "topk" for every
                 parameter, or {name: strategy};
      sparse     True, or a list of parameter names, that may use topk compression;
      density    topk density in (0, 1] (0: POSEIDON_TOPK_DENSITY);
      batch_size samples per rank for the planner (default: rows seen by the Linear hooks).
    """
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, model, compression,
               backward_passes_per_step, op, strategy, sparse, density, batch_size)
