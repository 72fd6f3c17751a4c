#!/usr/bin/env python3
"""Poseidon against Open MPI's *best* coll_tuned configuration, per size.

An OSU program (bench/osu/osu_<program>) prints Poseidon's Backend call beside Open MPI's own
call, which runs Open MPI's default algorithm choice. This script runs the program once per
Open MPI configuration of that collective's coll_tuned component:

  * "default": no MCA flags (Open MPI's fixed decision rules);
  * every algorithm N of the collective (as `ompi_info` lists them):
        --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_<coll>_algorithm N
  * for the algorithms that take a segment size, one configuration per --segsizes value:
        ... --mca coll_tuned_<coll>_algorithm_segmentsize S

Each configuration is a separate mpirun of the program with --json (every mpirun under a
timeout); the whole set is repeated -r times, interleaved (repetition 1 runs every
configuration in order, then repetition 2, ...). A configuration that fails (non-zero exit,
bad JSON) is recorded and not run again; one that times out is recorded and tried again in the
next repetition.

Per size it prints:
  * ours: the median of Poseidon's time. Where Poseidon's call does not touch Open MPI's
    collective (one node, size at or above the shared-memory threshold the program reports)
    the MCA flags cannot change it, so the median is over every run of every configuration;
    below the threshold (or across nodes) MpiBackend calls the same Open MPI collective, whose
    algorithm the flags force, so only the default configuration's runs count (--ours-from
    changes this);
  * Open MPI default: the median over the default configuration's runs;
  * best Open MPI: min over configurations of the median over repetitions, and its name;
  * default / ours and best / ours: speed ratios, peer time / our time (> 1: Poseidon faster).
Times are the program's per-size average over its timed runs, averaged across ranks. A
configuration whose peer result was ever wrong (#wrong > 0) is not eligible as best.

With --confirm R2, the choice is then measured again on fresh runs: every configuration that
was best at some size runs R2 more times, interleaved, and per size the table adds the medians
of both columns *from those runs only* (ours and the chosen configuration in the same mpirun,
so the two see the same rank placement) and their ratio. Picking the lowest of ~25 medians
favours whichever configuration had lucky runs (on a VM whose rank placement moves small-message
times by 2-4x between runs, a large effect); measuring the pick on runs that did not choose it
removes that bias, and pairing removes the placement noise between the columns.

Output: a Markdown table (for bench/RESULTS.md) on stdout or --markdown FILE, and with
--json FILE every sample, configuration and command line. bench/osu/standing.py reads any
number of those JSON files and prints one row per collective and world size: the span of the
ratios and every size below its floor.

Usage:
  bench/osu/best_peer.py [--build DIR | --bin PATH] [-np N] [-m [MIN:]MAX] [-r REPS]
      [-i ITER] [-x WARMUP] [-t LEVEL] [-T TYPE] [--root R] [--segsizes S,S,...]
      [--algorithms N,N,...] [--timeout SEC] [--mpirun-args "ARGS"] [--ours-from auto|default|all]
      [--confirm R2]
      [--json FILE] [--markdown FILE] [--dry-run] [--verbose]
      {allreduce,reduce_scatter,allgather,broadcast}
e.g.
  bench/osu/best_peer.py --build build allreduce -np 4 -m 1K:64M -r 5 --json /tmp/ar4.json

Standard library only. Run it on a quiet machine: one mpirun at a time, nothing else running.
"""

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# program -> (coll_tuned name, the MPI call the program's peer column makes)
PROGRAMS = {
    "allreduce": ("allreduce", "MPI_Allreduce"),
    "reduce_scatter": ("reduce_scatter", "MPI_Reduce_scatter"),
    "allgather": ("allgather", "MPI_Allgather"),
    "broadcast": ("bcast", "MPI_Bcast"),
}

