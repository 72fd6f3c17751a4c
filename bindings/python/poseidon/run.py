"""poseidonrun: starts a Poseidon job under mpirun.

    poseidonrun -np 4 python3 train.py                  # console script (pip install)
    python -m poseidon.run -np 4 python3 train.py       # the same from a source tree
    poseidonrun -np 8 -H node1:4,node2:4 python3 train.py

It finds mpirun (Open MPI, or MPICH's Hydra), adds what the machine needs (--allow-run-as-root
when run as root, --oversubscribe when there are more ranks than slots, no core binding so that
the engine's thread is not pinned to its rank's core), passes every POSEIDON_* variable,
PYTHONPATH, PATH and LD_LIBRARY_PATH to every rank, and exits with the job's exit code (124 when
--timeout stopped it, as timeout(1) does).
"""
import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

# Variables every rank gets from the launching shell (besides POSEIDON_*): on other hosts
# mpirun would not pass them, and the ranks must find the same Python and package.
FORWARDED = ("PYTHONPATH", "PATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV")
TIMEOUT_EXIT = 124  # as timeout(1)
KILL_GRACE_S = 10.0  # after --timeout: SIGTERM, then SIGKILL this much later


def _parser():
    p = argparse.ArgumentParser(
        prog="poseidonrun",
        description="Runs COMMAND on NP ranks under mpirun with what Poseidon needs.",
        epilog="Example: poseidonrun -np 4 python3 examples/python/train_torch.py")
    p.add_argument("-np", "-n", "--num-proc", dest="np", type=int, required=True,
                   help="number of ranks")
    p.add_argument("-H", "--hosts", default=None,
                   help="hosts and their slots, e.g. node1:4,node2:4 (default: this machine)")
    p.add_argument("--hostfile", default=None, help="an mpirun host file instead of --hosts")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="stop the whole job after this many seconds and exit with 124")
    p.add_argument("-x", "--env", action="append", default=[], metavar="NAME[=VALUE]",
                   help="also pass this environment variable to every rank (repeatable)")
    p.add_argument("--mpirun", default=None,
                   help="the mpirun to use (default: mpirun, then mpiexec, on PATH)")
    p.add_argument("--mpi-args", default="", metavar="ARGS",
                   help="extra mpirun arguments, one shell-quoted string")
    p.add_argument("--verbose", action="store_true",
                   help="print the mpirun command before running it")
    p.add_argument("--dry-run", action="store_true",
                   help="print the mpirun command and exit without running it")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="the program each rank runs, with its arguments")
    return p


def find_mpirun(explicit=None):
    """The mpirun executable: `explicit`, else mpirun or mpiexec on PATH; None if none."""
    if explicit:
        return shutil.which(explicit) or (explicit if os.access(explicit, os.X_OK) else None)
    for name in ("mpirun", "mpiexec"):
        found = shutil.which(name)
        if found:
            return found
    return None


