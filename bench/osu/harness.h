// The OSU-style collective benchmark harness: one small library, one program per operation.
// The one header a program includes.
//
// A program defines a Collective (collective.h: how to size, fill, run and check one
// operation, ours and the peer's: Open MPI's own call, and its own flags) and calls RunMain
// (runner.h). The harness parses the common options (args.h) with the program's, prints
// bench/common's preamble and one row per size with nccl-tests' columns for ours and for the
// peer, and the busbw ratio ours / peer (report.h).
//
// Per size and per implementation: warm-up runs, then timed runs; before each timed run the
// output is poisoned (untimed) and the ranks meet in a barrier; after the run they meet in
// another (as OSU's loop does after each call), then every element is compared (untimed)
// with an exact formula (verify.h; sparse_inputs.h for the sparse
// exchanges), so a wrong or missing result shows in #wrong. Buffers (host or device) and their
// staging: buffers.h. Time is the average over the timed runs, averaged across ranks (min / max
// with -f).
//
// Laid out as nccl-tests lays out its common code:
//   args        the options every program takes, declared on bench/common's flag parser
//   collective  the interface a program implements, with its defaults
//   buffers     host / device buffers, one-call collectives' buffers, in-place buffers
//   verify      the exact formula and the bitwise check
//   sparse_inputs  sparse gradients with exactly known sums (osu_topk, osu_hybrid)
//   report      header, rows, JSON
//   runner      RunMain: MPI init, communicator, the sizes, timing, exit status
#pragma once

#include "bench/osu/args.h"
#include "bench/osu/buffers.h"
#include "bench/osu/collective.h"
#include "bench/osu/runner.h"
#include "bench/osu/sparse_inputs.h"
#include "bench/osu/verify.h"
