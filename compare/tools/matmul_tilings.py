"""Which tilings keep the bits: the Triton matmul port under several tilings, compared bitwise.

    python -m compare.tools.matmul_tilings [--m 1,128,1000] [--n 4096] [--k 4096]
    python -m compare.tools.matmul_tilings --cases shapes

For each M, runs the port with each tiling in TILINGS on the same bf16 inputs and reports
whether its output equals the first tiling's bit for bit and, on a GPU, its kernel time
(torch.profiler, the median of 10 calls each after an L2 flush, no launch overhead) next to cuBLAS's. On a CPU it runs
through the Triton interpreter (float16, small sizes), whose numpy dots sum in shape-dependent
orders: there differences are expected and say nothing about the GPU.
With --cases SET, the same for each M x N x K of the matmul workload's case set, then a line a case: the kernel
time of the tiling the port chooses (`matmul_tiling`), of the fastest tiling, and cuBLAS's: the data for a tile
heuristic.
"""
from __future__ import annotations

import argparse
import sys

import torch

from compare import gpu_or_interpreters
from compare.timing import median_kernel_us

TILINGS = [  # (tile_m, tile_n, tile_k, warps, stages); the first is the reference
    (128, 256, 64, 8, 3), (64, 64, 64, 4, 4), (128, 128, 64, 8, 3), (64, 128, 64, 4, 4), (128, 256, 64, 8, 4),
    (64, 256, 64, 4, 3), (128, 128, 64, 4, 4), (128, 256, 32, 8, 4), (128, 256, 128, 8, 2),
    (64, 32, 64, 4, 4), (64, 32, 64, 4, 6), (64, 16, 64, 4, 6), (64, 64, 64, 4, 6), (64, 32, 128, 4, 4),
]


def compare_tilings(m: int, n: int, k: int, on_gpu: bool):
    """Prints each tiling's line for one M x N x K; returns (the chosen tiling's us, the fastest's us, the fastest
    tiling, cuBLAS's us), each None without a GPU."""
    from ports import first_difference
    from kernel_support.matmul_common import MatmulTiling, matmul_tiling
    from triton_kernels.matmul import matmul

    device, dtype = ("cuda", torch.bfloat16) if on_gpu else ("cpu", torch.float16)
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn((m, k), device=device, generator=gen).to(dtype)
    b = torch.randn((k, n), device=device, generator=gen).to(dtype)
    cublas = median_kernel_us(lambda d: d[0] @ d[1], (a, b)) if on_gpu else None
    print(f"M={m} N={n} K={k} {dtype} on {device}" + (f"; cuBLAS {cublas:.1f} us" if on_gpu else ""))
    chosen = matmul_tiling(m, n)
    tilings = [MatmulTiling(tile_m, tile_n, tile_k, warps=warps, stages=stages)
               for tile_m, tile_n, tile_k, warps, stages in TILINGS]
    reference, times = None, {}
    for tiles in tilings + ([chosen] if chosen not in tilings else []):
        out = matmul((a, b, "same"), tiles)
        reference = out if reference is None else reference
        difference = first_difference(out, reference)
        timing = ""
        if on_gpu:
            times[tiles] = us = median_kernel_us(lambda data: matmul(data, tiles), (a, b, "same"))
            timing = f"  {us:8.1f} us  {2 * m * n * k / us / 1e6:6.0f} TFLOP/s"
        bits = "equal to the first" if difference is None else f"DIFFERS: {difference}"
        print(f"{tiles.tile_m:4}x{tiles.tile_n:<4} k{tiles.tile_k:<4} {tiles.warps} warps {tiles.stages} stages: "
              f"{bits}{timing}{'  (chosen)' if tiles == chosen else ''}", flush=True)
    if not on_gpu:
        return None, None, None, None
    fastest = min(times, key=times.get)
    label = f"{fastest.tile_m}x{fastest.tile_n} k{fastest.tile_k} {fastest.warps}w {fastest.stages}s"
    return times[chosen], times[fastest], label, cublas


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m compare.tools.matmul_tilings", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    on_gpu = gpu_or_interpreters()
    parser.add_argument("--m", default="1,128,1000" if on_gpu else "70", help="comma-separated row counts")
    parser.add_argument("--n", type=int, default=4096 if on_gpu else 96)
    parser.add_argument("--k", type=int, default=4096 if on_gpu else 160)
    parser.add_argument("--cases", help="a case set of the matmul workload (shapes, say): its M x N x K in place of "
                                        "--m, --n and --k")
    args = parser.parse_args(argv)

    from ports import matmul as spec

    if args.cases:
        if args.cases not in spec.WORKLOAD.cases:
            parser.error(f"--cases {args.cases}: no such case set; valid: {', '.join(spec.WORKLOAD.cases)}")
        sizes = [(case["m"], case["n"], case["k"]) for case in spec.WORKLOAD.cases[args.cases]]
    else:
        sizes = [(int(text), args.n, args.k) for text in args.m.split(",")]
    summary = [compare_tilings(m, n, k, on_gpu) for m, n, k in sizes]
    if args.cases and on_gpu:
        print(f"\n{'M x N x K':>22} {'chosen us':>10} {'fastest us':>11}  {'fastest tiling':<24} {'cuBLAS us':>9}")
        for (m, n, k), (chosen, fastest, label, cublas) in zip(sizes, summary):
            print(f"{m:>6} x {n:>6} x {k:>5} {chosen:>10.1f} {fastest:>11.1f}  {label:<24} {cublas:>9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