def mpi_flavor(mpirun):
    """'openmpi' or 'mpich' (Hydra), from `mpirun --version`; 'openmpi' when it cannot tell."""
    try:
        out = subprocess.run([mpirun, "--version"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return "openmpi"
    text = out.decode("utf-8", "replace").lower()
    if "open mpi" in text or "open-mpi" in text or "openrte" in text:
        return "openmpi"
    if "hydra" in text or "mpich" in text or "intel(r) mpi" in text:
        return "mpich"
    return "openmpi"


def local_cores():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def host_slots(hosts):
    """Total slots of a -H list ("a:4,b:2,c" -> 7; a host without a count has one slot)."""
    total = 0
    for entry in hosts.split(","):
        entry = entry.strip()
        if not entry:
            continue
        name, _, count = entry.rpartition(":") if ":" in entry else (entry, "", "1")
        if not name or not count.isdigit() or int(count) < 1:
            raise ValueError("host entry %r is not NAME or NAME:SLOTS (e.g. node1:4)" % entry)
        total += int(count)
    if total == 0:
        raise ValueError("--hosts %r names no host" % hosts)
    return total


def forwarded_names(environ, extra=()):
    """Names of the variables passed to every rank: POSEIDON_*, FORWARDED ones that are set,
    then `extra` (NAME or NAME=VALUE), without repeats."""
    names = sorted(k for k in environ if k.startswith("POSEIDON_"))
    names += [k for k in FORWARDED if k in environ]
    for item in extra:
        name = item.split("=", 1)[0]
        if name not in names:
            names.append(name)
    return names


def build_command(args, environ=None, mpirun=None, flavor=None, is_root=None, cores=None):
    """The mpirun command line for parsed `args`, and the environment to run it with."""
    environ = dict(os.environ if environ is None else environ)
    mpirun = mpirun or find_mpirun(args.mpirun)
    if mpirun is None:
        raise FileNotFoundError(
            "poseidonrun: no mpirun or mpiexec on PATH (install Open MPI: apt-get install "
            "openmpi-bin) and none given with --mpirun")
    flavor = flavor or mpi_flavor(mpirun)
    is_root = (os.geteuid() == 0) if is_root is None else is_root
    for item in args.env:  # -x NAME=VALUE sets the value for the job
        if "=" in item:
            name, value = item.split("=", 1)
            environ[name] = value
    names = forwarded_names(environ, args.env)
    cmd = [mpirun, "-np", str(args.np)]
    if flavor == "openmpi":
        if is_root:
            cmd.append("--allow-run-as-root")
            environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
            environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        slots = host_slots(args.hosts) if args.hosts else None
        if args.hostfile is None and args.np > (slots or cores or local_cores()):
            # More ranks than slots: allowed, and idle ranks yield their core.
            cmd += ["--oversubscribe", "--mca", "mpi_yield_when_idle", "1"]
        cmd += ["--bind-to", "none"]
        if args.hosts:
            cmd += ["-H", args.hosts]
        if args.hostfile:
            cmd += ["--hostfile", args.hostfile]
        for name in names:
            cmd += ["-x", name]
    else:  # MPICH / Hydra: no root or oversubscription checks; variables by list
        if args.hosts:
            cmd += ["-hosts", args.hosts]
        if args.hostfile:
            cmd += ["-f", args.hostfile]
        if names:
            cmd += ["-genvlist", ",".join(names)]
    cmd += shlex.split(args.mpi_args)
    cmd += args.command
    return cmd, environ


def _run(cmd, environ, timeout):
    """Runs cmd in its own process group; returns its exit code (124 after a timeout)."""
    proc = subprocess.Popen(cmd, env=environ, start_new_session=True)

    def forward(signum, _frame):
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            return _exit_code(proc.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            print("poseidonrun: the job ran past --timeout %g s; stopping it" % timeout,
                  file=sys.stderr, flush=True)
            forward(signal.SIGTERM, None)
            try:
                proc.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                forward(signal.SIGKILL, None)
                proc.wait()
            return TIMEOUT_EXIT
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _exit_code(status):
    return 128 - status if status < 0 else status  # killed by a signal: 128 + its number


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        parser.error("no command to run (e.g. poseidonrun -np 2 python3 train.py)")
    if args.np < 1:
        parser.error("-np %d: expected at least 1 rank" % args.np)
    if args.timeout is not None and args.timeout <= 0:
        parser.error("--timeout %g: expected a positive number of seconds" % args.timeout)
    if args.hosts and args.hostfile:
        parser.error("--hosts and --hostfile: expected one of them")
    try:
        cmd, environ = build_command(args)
    except (FileNotFoundError, ValueError) as e:
        print("poseidonrun: %s" % e, file=sys.stderr)
        return 2
    if args.verbose or args.dry_run:
        print("poseidonrun: %s" % " ".join(shlex.quote(c) for c in cmd), flush=True)
    if args.dry_run:
        return 0
    start = time.monotonic()
    code = _run(cmd, environ, args.timeout)
    if args.verbose:
        print("poseidonrun: exit code %d after %.1f s" % (code, time.monotonic() - start),
              file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
