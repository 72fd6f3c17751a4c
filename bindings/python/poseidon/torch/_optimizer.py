"""DistributedOptimizer: wait-free backprop through Poseidon's engine, one layer per
parameter, the hybrid planner choosing allreduce / sfb / topk per parameter.

Horovod's semantics, step by step:
  * backward_passes_per_step=N: the gradients of N backward passes are summed in p.grad (not
    divided by N); the sum is exchanged once, after the N-th pass, and averaged (or summed)
    over ranks. zero_grad() between those passes raises, as in Horovod.
  * A parameter whose gradient hook did not fire on a rank in a step (unused there) is
    submitted at synchronize() with a zero gradient: the engine matches layers by id in any
    order, so the result is the average with this rank contributing zeros.
  * gradient_predivide_factor f (op=Average only): gradients are scaled by 1/f before the
    exchange and the average by f after it.
  * compression (e.g. Compression.fp16): the engine exchanges float32, so the gradient is
    rounded through the compressed type in place before the exchange and the result again
    after it: the values are those of the sum of fp16-rounded gradients, rounded to fp16, as
    with Horovod (whose own fp16 partial sums may round once more per addition). Sufficient
    factors are float32 only, so with a compression Linear weights are never sent as factors.
  * synchronize(), then step() inside skip_synchronize() (e.g. to clip gradients in between);
    step() after synchronize() without it warns and does not exchange again.
  * Sufficient factors (model=): every call of a Linear in a step (several calls in one
    forward, several backward passes) adds its rows: the factors are the concatenated rows.
    A rank where the Linear did not run (or whose output did not reach the loss) sends one
    zero row, so every rank submits factors for an sfb layer. When the rows exceed the planned
    K (Poseidon's K is fixed by the plan), this rank sends its dense gradient G as exact
    factors instead (identity and G: min(M, N) rows). The factors are cleared at every step.
"""
import contextlib as _contextlib
import threading as _threading
import warnings as _warnings

import torch as _torch

import poseidon as _psd
from poseidon.torch import _process_sets
from poseidon.torch._compression import Compression
from poseidon.torch._core import Adasum, Average, Sum, _comm, _state

_GLOBAL_PROCESS_SET_ID = 0

# Every DistributedOptimizer whose communicator lives, in creation order (the same on every
# rank): join() must keep exchanging zeros on all of them, so none may be forgotten by the
# garbage collector on one rank and not another.
_optimizers = []


def _check_process_set(process_set):
    """None (every rank) or a ProcessSet added with add_process_set, this rank a member."""
    if process_set is None:
        return None
    if not isinstance(process_set, _process_sets.ProcessSet):
        raise ValueError("DistributedOptimizer: process_set %r is not a ProcessSet; expected "
                         "None or a set from add_process_set" % (process_set,))
    # Whether it was added and holds this rank: new_comm checks, when the optimizer is made.
    return None if process_set.process_set_id == _GLOBAL_PROCESS_SET_ID else process_set


def _check_compression(compression):
    if not (hasattr(compression, "compress") and hasattr(compression, "decompress")):
        raise ValueError("DistributedOptimizer: compression must have compress() and "
                         "decompress(), e.g. Compression.none or Compression.fp16")


