#!/usr/bin/env python3
"""Renders a Poseidon engine timeline (POSEIDON_TIMELINE Chrome-trace JSON) to a PNG.

    python3 tools/plot_timeline.py trace.rank0.json out.png [--last-steps 2]

One row per layer; bars for the engine phases (queue, selection, communication, ...) of the
last few steps, so overlap with the backward pass reads at a glance. For interactive viewing,
load the JSON itself in https://ui.perfetto.dev or chrome://tracing.
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Phase name prefixes as the engine records them (engine/engine.cc).
COLORS = [("queue", "#c8c8c8"), ("pack", "#67c23a"), ("unpack", "#95d475"),
          ("allreduce", "#409eff"), ("scale", "#b37feb"), ("ps", "#e6a23c"),
          ("sfb", "#f56c6c"), ("topk", "#d4a017")]


def color_of(name):
    for prefix, color in COLORS:
        if name.startswith(prefix):
            return color
    return "#909399"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("png")
    ap.add_argument("--last-steps", type=int, default=2)
    args = ap.parse_args()
    with open(args.trace) as f:
        events = json.load(f)
    names = {e["tid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    spans = [e for e in events if e.get("ph") in ("X", "i") and "args" in e]
    steps = sorted({e["args"].get("step", 0) for e in spans})
    keep = set(steps[-args.last_steps:])
    spans = [e for e in spans if e["args"].get("step", 0) in keep]
    if not spans:
        raise SystemExit("no events in the chosen steps")
    t0 = min(e["ts"] for e in spans)
    fig, ax = plt.subplots(figsize=(11, 0.45 * len(names) + 1.5))
    seen = set()
    for e in spans:
        start = (e["ts"] - t0) / 1000.0
        if e["ph"] == "X":
            color = color_of(e["name"])
            label = e["name"] if e["name"] not in seen else None
            seen.add(e["name"])
            ax.barh(e["tid"], e["dur"] / 1000.0, left=start, color=color, height=0.6, label=label)
        elif e["name"] == "submit":
            ax.plot(start, e["tid"], "k|", markersize=10)
    ax.set_yticks(sorted(names))
    ax.set_yticklabels([names[t] for t in sorted(names)])
    ax.invert_yaxis()
    ax.set_xlabel("ms (| = submit)")
    ax.set_title(f"{os.path.basename(args.trace)}: engine phases per layer, steps {sorted(keep)}")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)


if __name__ == "__main__":
    main()
