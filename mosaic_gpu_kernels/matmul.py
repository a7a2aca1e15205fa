"""Batch-invariant matmul in Pallas on Mosaic GPU: the algorithm of triton_kernels/matmul.py with Hopper's own parts.

Each CTA (one warpgroup, 128 threads) owns one tile_m x tile_n tile of C and walks the whole of K in 64-deep steps (32 with 32-wide tiles),
in order: TMA brings the A and B tiles into swizzled shared memory through a pipeline of `stages` buffers, and wgmma
accumulates A @ B into fp32 registers, one 16-deep tensor-core step after another. No split-K, so every element of C
is the same sequence of operations whatever M is, and the tile shape changes only which CTA does the work. CTAs run
in grouped order (group_m row tiles share the B tiles they read through L2), as in the other ports. The epilogue
rounds the accumulator to the output type in registers, stores it to shared memory, and TMA writes it out.

Differences the language forces, against the Triton port:
- Shapes are static, as in every Pallas kernel: each distinct (padded) shape compiles once.
- No masks: TMA zero-fills the part of a tile that lies past the array and drops the part of a store that does.
  The swizzled layouts wgmma reads, though, tile the whole array in (8, swizzle width) blocks, so the lowering needs
  each tiled dimension to be a multiple of its block or smaller than it: M is padded to a multiple of 8 (when at
  least 8), K to a multiple of the K step and N to a multiple of the swizzle width, with zero rows and columns that add
  exactly nothing. At the benchmarked shapes nothing is padded.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from ports.matmul import PROGRAMS_WANTED, SMALL_M, validate

try:  # public from jax 0.11
    _interpret_params = plgpu.InterpretGPUParams
    _INTERPRETER_READS_PAST_THE_ARRAY = True
except AttributeError:  # jax 0.10's interpreter is private and raises on TMA reads past the array
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams as _interpret_params
    _INTERPRETER_READS_PAST_THE_ARRAY = False

@dataclass(frozen=True)
class MosaicTiling:
    tile_m: int
    tile_n: int
    stages: int
    group_m: int = 8

    @property
    def tile_k(self) -> int:
        """wgmma reads A and B with one swizzle: A's row of tile_k elements as wide as B's row of tile_n, up to 128
        bytes (64 elements)."""
        return min(64, self.tile_n)


def mosaic_tiling(m: int, n: int) -> MosaicTiling:
    """Small batches: 64-row tiles (wgmma's least) with the widest column tile that still gives about a CTA per SM.
    Large batches: 128 x 128, the largest fp32 accumulator one warpgroup holds in registers."""
    if m <= SMALL_M:
        row_tiles = -(-m // 64)
        tile_n = next((width for width in (128, 64) if row_tiles * -(-n // width) >= PROGRAMS_WANTED), 32)
        return MosaicTiling(tile_m=64, tile_n=tile_n, stages=8 if tile_n > 32 else 12)
    return MosaicTiling(tile_m=128, tile_n=128, stages=4)


def _swizzled(minor: int, dtype) -> tuple:
    """The shared-memory layout wgmma reads and TMA writes: (8 rows, one swizzle width) blocks, swizzled."""
    itemsize = jnp.dtype(dtype).itemsize
    swizzle = plgpu.find_swizzle(minor * itemsize * 8)
    return plgpu.TilingTransform((8, swizzle // itemsize)), plgpu.SwizzleTransform(swizzle)


def _swizzle_width(minor: int, dtype) -> int:
    return plgpu.find_swizzle(minor * jnp.dtype(dtype).itemsize * 8) // jnp.dtype(dtype).itemsize


def _matmul_kernel(a_gmem, b_gmem, c_gmem, c_smem, *, tiles: MosaicTiling):
    (m, k), n = a_gmem.shape, b_gmem.shape[1]
    tiles_m, tiles_n = pl.cdiv(m, tiles.tile_m), pl.cdiv(n, tiles.tile_n)
    pid = lax.axis_index("tile")
    per_group = tiles.group_m * tiles_n
    first_m = (pid // per_group) * tiles.group_m
    group_rows = jnp.minimum(tiles_m - first_m, tiles.group_m)
    rows = pl.ds((first_m + (pid % per_group) % group_rows) * tiles.tile_m, tiles.tile_m)
    cols = pl.ds(((pid % per_group) // group_rows) * tiles.tile_n, tiles.tile_n)

    def k_loop(acc):
        def step(_, a_smem, b_smem):
            plgpu.wgmma(acc, a_smem, b_smem)  # asynchronous: acc += a @ b, in 16-deep steps
            plgpu.wgmma_wait(1)  # the step before has read its buffers: the pipeline may refill them

        plgpu.emit_pipeline(
            step, grid=(pl.cdiv(k, tiles.tile_k),), max_concurrent_steps=tiles.stages,
            in_specs=[plgpu.BlockSpec((tiles.tile_m, tiles.tile_k), lambda kk: (0, kk),
                                      transforms=_swizzled(tiles.tile_k, a_gmem.dtype), delay_release=1),
                      plgpu.BlockSpec((tiles.tile_k, tiles.tile_n), lambda kk: (kk, 0),
                                      transforms=_swizzled(tiles.tile_n, b_gmem.dtype), delay_release=1)],
        )(a_gmem.at[rows, :], b_gmem.at[:, cols])
        return acc[...]  # waits for the last wgmma

    c_smem[...] = pl.run_scoped(k_loop, plgpu.ACC((tiles.tile_m, tiles.tile_n), jnp.float32)).astype(c_smem.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(c_smem, c_gmem.at[rows, cols])
    plgpu.wait_smem_to_gmem(0)


@functools.partial(jax.jit, static_argnames=("out", "tiles", "interpret"))
def _matmul(a, b, *, out, tiles: MosaicTiling, interpret: bool):
    """a [M, K] and b [K, N] already padded as the module says."""
    out_dtype = jnp.float32 if out == "float32" else a.dtype
    grid = pl.cdiv(a.shape[0], tiles.tile_m) * pl.cdiv(b.shape[1], tiles.tile_n)
    return plgpu.kernel(
        functools.partial(_matmul_kernel, tiles=tiles),
        out_type=jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), out_dtype),
        scratch_types=[plgpu.SMEM((tiles.tile_m, tiles.tile_n), out_dtype,
                                  transforms=_swizzled(tiles.tile_n, out_dtype))],
        grid=(grid,), grid_names=("tile",),
        # explicit: the default changed from Lane (jax 0.10) to Warpgroup (jax 0.11)
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=_interpret_params() if interpret else None,
        kernel_name="batch_invariant_matmul",
    )(a, b)


def padded_shape(m: int, n: int, k: int, out: str, tiles: MosaicTiling, whole_tiles: bool) -> tuple[int, int, int]:
    """(M, N, K) as the kernel gets them: whole tiles for an interpreter that cannot read past the array, else the
    least padding the swizzled layouts allow."""
    if whole_tiles:
        return tuple(-(-size // tile) * tile for size, tile in ((m, tiles.tile_m), (n, tiles.tile_n), (k, tiles.tile_k)))
    n_multiple = max(_swizzle_width(tiles.tile_n, jnp.bfloat16),
                     _swizzle_width(tiles.tile_n, jnp.float32 if out == "float32" else jnp.bfloat16))
    return (m if m < 8 else -(-m // 8) * 8), -(-n // n_multiple) * n_multiple, -(-k // tiles.tile_k) * tiles.tile_k


def matmul(data):
    """C = a @ b for `(a, b, out)` as JAX arrays: a [M, K], b [K, N] bf16 (or fp16); out "same" or "float32".

    Runs the compiled kernel on a GPU and Mosaic GPU's interpreter elsewhere.
    """
    validate(data)
    a, b, out = data
    (m, k), n = a.shape, b.shape[1]
    tiles = mosaic_tiling(m, n)
    interpret = jax.default_backend() != "gpu"
    pm, pn, pk = padded_shape(m, n, k, out, tiles, whole_tiles=interpret and not _INTERPRETER_READS_PAST_THE_ARRAY)
    # padded outside the jitted function, so that it compiles once per padded shape, not once per M
    if (pm, pk) != (m, k):
        a = jnp.pad(a, ((0, pm - m), (0, pk - k)))
    if (pk, pn) != (k, n):
        b = jnp.pad(b, ((0, pk - k), (0, pn - n)))
    c = _matmul(a, b, out=out, tiles=tiles, interpret=interpret)
    return c if (pm, pn) == (m, n) else c[:m, :n]