class _DistributedOptimizer(_torch.optim.Optimizer):
    """Mixed into the wrapped optimizer's class (see DistributedOptimizer)."""

    def __init__(self, params, named_parameters, model, compression, backward_passes_per_step,
                 op, gradient_predivide_factor, groups, sparse_as_dense, strategy, sparse,
                 density, batch_size, process_set=None):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        self._predivide = float(gradient_predivide_factor)
        self._sparse_as_dense = bool(sparse_as_dense)
        # Each optimizer has its own communicator: its own layers, plan and engine. It lives
        # until shutdown() (see there).
        # Over the process set's ranks when one is given (averages divide by its size).
        self._comm = _process_sets.new_comm(process_set, "DistributedOptimizer")
        self._process_set = process_set
        _state["optimizer_comms"].append(self._comm)
        self._op = op
        self._passes = int(backward_passes_per_step)
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
        trained = {id(p) for _, p in self._named}
        if isinstance(groups, list):
            for group in groups:
                if not isinstance(group, (list, tuple)) or any(
                        id(t) not in trained for t in group):
                    raise ValueError("DistributedOptimizer: groups must be a list of lists of "
                                     "parameters that require gradients")
        # groups only fuse Horovod's allreduces; Poseidon's engine fuses on its own, so they
        # are checked and otherwise change nothing.
        self._groups = groups

        # Linear modules whose weight can travel as sufficient factors (float32 factors: not
        # with a compression, whose values are those of the compressed dense gradient).
        self._records = {}  # id(weight) -> [[input rows, output-gradient rows or None], ...]
        self._hook_handles = []
        linear_weights = set()
        if model is not None and compression is Compression.none:
            for module in model.modules():
                if isinstance(module, _torch.nn.Linear) and id(module.weight) in trained:
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
        # One more layer per optimizer: who has joined (see _join_optimizers), exchanged with
        # every step's gradients.
        self._joined_layer = self._comm.register_layer(
            "psd.joined", [self._comm.size], kind="dense", strategy="allreduce")
        self._join_rounds = 0
        self._batch_size = batch_size
        self._planned = False
        self._kmax = 0      # the planned K (rows of factors a rank may send)
        self._handles = {}  # id(p) -> poseidon.Handle
        self._counts = {}   # id(p) -> backward passes since the last step
        self._strategies = {}
        self._synchronized = False
        self._should_synchronize = True
        self._register_hooks()
        _optimizers[:] = [o for o in _optimizers if _alive(o)] + [self]

    # -- hooks ---------------------------------------------------------------------------
    def _hook_linear(self, module):
        records = self._records.setdefault(id(module.weight), [])

        def forward_hook(mod, inputs, output):
            if not _torch.is_grad_enabled() or not output.requires_grad:
                return
            x = inputs[0]
            record = [x.detach().reshape(-1, x.shape[-1]), None]
            records.append(record)

            def grad_hook(grad):
                # Each call of the module keeps its own rows (a Linear may run twice).
                g = grad.detach().reshape(-1, grad.shape[-1])
                record[1] = g if record[1] is None else record[1] + g

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
                    "DistributedOptimizer: the gradient of %s was computed more than "
                    "backward_passes_per_step (%d) times before step(); increase "
                    "backward_passes_per_step to accumulate gradients locally"
                    % (self._names[id(p)], self._passes))
            self._synchronized = False
            count = self._counts.get(id(p), 0) + 1
            self._counts[id(p)] = count
            if count >= self._passes:
                self._submit(p)
        return hook

    def _plan(self):
        # K: the most rows any Linear saw this step on any rank (several calls and passes
        # add up), at least batch_size x backward passes when batch_size is given.
        rows = max([sum(r[0].shape[0] for r in recs) for recs in self._records.values()] + [1])
        if self._batch_size is not None:
            rows = max(rows, int(self._batch_size) * self._passes)
        mine = _torch.tensor([rows], dtype=_torch.int64)
        every = _torch.zeros(self._comm.size, dtype=_torch.int64)
        # The ranks compare their optimizers' terms here, once: an op, predivide factor or
        # compression that differs on one rank would otherwise scale or round its gradients
        # differently and the replicas would silently diverge. (Passes per step may differ:
        # each rank's accumulated sum is what it submits.)
        self._comm.allgather(mine, every, self._terms())
        self._kmax = int(every.max())
        # Collective, at the first submission of the first step on every rank.
        self._comm.build_plan(self._kmax)
        self._strategies = {pid: self._comm.layer_strategy(lid)
                            for pid, lid in self._layers.items()}
        self._planned = True

    def _terms(self):
        c = self._compression
        return ("DistributedOptimizer: op %s, gradient_predivide_factor %r, compression %s"
                % (self._op, self._predivide, getattr(c, "__name__", type(c).__name__)))

    def _round(self, tensor):
        """Rounds through the compression's wire type in place (nothing for none)."""
        if self._compression is Compression.none:
            return
        wire, ctx = self._compression.compress(tensor)
        back = self._compression.decompress(wire, ctx)
        if back is not tensor:
            tensor.copy_(back)

    def _factors(self, p):
        """(u, v) for an sfb layer: every call's rows, one zero row when there are none."""
        rows, cols = p.shape
        pairs = [(g, x) for x, g in self._records.get(id(p), []) if g is not None]
        pairs = [(g, x) for g, x in pairs if g.shape[0] > 0]
        if pairs:
            u = _torch.cat([g for g, _ in pairs]) if len(pairs) > 1 else pairs[0][0]
            v = _torch.cat([x for _, x in pairs]) if len(pairs) > 1 else pairs[0][1]
        else:
            u = _torch.zeros(1, rows)
            v = _torch.zeros(1, cols)
        if u.shape[0] > self._kmax and min(rows, cols) <= self._kmax:
            # More rows than the plan allows: G itself as exact factors (I^T G or G^T^T I).
            grad = p.grad if p.grad is not None else _torch.zeros_like(p)
            if rows <= cols:
                u, v = _torch.eye(rows), grad.detach()
            else:
                u, v = grad.detach().t(), _torch.eye(cols)
        u = u.to(_torch.float32).contiguous()
        v = v.to(_torch.float32).contiguous()
        if self._op == Average and self._predivide != 1.0:
            u = u * (1.0 / self._predivide)
        return u, v

    def _submit(self, p):
        if not self._planned:
            self._plan()
        if p.grad is None:
            # Not computed on this rank this step: the other ranks may have it (zeros here).
            p.grad = _torch.zeros_like(p)
        elif p.grad.is_sparse:
            if not self._sparse_as_dense:
                raise _psd.UnimplementedError(
                    "DistributedOptimizer: %s has a sparse gradient; Poseidon exchanges dense "
                    "gradients: pass sparse_as_dense=True" % self._names[id(p)])
            p.grad = p.grad.to_dense()
        grad = p.grad
        if not grad.is_contiguous():
            p.grad = grad = grad.contiguous()
        layer = self._layers[id(p)]
        if self._strategies[id(p)] == "sfb":
            u, v = self._factors(p)
            self._handles[id(p)] = self._comm.submit(layer, grad, u=u, v=v)
        else:
            self._round(grad)
            if self._op == Average and self._predivide != 1.0:
                grad.mul_(1.0 / self._predivide)
            self._handles[id(p)] = self._comm.submit(layer, grad)
        self._counts[id(p)] = 0

    # -- Horovod's optimizer API -----------------------------------------------------------
    def set_backward_passes_per_step(self, passes):
        if passes < 1:
            raise ValueError("DistributedOptimizer: backward_passes_per_step must be >= 1")
        self._passes = int(passes)
        self._counts.clear()

    @property
    def backward_passes_per_step(self):
        return self._passes

    def synchronize(self):
        """Waits for every parameter's exchange, submitting those not submitted yet (fewer
        backward passes than backward_passes_per_step, or no gradient on this rank: zeros)."""
        if self._synchronized:
            return
        for _, p in self._named:
            if id(p) not in self._handles:
                self._submit(p)
        if not self._planned:
            self._plan()
        # This rank has not joined: no flag set.
        joined = self._comm.submit(self._joined_layer, _torch.zeros(self._comm.size))
        scale = self._predivide if self._op == Average else float(self._comm.size)
        for _, p in self._named:
            h = self._handles.pop(id(p))
            h.wait()
            if scale != 1.0:
                p.grad.mul_(scale)
            if self._strategies[id(p)] != "sfb":
                self._round(p.grad)
        joined.wait()
        self._counts.clear()
        for records in self._records.values():
            del records[:]  # never last step's factors
        self._synchronized = True

    def _join_round(self):
        """One exchange on a rank that has joined: zeros for every layer (what this rank
        submitted already still completes), its flag in psd.joined. Returns how many ranks
        have joined."""
        if not self._planned:
            self._plan()
        pending = dict(self._handles)
        self._handles.clear()
        handles = list(pending.values())
        scratch = []  # the zeros stay referenced until their exchange is done
        for _, p in self._named:
            if id(p) in pending:
                continue
            zero = _torch.zeros(p.shape)
            scratch.append(zero)
            layer = self._layers[id(p)]
            if self._strategies[id(p)] == "sfb":
                handles.append(self._comm.submit(layer, zero, u=_torch.zeros(1, p.shape[0]),
                                                 v=_torch.zeros(1, p.shape[1])))
            else:
                handles.append(self._comm.submit(layer, zero))
        flags = _torch.zeros(self._comm.size)
        flags[self._comm.rank] = 1.0
        joined = self._comm.submit(self._joined_layer, flags)
        for h in handles:
            h.wait()
        joined.wait()
        self._counts.clear()
        for records in self._records.values():
            del records[:]
        self._synchronized = False
        self._join_rounds += 1
        return int(round(float(flags.sum()) * self._comm.size))

    @_contextlib.contextmanager
    def skip_synchronize(self):
        """step() inside this context does not synchronize (call synchronize() before)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                _warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                               "after optimizer.synchronize(); the gradients are already "
                               "synchronized and are not exchanged again")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._handles or any(self._counts.values()):
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(); this is "
                                 "prohibited (it would lose the gradients being accumulated "
                                 "or exchanged)")
        return super(self.__class__, self).zero_grad(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        for h in self._handles.values():
            h.wait()  # every rank submitted them: let them finish, then drop them
        self._handles.clear()
        self._counts.clear()
        self._synchronized = False
        self._should_synchronize = True
        return super(self.__class__, self).load_state_dict(*args, **kwargs)

    def plan(self):
        """The planner's table (after the first backward pass)."""
        return self._comm.plan() if self._planned else ""

    def strategies(self):
        """{parameter name: strategy} once planned."""
        return {self._names[pid]: s for pid, s in self._strategies.items()}


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False, process_set=None,
                         model=None, strategy="auto", sparse=None, density=0.0,
                         batch_size=None):
    """Wraps a torch optimizer for data-parallel training over Poseidon (Horovod's signature,
    plus Poseidon's options):
      model      a module whose nn.Linear weights may travel as sufficient factors (sfb);
      strategy   "auto" (the planner chooses), or "allreduce" / "sfb" / "topk" for every
                 parameter, or {name: strategy};
      sparse     True, or a list of parameter names, that may use topk compression;
      density    topk density in (0, 1] (0: POSEIDON_TOPK_DENSITY);
      batch_size samples per rank for the planner (default: rows seen by the Linear hooks in
                 the first step; sfb's K is that times backward_passes_per_step).
    Horovod's keywords: op Average or Sum (Adasum is refused); gradient_predivide_factor
    (Average only); num_groups / groups are checked and accepted (the engine fuses on its
    own); sparse_as_dense turns sparse gradients dense; process_set only the global one.
    """
    if op == Adasum:
        raise _psd.UnimplementedError("DistributedOptimizer: op=Adasum is not supported by "
                                      "Poseidon; expected Average or Sum")
    if op not in (Average, Sum):
        raise ValueError("DistributedOptimizer: op %r is not supported; expected Average "
                         "or Sum" % (op,))
    if gradient_predivide_factor != 1.0:
        if op != Average:
            raise ValueError("DistributedOptimizer: gradient_predivide_factor is supported "
                             "only with op=Average")
        if not gradient_predivide_factor > 0:
            raise ValueError("DistributedOptimizer: gradient_predivide_factor must be > 0")
    if backward_passes_per_step < 1:
        raise ValueError("DistributedOptimizer: backward_passes_per_step must be >= 1")
    if num_groups != 0:
        _warnings.warn("DistributedOptimizer: num_groups is deprecated; use groups")
        if groups is None:
            groups = num_groups
    if groups is not None and not (isinstance(groups, list) or
                                   (isinstance(groups, int) and groups >= 0)):
        raise ValueError("DistributedOptimizer: groups must be a non-negative integer or a "
                         "list of lists of parameters")
    _check_compression(compression)
    _comm()
    process_set = _check_process_set(process_set)
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, model, compression,
               backward_passes_per_step, op, gradient_predivide_factor, groups,
               sparse_as_dense, strategy, sparse, density, batch_size, process_set)


