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
from poseidon.torch._core import (  # noqa: F401
    Average, Sum, Adasum, init, shutdown, is_initialized, rank, size, local_rank, local_size,
    mpi_threads_supported)
from poseidon.torch._compression import Compression  # noqa: F401
from poseidon.torch._collectives import (  # noqa: F401
    allreduce, allreduce_, allreduce_async, allreduce_async_, synchronize, poll, broadcast,
    broadcast_, broadcast_async, broadcast_async_, allgather, allgather_async,
    broadcast_parameters, broadcast_optimizer_state, broadcast_object, join)
from poseidon.torch._optimizer import DistributedOptimizer  # noqa: F401

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "Average", "Sum", "Adasum", "Compression",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "synchronize", "poll",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "allgather",
    "allgather_async", "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
    "DistributedOptimizer", "join", "mpi_threads_supported",
]
