"""Process sets (Horovod's sub-groups of ranks): each added set is a Poseidon communicator over
an MPI sub-communicator of the package's communicator, made collectively by MPI_Comm_split.
The collectives take ``process_set=``; a rank outside the set that calls one gets ValueError."""
import zlib as _zlib

import numpy as _np

import poseidon as _psd
from poseidon.torch._core import _comm, _run, _state


class ProcessSet:
    """A set of ranks (of the package's communicator). Build it from a list of ranks and pass
    it to add_process_set (on every rank, in the same order) before using it."""

    def __init__(self, ranks):
        if hasattr(ranks, "Get_group"):  # an mpi4py communicator
            ranks = _ranks_of_mpi_comm(ranks)
        ranks = list(ranks)
        self.ranks = sorted(set(int(r) for r in ranks))
        if len(self.ranks) != len(ranks):
            raise ValueError("ProcessSet: ranks %r repeat a rank" % (list(ranks),))
        self.process_set_id = None
        self._comm = None
        self._mpi_comm = None

    def _require_added(self):
        if self.process_set_id is None:
            raise ValueError("process set %r was not added; call add_process_set on every "
                             "rank first" % (self.ranks,))

    def size(self):
        self._require_added()
        return len(self.ranks)

    def rank(self):
        """This rank's rank within the set; -1 when it is not in the set."""
        self._require_added()
        me = _comm().rank
        return self.ranks.index(me) if me in self.ranks else -1

    def included(self):
        self._require_added()
        return _comm().rank in self.ranks

    def __eq__(self, other):
        return isinstance(other, ProcessSet) and self.process_set_id == other.process_set_id \
            and self.ranks == other.ranks

    def __hash__(self):
        return hash((self.process_set_id, tuple(self.ranks)))

    def __repr__(self):
        return "ProcessSet(process_set_id=%r, ranks=%r)" % (self.process_set_id, self.ranks)


def _ranks_of_mpi_comm(mpi_comm):
    """The ranks (of the package's communicator) of an mpi4py communicator's members, known to
    its members only."""
    from mpi4py import MPI
    base = _state["mpi_comm"] if _state["mpi_comm"] is not None else MPI.COMM_WORLD
    return list(MPI.Group.Translate_ranks(mpi_comm.Get_group(),
                                          list(range(mpi_comm.Get_size())), base.Get_group()))


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def _on_init():
    global_process_set.ranks = list(range(_comm().size))
    global_process_set._comm = _comm()


def _on_shutdown():
    # Collective on the members, in the order the sets were added (the same on every rank).
    for ps in sorted(_state["process_sets"].values(), key=lambda p: p.process_set_id):
        _release(ps)
    _state["process_sets"].clear()
    global_process_set._comm = None


def _release(ps):
    if ps._comm is not None:
        ps._comm.destroy()
    if ps._mpi_comm is not None:
        ps._mpi_comm.Free()
    ps._comm = None
    ps._mpi_comm = None
    ps.process_set_id = None


def comm_of(process_set, what):
    """The Poseidon communicator of ``process_set`` (None or the global set: the package's);
    ValueError when this rank is not in it or it was not added."""
    if process_set is None or process_set is global_process_set:
        return _comm()
    if not isinstance(process_set, ProcessSet):
        raise TypeError("%s: process_set must be a ProcessSet, got %s"
                        % (what, type(process_set).__name__))
    if process_set.process_set_id == 0:
        return _comm()
    if process_set.process_set_id is None:
        raise ValueError("%s: process set %r was not added (or was removed); call "
                         "add_process_set on every rank first" % (what, process_set.ranks))
    if process_set._comm is None:
        raise ValueError("%s: rank %d is not in process set %d (ranks %r); only its members "
                         "may call collectives on it"
                         % (what, _comm().rank, process_set.process_set_id, process_set.ranks))
    return process_set._comm


def _agree(text, what):
    """Raises ValueError on every rank unless every rank passed the same ``text``."""
    c = _comm()
    mine = _np.array([_zlib.crc32(text.encode())], dtype=_np.int64)
    every = _np.zeros(c.size, dtype=_np.int64)
    c.allgather(mine, every)
    if (every != every[0]).any():
        raise ValueError("%s: ranks passed different process sets (every rank must add the "
                         "same sets in the same order)" % what)


def add_process_set(process_set):
    """Adds a process set (a ProcessSet or a list of ranks) and returns it. Collective: every
    rank of the package's communicator calls it with the same ranks, in the same order."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise ValueError("add_process_set: %r was already added" % (process_set,))
    return _run(_add, process_set)


def _add(ps):
    c = _comm()
    bad = [r for r in ps.ranks if r < 0 or r >= c.size]
    if bad or not ps.ranks:
        raise ValueError("add_process_set: ranks %r are not in 0..%d" % (ps.ranks, c.size - 1))
    _agree(repr(ps.ranks), "add_process_set")
    for other in _state["process_sets"].values():
        if other.ranks == ps.ranks:
            raise ValueError("add_process_set: a process set with ranks %r exists already "
                             "(id %d)" % (ps.ranks, other.process_set_id))
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise _psd.UnimplementedError("add_process_set: process sets need mpi4py (the "
                                      "sub-communicator is made with MPI_Comm_split)") from e
    base = _state["mpi_comm"] if _state["mpi_comm"] is not None else MPI.COMM_WORLD
    member = c.rank in ps.ranks
    sub = base.Split(0 if member else MPI.UNDEFINED, c.rank)
    if member:
        ps._mpi_comm = sub
        ps._comm = _psd.init(sub)  # collective on the members
    ps.process_set_id = _state["next_set_id"]
    _state["next_set_id"] += 1
    _state["process_sets"][ps.process_set_id] = ps
    return ps


def remove_process_set(process_set):
    """Removes an added process set (collective on every rank); False for the global set or
    one that is not added."""
    if process_set is global_process_set or not isinstance(process_set, ProcessSet) or \
            process_set.process_set_id in (None, 0):
        return False
    if process_set.process_set_id not in _state["process_sets"]:
        return False
    return _run(_remove, process_set)


def _remove(ps):
    _agree(repr(ps.ranks), "remove_process_set")
    del _state["process_sets"][ps.process_set_id]
    _release(ps)
    return True


def new_comm(process_set, what):
    """A new Poseidon communicator over ``process_set``'s ranks (collective on its members;
    None or the global set: over the package's communicator), e.g. for an optimizer's own
    engine. ValueError on a rank outside the set. The caller destroys it (before shutdown)."""
    comm_of(process_set, what)  # membership and registration checks
    if process_set is None or process_set.process_set_id == 0:
        return _psd.init(_state["mpi_comm"]) if _state["mpi_comm"] is not None \
            else _psd.Comm(0)
    return _psd.init(process_set._mpi_comm)
