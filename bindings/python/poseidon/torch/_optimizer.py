"""DistributedOptimizer: wait-free backprop through Poseidon's engine, one layer per
parameter, the hybrid planner choosing allreduce / sfb / topk per parameter."""
import torch as _torch

import poseidon as _psd
from poseidon.torch._compression import Compression
from poseidon.torch._core import Average, Sum, _comm, _state


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
