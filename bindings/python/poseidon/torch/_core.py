"""poseidon.torch's shared state: initialization, the world's ranks, the reduction ops, what
the library was built with, the engine's timeline."""
import concurrent.futures as _futures
import os as _os
import threading as _threading
import warnings as _warnings

import poseidon as _psd

Average = "average"
Sum = "sum"
Adasum = "adasum"
# Poseidon's allreduce sums; Min, Max and Product are computed from an allgather (every rank's
# tensor) reduced locally with torch, so they move size() times the bytes of a sum.
Min = "min"
Max = "max"
Product = "product"

# A peer failed (stopped answering, died, was cut off): the collective cannot finish and the
# job is ending. Horovod's elastic code catches this name.
HorovodInternalError = _psd.PeerLostError

_state = {"comm": None, "mpi_comm": None, "executor": None, "handles": {}, "next": 0,
          "optimizer_comms": [], "cross": (0, 1), "homogeneous": True,
          "process_sets": {}, "next_set_id": 1, "timeline": None}
_lock = _threading.Lock()
_executor_thread = _threading.local()


def _mark_worker():
    _executor_thread.inside = True


def init(comm=None, process_sets=None):
    """Initializes Poseidon (and MPI unless mpi4py already did). ``comm``: an optional mpi4py
    communicator to work on instead of the world (its ranks become this package's ranks).
    ``process_sets``: ProcessSet objects (or rank lists) to add right away, as in Horovod."""
    if _state["comm"] is None:
        c = _psd.init(comm)
        _state["comm"] = c
        _state["mpi_comm"] = comm
        # One worker runs every collective of this package, blocking ones included, in the
        # order this rank issued them: the same order on every rank, whatever the threads.
        _state["executor"] = _futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="poseidon-async", initializer=_mark_worker)
        _learn_topology(c)
        from poseidon.torch import _process_sets
        _process_sets._on_init()
    if process_sets:
        from poseidon.torch import _process_sets
        for ps in process_sets:
            _process_sets.add_process_set(ps)


def _learn_topology(c):
    """cross_rank / cross_size / is_homogeneous from every rank's local_rank and local_size
    (collective, once, at init)."""
    import numpy as np
    mine = np.array([c.local_rank, c.local_size], dtype=np.int64)
    every = np.zeros(2 * c.size, dtype=np.int64)
    c.allgather(mine, every)
    local_ranks = every[0::2]
    local_sizes = every[1::2]
    me = c.rank
    # As in Horovod: the ranks sharing this rank's local_rank form its cross communicator (one
    # rank per node), ordered by rank: the node's index and the number of nodes.
    same = [r for r in range(c.size) if local_ranks[r] == local_ranks[me]]
    _state["cross"] = (same.index(me), len(same))
    _state["homogeneous"] = bool((local_sizes == local_sizes[0]).all())


def shutdown():
    if _state["comm"] is None:
        return
    _state["executor"].shutdown(wait=True)
    _state["handles"].clear()
    from poseidon.torch import _process_sets
    _process_sets._on_shutdown()
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


def _run(fn, *args):
    """Runs a collective on the package's worker (directly when already there) and returns
    its result, so blocking and asynchronous calls keep this rank's order."""
    _executor_thread.started = True  # see _collectives._refusals
    if getattr(_executor_thread, "inside", False):
        return fn(*args)
    _comm()
    return _state["executor"].submit(fn, *args).result()


def rank():
    return _comm().rank


def size():
    return _comm().size


def local_rank():
    return _comm().local_rank


def local_size():
    return _comm().local_size


def cross_rank():
    """This rank's node index: its place among the ranks with its local_rank."""
    _comm()
    return _state["cross"][0]


def cross_size():
    """The number of nodes: how many ranks share this rank's local_rank."""
    _comm()
    return _state["cross"][1]


def is_homogeneous():
    """True when every node runs the same number of ranks."""
    _comm()
    return _state["homogeneous"]


def mpi_threads_supported():
    return True


def mpi_built():
    return True


def mpi_enabled():
    return True


def gloo_built():
    return False


def gloo_enabled():
    return False


def ddl_built():
    return False


def ccl_built():
    return False


def rocm_built():
    return False


_symbols = {}


def _extension_has(symbol):
    """Whether the extension binary names ``symbol`` (a CUDA or NCCL entry point is there only
    when Poseidon was built with them)."""
    if symbol not in _symbols:
        ext = getattr(_psd, "_ext", None)
        path = getattr(ext, "__file__", None)
        found = False
        if path and _os.path.exists(path):
            with open(path, "rb") as f:
                found = symbol.encode() in f.read()
        _symbols[symbol] = found
    return _symbols[symbol]


def cuda_built():
    return _extension_has("cudaStreamCreate")


def nccl_built():
    return _extension_has("ncclCommInitRank")


def _engines_running():
    running = []
    for c in _state["optimizer_comms"]:
        try:
            c.plan()
            running.append(c)
        except _psd.Error:
            pass
    return running


def start_timeline(file_path, mark_cycles=False):
    """Records the engine's Chrome trace (POSEIDON_TIMELINE) to ``file_path`` (one file per
    rank: path.rank<N>.json). The trace opens when an engine starts, i.e. at a
    DistributedOptimizer's first step: call this before it. ``mark_cycles`` is accepted for
    Horovod's signature; the trace always has a negotiation track."""
    _comm()
    if not file_path:
        raise ValueError("start_timeline: file_path is empty; expected a path")
    if _engines_running():
        raise _psd.UnimplementedError(
            "start_timeline: an engine is already running and its timeline can only open when "
            "it starts; set POSEIDON_TIMELINE=%s in the environment (or call start_timeline "
            "before the DistributedOptimizer's first step)" % file_path)
    _psd.set_setting("POSEIDON_TIMELINE", str(file_path))
    _state["timeline"] = str(file_path)


def stop_timeline():
    """Engines started from now on record no timeline; one already recording keeps its file
    open until shutdown() (an engine's trace closes when the engine stops)."""
    _comm()
    _psd.set_setting("POSEIDON_TIMELINE", "")
    if _state["timeline"] is not None and _engines_running():
        _warnings.warn("stop_timeline: the running engine's timeline (POSEIDON_TIMELINE=%s) "
                       "is closed at shutdown()" % _state["timeline"])
    _state["timeline"] = None