def _alive(opt):
    return any(c is opt._comm for c in _state["optimizer_comms"])


def _join_optimizers():
    """Horovod's join for DistributedOptimizer: this rank has run out of data. Until every rank
    has joined, it keeps taking part in every live optimizer's exchanges with zero gradients
    (so the ranks still training average with zeros from here, divided by the full size, as
    in Horovod); its own parameters are left alone. Every rank calls it once per epoch.
    Returns the rank that joined last (the highest such rank when several joined at once),
    or None when there is no optimizer (the caller then only needs a barrier)."""
    _optimizers[:] = [o for o in _optimizers if _alive(o)]
    # Over every rank only: an optimizer of a process set is stepped by its members alone.
    opts = [o for o in _optimizers if o._process_set is None]
    if not opts:
        return None
    errors = []

    def rounds(opt):
        try:
            while opt._join_round() < opt._comm.size:
                pass
        except BaseException as e:  # noqa: BLE001 (raised again below)
            errors.append(e)

    # Optimizers are independent engines that the training ranks step in their own order and
    # number: one thread each, so no order between them is assumed.
    threads = [_threading.Thread(target=rounds, args=(o,), name="psd-join") for o in opts[1:]]
    for t in threads:
        t.start()
    rounds(opts[0])
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    # A rank that joined earlier took part in at least as many rounds of every optimizer:
    # the last to join ran the fewest.
    mine = _torch.tensor([sum(o._join_rounds for o in opts)], dtype=_torch.int64)
    for o in opts:
        o._join_rounds = 0
    world = _comm()
    every = _torch.zeros(world.size, dtype=_torch.int64)
    world.allgather(mine, every)
    fewest = int(every.min())
    return max(r for r in range(world.size) if int(every[r]) == fewest)
