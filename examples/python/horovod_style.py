"""A training script written in Horovod's style that runs on Poseidon: every public name of
poseidon.torch is used once at least. Swap the import for ``import horovod.torch as hvd`` and
the script is a Horovod script.

    scripts/mpirun.sh -np 2 python3 examples/python/horovod_style.py
Prints OK on rank 0 when every check passed.
"""
import os
import tempfile
import warnings

import torch

import poseidon.torch as hvd


def check(cond, what):
    if not cond:
        raise RuntimeError("horovod_style: " + what)


def main():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    check(hvd.is_initialized() and size >= 2, "needs 2 ranks or more")
    check(0 <= hvd.local_rank() < hvd.local_size(), "local rank")
    check(0 <= hvd.cross_rank() < hvd.cross_size(), "cross rank")
    check(isinstance(hvd.is_homogeneous(), bool), "is_homogeneous")
    built = [hvd.mpi_built(), hvd.mpi_enabled(), hvd.gloo_built(), hvd.gloo_enabled(),
             hvd.nccl_built(), hvd.ddl_built(), hvd.ccl_built(), hvd.cuda_built(),
             hvd.rocm_built(), hvd.mpi_threads_supported()]
    check(all(isinstance(b, (bool, int)) for b in built), "built flags")
    check(issubclass(hvd.HorovodInternalError, Exception), "HorovodInternalError")
    check(hvd.global_process_set.size() == size, "global process set")

    # A model with synchronized batch norm, the same initial state on every rank.
    torch.manual_seed(1234 + rank)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), hvd.SyncBatchNorm(16),
                                torch.nn.ReLU(), torch.nn.Linear(16, 1))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * size, momentum=0.9)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=hvd.Compression.none, op=hvd.Average)
    timeline = os.path.join(tempfile.gettempdir(), "psd_horovod_style_timeline.json")
    hvd.start_timeline(timeline)

    # Each rank trains on its own shard of y = sum(x).
    gen = torch.Generator().manual_seed(rank)
    first = last = None
    for step in range(30):
        x = torch.randn(16, 8, generator=gen)
        y = x.sum(dim=1, keepdim=True)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        avg = hvd.allreduce(loss.detach(), op=hvd.Average, name="loss")
        first = float(avg) if first is None else first
        last = float(avg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the running engine's trace closes at shutdown
        hvd.stop_timeline()
    check(last < first, "the loss went down (%.4f -> %.4f)" % (first, last))
    w = model[0].weight.detach().reshape(1, -1)
    every = hvd.allgather(w)
    check(all(torch.equal(every[k], every[0]) for k in range(size)), "replicas agree")

    # The collectives, blocking and asynchronous.
    t = torch.full((4,), float(rank + 1))
    check(float(hvd.allreduce(t, op=hvd.Sum)[0]) == size * (size + 1) / 2, "allreduce")
    check(float(hvd.allreduce(t, op=hvd.Min)[0]) == 1.0, "Min")
    check(float(hvd.allreduce(t, op=hvd.Max)[0]) == size, "Max")
    check(float(hvd.allreduce(t, op=hvd.Product)[0]) == float(torch.arange(1, size + 1)
                                                                .prod()), "Product")
    try:
        hvd.allreduce(t, op=hvd.Adasum)
        check(False, "Adasum is refused")
    except NotImplementedError:
        pass
    u = t.clone()
    hvd.allreduce_(u, op=hvd.Average)
    h = hvd.allreduce_async(t, op=hvd.Sum)
    v = t.clone()
    h2 = hvd.allreduce_async_(v)
    hvd.synchronize(h)
    while not hvd.poll(h2):
        pass
    hvd.synchronize(h2)
    check(torch.equal(u, v), "allreduce_ and allreduce_async_")
    outs = hvd.grouped_allreduce([t, t * 2], op=hvd.Sum)
    check(float(outs[1][0]) == 2 * float(outs[0][0]), "grouped_allreduce")
    pair = [t.clone(), t.clone()]
    hvd.grouped_allreduce_(pair)
    hvd.synchronize(hvd.grouped_allreduce_async([t]))
    hvd.synchronize(hvd.grouped_allreduce_async_(pair))
    sparse = torch.sparse_coo_tensor(torch.tensor([[rank]]), torch.tensor([1.0]), (size,))
    dense = hvd.synchronize(hvd.sparse_allreduce_async(sparse, name="s", op=hvd.Sum))
    check(torch.equal(dense.to_dense(), torch.ones(size)), "sparse_allreduce_async")
    rows = torch.full((rank + 1, 2), float(rank))
    check(hvd.allgather(rows).shape[0] == size * (size + 1) // 2, "allgather")
    hvd.synchronize(hvd.allgather_async(rows))
    hvd.grouped_allgather([rows, rows])
    hvd.synchronize(hvd.grouped_allgather_async([rows]))
    b = hvd.broadcast(t, root_rank=size - 1)
    check(float(b[0]) == size, "broadcast")
    c = t.clone()
    hvd.broadcast_(c, root_rank=0)
    hvd.synchronize(hvd.broadcast_async(t, root_rank=0))
    hvd.synchronize(hvd.broadcast_async_(c, root_rank=0))
    splits = [1] * size
    received, recv_splits = hvd.alltoall(torch.arange(size, dtype=torch.float32) + 10 * rank,
                                         splits=splits)
    check(received.tolist() == [10.0 * k + rank for k in range(size)], "alltoall")
    hvd.synchronize(hvd.alltoall_async(torch.zeros(size), splits=splits))
    part = hvd.reducescatter(torch.ones(2 * size + 1, 3), op=hvd.Sum)
    check(part.shape[0] == (3 if rank == 0 else 2) and float(part[0, 0]) == size,
          "reducescatter")
    hvd.synchronize(hvd.reducescatter_async(torch.ones(size, 1)))
    hvd.grouped_reducescatter([torch.ones(size, 1), torch.ones(size, 2)])
    hvd.synchronize(hvd.grouped_reducescatter_async([torch.ones(size, 1)]))

    # Objects and process sets.
    config = hvd.broadcast_object({"lr": 0.1, "seed": rank}, root_rank=0)
    check(config["seed"] == 0, "broadcast_object")
    check(hvd.allgather_object(rank) == list(range(size)), "allgather_object")
    evens = hvd.add_process_set(hvd.ProcessSet(list(range(0, size, 2))))
    if evens.included():
        s = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=evens)
        check(float(s) == evens.size(), "allreduce on a process set")
    hvd.remove_process_set(evens)
    hvd.barrier()
    hvd.join()
    hvd.shutdown()
    if rank == 0:
        print("final loss %.4f (from %.4f)" % (last, first))
        print("OK")


if __name__ == "__main__":
    main()
