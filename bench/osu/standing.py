#!/usr/bin/env python3
"""Where Poseidon stands against Open MPI's best, from bench/osu/best_peer.py's --json files.

best_peer.py writes one table per collective, world size and size range. This script reads
any number of its JSON files and prints one Markdown table with a row per collective and world
size (several files of the same collective and P, such as a small-size and a large-size run,
share a row): the lowest and highest best / ours ratio in the selection and in the
confirmation, and every size where either falls below its floor, with both figures. Nothing is
measured here; every number comes from the files.

A floor is 1.0 (Poseidon at least as fast as Open MPI's best) unless a --floor rule sets
another for some sizes, e.g. the allreduce at P = 4 from 16 MiB to 64 MiB at 2.5:
    --floor allreduce:4:16M:64M:2.5

Exit status: 0 when every size meets its floor in both columns, 1 when some size does not
(--check only; otherwise 0), 2 on bad input (a missing file, a file best_peer.py did not
write, a bad rule).

Usage:
  bench/osu/standing.py FILE.json [FILE.json ...] [--floor COLL:P:MIN:MAX:RATIO ...]
      [--markdown OUT] [--check]

Standard library only.
"""

import argparse
import json
import sys

from best_peer import human_size  # this directory's best_peer.py: the sizes as its tables name them

ORDER = ["allreduce", "reduce_scatter", "allgather", "broadcast"]
UNITS = {"": 1, "B": 1, "K": 1 << 10, "KiB": 1 << 10, "M": 1 << 20, "MiB": 1 << 20,
         "G": 1 << 30, "GiB": 1 << 30}


def fail(msg):
    print("standing.py: " + msg, file=sys.stderr)
    sys.exit(2)


def parse_bytes(text, rule):
    text = text.strip()
    digits = text.rstrip("KMGiB")
    unit = text[len(digits):]
    if not digits.isdigit() or unit not in UNITS:
        fail("--floor %r: size %r is not a byte count (e.g. 4096, 64K, 16M)" % (rule, text))
    return int(digits) * UNITS[unit]


def parse_floor(rule):
    parts = rule.split(":")
    if len(parts) != 5:
        fail("--floor %r: expected COLL:P:MIN:MAX:RATIO, e.g. allreduce:4:16M:64M:2.5" % rule)
    coll, p, lo, hi, ratio = parts
    if coll not in ORDER:
        fail("--floor %r: collective %r is not one of %s" % (rule, coll, ", ".join(ORDER)))
    if not p.isdigit() or int(p) < 1:
        fail("--floor %r: world size %r is not a positive integer" % (rule, p))
    try:
        r = float(ratio)
    except ValueError:
        r = -1.0
    if r <= 0:
        fail("--floor %r: ratio %r is not a positive number" % (rule, ratio))
    lo_b, hi_b = parse_bytes(lo, rule), parse_bytes(hi, rule)
    if lo_b > hi_b:
        fail("--floor %r: the range %s..%s is empty" % (rule, lo, hi))
    return (coll, int(p), lo_b, hi_b, r)


def load(path):
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        fail("%s: cannot read it as JSON (%s)" % (path, e))
    for key in ("program", "world_size", "rows"):
        if key not in doc:
            fail("%s: no %r: not a file bench/osu/best_peer.py --json wrote" % (path, key))
    name = doc["program"][len("osu_"):] if doc["program"].startswith("osu_") else ""
    if name not in ORDER:
        fail("%s: program %r is not one of osu_%s" % (path, doc["program"], ", osu_".join(ORDER)))
    if not doc["rows"] or not all(isinstance(r, dict) and isinstance(r.get("size"), int)
                                  for r in doc["rows"]):
        fail("%s: expected rows with a byte size each, as best_peer.py writes them; found %s"
             % (path, "none" if not doc["rows"] else "a row without one"))
    doc["collective_name"] = name
    return doc


