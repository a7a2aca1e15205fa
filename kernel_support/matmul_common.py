"""What the matmul ports share: their tiling and the heuristic that picks it for a shape (one tiling for all four
ports, so that they give the same bits)."""
from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class MatmulTiling:
    """Tiles shared by the Triton and Pallas ports. Every tiling sums each element over K in the
    same sequence of 16-deep tensor-core steps, so all of them give the same bits on the H200
    (measured: `python -m compare.tools.matmul_tilings`, and the driver's batch-invariance sweep, which
    crosses from the small tiles to the large ones)."""

    tile_m: int
    tile_n: int
    tile_k: int = 64
    group_m: int = 8
    warps: int = 8
    stages: int = 3


SMALL_M = 128
PROGRAMS_WANTED = 128  # about one program per SM (132 on the H200)
SMS = 132  # the H100's and H200's streaming multiprocessors: one wave of programs
SMALL_TILES = {  # tile_n: (tile_k, stages), the fastest measured for 64-row tiles (`compare.tools.matmul_tilings`)
    128: (64, 4), 64: (64, 6), 32: (128, 4)}
# 128-row tilings and the time of one wave of each, relative to 128 x 256's, as measured where the waves are full
# (`python -m compare.tools.matmul_tilings --cases shapes`; results/h200/experiments/matmul-tilings).
LARGE_TILES = ((MatmulTiling(tile_m=128, tile_n=256, warps=8, stages=3), 1.0),
               (MatmulTiling(tile_m=128, tile_n=128, warps=8, stages=3), 0.66))


@functools.lru_cache(maxsize=4096)  # a call's share of its host path otherwise
def matmul_tiling(m: int, n: int, batch: int = 1) -> MatmulTiling:
    """The tiling of `batch` products [m, K] @ [K, n] launched together (each the same tiles as alone, on the grid's
    second axis), chosen by how many programs they make in all:
    - Large work: of 128 x 256 and 128 x 128 tiles, the one whose waves of programs take the least time, a wave's
      time measured for each (the last wave counts whole: M = 1025 at N = 4096 is 144 tiles of 128 x 256, two waves,
      against three quicker waves of 128 x 128; M = 513 is 80 tiles, one wave, against two).
    - Small M, N at most 64, and work whose 128 x 128 tiles would fill under half a wave: 64-row tiles, with the
      widest column tile, up to twice N, that still gives about a program per SM (without split-K, the programs
      streaming B are what bounds their latency), or half a wave of them above M = 128.

    Counting a batch's programs gives attention's products (thousands of small ones: a product a sequence and head)
    wider tiles than one product alone would take: docs/findings.md, "Hugging Face's Llama under the modes"."""
    if m > SMALL_M and n > 64 and batch * -(-m // 128) * -(-n // 128) >= SMS // 2:
        def waves_time(tiling_and_wave):
            tiles, wave = tiling_and_wave
            return -(-(batch * -(-m // tiles.tile_m) * -(-n // tiles.tile_n)) // SMS) * wave

        return min(LARGE_TILES, key=waves_time)[0]
    row_tiles = batch * -(-m // 64)
    wanted = PROGRAMS_WANTED if m <= SMALL_M else SMS // 2  # above M = 128, fewer and wider tiles won (M = 129, 160)
    tile_n = next((width for width in (128, 64) if width < 2 * n and row_tiles * -(-n // width) >= wanted), 32)
    tile_k, stages = SMALL_TILES[tile_n]
    return MatmulTiling(tile_m=64, tile_n=tile_n, tile_k=tile_k, warps=4, stages=stages)
