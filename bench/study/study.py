#!/usr/bin/env python3
"""Model-level study: VGG19, VGG19-22K, ResNet-152 and Inception-V3 at batch 32.

Steps:
  1. For each model and P in --nps (2, 4, 8): poseidon_model_trainer under mpirun on this host
     (shared memory), compute off (--compute-scale 0), modes dense and hybrid exchanged after
     the backward pass, so the iteration time is the exchange time per iteration. Models are
     shrunk to the fraction --scale of their parameters (default 1/8) so 8 ranks fit beside
     other work; the planner's prediction for the same shrunk layers is printed beside each
     measurement.
  2. The P=8 run also prints (for the FULL-size model) the plan per layer with the cost model
     measured here, bytes per iteration for each strategy alone and for the hybrid, and the
     predicted exchange time for P up to 64 with the measured model and with a stated
     10 Gbit/s cluster model (25 us per step, 1.25 GB/s, GPU-class kernels).
  3. Writes plans/<model>-P8-measured.txt, PNG plots, and the "Model-level study" section of
     bench/RESULTS.md.
"""
import argparse
import datetime
import os
import platform
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench", "cluster"))
from report import replace_section  # noqa: E402

MODELS = ["vgg19", "vgg19-22k", "resnet152", "inception-v3"]
PREDICT = [2, 4, 8, 16, 32, 64]


def kv_lines(text, tag):
    out = []
    for line in text.splitlines():
        if line.startswith(tag + " "):
            out.append(dict(item.split("=", 1) for item in line.split()[1:]))
    return out


