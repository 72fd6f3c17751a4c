"""Horovod's PyTorch API over Poseidon: change ``import horovod.torch as hvd`` to
``import poseidon.torch as hvd``.

How it maps:
  * init / rank / size / local_rank / local_size: the Poseidon world communicator.
  * cross_rank / cross_size / is_homogeneous: from every rank's local_rank and local_size,
    learned at init().
  * The collectives (allreduce, grouped_allreduce, allgather, broadcast, alltoall,
    reducescatter, their in-place ``_`` and ``_async`` forms, barrier, join): Poseidon's
    blocking collectives, run in the order this rank issued them on one worker thread (so every
    rank issues them in the same order); ``_async`` forms return a handle for ``synchronize``
    / ``poll``. Every Horovod dtype (uint8, int8, int16 and bool travel widened to int32).
    Min / Max / Product are an allgather reduced with torch; Adasum raises. See _collectives.
  * process_set=: a ProcessSet added with add_process_set is a Poseidon communicator over an
    MPI sub-communicator (mpi4py's Split); see _process_sets.
  * broadcast_object / allgather_object: cloudpickle when installed, pickle otherwise; a rank
    that cannot serialize makes every rank raise (see _functions).
  * SyncBatchNorm: Horovod's algorithm in torch arithmetic (CPU and CUDA).
  * start_timeline / stop_timeline: POSEIDON_TIMELINE for the engines started afterwards.
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
    Average, Sum, Adasum, Min, Max, Product, HorovodInternalError, init, shutdown,
    is_initialized, rank, size, local_rank, local_size, cross_rank, cross_size, is_homogeneous,
    mpi_threads_supported, mpi_built, mpi_enabled, gloo_built, gloo_enabled, nccl_built,
    ddl_built, ccl_built, cuda_built, rocm_built, start_timeline, stop_timeline)
from poseidon.torch._compression import Compression  # noqa: F401
from poseidon.torch._process_sets import (  # noqa: F401
    ProcessSet, global_process_set, add_process_set, remove_process_set)
from poseidon.torch._collectives import (  # noqa: F401
    allreduce, allreduce_, allreduce_async, allreduce_async_, grouped_allreduce,
    grouped_allreduce_, grouped_allreduce_async, grouped_allreduce_async_,
    sparse_allreduce_async, allgather, allgather_async, grouped_allgather,
    grouped_allgather_async, broadcast, broadcast_, broadcast_async, broadcast_async_,
    alltoall, alltoall_async, reducescatter, reducescatter_async, grouped_reducescatter,
    grouped_reducescatter_async, synchronize, poll, barrier, join)
from poseidon.torch._functions import (  # noqa: F401
    broadcast_object, allgather_object, broadcast_parameters, broadcast_optimizer_state)
from poseidon.torch._optimizer import DistributedOptimizer  # noqa: F401
from poseidon.torch._sync_batch_norm import SyncBatchNorm  # noqa: F401

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "is_homogeneous", "mpi_threads_supported", "mpi_built",
    "mpi_enabled", "gloo_built", "gloo_enabled", "nccl_built", "ddl_built", "ccl_built",
    "cuda_built", "rocm_built", "start_timeline", "stop_timeline",
    "Average", "Sum", "Adasum", "Min", "Max", "Product", "HorovodInternalError", "Compression",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "sparse_allreduce_async", "allgather", "allgather_async", "grouped_allgather",
    "grouped_allgather_async", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
    "grouped_reducescatter", "grouped_reducescatter_async", "synchronize", "poll", "barrier",
    "join", "broadcast_object", "allgather_object", "broadcast_parameters",
    "broadcast_optimizer_state", "DistributedOptimizer", "SyncBatchNorm",
]
