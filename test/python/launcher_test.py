"""poseidonrun (python -m poseidon.run): the mpirun command it builds (root, oversubscription,
hosts, forwarded variables, MPICH's flags, refused arguments), then real jobs at np 2: every
rank sees the POSEIDON_ variables and PYTHONPATH and is one of 2 ranks of one world; a rank's
exit code is the launcher's; --timeout stops a job that runs too long (exit 124).

    launcher_test.py [--mpirun PATH]     the driver (ctest python_launcher)
    launcher_test.py --rank NP           what each rank runs
"""
import os
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)
CHECK_VALUE = "launcher 42"  # POSEIDON_LAUNCHER_CHECK, with a space to survive quoting
DENSITY = "0.0025"  # POSEIDON_TOPK_DENSITY: a real setting the runtime must read


def rank_main(want_size):
    import numpy as np

    import poseidon
    comm = poseidon.init()
    problems = []
    seen = os.environ.get("POSEIDON_LAUNCHER_CHECK")
    if seen != CHECK_VALUE:
        problems.append("POSEIDON_LAUNCHER_CHECK is %r" % seen)
    density = poseidon.get_setting("POSEIDON_TOPK_DENSITY")
    if float(density) != float(DENSITY):
        problems.append("POSEIDON_TOPK_DENSITY is %s" % density)
    if "PYTHONPATH" not in os.environ:
        problems.append("no PYTHONPATH")
    if comm.size != want_size:
        problems.append("world size %d; expected %d" % (comm.size, want_size))
    x = np.ones(1, np.int64)
    comm.allreduce(x, x)  # one world of want_size ranks, not want_size worlds of one
    if x[0] != want_size:
        problems.append("allreduce of ones gave %d; expected %d" % (x[0], want_size))
    print("rank %d of %d: %s" % (comm.rank, comm.size, "; ".join(problems) or "ok"), flush=True)
    return 1 if problems else 0


failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL: %s" % what, file=sys.stderr, flush=True)


def launcher(args, env, timeout=150):
    """Runs the launcher; returns (exit code, stdout + stderr, seconds)."""
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "poseidon.run"] + args, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    return out.returncode, out.stdout.decode("utf-8", "replace"), time.monotonic() - t0


