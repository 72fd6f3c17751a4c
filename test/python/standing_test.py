#!/usr/bin/env python3
"""bench/osu/standing.py on documents shaped like best_peer.py --json output: the rows it
groups, the ratios it spans, the sizes it reports below their floor, its exit status, and its
errors. Standard library only; run as `standing_test.py REPO`."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

REPO = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "bench", "osu", "standing.py")


def row(size, sel, conf, wrong=0):
    return {"size": size, "best_over_ours": sel, "confirm_best_over_ours": conf,
            "wrong_ours": wrong, "wrong_peer": 0, "confirm_wrong": 0}


def doc(program, p, rows, start="2026-12-02T07:35:00+00:00", end="2026-12-02T07:37:00+00:00"):
    return {"program": program, "world_size": p, "rows": rows, "host": "vm",
            "meta": {"cpu": "AMD EPYC", "mpi": "Open MPI v4.1.4"}, "started_utc": start,
            "finished_utc": end, "mpi_thread_levels": ["single"]}


class Standing(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def write(self, name, content):
        path = os.path.join(self.dir.name, name)
        with open(path, "w") as f:
            f.write(content if isinstance(content, str) else json.dumps(content))
        return path

    def run_script(self, *args):
        return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                              timeout=60)

    def table_rows(self, out):
        return [line for line in out.splitlines() if line.startswith("| ") and
                not line.startswith("| collective")]

    def test_small_and_large_files_share_a_row(self):
        small = self.write("s.json", doc("osu_allreduce", 4, [row(4, 1.5, 1.7), row(4096, 2.5, 2.0)]))
        large = self.write("l.json", doc("osu_allreduce", 4, [row(8192, 3.0, 3.5),
                                                               row(64 << 20, 2.6, 2.7)],
                                         end="2026-12-02T08:10:00+00:00"))
        bcast = self.write("b.json", doc("osu_broadcast", 2, [row(4, 0.9, 1.1), row(16, 1.2, 0.8)]))
        r = self.run_script(bcast, large, small)
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = self.table_rows(r.stdout)
        self.assertEqual(rows, [
            "| allreduce | 4 | 4 B-64 MiB | 1.50-3.00 | 1.70-3.50 | none | 0 |",
            "| broadcast | 2 | 4 B-16 B | 0.90-1.20 | 0.80-1.10 | 4 B: 0.90 / 1.10; "
            "16 B: 1.20 / 0.80 | 0 |",
        ])
        self.assertIn("2026-12-02 07:35 to 2026-12-02 08:10 UTC", r.stdout)

    def test_floor_rule_and_check(self):
        f = self.write("a.json", doc("osu_allreduce", 4, [row(8 << 20, 2.2, 2.6),
                                                           row(16 << 20, 2.57, 2.42),
                                                           row(64 << 20, 2.53, 2.75, wrong=1)]))
        r = self.run_script(f, "--floor", "allreduce:4:16M:64M:2.5", "--check")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertEqual(self.table_rows(r.stdout), [
            "| allreduce | 4 | 8 MiB-64 MiB | 2.20-2.57 | 2.42-2.75 | "
            "16 MiB: 2.57 / 2.42 (floor 2.50) | 1 |"])
        # A rule for another world size does not apply; without --check the status is 0.
        r = self.run_script(f, "--floor", "allreduce:8:16M:64M:2.5")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("| none |", r.stdout)
        r = self.run_script(f, "--check")
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_markdown_file(self):
        f = self.write("a.json", doc("osu_allgather", 8, [row(4, 1.1, 1.2)]))
        out = os.path.join(self.dir.name, "out.md")
        r = self.run_script(f, "--markdown", out)
        self.assertEqual((r.returncode, r.stdout), (0, ""), r.stderr)
        with open(out) as fh:
            self.assertIn("| allgather | 8 | 4 B-4 B | 1.10-1.10 | 1.20-1.20 | none | 0 |",
                          fh.read())

    def test_errors_name_the_input(self):
        good = self.write("g.json", doc("osu_allreduce", 2, [row(4, 1.1, 1.2)]))
        cases = [
            ([os.path.join(self.dir.name, "missing.json")], "missing.json: cannot read it"),
            ([self.write("t.json", "not json")], "t.json: cannot read it as JSON"),
            ([self.write("k.json", {"program": "osu_allreduce"})], "no 'world_size'"),
            ([self.write("p.json", doc("osu_topk", 2, []))], "program 'osu_topk'"),
            ([self.write("e.json", doc("osu_allreduce", 2, []))], "e.json: expected rows"),
            ([self.write("r.json", doc("osu_allreduce", 2, [{"best_over_ours": 1.0}]))],
             "a row without one"),
            ([good, good], "4 B is also in an earlier file"),
            ([good, "--floor", "allreduce:4:16M:2.5"], "expected COLL:P:MIN:MAX:RATIO"),
            ([good, "--floor", "alltoall:4:16M:64M:2.5"], "collective 'alltoall'"),
            ([good, "--floor", "allreduce:0:16M:64M:2.5"], "world size '0'"),
            ([good, "--floor", "allreduce:4:16Q:64M:2.5"], "size '16Q' is not a byte count"),
            ([good, "--floor", "allreduce:4:64M:16M:2.5"], "the range 64M..16M is empty"),
            ([good, "--floor", "allreduce:4:16M:64M:-1"], "ratio '-1'"),
        ]
        for args, message in cases:
            with self.subTest(args=args[-1]):
                r = self.run_script(*args)
                self.assertEqual(r.returncode, 2, r.stdout)
                self.assertIn(message, r.stderr)


if __name__ == "__main__":
    unittest.main()
