"""Which tilings keep the bits: the Triton matmul port under several tilings, compared bitwise.

    python -m compare.matmul_tilings [--m 1000] [--n 4096] [--k 4096]

Runs the port with each tiling in TILINGS on the same bf16 inputs and reports whether its output
equals the first tiling's bit for bit, with the median time (triton.testing.do_bench, launch
included) on a GPU. On a CPU it runs through the Triton interpreter (float16, small sizes),
whose numpy dots sum in shape-dependent orders: there differences are expected and say
nothing about the GPU.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

TILINGS = [  # (tile_m, tile_n, tile_k, warps, stages); the first is the reference
    (128, 256, 64, 8, 3), (64, 64, 64, 4, 4), (128, 128, 64, 8, 3), (64, 128, 64, 4, 4), (128, 256, 64, 8, 4),
    (64, 256, 64, 4, 3), (128, 128, 64, 4, 4), (128, 256, 32, 8, 4), (128, 256, 128, 8, 2),
]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m compare.matmul_tilings", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    on_gpu = torch.cuda.is_available()
    parser.add_argument("--m", type=int, default=1000 if on_gpu else 70)
    parser.add_argument("--n", type=int, default=4096 if on_gpu else 96)
    parser.add_argument("--k", type=int, default=4096 if on_gpu else 160)
    args = parser.parse_args(argv)
    if not on_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import triton

    from ports import first_difference
    from ports.matmul import MatmulTiling
    from triton_kernels.matmul import matmul

    device, dtype = ("cuda", torch.bfloat16) if on_gpu else ("cpu", torch.float16)
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn((args.m, args.k), device=device, generator=gen).to(dtype)
    b = torch.randn((args.k, args.n), device=device, generator=gen).to(dtype)
    reference = None
    print(f"M={args.m} N={args.n} K={args.k} {dtype} on {device}")
    for tile_m, tile_n, tile_k, warps, stages in TILINGS:
        tiles = MatmulTiling(tile_m, tile_n, tile_k, warps=warps, stages=stages)
        out = matmul((a, b, "same"), tiles)
        reference = out if reference is None else reference
        difference = first_difference(out, reference)
        timing = ""
        if on_gpu:
            ms = triton.testing.do_bench(lambda: matmul((a, b, "same"), tiles), return_mode="median")
            timing = f"  {ms * 1e3:8.1f} us  {2 * args.m * args.n * args.k / ms / 1e9:6.0f} TFLOP/s"
        bits = "equal to the first" if difference is None else f"DIFFERS: {difference}"
        print(f"{tile_m:4}x{tile_n:<4} k{tile_k:<4} {warps} warps {stages} stages: {bits}{timing}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
