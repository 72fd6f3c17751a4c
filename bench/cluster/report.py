#!/usr/bin/env python3
"""Scaling table of an emulated-cluster run, written into bench/RESULTS.md.

Steps:
  1. Read the runs' log (emulate.sh tees every trainer's output into it): the "RESULT" lines
     (model, np, mode, iteration time, images/s) and the preamble lines of each run.
  2. Scaling efficiency per mode and P: throughput(P) / (P x throughput(1)), against the same
     mode's P=1 run (no communication at P=1, so it is the compute alone).
  3. Replace the "## Emulated cluster" section of the results file (other sections are left as
     they are; the file is created with a short header when missing) and print the table.
"""
import argparse
import datetime
import os
import platform
import re
import sys

HEADER = ("# Poseidon benchmark results\n\n"
          "Measured figures, each section with its machine, command and date. Sections are "
          "owned by the benchmark that writes them.\n")


def replace_section(path, title, body):
    """Replaces '## <title>' up to the next '## ' heading (or appends it)."""
    text = open(path).read() if os.path.exists(path) else HEADER
    lines = text.splitlines(keepends=True)
    head = f"## {title}\n"
    start = next((i for i, l in enumerate(lines) if l == head), None)
    new = [head, "\n"] + [l + "\n" for l in body.rstrip("\n").split("\n")] + ["\n"]
    if start is None:
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        if lines and lines[-1].strip():
            lines.append("\n")
        lines += new
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
                   len(lines))
        lines[start:end] = new
    with open(path, "w") as f:
        f.write("".join(lines))


def parse(log):
    results, preamble = [], {}
    current = None
    for line in open(log):
        line = line.rstrip("\n")
        m = re.match(r"=== P=(\d+): (.*)", line)
        if m:
            current = int(m.group(1))
            preamble.setdefault(current, [f"command: {m.group(2)}"])
            continue
        if line.startswith("RESULT "):
            kv = dict(item.split("=", 1) for item in line.split()[1:])
            results.append(kv)
        elif line.startswith("# ") and current is not None:
            preamble.setdefault(current, []).append(line[2:])
    return results, preamble


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", required=True)
    ap.add_argument("--results")
    ap.add_argument("--rate", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--note", default="", help="a paragraph of analysis for the section")
    a = ap.parse_args()
    results, preamble = parse(a.log)
    if not results:
        sys.exit(f"report.py: no RESULT lines in {a.log}")
    modes = []
    for r in results:
        if r["mode"] not in modes:
            modes.append(r["mode"])
    nps = sorted({int(r["np"]) for r in results})
    by = {(int(r["np"]), r["mode"]): r for r in results}
    model = results[0]["model"]

    rows = ["| mode | P | iteration ms | images/s (run) | images/s (modelled cluster) | "
            "MB/iter per rank | scaling efficiency | check |",
            "|---|---|---|---|---|---|---|---|"]
    for mode in modes:
        base = by.get((1, mode))
        for p in nps:
            r = by.get((p, mode))
            if r is None:
                continue
            eff = "-"
            if base is not None:
                eff = "%.1f%%" % (100 * float(r["img_s"]) / (p * float(base["img_s"])))
            rows.append(f"| {mode} | {p} | {float(r['iter_ms']):.1f} | {float(r['img_s']):.1f} | "
                        f"{float(r['img_s']) * float(r['scale']) * float(r['compute_scale']):.2f} | {float(r['MB_per_iter']):.2f} | {eff} | "
                        f"{r['check']} |")
    table = "\n".join(rows)
    print(table)
    if not a.results:
        return
    pmax = max(nps)
    pre = preamble.get(pmax, [])
    keep = [l for l in pre if l.startswith(("poseidon_model_trainer", "host", "ranks", "network",
                                            "build", "model", "SCALED", "COMPUTE", "compute :",
                                            "cost model"))]
    date = datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC")
    body = [
        f"Run {date} on {platform.node()} ({platform.platform()}, {os.cpu_count()} cores): "
        f"{pmax} emulated hosts at most, each in its own network namespace with a "
        f"{a.rate} full-duplex port (tbf on both veth ends) into a bridge; Open MPI over TCP.",
        "",
        f"Command: `{a.command}` (per P the script prints the full `mpirun` line it runs).",
        "",
        "Compute is emulated with sleeps (the GPU computes on the modelled cluster, so the host "
        "CPU stays free); the gradient exchange is real. Run conditions at the largest P, as the "
        "trainer printed them:",
        "",
    ]
    body += [f"    {l}" for l in keep]
    body += ["", f"Model {model}. Scaling efficiency = throughput(P) / (P x throughput(1)) of "
             "the same mode.", "", table, ""]
    if a.note:
        body += [a.note, ""]
    replace_section(a.results, "Emulated cluster", "\n".join(body))
    print(f"report.py: wrote the 'Emulated cluster' section of {a.results}")


if __name__ == "__main__":
    main()
