#!/usr/bin/env python3
"""The main job through the engine against its own --dense-baseline, alternated back to back.

  bench/main_job_vs_dense.py --build build -np 2 --pairs 5 [--other-build DIR] [-- flags]

Runs poseidon_mlp (engine, defaults) and poseidon_mlp --dense-baseline (one fused allreduce of
every gradient, the trainer's own SGD) one after the other, --pairs times, under
scripts/mpirun.sh, and prints each run's samples/s (all ranks), the medians, and the ratio of
medians (engine / baseline; >= 1.0 means the engine is not slower). Alternating the two sides
keeps slow drifts of the machine out of the ratio. Every mpirun has a timeout.

--other-build DIR adds a third run to every round, the engine of another build (an older
commit, say), so that two versions of the engine are compared in the same window of the
machine's speed: each round runs engine, other engine, baseline.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

RATE = re.compile(r"= (\d+) samples/s")


def run_once(mpirun, trainer, np, flags, timeout):
    cmd = [mpirun, "-np", str(np), trainer, "--log-every", "0"] + flags
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                             start_new_session=True)
    except subprocess.TimeoutExpired:
        sys.exit(f"main_job_vs_dense: {' '.join(cmd)} ran past {timeout} s")
    text = out.stdout + out.stderr
    m = RATE.search(text)
    if out.returncode != 0 or m is None:
        sys.exit(f"main_job_vs_dense: {' '.join(cmd)} exited {out.returncode}:\n{text[-2000:]}")
    return int(m.group(1))


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default=os.path.join(root, "build"), help="build directory")
    p.add_argument("-np", type=int, default=2, help="ranks (default 2)")
    p.add_argument("--pairs", type=int, default=5, help="engine / baseline pairs (default 5)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per run (default 300)")
    p.add_argument("--other-build", help="also run this build's engine in every round")
    p.add_argument("flags", nargs="*", help="extra poseidon_mlp flags for both sides (after --)")
    a = p.parse_args()
    if a.np < 1 or a.pairs < 1:
        sys.exit(f"main_job_vs_dense: -np {a.np} --pairs {a.pairs}; expected both >= 1")
    trainer = os.path.join(a.build, "examples", "poseidon_mlp")
    if not os.access(trainer, os.X_OK):
        sys.exit(f"main_job_vs_dense: {trainer} not found; build first (scripts/build.sh)")
    mpirun = os.path.join(root, "scripts", "mpirun.sh")
    other = None
    if a.other_build:
        other = os.path.join(a.other_build, "examples", "poseidon_mlp")
        if not os.access(other, os.X_OK):
            sys.exit(f"main_job_vs_dense: --other-build: {other} not found")
    engine, dense, older = [], [], []
    print(f"poseidon_mlp {' '.join(a.flags) or '(defaults)'}, np {a.np}, {a.pairs} pairs")
    print("pair  engine samples/s  dense-baseline samples/s  ratio" +
          ("  other engine samples/s  ratio" if other else ""))
    for i in range(a.pairs):
        e = run_once(mpirun, trainer, a.np, a.flags, a.timeout)
        o = run_once(mpirun, other, a.np, a.flags, a.timeout) if other else None
        d = run_once(mpirun, trainer, a.np, a.flags + ["--dense-baseline"], a.timeout)
        engine.append(e)
        dense.append(d)
        line = f"{i + 1:4d}  {e:16d}  {d:24d}  {e / d:5.3f}"
        if other:
            older.append(o)
            line += f"  {o:22d}  {o / d:5.3f}"
        print(line)
    md = statistics.median(dense)
    # The machine's speed can drift between runs by more than the difference measured; each
    # pair runs back to back, so the median of the pairs' ratios is the steadier figure.
    for name, runs in (("engine", engine), ("other engine", older)):
        if not runs:
            continue
        me = statistics.median(runs)
        ratios = [e / d for e, d in zip(runs, dense)]
        print(f"{name}: median {me:.0f}, dense-baseline {md:.0f}: {name} / baseline = "
              f"{me / md:.3f}; median of the pairs' ratios: {statistics.median(ratios):.3f} "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f})")


if __name__ == "__main__":
    main()
