#!/usr/bin/env python3
"""torch.topk on the sizes of topk_gpu_bench, timed with CUDA events (median of 5 runs of
several iterations each), for the comparison with Poseidon's fused select on a GPU machine.

Columns, per n and density:
  topk ms       torch.topk(|r|, k): what a PyTorch top-k compressor does per step;
  add+topk ms   the residual update, torch.topk and the zeroing of the selected entries: the
                work of Poseidon's FusedResidualTopK, so the fair comparison;
  copy ms       a device copy (torch's dst.copy_(src)) of 6n bytes: the same 12n bytes of
                traffic (6n read, 6n written) as the fused pass (grad and residual read,
                residual written), i.e. topk_gpu_bench's BM_CopyTouchedBytes;
  add+topk/copy and topk/copy: how many such copies each costs (the fused kernel's floor is
                about 1; topk_gpu_bench prints the fused time against the same copy).
The copy bandwidth (bytes read + written over time) of one large copy is printed first.

    python3 bench/gpu/topk_torch.py [--sizes 1048576 25000000 100000000] [--reps 5]

Prints "no GPU: skipped" and exits 0 when torch or a CUDA device is missing.
"""
import argparse
import statistics
import sys


def median_ms(torch, fn, reps, iters):
    """Median over reps of the mean time of iters calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / iters)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1 << 20, 25_000_000, 100_000_000])
    ap.add_argument("--densities", type=float, nargs="+", default=[0.01, 0.001, 0.0001])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--copy-gib", type=float, default=1.0,
                    help="size of the buffer of the bandwidth copy (GiB)")
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
    print(f"topk_torch: torch {torch.__version__} (CUDA {torch.version.cuda}), "
          f"{torch.cuda.get_device_name(dev)}")

    def copy_ms(nbytes):
        src = torch.empty(nbytes, dtype=torch.uint8, device=dev).fill_(1)
        dst = torch.empty_like(src)
        ms = median_ms(torch, lambda: dst.copy_(src), args.reps, args.iters)
        del src, dst
        return ms

    big = int(args.copy_gib * (1 << 30))
    ms = copy_ms(big)
    print(f"copy bandwidth: {2 * big / ms / 1e6:.0f} GB/s (dst.copy_(src) of "
          f"{args.copy_gib:g} GiB: bytes read + written over the median time {ms:.3f} ms)")
    print(f"  {'n':>11} {'density':>8} {'topk ms':>9} {'add+topk ms':>12} {'copy ms':>9} "
          f"{'add+topk/copy':>14} {'topk/copy':>10}")
    gen = torch.Generator(device=dev).manual_seed(1)
    for n in args.sizes:
        copy = copy_ms(6 * n)
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

            t_topk = median_ms(torch, topk_only, args.reps, args.iters)
            t_add = median_ms(torch, add_topk, args.reps, args.iters)
            print(f"  {n:>11} {d * 100:>7.2f}% {t_topk:>9.3f} {t_add:>12.3f} {copy:>9.3f} "
                  f"{t_add / copy:>14.1f} {t_topk / copy:>10.1f}")
        del grad, residual
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