# Open MPI 4.1's algorithms, used when ompi_info cannot be asked (from
# `ompi_info --param coll tuned --level 9`).
FALLBACK_ALGORITHMS = {
    "allreduce": {1: "basic_linear", 2: "nonoverlapping", 3: "recursive_doubling", 4: "ring",
                  5: "segmented_ring", 6: "rabenseifner"},
    "reduce_scatter": {1: "non-overlapping", 2: "recursive_halving", 3: "ring", 4: "butterfly"},
    "allgather": {1: "linear", 2: "bruck", 3: "recursive_doubling", 4: "ring", 5: "neighbor",
                  6: "two_proc"},
    "bcast": {1: "basic_linear", 2: "chain", 3: "pipeline", 4: "split_binary_tree",
              5: "binary_tree", 6: "binomial", 7: "knomial", 8: "scatter_allgather",
              9: "scatter_allgather_ring"},
}

# The algorithms that pass coll_tuned_<coll>_algorithm_segmentsize on to the algorithm, from
# Open MPI 4.1's coll_tuned_<coll>_decision.c (*_intra_do_this) and coll_base: allreduce's
# segmented ring; bcast's chain, pipeline, split binary tree, binary tree, binomial and
# k-nomial (scatter_allgather and scatter_allgather_ring accept the argument but ignore it).
# reduce_scatter's and allgather's algorithms take none.
SEGMENTED = {
    "allreduce": {5},
    "reduce_scatter": set(),
    "allgather": set(),
    "bcast": {2, 3, 4, 5, 6, 7},
}

DEFAULT_SEGSIZES = [0, 8192, 65536, 131072, 1048576]
BASE_MPIRUN = ["mpirun", "--oversubscribe", "--bind-to", "none", "--mca", "mpi_yield_when_idle",
               "1"]