def driver(mpirun):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_")}  # the launcher's job
    env["POSEIDON_LAUNCHER_CHECK"] = CHECK_VALUE
    env["POSEIDON_TOPK_DENSITY"] = DENSITY
    check("PYTHONPATH" in env, "the test runs with PYTHONPATH set (poseidon from the build)")
    base = ["--mpirun", mpirun] if mpirun else []
    cores = len(os.sched_getaffinity(0))
    root = os.geteuid() == 0

    # The command, without running it.
    def dry(*args):
        rc, out, _ = launcher(base + ["--dry-run"] + list(args), env, timeout=60)
        check(rc == 0, "dry run %s: exit %d (%s)" % (args, rc, out))
        return out.split()

    cmd = dry("-np", "2", "python3", "x.py", "--lr", "1")
    check("-np" in cmd and cmd[cmd.index("-np") + 1] == "2", "-np 2 in %s" % cmd)
    for name in ("POSEIDON_LAUNCHER_CHECK", "POSEIDON_TOPK_DENSITY", "PYTHONPATH"):
        check(any(a == "-x" and b == name for a, b in zip(cmd, cmd[1:])),
              "-x %s in %s" % (name, cmd))
    check(("--allow-run-as-root" in cmd) == root, "--allow-run-as-root iff root: %s" % cmd)
    check(("--oversubscribe" in cmd) == (2 > cores), "--oversubscribe iff 2 > %d cores" % cores)
    check(cmd[-4:] == ["python3", "x.py", "--lr", "1"], "the command comes last: %s" % cmd)
    cmd = dry("-np", str(cores + 1), "python3", "x.py")
    check("--oversubscribe" in cmd,
          "--oversubscribe with %d ranks on %d cores" % (cores + 1, cores))
    cmd = dry("-H", "nodeA:1,nodeB:1", "-np", "2", "python3", "x.py")
    check("-H" in cmd and cmd[cmd.index("-H") + 1] == "nodeA:1,nodeB:1" and
          "--oversubscribe" not in cmd, "-H passed on, 2 slots for 2 ranks: %s" % cmd)
    cmd = dry("-H", "nodeA:1,nodeB", "-np", "3", "python3", "x.py")
    check("--oversubscribe" in cmd, "3 ranks on 2 host slots oversubscribe: %s" % cmd)
    cmd = dry("-np", "2", "-x", "EXTRA_VAR=1", "python3", "x.py")
    check(any(a == "-x" and b == "EXTRA_VAR" for a, b in zip(cmd, cmd[1:])), "-x EXTRA_VAR")

    import argparse

    from poseidon import run
    args = argparse.Namespace(np=2, hosts="h1:2", hostfile=None, env=[], mpirun=None,
                              mpi_args="", command=["python3", "x.py"])
    cmd, _ = run.build_command(args, environ={"POSEIDON_A": "1", "PYTHONPATH": "/p"},
                               mpirun="/usr/bin/mpiexec", flavor="mpich", is_root=True)
    check(cmd == ["/usr/bin/mpiexec", "-np", "2", "-hosts", "h1:2", "-genvlist",
                  "POSEIDON_A,PYTHONPATH", "python3", "x.py"], "MPICH command %s" % cmd)

    for args, text in ((["-H", "nodeA:x", "-np", "2", "true"], "is not NAME or NAME:SLOTS"),
                       (["-np", "2"], "no command to run"),
                       (["-np", "0", "true"], "expected at least 1 rank"),
                       (["--timeout", "0", "-np", "1", "true"], "expected a positive number"),
                       (["--mpirun", "/nonexistent/mpirun", "-np", "2", "true"], "no mpirun")):
        rc, out, _ = launcher(args if "--mpirun" in args else base + args, env, timeout=60)
        check(rc == 2 and text in out, "%s: exit 2 with %r, got %d: %s" % (args, text, rc, out))

    # A real job at np 2: each rank checks what it was given.
    rc, out, secs = launcher(base + ["-np", "2", "--timeout", "100", "--verbose",
                                     sys.executable, HERE, "--rank", "2"], env)
    print(out)
    check(rc == 0, "np 2 job: exit %d" % rc)
    for r in range(2):
        check("rank %d of 2: ok" % r in out, "rank %d of 2 reports ok" % r)
    check("poseidonrun: " in out and " -np 2 " in out, "--verbose prints the mpirun command")

    # The job's exit code is the launcher's.
    rc, out, _ = launcher(base + ["-np", "2", sys.executable, "-c",
                                  "import os, sys; "
                                  "sys.exit(3 if os.environ['OMPI_COMM_WORLD_RANK'] == '1' "
                                  "else 0)"], env)
    check(rc == 3, "a rank's exit code 3 is the launcher's (got %d: %s)" % (rc, out[-500:]))

    # A rank that dies on an uncaught exception while its peer waits in a collective ends the
    # job at once, naming itself, instead of both waiting for each other at exit (the peer in
    # its allreduce, the dying rank in the window's collective free).
    rc, out, secs = launcher(base + ["-np", "2", "--timeout", "100", sys.executable, "-c",
                                     "import numpy as np, poseidon; c = poseidon.init(); "
                                     "x = np.ones(1 << 16, np.float32); c.allreduce(x, x)\n"
                                     "if c.rank == 1: raise KeyError('lost batch')\n"
                                     "c.allreduce(x, x)"], env)
    check(rc != 0 and rc != 124 and secs < 30 and
          "rank 1 is exiting on an uncaught KeyError ('lost batch')" in out,
          "an uncaught exception on rank 1: exit %d after %.1f s (%s)" % (rc, secs, out[-800:]))

    # --timeout stops the whole job and exits with 124.
    rc, out, secs = launcher(base + ["-np", "2", "--timeout", "2", sys.executable, "-c",
                                     "import time; time.sleep(60)"], env)
    check(rc == 124 and "ran past --timeout 2 s" in out and secs < 30,
          "--timeout 2: exit %d after %.1f s (%s)" % (rc, secs, out[-500:]))

    print("launcher_test: %s" % ("PASSED" if not failures else "FAILED"))
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--rank":
        sys.exit(rank_main(int(sys.argv[2])))
    mpirun = sys.argv[2] if len(sys.argv) == 3 and sys.argv[1] == "--mpirun" else None
    sys.exit(driver(mpirun))
