"""Which tilings keep the bits: the Triton matmul port under several tilings, compared bitwise.

    python -m compare.matmul_tilings [--m 1,128,1000] [--n 4096] [--k 4096]

For each M, runs the port with each tiling in TILINGS on the same bf16 inputs and reports
whether its output equals the first tiling's bit for bit and, on a GPU, its kernel time
(torch.profiler, mean of 20 calls, no launch overhead) next to cuBLAS's. On a CPU it runs
through the Triton interpreter (float16, small sizes), whose numpy dots sum in shape-dependent
orders: there differences are expected and say nothing about the GPU.
"""
from __future__ import annotations

import argparse
import sys

import torch

from compare import gpu_or_interpreters

TILINGS = [  # (tile_m, tile_n, tile_k, warps, stages); the first is the reference
    (128, 256, 64, 8, 3), (64, 64, 64, 4, 4), (128, 128, 64, 8, 3), (64, 128, 64, 4, 4), (128, 256, 64, 8, 4),
    (64, 256, 64, 4, 3), (128, 128, 64, 4, 4), (128, 256, 32, 8, 4), (128, 256, 128, 8, 2),
    (64, 32, 64, 4, 4), (64, 32, 64, 4, 6), (64, 16, 64, 4, 6), (64, 64, 64, 4, 6), (64, 32, 128, 4, 4),
]


def _kernel_us(function, data) -> float:
    from compare.kernel_times import kernel_times

    return sum(kernel_times(function, data, runs=20).values()) * 1e3


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m compare.matmul_tilings", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    on_gpu = gpu_or_interpreters()
    parser.add_argument("--m", default="1,128,1000" if on_gpu else "70", help="comma-separated row counts")
    parser.add_argument("--n", type=int, default=4096 if on_gpu else 96)
    parser.add_argument("--k", type=int, default=4096 if on_gpu else 160)
    args = parser.parse_args(argv)

    from ports import first_difference
    from ports.matmul_common import MatmulTiling
    from triton_kernels.matmul import matmul

    device, dtype = ("cuda", torch.bfloat16) if on_gpu else ("cpu", torch.float16)
    gen = torch.Generator(device=device).manual_seed(0)
    for m in (int(text) for text in args.m.split(",")):
        a = torch.randn((m, args.k), device=device, generator=gen).to(dtype)
        b = torch.randn((args.k, args.n), device=device, generator=gen).to(dtype)
        print(f"M={m} N={args.n} K={args.k} {dtype} on {device}"
              + (f"; cuBLAS {_kernel_us(lambda d: d[0] @ d[1], (a, b)):.1f} us" if on_gpu else ""))
        reference = None
        for tile_m, tile_n, tile_k, warps, stages in TILINGS:
            tiles = MatmulTiling(tile_m, tile_n, tile_k, warps=warps, stages=stages)
            out = matmul((a, b, "same"), tiles)
            reference = out if reference is None else reference
            difference = first_difference(out, reference)
            timing = ""
            if on_gpu:
                us = _kernel_us(lambda data: matmul(data, tiles), (a, b, "same"))
                timing = f"  {us:8.1f} us  {2 * m * args.n * args.k / us / 1e6:6.0f} TFLOP/s"
            bits = "equal to the first" if difference is None else f"DIFFERS: {difference}"
            print(f"{tile_m:4}x{tile_n:<4} k{tile_k:<4} {warps} warps {stages} stages: {bits}{timing}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
