"""What the matmul ports share: their tiling and the heuristic that picks it for a shape (one tiling for all four
ports, so that they give the same bits)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MatmulTiling:
    """Tiles shared by the Triton and Pallas ports. Every tiling sums each element over K in the
    same sequence of 16-deep tensor-core steps, so all of them give the same bits on the H200
    (measured: `python -m compare.matmul_tilings`, and the driver's batch-invariance sweep, which
    crosses from the small tiles to the large ones)."""

    tile_m: int
    tile_n: int
    tile_k: int = 64
    group_m: int = 8
    warps: int = 8
    stages: int = 3


SMALL_M = 128
PROGRAMS_WANTED = 128  # about one program per SM (132 on the H200)
SMALL_TILES = {  # tile_n: (tile_k, stages), the fastest measured for 64-row tiles (results/h200/NOTES.md)
    128: (64, 4), 64: (64, 6), 32: (128, 4)}


def matmul_tiling(m: int, n: int) -> MatmulTiling:
    """Small batches: 64-row tiles, with the widest column tile that still gives about a program
    per SM (without split-K, the programs streaming B are what bounds small-M latency).
    Large batches: 128 x 256 tiles, or 128 x 128 where that is too few programs (M = 512 at N = 4096)."""
    if m <= SMALL_M:
        row_tiles = -(-m // 64)
        tile_n = next((width for width in (128, 64) if row_tiles * -(-n // width) >= PROGRAMS_WANTED), 32)
        tile_k, stages = SMALL_TILES[tile_n]
        return MatmulTiling(tile_m=64, tile_n=tile_n, tile_k=tile_k, warps=4, stages=stages)
    if -(-m // 128) * -(-n // 256) < PROGRAMS_WANTED:
        return MatmulTiling(tile_m=128, tile_n=128, warps=8, stages=3)
    return MatmulTiling(tile_m=128, tile_n=256, warps=8, stages=3)