def run_trainer(args, model, p, with_predict):
    cmd = ["timeout", "-k", "10", str(args.timeout), "mpirun", "-np", str(p), "--oversubscribe",
           "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1", args.trainer,
           "--model", model, "--scale", str(args.scale), "--compute-scale", "0",
           "--modes", "dense,hybrid", "--iters", str(args.iters), "--warmup", "1"]
    if with_predict:
        cmd += ["--predict", ",".join(map(str, PREDICT)), "--print-plan"]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1",
               POSEIDON_COST_CACHE=os.path.join(args.work, f"cost-shm-P{p}.txt"))
    print("+", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"study.py: {model} at P={p} failed (rc {r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout, " ".join(cmd[4:])


def plots(meas, pred, strat, out_dir):
    try:
        import matplotlib
    except ImportError:  # pyenv's python: use Debian's python3-matplotlib
        sys.path.append("/usr/lib/python3/dist-packages")
        import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # 1. Predicted exchange time per iteration vs P.
    fig, axes = plt.subplots(1, len(MODELS), figsize=(4.2 * len(MODELS), 3.6))
    for ax, model in zip(axes, MODELS):
        for cost, style in (("measured", "-"), ("net10g", "--")):
            rows = [r for r in pred if r["model"] == model and r["cost"] == cost]
            ps = [int(r["P"]) for r in rows]
            ax.plot(ps, [float(r["dense_ms"]) for r in rows], "o" + style, color="tab:red",
                    label=f"dense allreduce ({cost})")
            ax.plot(ps, [float(r["hybrid_ms"]) for r in rows], "s" + style, color="tab:blue",
                    label=f"hybrid ({cost})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(model)
        ax.set_xlabel("P (ranks)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("predicted exchange ms / iteration")
    axes[0].legend(fontsize=7)
    fig.suptitle("Planner prediction, full-size models, batch 32 "
                 "(measured: this host's cost model; net10g: 10 Gbit/s, 25 us)", fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "predicted_exchange_time.png"), dpi=110)
    plt.close(fig)

    # 2. Bytes per iteration per strategy at P=8 (10 Gbit/s model).
    fig, ax = plt.subplots(figsize=(8, 3.8))
    names = ["allreduce", "ps", "sfb", "topk", "hybrid"]
    width = 0.16
    for j, name in enumerate(names):
        vals = []
        for model in MODELS:
            if name == "hybrid":
                r = [x for x in pred if x["model"] == model and x["cost"] == "net10g"
                     and x["P"] == "8"][0]
                vals.append(float(r["hybrid_MB"]))
            else:
                r = [x for x in strat if x["model"] == model and x["cost"] == "net10g"
                     and x["P"] == "8" and x["strategy"] == name][0]
                vals.append(float(r["MB"]))
        ax.bar([i + (j - 2) * width for i in range(len(MODELS))], vals, width, label=name)
    ax.set_xticks(range(len(MODELS)))
    ax.set_xticklabels(MODELS)
    ax.set_yscale("log")
    ax.set_ylabel("MB sent per rank per iteration")
    ax.set_title("Bytes per iteration at P=8 (each strategy alone where it applies; "
                 "hybrid = planner)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "bytes_per_strategy.png"), dpi=110)
    plt.close(fig)

    # 3. Measured exchange time here vs the planner's prediction for the same shrunk layers.
    fig, axes = plt.subplots(1, len(MODELS), figsize=(4.2 * len(MODELS), 3.6))
    for ax, model in zip(axes, MODELS):
        for mode, color in (("dense", "tab:red"), ("hybrid", "tab:blue")):
            rows = sorted([r for r in meas if r["model"] == model and r["mode"] == mode],
                          key=lambda r: int(r["np"]))
            ps = [int(r["np"]) for r in rows]
            ax.plot(ps, [float(r["iter_ms"]) for r in rows], "o-", color=color,
                    label=f"{mode} measured")
            ax.plot(ps, [float(r["pred_exchange_ms"]) for r in rows], "x:", color=color,
                    label=f"{mode} predicted")
        ax.set_title(f"{model} (x{meas[0]['scale']})")
        ax.set_xlabel("P (ranks, shared memory)")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("exchange ms / iteration")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "measured_exchange_time.png"), dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser()
    build = os.environ.get("POSEIDON_BUILD_DIR", os.path.join(ROOT, "build"))
    ap.add_argument("--trainer", default=os.path.join(build, "bench", "poseidon_model_trainer"))
    ap.add_argument("--nps", default="2,4,8")
    ap.add_argument("--scale", type=float, default=0.125)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--results", default=os.path.join(ROOT, "bench", "RESULTS.md"))
    ap.add_argument("--work", default="/tmp/psd-study")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    os.makedirs(os.path.join(HERE, "plans"), exist_ok=True)
    nps = [int(x) for x in a.nps.split(",")]
    meas, pred, strat, cmds, plans = [], [], [], [], {}
    for model in MODELS:
        for p in nps:
            out, cmd = run_trainer(a, model, p, p == max(nps))
            cmds.append(cmd)
            meas += kv_lines(out, "RESULT")
            if p == max(nps):
                pred += kv_lines(out, "PREDICT")
                strat += kv_lines(out, "STRATEGY")
                m = re.search(r"# full-size plan of .*", out, re.S)
                plans[model] = m.group(0) if m else ""
                with open(os.path.join(HERE, "plans", f"{model}-P{p}-measured.txt"), "w") as f:
                    f.write(plans[model])
                with open(os.path.join(a.work, f"{model}-P{p}.log"), "w") as f:
                    f.write(out)
    plots(meas, pred, strat, HERE)

    pmax = max(nps)
    date = datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC")
    L = [f"Run {date} on {platform.node()} ({platform.platform()}, {os.cpu_count()} cores), "
         f"Open MPI over shared memory, one host. Command: `python3 bench/study/study.py "
         f"--nps {a.nps} --scale {a.scale} --iters {a.iters}` (it runs, per model and P, e.g. "
         f"`{cmds[-1]}`). Plots: bench/study/*.png; full-size plans per layer at P={pmax}: "
         "bench/study/plans/.", "",
         "Cost models: *measured* = the probe of this host at P=%d (alpha-beta per collective, "
         "CPU kernels), extrapolated to larger P by the alpha-beta formulas; *net10g* = a stated "
         "10 Gbit/s cluster: 25 us per ring step, 1.25 GB/s, GPU-class GEMM 1000 GFLOP/s." % pmax,
         "", "### Plan and bytes per iteration (full-size models, batch 32, P=8)", "",
         "Bytes are wire bytes per rank per iteration, each strategy alone where it applies "
         "(allreduce elsewhere; ps with SGD on the shard owners; topk at density 0.001 on every "
         "layer, lossy) and the hybrid the planner picks (lossless candidates: no optimizer, "
         "no sparse layers, so allreduce or sfb).", "",
         "| model | layers | FC layers -> sfb (measured / net10g) | allreduce MB | ps MB | sfb MB "
         "| topk MB | hybrid MB (net10g) | hybrid MB (measured) |",
         "|---|---|---|---|---|---|---|---|---|"]
    for model in MODELS:
        def s(name):
            return float([x for x in strat if x["model"] == model and x["cost"] == "net10g"
                          and x["P"] == "8" and x["strategy"] == name][0]["MB"])

        def pr(cost):
            return [x for x in pred if x["model"] == model and x["cost"] == cost
                    and x["P"] == "8"][0]
        pm, pn = pr("measured"), pr("net10g")
        nfc = sum(1 for line in plans[model].splitlines() if " fc " in line)
        L.append(f"| {model} | {sum(int(pn[k]) for k in ('n_allreduce', 'n_ps', 'n_sfb', 'n_topk'))}"
                 f" | {pm['n_sfb']} / {pn['n_sfb']} of {nfc} | {s('allreduce'):.1f} | {s('ps'):.1f}"
                 f" | {s('sfb'):.1f} | {s('topk'):.2f} | {float(pn['hybrid_MB']):.1f} | "
                 f"{float(pm['hybrid_MB']):.1f} |")
    L += ["", f"### Measured exchange time per iteration here (shared memory, models x{a.scale})",
          "", "Compute off; the exchange runs after the backward pass, so iteration time = "
          "exchange time (slowest rank, mean of the timed iterations). *pred* is the planner's "
          "prediction for the same shrunk layers with the measured cost model.", "",
          "| model | P | dense ms | dense pred ms | hybrid ms | hybrid pred ms | dense/hybrid "
          "| MB dense | MB hybrid | check |", "|---|---|---|---|---|---|---|---|---|---|"]
    for model in MODELS:
        for p in nps:
            d = [r for r in meas if r["model"] == model and r["np"] == str(p)
                 and r["mode"] == "dense"][0]
            h = [r for r in meas if r["model"] == model and r["np"] == str(p)
                 and r["mode"] == "hybrid"][0]
            ok = "ok" if d["check"] == "ok" and h["check"] == "ok" else "FAIL"
            L.append(f"| {model} | {p} | {float(d['iter_ms']):.1f} | "
                     f"{float(d['pred_exchange_ms']):.1f} | {float(h['iter_ms']):.1f} | "
                     f"{float(h['pred_exchange_ms']):.1f} | "
                     f"{float(d['iter_ms']) / float(h['iter_ms']):.2f} | "
                     f"{float(d['MB_per_iter']):.1f} | {float(h['MB_per_iter']):.1f} | {ok} |")
    L += ["", "### Predicted exchange time per iteration, full-size models, P up to 64", "",
          "| model | cost model | " + " | ".join(f"P={p} dense / hybrid ms" for p in PREDICT)
          + " |", "|---|---|" + "---|" * len(PREDICT)]
    for model in MODELS:
        for cost in ("measured", "net10g"):
            cells = []
            for p in PREDICT:
                r = [x for x in pred if x["model"] == model and x["cost"] == cost
                     and x["P"] == str(p)][0]
                cells.append(f"{float(r['dense_ms']):.0f} / {float(r['hybrid_ms']):.0f}")
            L.append(f"| {model} | {cost} | " + " | ".join(cells) + " |")
    L += ["", "![predicted](study/predicted_exchange_time.png)",
          "![bytes](study/bytes_per_strategy.png)",
          "![measured](study/measured_exchange_time.png)"]
    replace_section(a.results, "Model-level study", "\n".join(L))
    print("\n".join(L))


if __name__ == "__main__":
    main()