def floor_of(floors, coll, p, size):
    ratio = 1.0
    for c, fp, lo, hi, r in floors:
        if c == coll and fp == p and lo <= size <= hi:
            ratio = r
    return ratio


def span(values):
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    return "%.2f-%.2f" % (min(vals), max(vals))


def main():
    ap = argparse.ArgumentParser(
        description="One table of Poseidon against Open MPI's best, from best_peer.py --json files")
    ap.add_argument("files", nargs="+", help="best_peer.py --json outputs")
    ap.add_argument("--floor", action="append", default=[], metavar="COLL:P:MIN:MAX:RATIO",
                    help="a floor other than 1.0 for these sizes (repeatable; the last match "
                         "wins)")
    ap.add_argument("--markdown", help="write the table here instead of stdout")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 when some size is below its floor in either column")
    a = ap.parse_args()
    floors = [parse_floor(r) for r in a.floor]

    groups = {}  # (collective, P) -> {size: row}
    hosts, starts, ends, levels = set(), [], [], set()
    for path in a.files:
        doc = load(path)
        key = (doc["collective_name"], int(doc["world_size"]))
        rows = groups.setdefault(key, {})
        for r in doc["rows"]:
            if r["size"] in rows:
                fail("%s: %s at P = %d, %s is also in an earlier file; give each size once"
                     % (path, key[0], key[1], human_size(r["size"])))
            rows[r["size"]] = r
        meta = doc.get("meta") or {}
        hosts.add("%s (%s), %s" % (doc.get("host", "?"), meta.get("cpu", "?"),
                                   meta.get("mpi", "?")))
        starts.append(doc.get("started_utc", ""))
        ends.append(doc.get("finished_utc", ""))
        levels.update(doc.get("mpi_thread_levels") or [])

    out = []
    out.append("Machine: %s. Runs %s to %s UTC. MPI thread level: %s. Ratios are best / ours "
               "(> 1: Poseidon faster); the floor is 1.0 unless a rule below says otherwise."
               % ("; ".join(sorted(hosts)), min(starts)[:16].replace("T", " "),
                  max(ends)[:16].replace("T", " "), ", ".join(sorted(levels)) or "?"))
    if floors:
        out.append("")
        out.append("Floors: " + "; ".join(
            "%s at P = %d, %s-%s: %.2f" % (c, p, human_size(lo), human_size(hi), r)
            for c, p, lo, hi, r in floors) + ".")
    out.append("")
    out.append("| collective | P | sizes | best / ours, selection | confirmed | below the floor "
               "(size: selection / confirmed) | #wrong |")
    out.append("|---|---|---|---|---|---|---|")
    below_any = False
    for key in sorted(groups, key=lambda k: (ORDER.index(k[0]), k[1])):
        rows = [groups[key][s] for s in sorted(groups[key])]
        below = []
        for r in rows:
            f = floor_of(floors, key[0], key[1], r["size"])
            sel, conf = r.get("best_over_ours"), r.get("confirm_best_over_ours")
            if any(v is not None and v < f for v in (sel, conf)):
                below.append("%s: %s / %s%s" % (
                    human_size(r["size"]), "-" if sel is None else "%.2f" % sel,
                    "-" if conf is None else "%.2f" % conf,
                    "" if f == 1.0 else " (floor %.2f)" % f))
        below_any = below_any or bool(below)
        wrong = sum(r.get("wrong_ours", 0) + r.get("wrong_peer", 0) + r.get("confirm_wrong", 0)
                    for r in rows)
        out.append("| %s | %d | %s-%s | %s | %s | %s | %d |" % (
            key[0], key[1], human_size(rows[0]["size"]), human_size(rows[-1]["size"]),
            span(r.get("best_over_ours") for r in rows),
            span(r.get("confirm_best_over_ours") for r in rows),
            "; ".join(below) if below else "none", wrong))
    text = "\n".join(out) + "\n"
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 1 if (a.check and below_any) else 0


if __name__ == "__main__":
    sys.exit(main())
