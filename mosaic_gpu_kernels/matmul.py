"""Batch-invariant matmul in Pallas on Mosaic GPU: the algorithm of triton_kernels/matmul.py with Hopper's own parts.

Each CTA owns one tile of C and walks the whole of K in tile_k steps, in order: TMA brings the A and B tiles into
swizzled shared memory through a pipeline of `stages` buffers, and wgmma accumulates A @ B into fp32 registers, one
16-deep tensor-core step after another. No split-K, so every element of C is the same sequence of operations whatever
M is, and the tile shape changes only which warpgroup does the work. CTAs run in grouped order (group_m row tiles
share the B tiles they read through L2), as in the other ports. The epilogue rounds the accumulator to the output
type in registers, stores it to shared memory, and TMA writes it out.

Two kernels, by batch size:
- small batches (M <= 128): 64-row tiles, one warpgroup that both issues the TMA copies and the wgmmas
  (`plgpu.emit_pipeline`);
- large batches: 128 x 256 tiles, warp-specialised (`plgpu.emit_pipeline_warp_specialized`): a memory warpgroup
  issues the TMA copies, and two compute warpgroups each own a 128 x 128 half of the tile (the largest fp32
  accumulator a warpgroup holds in registers); each writes its half out in 64 x 64 pieces through two shared-memory
  buffers, so that one piece's store overlaps the next piece's conversion. Where 128 x 256 tiles are too few for
  the SMs (M = 512 at N = 4096), 128 x 128 tiles with one warpgroup.

Differences the language forces, against the Triton port:
- Shapes are static, as in every Pallas kernel: each distinct shape compiles once, its padding and the cut back of
  the result in the same compiled call (one dispatch a call, as XLA's own dot).
- No masks: TMA zero-fills the part of a tile that lies past the array and drops the part of a store that does.
  The swizzled layouts wgmma reads, though, tile the whole array in (8, swizzle width) blocks, so the lowering needs
  each tiled dimension to be a multiple of its block or smaller than it: M is padded to a multiple of 8 (when at
  least 8), and K and N to a multiple of the swizzle width, with zero rows and columns that add exactly nothing.
  At the benchmarked shapes nothing is padded.
- wgmma reads A and B with one swizzle, set here by B's tile width (128 bytes for every tiling chosen).

A batch of products (`batched_matmul`, the batch-invariant JAX transformation's batched dot_general) runs on a
second grid axis, one matrix a CTA column, as in the Triton port; `matmul` is the batch of one. A and B may come
transposed (A^T [B, K, M], as a weight's gradient A^T g takes it; B^T [B, N, K], as g B^T): TMA brings their tiles as
they lie and wgmma reads them through a transposed view, as the TriMul port's contraction does for B; the products
are the same.
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from mosaic_gpu_kernels.common import interpret_params, swizzle, swizzled_layout
from kernel_support.jax_backend import check_platform, interpreted
from kernel_support.jax_padding import cut_to, zero_padded
from ports.matmul import validate, validate_batch
from kernel_support.matmul_common import PROGRAMS_WANTED, SMALL_M

EPILOGUE_TILE = 64  # the warp-specialised kernel's output pieces: 64 x 64
SHARED_MEMORY = 200 * 1024  # of the H200's 227 KiB a CTA may use, what the small tiles' stages may take


@dataclass(frozen=True)
class MosaicTiling:
    tile_m: int
    tile_n: int  # the CTA's columns: split between the compute warpgroups
    tile_k: int
    stages: int
    compute_warpgroups: int = 1  # more than one: warp-specialised, a memory warpgroup feeds them
    group_m: int = 8


def mosaic_tiling(m: int, n: int, out: str = "same") -> MosaicTiling:
    """Small batches: 64-row tiles (wgmma's least), 128 columns where that still gives about a CTA per SM, else 64,
    and as many pipeline stages as shared memory holds (up to 12): without split-K, the bytes of B in flight per SM
    are what bounds small-M latency. Not 32 columns as in the Triton port: TMA copies of 64-byte rows ran at half
    the rate of 128-byte ones (docs/findings.md, "Mosaic GPU matmul: 64-byte TMA rows"). Large batches: 128 x 256
    in two compute warpgroups, or 128 x 128 in one where that gives too few CTAs, 4 stages (3 for fp32 output,
    whose epilogue buffers are twice as large)."""
    if m <= SMALL_M:
        tile_n = 128 if -(-m // 64) * -(-n // 128) >= PROGRAMS_WANTED else 64
        stage_bytes = (64 * 64 + 64 * tile_n) * 2
        stages = min(12, (SHARED_MEMORY - 64 * tile_n * 4) // stage_bytes)
        return MosaicTiling(tile_m=64, tile_n=tile_n, tile_k=64, stages=stages)
    if -(-m // 128) * -(-n // 256) < PROGRAMS_WANTED:
        return MosaicTiling(tile_m=128, tile_n=128, tile_k=64, stages=4)
    return MosaicTiling(tile_m=128, tile_n=256, tile_k=64, stages=4 if out == "same" else 3, compute_warpgroups=2)


def _in_specs(tiles: MosaicTiling, dtype, delay_release: int, b_transposed: bool, a_transposed: bool = False) -> list:
    """A's (tile_m, tile_k) block and B's (tile_k, tile_n) block at K step kk (A^T's (tile_k, tile_m) and B^T's
    (tile_n, tile_k) blocks where they are given transposed), both with B's tile's swizzle."""
    layout = swizzled_layout(swizzle(tiles.tile_k if b_transposed else tiles.tile_n, dtype), dtype)
    a_block = ((tiles.tile_k, tiles.tile_m), lambda kk: (kk, 0)) if a_transposed else (
        (tiles.tile_m, tiles.tile_k), lambda kk: (0, kk))
    b_block = ((tiles.tile_n, tiles.tile_k), lambda kk: (0, kk)) if b_transposed else (
        (tiles.tile_k, tiles.tile_n), lambda kk: (kk, 0))
    return [plgpu.BlockSpec(*a_block, transforms=layout, delay_release=delay_release),
            plgpu.BlockSpec(*b_block, transforms=layout, delay_release=delay_release)]


def _tile_slices(m: int, n: int, tiles: MosaicTiling):
    """The rows and columns of C that this CTA owns, in grouped order."""
    tiles_m, tiles_n = pl.cdiv(m, tiles.tile_m), pl.cdiv(n, tiles.tile_n)
    pid = lax.axis_index("tile")
    per_group = tiles.group_m * tiles_n
    first_m = (pid // per_group) * tiles.group_m
    group_rows = jnp.minimum(tiles_m - first_m, tiles.group_m)
    return (pl.ds((first_m + (pid % per_group) % group_rows) * tiles.tile_m, tiles.tile_m),
            pl.ds(((pid % per_group) // group_rows) * tiles.tile_n, tiles.tile_n))


def one_warpgroup_tile(a_rows, b, c_tile, c_smem, *, tiles: MosaicTiling, b_transposed: bool = False,
                       a_transposed: bool = False):
    """c_tile = a_rows @ b in one warpgroup: a_rows [tile_m, K], b [K, tile_n] (with b_transposed, b^T given as
    [tile_n, K], with a_transposed, a_rows^T as [K, tile_m], each read by wgmma through a transposed view), over K in
    order through a TMA pipeline; the tile goes out through c_smem [tile_m, tile_n] and a TMA store. The TriMul
    port's contraction takes it too."""
    def k_loop(acc):
        def step(_, a_smem, b_smem):
            plgpu.wgmma(acc, a_smem.transpose((1, 0)) if a_transposed else a_smem,
                        b_smem.transpose((1, 0)) if b_transposed else b_smem)  # asynchronous
            plgpu.wgmma_wait(1)  # the step before has read its buffers: the pipeline may refill them

        depth = a_rows.shape[0 if a_transposed else 1]
        plgpu.emit_pipeline(step, grid=(pl.cdiv(depth, tiles.tile_k),), max_concurrent_steps=tiles.stages,
                            in_specs=_in_specs(tiles, a_rows.dtype, delay_release=1, b_transposed=b_transposed,
                                               a_transposed=a_transposed),
                            )(a_rows, b)
        return acc[...]  # waits for the last wgmma

    c_smem[...] = pl.run_scoped(k_loop, plgpu.ACC((tiles.tile_m, tiles.tile_n), jnp.float32)).astype(c_smem.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(c_smem, c_tile)
    plgpu.wait_smem_to_gmem(0)


def warp_specialised_tile(a_rows, b, c_tile, *, tiles: MosaicTiling, b_transposed: bool = False,
                          a_transposed: bool = False):
    """c_tile = a_rows @ b as one_warpgroup_tile, warp-specialised: a memory warpgroup issues the TMA copies and
    each compute warpgroup owns tile_n / compute_warpgroups of the columns, written out in 64 x 64 pieces through
    two shared-memory buffers each. Runs on a kernel's "warpgroup" axis."""
    warpgroup = lax.axis_index("warpgroup")  # the memory warpgroup is the last
    width = tiles.tile_n // tiles.compute_warpgroups
    own_cols = pl.ds(warpgroup * width, width)
    pieces = list(itertools.product(range(tiles.tile_m // EPILOGUE_TILE), range(width // EPILOGUE_TILE)))

    def with_buffers(out_smem):
        def compute(run_pipeline):
            def with_accumulator(acc):
                run_pipeline(acc)
                result = acc[...].astype(c_tile.dtype)
                for index, (i, j) in enumerate(pieces):
                    piece = (slice(i * EPILOGUE_TILE, (i + 1) * EPILOGUE_TILE),
                             slice(j * EPILOGUE_TILE, (j + 1) * EPILOGUE_TILE))
                    plgpu.wait_smem_to_gmem(1, wait_read_only=True)  # this buffer's store before the last is done
                    out_smem[warpgroup, index % 2] = result[piece]
                    plgpu.commit_smem()
                    plgpu.copy_smem_to_gmem(out_smem.at[warpgroup, index % 2], c_tile.at[:, own_cols].at[
                        pl.ds(i * EPILOGUE_TILE, EPILOGUE_TILE), pl.ds(j * EPILOGUE_TILE, EPILOGUE_TILE)])
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)

            pl.run_scoped(with_accumulator, plgpu.ACC((tiles.tile_m, width), jnp.float32))

        def step(_, a_smem, b_smem, acc):
            plgpu.wgmma(acc, a_smem.transpose((1, 0)) if a_transposed else a_smem,
                        b_smem.at[own_cols].transpose((1, 0)) if b_transposed else b_smem.at[:, own_cols])
            plgpu.wgmma_wait(1)
            return acc

        plgpu.emit_pipeline_warp_specialized(
            step, grid=(pl.cdiv(a_rows.shape[0 if a_transposed else 1], tiles.tile_k),), memory_registers=40,
            in_specs=_in_specs(tiles, a_rows.dtype, delay_release=1, b_transposed=b_transposed,
                               a_transposed=a_transposed),
            wg_axis="warpgroup", num_compute_wgs=tiles.compute_warpgroups, max_concurrent_steps=tiles.stages,
            compute_context=compute,
        )(a_rows, b)

    pl.run_scoped(with_buffers,
                  plgpu.SMEM((tiles.compute_warpgroups, 2, EPILOGUE_TILE, EPILOGUE_TILE), c_tile.dtype,
                             transforms=swizzled_layout(swizzle(EPILOGUE_TILE, c_tile.dtype), c_tile.dtype)),
                  collective_axes="warpgroup")
    plgpu.wait_smem_to_gmem(0)


def _matrix_tiles(a_gmem, b_gmem, c_gmem, tiles: MosaicTiling, transposed: tuple[bool, bool]):
    """This CTA's A rows (A^T's columns where A is given transposed), B columns (B^T's rows) and C tile, in its
    matrix of the batch where there is one."""
    rows, cols = _tile_slices(c_gmem.shape[-2], c_gmem.shape[-1], tiles)
    a_rows = (slice(None), rows) if transposed[0] else (rows, slice(None))
    b_cols = (cols, slice(None)) if transposed[1] else (slice(None), cols)
    if a_gmem.ndim == 2:  # one product: the TMA copies see 2-D arrays, as before there were batches
        return a_gmem.at[a_rows], b_gmem.at[b_cols], c_gmem.at[rows, cols]
    matrix = lax.axis_index("matrix")
    return a_gmem.at[(matrix, *a_rows)], b_gmem.at[(matrix, *b_cols)], c_gmem.at[matrix, rows, cols]


def _one_warpgroup_kernel(a_gmem, b_gmem, c_gmem, c_smem, *, tiles: MosaicTiling, transposed: tuple[bool, bool]):
    one_warpgroup_tile(*_matrix_tiles(a_gmem, b_gmem, c_gmem, tiles, transposed), c_smem, tiles=tiles,
                       a_transposed=transposed[0], b_transposed=transposed[1])


def _warp_specialised_kernel(a_gmem, b_gmem, c_gmem, *, tiles: MosaicTiling, transposed: tuple[bool, bool]):
    warp_specialised_tile(*_matrix_tiles(a_gmem, b_gmem, c_gmem, tiles, transposed), tiles=tiles,
                          a_transposed=transposed[0], b_transposed=transposed[1])


@functools.partial(jax.jit, static_argnames=("out", "tiles", "interpret", "a_transposed", "b_transposed"))
def _matmul(a, b, *, out, tiles: MosaicTiling, interpret: bool, a_transposed: bool = False,
            b_transposed: bool = False):
    """a [M, K] @ b [K, N], or a [B, M, K] @ b [B, K, N] on the grid's "matrix" axis (a_transposed: a holds A^T,
    [B, K, M]; b_transposed: b holds B^T, [B, N, K]), padded as the module says."""
    out_dtype = jnp.float32 if out == "float32" else a.dtype
    batch, m, n = a.shape[:-2], a.shape[-1 if a_transposed else -2], b.shape[-2 if b_transposed else -1]
    grid = (pl.cdiv(m, tiles.tile_m) * pl.cdiv(n, tiles.tile_n), *batch)
    transposed = (a_transposed, b_transposed)
    if tiles.compute_warpgroups == 1:
        body = functools.partial(_one_warpgroup_kernel, tiles=tiles, transposed=transposed)
        layout = swizzled_layout(swizzle(tiles.tile_n, out_dtype), out_dtype)
        threads = dict(scratch_types=[plgpu.SMEM((tiles.tile_m, tiles.tile_n), out_dtype, transforms=layout)])
    else:
        body = functools.partial(_warp_specialised_kernel, tiles=tiles, transposed=transposed)
        threads = dict(num_threads=tiles.compute_warpgroups + 1, thread_name="warpgroup")
    return plgpu.kernel(
        body, out_type=jax.ShapeDtypeStruct((*batch, m, n), out_dtype), grid=grid,
        grid_names=("tile", "matrix")[:len(grid)],
        # explicit: the default changed from Lane (jax 0.10) to Warpgroup (jax 0.11)
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=interpret_params() if interpret else None, kernel_name="batch_invariant_matmul", **threads,
    )(a, b)


def padded_shape(m: int, n: int, k: int, out: str, tiles: MosaicTiling,
                 a_transposed: bool = False) -> tuple[int, int, int]:
    """(M, N, K) as the kernel gets them: the least padding the swizzled layouts allow (M a whole swizzle width where
    A^T's rows are M long)."""
    out_dtype = jnp.float32 if out == "float32" else jnp.bfloat16
    out_width = tiles.tile_n if tiles.compute_warpgroups == 1 else EPILOGUE_TILE
    in_elements = swizzle(tiles.tile_n, jnp.bfloat16) // 2
    n_multiple = max(in_elements, swizzle(out_width, out_dtype) // jnp.dtype(out_dtype).itemsize)
    pm = -(-m // in_elements) * in_elements if a_transposed else (m if m < 8 else -(-m // 8) * 8)
    return pm, -(-n // n_multiple) * n_multiple, -(-k // in_elements) * in_elements


def matmul(data):
    """C = a @ b for `(a, b, out)` as JAX arrays: a [M, K], b [K, N] bf16 (or fp16); out "same" or "float32".

    Runs the compiled kernel on a GPU and Mosaic GPU's interpreter elsewhere.
    """
    validate(data, "jax")
    check_platform("a", data[0])
    return _product(*data)


def batched_matmul(a, b, out: str, *, a_transposed: bool = False, b_transposed: bool = False):
    """C[i] = a[i] @ b[i] for a [B, M, K], b [B, K, N] (a_transposed: a[i] is A[i]^T, [B, K, M]; b_transposed: b[i]
    is B[i]^T, [B, N, K]), each product's bits those of the product alone."""
    validate_batch(a, b, out, a_transposed, b_transposed, framework="jax")
    check_platform("a", a)
    return _product(a, b, out, a_transposed, b_transposed)


@functools.partial(jax.jit, static_argnames=("out", "a_transposed", "b_transposed"))
def _product(a, b, out: str, a_transposed: bool = False, b_transposed: bool = False):
    """One product or a batch of them (a leading dimension): padded as the module says, the kernel, and the result
    cut back, in one compiled call."""
    batch = a.shape[:-2]
    (m, k), n = a.shape[:-3:-1] if a_transposed else a.shape[-2:], b.shape[-2 if b_transposed else -1]
    tiles = mosaic_tiling(m, n, out)
    interpret = interpreted()
    pm, pn, pk = padded_shape(m, n, k, out, tiles, a_transposed=a_transposed)
    if (pm, pk) != (m, k):
        a = zero_padded(a, shape=(*batch, *((pk, pm) if a_transposed else (pm, pk))))
    if (pk, pn) != (k, n):
        b = zero_padded(b, shape=(*batch, *((pn, pk) if b_transposed else (pk, pn))))
    c = _matmul(a, b, out=out, tiles=tiles, interpret=interpret, a_transposed=a_transposed, b_transposed=b_transposed)
    return c if (pm, pn) == (m, n) else cut_to(c, shape=(*batch, m, n))
