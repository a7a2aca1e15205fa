"""Which Gluon matmul outputs go wrong at M x N x K = 3000 x 5120 x 2880 (the `shapes` case that fails), and which
neighbouring shapes share it: for each shape, the relative Frobenius error of the Gluon and Triton ports against a
float32 torch matmul, three runs, and the 128 x 256 output tiles whose error is over 1e-2.

    PYTHONPATH=. python results/h200/experiments/gluon-matmul/ragged_failure.py   (on a GPU)
"""
import torch

from gluon_kernels.matmul import gluon_tiling, matmul as gluon_matmul
from triton_kernels.matmul import matmul as triton_matmul

SHAPES = [(3000, 5120, 2880), (3072, 5120, 2880), (3000, 5120, 4096), (3000, 4096, 2880), (2944, 5120, 2880),
          (3000, 2880, 2880), (1025, 5120, 2880), (4096, 5120, 2880), (3000, 5120, 2816), (3000, 5120, 2944)]


def bad_tiles(c, ref, tile_m, tile_n):
    tiles = []
    for r in range(0, c.shape[0], tile_m):
        for s in range(0, c.shape[1], tile_n):
            part, want = c[r:r + tile_m, s:s + tile_n].float(), ref[r:r + tile_m, s:s + tile_n]
            error = (torch.linalg.norm(part - want) / torch.linalg.norm(want)).item()
            if not error < 1e-2:
                tiles.append((r // tile_m, s // tile_n))
    return tiles


def main():
    gen = torch.Generator(device="cuda").manual_seed(0)
    print(f"{'M x N x K':>18} {'tiles':>16} {'port':>7} {'run errors':>30}  bad tiles (row, col)")
    for m, n, k in SHAPES:
        a = torch.randn((m, k), device="cuda", generator=gen).to(torch.bfloat16)
        b = torch.randn((k, n), device="cuda", generator=gen).to(torch.bfloat16)
        ref = a.float() @ b.float()
        tiles = gluon_tiling(m, n)
        for port, function in (("gluon", gluon_matmul), ("triton", triton_matmul)):
            errors, bad = [], []
            for _ in range(3):
                c = function((a, b, "same"))
                torch.cuda.synchronize()
                errors.append((torch.linalg.norm(c.float() - ref) / torch.linalg.norm(ref)).item())
                bad = bad or bad_tiles(c, ref, tiles.tile_m, tiles.tile_n)
            shown = ", ".join(f"{e:.2g}" for e in errors)
            print(f"{m:>5} x {n:>5} x {k:>5} {tiles.tile_m:>4}x{tiles.tile_n}x{tiles.tile_k}/{tiles.stages} {port:>7} "
                  f"{shown:>30}  {len(bad)} {bad[:12]}")


if __name__ == "__main__":
    main()