MPIRUN_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def ompi_algorithms(coll):
    """{N: name} for coll_tuned_<coll>_algorithm from ompi_info (N >= 1), and its source."""
    try:
        out = subprocess.run(["ompi_info", "--param", "coll", "tuned", "--level", "9",
                              "--parsable"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return dict(FALLBACK_ALGORITHMS[coll]), "built-in Open MPI 4.1 table (ompi_info failed)"
    key = "mca:coll:tuned:param:coll_tuned_%s_algorithm:enumerator:value:" % coll
    found = {}
    for line in out.splitlines():
        if line.startswith(key):
            number, _, name = line[len(key):].partition(":")
            if number.isdigit() and int(number) > 0:
                found[int(number)] = name
    if not found:
        return dict(FALLBACK_ALGORITHMS[coll]), "built-in Open MPI 4.1 table (not in ompi_info)"
    return found, "ompi_info --param coll tuned --level 9"


def parse_list(text, what):
    try:
        return [int(x) for x in text.split(",") if x.strip() != ""]
    except ValueError:
        raise SystemExit("best_peer.py: %s: '%s' is not a comma-separated list of integers"
                         % (what, text))


def make_configs(coll, algorithms, segsizes):
    """[(name, [mca flags])], the default first."""
    configs = [("default", [])]
    for n in sorted(algorithms):
        base = ["--mca", "coll_tuned_use_dynamic_rules", "1",
                "--mca", "coll_tuned_%s_algorithm" % coll, str(n)]
        label = "%s=%d %s" % (coll, n, algorithms[n])
        if n in SEGMENTED.get(coll, set()) and segsizes:
            for s in segsizes:
                configs.append(("%s seg=%d" % (label, s),
                                base + ["--mca", "coll_tuned_%s_algorithm_segmentsize" % coll,
                                        str(s)]))
        else:
            configs.append((label, base))
    return configs


def descendants(pid):
    """The pids of pid's descendants (from /proc), children first."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def run_once(cmd, timeout):
    """Runs one mpirun in its own session. On timeout: SIGTERM to mpirun's process group (mpirun
    then ends its ranks, which Open MPI puts in process groups of their own); if that does not
    end it within 10 s, SIGKILL to the group and to every process it had started."""
    env = dict(os.environ)
    env.update(MPIRUN_ENV)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err, False, time.monotonic() - t0
    except subprocess.TimeoutExpired:
        started = descendants(proc.pid)
        out, err = "", ""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            if sig == signal.SIGKILL:
                for pid in started:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            try:
                out, err = proc.communicate(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        return None, out or "", err or "", True, time.monotonic() - t0


def parse_json_output(text):
    text = text.strip()
    try:
        return json.loads(text)
    except ValueError:
        start, end = text.find("{"), text.rfind("}")
        if start >= 0 and end > start:
            return json.loads(text[start:end + 1])
        raise


def last_line(text):
    lines = [l for l in text.strip().splitlines() if l.strip()
             and not l.startswith("---") and "help message" not in l
             and "orte_base_help_aggregate" not in l]
    return lines[0][:300] if lines else ""


def median(xs):
    return statistics.median(xs) if xs else None


def human_size(b):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= (1 << shift) and b % (1 << shift) == 0:
            return "%d %s" % (b >> shift, unit)
    return "%d B" % b


def fmt_us(x):
    if x is None:
        return "-"
    return "%.1f" % x if x >= 10 else "%.2f" % x


def fmt_ratio(x):
    return "-" if x is None else "%.2f" % x


def run_config(cmd, timeout, rep):
    """One mpirun of a configuration: (its JSON document or None, the run's record, seconds)."""
    rc, out, err, timed_out, wall = run_once(cmd, timeout)
    run = {"rep": rep, "rc": rc, "timed_out": timed_out, "wall_s": round(wall, 2)}
    doc = None
    if timed_out:
        run["error"] = "timed out after %.0f s" % timeout
    elif rc != 0:
        run["error"] = "exit %s: %s" % (rc, last_line(err) or last_line(out))
    else:
        try:
            doc = parse_json_output(out)
            if not doc.get("rows"):
                raise ValueError("no rows")
        except ValueError as e:
            run["error"] = "bad JSON output (%s): %s" % (e, last_line(out))
            doc = None
    return doc, run, wall


def main():
    ap = argparse.ArgumentParser(
        description="Poseidon vs Open MPI's best coll_tuned configuration, per size "
                    "(see the module docstring).")
    ap.add_argument("program", choices=sorted(PROGRAMS))
    ap.add_argument("-np", "--np", type=int, default=2, help="world size (default 2)")
    ap.add_argument("-m", "--sizes", default="4:1M", help="program's -m [MIN:]MAX (default 4:1M)")
    ap.add_argument("-r", "--reps", type=int, default=5,
                    help="repetitions of the whole set of configurations (default 5)")
    ap.add_argument("-i", "--iterations", type=int, help="program's -i")
    ap.add_argument("-x", "--warmup", type=int, help="program's -x")
    ap.add_argument("-t", "--thread-level",
                    choices=["single", "funneled", "serialized", "multiple"],
                    help="program's -t (default: the program's own, the lowest it needs)")
    ap.add_argument("-T", "--type", help="program's -T (default float32)")
    ap.add_argument("--root", type=int, help="broadcast only: the program's -r ROOT")
    ap.add_argument("--prog-args", default="", help="more program arguments (one string)")
    ap.add_argument("--build", default=os.path.join(REPO, "build"),
                    help="build directory holding bench/osu/osu_<program> (default REPO/build)")
    ap.add_argument("--bin", help="the program's path (overrides --build)")
    ap.add_argument("--segsizes", default=",".join(str(s) for s in DEFAULT_SEGSIZES),
                    help="segment sizes in bytes for the segmenting algorithms "
                         "(default %(default)s; empty: the algorithms' default only)")
    ap.add_argument("--algorithms", help="only these algorithm numbers (default: every one)")
    ap.add_argument("--mpirun", default="mpirun", help="the mpirun to use")
    ap.add_argument("--mpirun-args", default="",
                    help="more mpirun arguments, one string (e.g. \"--host a,b --mca btl ^openib\")")
    ap.add_argument("--timeout", type=float, default=600,
                    help="seconds per mpirun before it is killed (default 600)")
    ap.add_argument("--ours-from", choices=["auto", "default", "all"], default="auto",
                    help="which runs make our median: all configurations' runs where our call "
                         "cannot depend on the MCA flags and the default's elsewhere (auto, "
                         "the default), the default configuration's only, or all")
    ap.add_argument("--confirm", type=int, default=0, metavar="R2",
                    help="then run each size's chosen configuration R2 more times and report "
                         "both columns from those runs alone (default 0: no confirmation)")
    ap.add_argument("--json", dest="json_out", help="write every sample and command here")
    ap.add_argument("--markdown", help="write the Markdown here instead of stdout")
    ap.add_argument("--dry-run", action="store_true", help="print the command lines, run nothing")
    ap.add_argument("--verbose", action="store_true", help="log each run's figures")
    a = ap.parse_args()

    if a.np < 1 or a.reps < 1 or a.confirm < 0:
        raise SystemExit("best_peer.py: -np and -r must be at least 1, --confirm at least 0")
    if a.root is not None and a.program != "broadcast":
        raise SystemExit("best_peer.py: --root is for broadcast only")
    coll, peer_call = PROGRAMS[a.program]
    binary = a.bin or os.path.join(a.build, "bench", "osu", "osu_" + a.program)
    if not a.dry_run and not os.access(binary, os.X_OK):
        raise SystemExit("best_peer.py: %s is not an executable; build it (ninja osu_%s) or pass "
                         "--build / --bin" % (binary, a.program))

    algorithms, algo_source = ompi_algorithms(coll)
    if a.algorithms:
        wanted = parse_list(a.algorithms, "--algorithms")
        unknown = [n for n in wanted if n not in algorithms]
        if unknown:
            raise SystemExit("best_peer.py: --algorithms %s: not among %s's algorithms %s"
                             % (unknown, coll, sorted(algorithms)))
        algorithms = {n: algorithms[n] for n in wanted}
    segsizes = parse_list(a.segsizes, "--segsizes")
    configs = make_configs(coll, algorithms, segsizes)

    prog_args = ["-m", a.sizes, "--json"]
    if a.iterations is not None:
        prog_args += ["-i", str(a.iterations)]
    if a.warmup is not None:
        prog_args += ["-x", str(a.warmup)]
    if a.thread_level:
        prog_args += ["-t", a.thread_level]
    if a.type:
        prog_args += ["-T", a.type]
    if a.root is not None:
        prog_args += ["-r", str(a.root)]
    prog_args += shlex.split(a.prog_args)
    mpirun = [a.mpirun] + BASE_MPIRUN[1:] + ["-np", str(a.np)] + shlex.split(a.mpirun_args)
    commands = {name: mpirun + flags + [binary] + prog_args for name, flags in configs}
    env_text = " ".join("%s=%s" % kv for kv in MPIRUN_ENV.items())

    if a.dry_run:
        for name, _ in configs:
            print("%-40s %s %s" % (name, env_text, shlex.join(commands[name])))
        return 0

    started = datetime.datetime.now(datetime.timezone.utc)
    state = {name: {"runs": [], "failed": None} for name, _ in configs}
    docs = {}  # name -> [json document per successful run]
    total = len(configs) * a.reps
    k = 0
    for rep in range(1, a.reps + 1):
        for name, _ in configs:
            k += 1
            st = state[name]
            if st["failed"] is not None:
                st["runs"].append({"rep": rep, "skipped": True})
                continue
            doc, run, wall = run_config(commands[name], a.timeout, rep)
            if doc is None and not run["timed_out"]:
                st["failed"] = run["error"]
            if doc is not None:
                docs.setdefault(name, []).append(doc)
                run["ok"] = bool(doc.get("ok", False))
            st["runs"].append(run)
            log("[%d/%d] rep %d %-36s %s (%.1f s)" % (
                k, total, rep, name, "ok" if doc is not None else run.get("error", "?"), wall))
            if a.verbose and doc is not None:
                for row in doc["rows"]:
                    log("    %10d B  ours %.2f us  peer %s us" % (
                        row["size"], row["ours"]["time_us"],
                        "%.2f" % row["peer"]["time_us"] if row.get("peer") else "-"))

    if "default" not in docs and not docs:
        log("best_peer.py: no configuration produced a result")
    meta_doc = (docs.get("default") or next(iter(docs.values()), [None]))[0]
    meta = {}
    if meta_doc:
        for key in ("benchmark", "ours", "peer", "host", "cpu", "ranks", "nodes", "mpi",
                    "backend", "memory", "settings", "build", "busbw_factor", "mpi_thread_level",
                    "mpi_thread_level_asked", "mpi_thread_level_needed", "liveness_thread",
                    "buffers", "options"):
            if key in meta_doc:
                meta[key] = meta_doc[key]
    levels = sorted({d.get("mpi_thread_level", "?") for ds in docs.values() for d in ds})
    m = re.search(r"shm threshold (\d+) B", meta.get("settings", ""))
    shm_threshold = int(m.group(1)) if m else None
    nodes = meta.get("nodes")

    # samples[size][name] = {"ours": [...], "peer": [...], "wrong_ours": n, "wrong_peer": n}
    samples = {}
    counts = {}
    for name, ds in docs.items():
        for d in ds:
            for row in d["rows"]:
                s = samples.setdefault(row["size"], {}).setdefault(
                    name, {"ours": [], "peer": [], "wrong_ours": 0, "wrong_peer": 0})
                counts[row["size"]] = row.get("count")
                s["ours"].append(row["ours"]["time_us"])
                s["wrong_ours"] += int(row["ours"].get("wrong", 0))
                if row.get("peer"):
                    s["peer"].append(row["peer"]["time_us"])
                    s["wrong_peer"] += int(row["peer"].get("wrong", 0))

    rows = []
    for size in sorted(samples):
        per = samples[size]
        mpi_path = not (nodes == 1 and shm_threshold is not None and size >= shm_threshold)
        if a.ours_from == "all" or (a.ours_from == "auto" and not mpi_path):
            ours = [t for s in per.values() for t in s["ours"]]
            ours_from = "all"
        else:
            ours = per.get("default", {}).get("ours", [])
            ours_from = "default"
        default_peer = median(per.get("default", {}).get("peer", []))
        config_medians = {n: median(s["peer"]) for n, s in per.items() if s["peer"]}
        eligible = {n: t for n, t in config_medians.items() if per[n]["wrong_peer"] == 0}
        best_name = min(eligible, key=lambda n: eligible[n]) if eligible else None
        best = eligible.get(best_name)
        ours_med = median(ours)
        rows.append({
            "size": size, "count": counts.get(size),
            "ours_path": "MPI" if mpi_path else "shm",
            "ours_from": ours_from,
            "ours_median_us": ours_med, "ours_n": len(ours), "ours_samples_us": ours,
            "default_median_us": default_peer,
            "default_n": len(per.get("default", {}).get("peer", [])),
            "best_median_us": best, "best_config": best_name,
            "best_n": len(per[best_name]["peer"]) if best_name else 0,
            "default_over_ours": (default_peer / ours_med) if default_peer and ours_med else None,
            "best_over_ours": (best / ours_med) if best and ours_med else None,
            "config_medians_us": config_medians,
            "wrong_ours": sum(s["wrong_ours"] for s in per.values()),
            "wrong_peer": sum(s["wrong_peer"] for s in per.values()),
            "wrong_peer_configs": sorted(n for n, s in per.items() if s["wrong_peer"] > 0),
        })

    # ---- Confirmation: each size's chosen configuration on fresh runs, both columns paired ----
    order = [n for n, _ in configs]
    chosen = sorted({r["best_config"] for r in rows if r["best_config"]}, key=order.index)
    confirm = {name: {"runs": [], "docs": []} for name in chosen}
    if a.confirm > 0:
        total_c = len(chosen) * a.confirm
        kc = 0
        for rep in range(1, a.confirm + 1):
            for name in chosen:
                kc += 1
                doc, run, wall = run_config(commands[name], a.timeout, rep)
                confirm[name]["runs"].append(run)
                if doc is not None:
                    confirm[name]["docs"].append(doc)
                log("[confirm %d/%d] rep %d %-36s %s (%.1f s)" % (
                    kc, total_c, rep, name, "ok" if doc is not None else run.get("error", "?"),
                    wall))
        for r in rows:
            ours_c, peer_c, wrong_c = [], [], 0
            for d in confirm.get(r["best_config"], {"docs": []})["docs"]:
                for row in d["rows"]:
                    if row["size"] != r["size"] or not row.get("peer"):
                        continue
                    ours_c.append(row["ours"]["time_us"])
                    peer_c.append(row["peer"]["time_us"])
                    wrong_c += int(row["ours"].get("wrong", 0))
            oc, pc = median(ours_c), median(peer_c)
            r.update({"confirm_ours_us": oc, "confirm_best_us": pc, "confirm_n": len(ours_c),
                      "confirm_ours_samples_us": ours_c, "confirm_best_samples_us": peer_c,
                      "confirm_best_over_ours": (pc / oc) if pc and oc else None,
                      "confirm_wrong": wrong_c})
    finished = datetime.datetime.now(datetime.timezone.utc)

    # ---- Markdown ----
    md = []
    P = meta.get("ranks", a.np)
    md.append("### %s: %s vs Open MPI's best coll_tuned configuration (P=%s, %s)" % (
        "osu_" + a.program, meta.get("ours", "Poseidon"), P, meta.get("options", {}).get(
            "type", a.type or "float32")))
    md.append("")
    md.append(
        "Run %s to %s UTC on %s (%s, %s cores); %s; ranks %s on %s node(s); MPI thread level: "
        "%s (asked %s, the program needs %s; both columns; liveness heartbeat thread %s); "
        "Poseidon backend %s, %s memory (%s buffers, both columns), %s; %s." % (
            started.strftime("%Y-%m-%d %H:%M"), finished.strftime("%H:%M"),
            meta.get("host", socket.gethostname()), meta.get("cpu", platform.processor()),
            os.cpu_count(), meta.get("mpi", "?"), P, nodes,
            "/".join(levels) if levels else "?", meta.get("mpi_thread_level_asked", "?"),
            meta.get("mpi_thread_level_needed", "?"),
            "on" if meta.get("liveness_thread") else "off", meta.get("backend", "?"),
            meta.get("memory", "?"), meta.get("buffers", "private"), meta.get("settings", "?"),
            meta.get("build", "?")))
    md.append("")
    md.append(
        "%d configurations of coll_tuned's %s (the default, then every algorithm from %s%s) x "
        "%d repetitions, interleaved: each repetition runs every configuration once, in the "
        "order listed below, each a separate mpirun with --json (timeout %.0f s). Each sample "
        "is the program's time for one size: the average over its timed runs (%s per size), "
        "averaged across ranks. ours = median of Poseidon's %s; Open MPI default = median over "
        "the default configuration's runs; best = the configuration with the lowest median "
        "over its repetitions (a configuration whose result was ever wrong is not eligible). "
        "Ratios are peer time / our time (> 1: Poseidon faster). Path: shm = Poseidon's "
        "shared-memory collective (one node, size >= the %s B threshold; the MCA flags cannot "
        "change it, so ours pools every configuration's runs), MPI = MpiBackend calls %s "
        "itself (so ours uses only the default configuration's runs, Open MPI's algorithm "
        "choice as shipped)." % (
            len(configs), coll, algo_source,
            (", segment sizes %s B for %s" % (
                ", ".join(str(s) for s in segsizes),
                ", ".join(str(n) for n in sorted(SEGMENTED.get(coll, set()) & set(algorithms)))))
            if segsizes and SEGMENTED.get(coll, set()) & set(algorithms) else "",
            a.reps, a.timeout,
            "%s iterations" % meta.get("options", {}).get("iterations", "?"),
            {"auto": "runs (see path)", "default": "runs in the default configuration",
             "all": "runs over every configuration"}[a.ours_from],
            shm_threshold if shm_threshold is not None else "?", peer_call))
    md.append("")
    if a.confirm > 0:
        md.append(
            "Confirmation: each size's best configuration then ran %d more times, interleaved "
            "(%d configurations); \"confirmed\" = the medians of ours and of that configuration "
            "over those runs only, both columns from the same mpiruns, and their ratio."
            % (a.confirm, len(chosen)))
        md.append("")
    head = ("| size | path | ours us (n) | Open MPI default us (n) | best Open MPI us (n) | "
            "best configuration | default / ours | best / ours |")
    rule = "|---|---|---|---|---|---|---|---|"
    if a.confirm > 0:
        head += " confirmed: ours / best us (n) | confirmed best / ours |"
        rule += "---|---|"
    md.append(head + " #wrong ours / peer |")
    md.append(rule + "---|")
    for r in rows:
        line = "| %s | %s | %s (%d) | %s (%d) | %s (%d) | %s | %s | %s |" % (
            human_size(r["size"]), r["ours_path"], fmt_us(r["ours_median_us"]), r["ours_n"],
            fmt_us(r["default_median_us"]), r["default_n"], fmt_us(r["best_median_us"]),
            r["best_n"], r["best_config"] or "-", fmt_ratio(r["default_over_ours"]),
            fmt_ratio(r["best_over_ours"]))
        if a.confirm > 0:
            line += " %s / %s (%d) | %s |" % (
                fmt_us(r.get("confirm_ours_us")), fmt_us(r.get("confirm_best_us")),
                r.get("confirm_n", 0), fmt_ratio(r.get("confirm_best_over_ours")))
        md.append(line + " %d / %d |" % (r["wrong_ours"] + r.get("confirm_wrong", 0),
                                          r["wrong_peer"]))
    md.append("")
    bad = [(n, st["failed"]) for n, st in state.items() if st["failed"]]
    timeouts = [(n, sum(1 for r in st["runs"] if r.get("timed_out"))) for n, st in state.items()]
    timeouts = [(n, c) for n, c in timeouts if c]
    wrong = sorted({n for r in rows for n in r["wrong_peer_configs"]})
    if bad or timeouts or wrong:
        md.append("Configurations left out:")
        for n, why in bad:
            md.append("- `%s`: failed (%s); not run again" % (n, why))
        for n, c in timeouts:
            md.append("- `%s`: timed out in %d of %d repetitions" % (n, c, a.reps))
        for n in wrong:
            md.append("- `%s`: wrong peer results (not eligible as best)" % n)
        md.append("")
    md.append("Command lines (environment: `%s`), in run order:" % env_text)
    md.append("")
    md.append("```")
    for name, _ in configs:
        md.append("# %s" % name)
        md.append(shlex.join(commands[name]))
    md.append("```")
    md.append("")
    md.append("Made with: `%s`" % shlex.join(["bench/osu/best_peer.py"] + sys.argv[1:]))
    text = "\n".join(md) + "\n"
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(text)
        log("best_peer.py: wrote %s" % a.markdown)
    else:
        sys.stdout.write(text)

    if a.json_out:
        out = {
            "program": "osu_" + a.program, "collective": coll, "peer_call": peer_call,
            "world_size": a.np, "repetitions": a.reps, "started_utc": started.isoformat(),
            "finished_utc": finished.isoformat(), "host": meta.get("host", socket.gethostname()),
            "mpi_thread_levels": levels, "shm_threshold_bytes": shm_threshold,
            "ours_from": a.ours_from, "algorithms": {str(k): v for k, v in algorithms.items()},
            "algorithms_source": algo_source, "segmented_algorithms":
                sorted(SEGMENTED.get(coll, set()) & set(algorithms)),
            "segsizes": segsizes, "environment": MPIRUN_ENV, "meta": meta,
            "configs": [{"name": n, "mca": flags, "command": commands[n],
                         "failed": state[n]["failed"], "runs": state[n]["runs"]}
                        for n, flags in configs],
            "rows": rows,
            "confirm_repetitions": a.confirm,
            "confirm_runs": {n: c["runs"] for n, c in confirm.items()},
            "script_command": ["bench/osu/best_peer.py"] + sys.argv[1:],
        }
        with open(a.json_out, "w") as f:
            json.dump(out, f, indent=1)
        log("best_peer.py: wrote %s" % a.json_out)
    any_wrong = any(r["wrong_ours"] or r.get("confirm_wrong", 0) for r in rows)
    return 1 if (any_wrong or not docs) else 0


if __name__ == "__main__":
    sys.exit(main())
