#!/usr/bin/env python3
"""torch.topk on the sizes of topk_gpu_bench, timed with CUDA events (median of 5 runs of
several iterations each), for the comparison with Poseidon's fused select on a GPU machine.

torch.topk(|r|, k) is what a PyTorch top-k compressor does per step; it does not fuse the
residual update, so the fused kernel's figure includes work this one does not do (the
`+ add` column times the residual update and the topk together, the fair comparison).

    python3 bench/gpu/topk_torch.py [--sizes 1048576 25000000 100000000] [--reps 5]

Prints "no GPU: skipped" and exits 0 when torch or a CUDA device is missing.
"""
import argparse
import statistics
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1 << 20, 25_000_000, 100_000_000])
    ap.add_argument("--densities", type=float, nargs="+", default=[0.01, 0.001, 0.0001])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("topk_torch: no GPU: skipped (torch is not installed)")
        return 0
    if not torch.cuda.is_available():
        print("topk_torch: no GPU: skipped (torch.cuda.is_available() is False)")
        return 0

    dev = torch.device("cuda")
    print(f"topk_torch: torch {torch.__version__}, {torch.cuda.get_device_name(dev)}")
    print(f"  {'n':>11} {'density':>8} {'topk ms':>10} {'add+topk ms':>12}")
    gen = torch.Generator(device=dev).manual_seed(1)
    for n in args.sizes:
        grad = torch.randn(n, device=dev, generator=gen)
        residual = torch.randn(n, device=dev, generator=gen)
        for d in args.densities:
            k = max(1, int(n * d))

            def topk_only():
                return torch.topk(residual.abs(), k, sorted=False)

            def add_topk():
                residual.add_(grad)
                _, idx = torch.topk(residual.abs(), k, sorted=False)
                residual[idx] = 0  # the selected entries leave the residual, as in Poseidon
                return idx

            results = []
            for fn in (topk_only, add_topk):
                fn()  # warm-up (allocator, kernels)
                times = []
                for _ in range(args.reps):
                    start = torch.cuda.Event(enable_timing=True)
                    stop = torch.cuda.Event(enable_timing=True)
                    start.record()
                    for _ in range(args.iters):
                        fn()
                    stop.record()
                    stop.synchronize()
                    times.append(start.elapsed_time(stop) / args.iters)
                results.append(statistics.median(times))
            print(f"  {n:>11} {d * 100:>7.2f}% {results[0]:>10.3f} {results[1]:>12.3f}")
        del grad, residual
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
