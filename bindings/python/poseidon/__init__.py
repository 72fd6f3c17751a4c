"""Poseidon from Python: communicators, blocking collectives, layers, the per-layer plan and
asynchronous exchange through the background engine, on numpy arrays and PyTorch tensors
without copies.

    import numpy as np, poseidon
    comm = poseidon.init()                    # MPI (unless mpi4py did it) + world communicator
    x = np.arange(4, dtype=np.float32)
    comm.allreduce(x, x)                      # in place: sum over ranks
    fc = comm.register_layer("fc", (64, 32), kind="fc")
    comm.build_plan(batch=16); print(comm.plan())
    h = comm.submit(fc, grad); h.wait()       # grad now holds the average over ranks

Node-shared memory: ``buf = comm.alloc_shared(nbytes)`` (collective) and ``a = buf.array(np.float32)``
give arrays that every rank of the node maps; collectives whose arrays all lie in such memory
read their peers' inputs straight (no copy through the shared-memory window). ``buf.free()`` is
collective and refused on every rank while any rank still holds an array over it.

A handle may be dropped before its exchange completes: the arrays it was given stay alive (held
by its Comm) until then. Launch jobs with ``poseidonrun -np 4 python3 train.py``
(``python -m poseidon.run``; see poseidon/run.py).
PyTorch (Horovod's API): ``import poseidon.torch as hvd``.
Errors raise poseidon.Error subclasses (InvalidArgumentError is also a ValueError,
TimeoutError also the built-in TimeoutError) carrying the library's message; each class's
``code`` is its psdResult_t. PeerLostError: a peer stopped answering for
POSEIDON_PEER_TIMEOUT_S (frozen, dead or cut off; the message names its rank and host) and the
job is ending.
"""
import atexit as _atexit
import sys as _sys

try:  # installed with pip: the extension lives inside the package
    from . import _poseidon as _ext
except ImportError:  # build tree: <build>/bindings/python on sys.path
    import _poseidon as _ext

Comm = _ext.Comm
Handle = _ext.Handle
SharedBuffer = _ext.SharedBuffer
Error = _ext.Error
InvalidArgumentError = _ext.InvalidArgumentError
MismatchError = _ext.MismatchError
BackendError = _ext.BackendError
TimeoutError = _ext.TimeoutError  # noqa: A001 (also a subclass of the built-in)
AbortedError = _ext.AbortedError
UnavailableError = _ext.UnavailableError
InternalError = _ext.InternalError
UnimplementedError = _ext.UnimplementedError
PeerLostError = _ext.PeerLostError
set_setting = _ext.set_setting
get_setting = _ext.get_setting

VERSION_CODE = _ext.VERSION_CODE
__version__ = "%d.%d.%d" % (VERSION_CODE // 10000, VERSION_CODE // 100 % 100, VERSION_CODE % 100)

_world = None
_finalize_registered = False
# The exception that is ending this interpreter, if one is (see _finalize_at_exit).
_uncaught = None
_previous_excepthook = None


def _excepthook(kind, value, traceback):
    global _uncaught
    _uncaught = (kind, value)
    (_previous_excepthook or _sys.__excepthook__)(kind, value, traceback)


def _finalize_at_exit():
    """At interpreter exit: finalize(), unless an uncaught exception is ending this rank. Then
    its peers may be inside a collective that this rank will never join, and tearing the
    communicators down (collective: the shared-memory window's free, MPI_Finalize) would wait
    for them while they wait for it. So the job is ended instead, as mpirun ends it when a rank
    exits with an error: MPI_Abort, after a line naming this rank and the exception."""
    if _uncaught is not None and _ext._world_size() > 1:
        kind, value = _uncaught
        print("poseidon: rank %d is exiting on an uncaught %s (%s); aborting the job (MPI_Abort) "
              "so that no other rank waits for it in a collective"
              % (_ext._world_rank(), kind.__name__, value), file=_sys.stderr, flush=True)
        _ext._abort(1)
    finalize()


def _mpi_handle(comm):
    """The integer MPI_Comm of an mpi4py communicator (or an int passed through)."""
    if comm is None:
        return 0
    if isinstance(comm, int):
        return comm
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise InvalidArgumentError(
            "poseidon: comm must be an mpi4py communicator or an MPI_Comm integer; "
            "mpi4py is not importable") from e
    if not isinstance(comm, MPI.Comm):
        raise InvalidArgumentError("poseidon: comm is a %s; expected an mpi4py communicator"
                                   % type(comm).__name__)
    return MPI._handleof(comm)


def init(comm=None):
    """Initializes MPI (MPI_THREAD_MULTIPLE) unless it already is (e.g. by mpi4py), and returns
    the world communicator, or one over ``comm`` (an mpi4py communicator). Safe to call again:
    the world communicator is made once."""
    global _world, _finalize_registered, _previous_excepthook
    _ext.init()
    if not _finalize_registered:
        # Communicators must go before MPI_Finalize; finalize() also ends MPI if we started it.
        _atexit.register(_finalize_at_exit)
        _previous_excepthook = _sys.excepthook
        _sys.excepthook = _excepthook
        _finalize_registered = True
    if comm is not None:
        return Comm(_mpi_handle(comm))
    if _world is None:
        _world = Comm(0)
    return _world


def world():
    """The communicator init() made (None before)."""
    return _world


def finalize():
    """Destroys every communicator and finalizes MPI if init() started it."""
    global _world
    _world = None
    _ext.finalize()


def version():
    return _ext.version()
