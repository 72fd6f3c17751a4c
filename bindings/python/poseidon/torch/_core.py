"""poseidon.torch's shared state: initialization, the world's ranks, the reduction ops."""
import concurrent.futures as _futures
import threading as _threading

import poseidon as _psd

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


