"""TriMul in Pallas on Mosaic GPU: the four stages of triton_kernels/trimul.py, with Hopper's own parts.

1. `_layer_norm_kernel`: per tile of 64 pairs (b, i, k), TMA brings x [64, dim] (float32) into shared memory;
   mean, then the centred sum of squares (two passes over shared memory, so no large sums cancel), then the
   normalised tile goes out as float16 in 64-column pieces.
2. `_gated_project_kernel`: per tile of 64 pairs and group (left, right, out gate), the [hidden, 64] products
   W @ xn^T on wgmma, with W's and xn's chunks of dim brought by a TMA pipeline; left and right are
   projection * sigmoid(gate) * mask, the out gate sigmoid(projection). Written channel-major into
   `gated` [3 * B * hidden, N * N], so that the contraction reads row-major matrices.
3. `_triangle_kernel`: per (b, h), product = left @ right^T on the matmul port's tile functions, the right operand
   as a transposed B: 128 x 256 tiles warp-specialised where 256 divides N, else 128 x 128 (64 x 64 where N is no
   multiple of 128) in one warpgroup; a TMA pipeline over k, fp32 accumulation on wgmma, fp16 out.
4. `_out_norm_project_kernel`: per tile of 64 pairs (b, i, j), LayerNorm over hidden of the product's
   [hidden, 64] tile, times the out gate, then the output projection on wgmma in chunks of dim, float32 out.

Differences the language forces, against the Triton and Pallas-Triton ports:
- The wgmma and its swizzled shared-memory layouts tile whole arrays: N is padded to a multiple of 64 (not 16),
  hidden to at least 64 channels (zero weights: a padded channel is exactly 0 in left, right and the product,
  and its out-norm weight and bias are 0), and dim, in the output projection only, to a multiple of 64.
- wgmma's rows are a warpgroup's 64: every tile of pairs is 64 pairs (the Triton port takes 128).
- The mask is given to the kernel as float32 (one small XLA conversion per call).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from mosaic_gpu_kernels.common import interpret_params, swizzle, swizzled_layout
from mosaic_gpu_kernels.matmul import MosaicTiling, one_warpgroup_tile, warp_specialised_tile
from kernel_support.jax_backend import check_platform, interpreted
from kernel_support.jax_padding import cut_to, zero_padded
from ports.trimul import LAYER_NORM_EPS, PROJECTIONS, validate
from kernel_support.trimul_common import (check_kernel_sizes, largest_power_of_two_dividing, padded_length,
                                          refuse_non_finite)

SEQUENCE_MULTIPLE = 64  # N as the kernels get it (see the module's docstring)
PAIRS = 64  # pairs per CTA in the norm, projection and output kernels: one warpgroup's wgmma rows
MIN_HIDDEN = 64  # wgmma's least M: fewer channels are padded with zero weights
# Pipeline stages: two, in every kernel, so that two CTAs fit an SM's shared memory and one's loads or epilogue
# overlap the other's wgmmas (results/h200/experiments/trimul-mosaic-gpu/)
STAGES = 2
MAX_DIM = 768  # the LayerNorm kernel holds a [64, dim] float32 tile in shared memory (227 KiB a CTA)


def _layout(width: int, dtype) -> tuple:
    """The swizzled shared-memory layout that TMA writes and wgmma reads, for tiles `width` elements wide."""
    return swizzled_layout(swizzle(width, dtype), dtype)


def _sigmoid(v):
    return 1.0 / (1.0 + jnp.exp(-v))


def _params(interpret: bool) -> dict:
    # explicit: the default changed from Lane (jax 0.10) to Warpgroup (jax 0.11)
    return dict(compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
                interpret=interpret_params() if interpret else None)


def _layer_norm_kernel(x_gmem, gamma_gmem, beta_gmem, normed_gmem, x_smem, gamma_smem, beta_smem, out_smem,
                       barrier):
    """gamma_gmem, beta_gmem: [dim / chunk, chunk]; x_smem [dim / chunk, 64, chunk] (a TMA copy takes at most 256
    elements along each dimension)."""
    pieces, chunk = gamma_gmem.shape
    dim = pieces * chunk
    row0 = lax.axis_index("tile") * PAIRS
    for c in range(pieces):
        plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(row0, PAIRS), pl.ds(c * chunk, chunk)], x_smem.at[c], barrier)
    plgpu.copy_gmem_to_smem(gamma_gmem, gamma_smem, barrier)
    plgpu.copy_gmem_to_smem(beta_gmem, beta_smem, barrier)
    plgpu.barrier_wait(barrier)
    pieces = range(pieces)

    def rows(v):  # a per-pair value, across a chunk
        return lax.broadcast_in_dim(v, (PAIRS, chunk), (0,))

    def columns(ref, c):  # a per-column weight, down a chunk
        return lax.broadcast_in_dim(ref[c], (PAIRS, chunk), (1,))

    def x(c):
        return x_smem[c]

    mean = sum(jnp.sum(x(c), axis=1) for c in pieces) / dim
    centred = [x(c) - rows(mean) for c in pieces]
    squares = sum(jnp.sum(v * v, axis=1) for v in centred)
    # a sum of squares past float32's range (|x| beyond about 1e19) would make rstd 0 and the row finite and wrong: NaN
    # instead, which the port refuses (refuse_non_finite)
    rstd = jnp.where(squares < jnp.inf, lax.rsqrt(squares / dim + LAYER_NORM_EPS), jnp.nan)
    for c in pieces:
        normed = (x(c) - rows(mean)) * rows(rstd) * columns(gamma_smem, c) + columns(beta_smem, c)
        plgpu.wait_smem_to_gmem(1, wait_read_only=True)  # this buffer's store before the last is done
        out_smem[c % 2] = normed.astype(jnp.float16)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(out_smem.at[c % 2], normed_gmem.at[pl.ds(row0, PAIRS), pl.ds(c * chunk, chunk)])
    plgpu.wait_smem_to_gmem(0)


def _gated_project_kernel(normed_gmem, mask_gmem, weight_gmem, gated_gmem, mask_smem, out_smem, barrier, *,
                          batch: int, pairs_per_batch: int, tile_k: int):
    """weight_gmem [5 * hidden, dim]: left_proj, left_gate, right_proj, right_gate, out_gate, in that order."""
    hidden, dim = weight_gmem.shape[0] // 5, normed_gmem.shape[1]
    group, tile = lax.axis_index("group"), lax.axis_index("tile")
    row0 = tile * PAIRS
    b = row0 // pairs_per_batch
    plgpu.copy_gmem_to_smem(mask_gmem.at[pl.ds(row0, PAIRS)], mask_smem, barrier)
    layout = _layout(tile_k, jnp.float16)

    def project(weight_rows: list):
        """[hidden, PAIRS] = W @ xn^T for each block of W's rows, on wgmma, over dim in tile_k steps."""
        def with_accumulators(*accs):
            def step(_, xn_smem, *w_smems):
                for acc, w_smem in zip(accs, w_smems):
                    plgpu.wgmma(acc, w_smem, xn_smem.transpose((1, 0)))
                plgpu.wgmma_wait(len(accs))  # the step before has read its buffers

            specs = [plgpu.BlockSpec((PAIRS, tile_k), lambda kk: (0, kk), transforms=layout, delay_release=1)]
            specs += [plgpu.BlockSpec((hidden, tile_k), lambda kk: (0, kk), transforms=layout, delay_release=1)
                      for _ in weight_rows]
            plgpu.emit_pipeline(step, grid=(dim // tile_k,), max_concurrent_steps=STAGES, in_specs=specs)(
                normed_gmem.at[pl.ds(row0, PAIRS)], *(weight_gmem.at[pl.ds(r, hidden)] for r in weight_rows))
            return [acc[...] for acc in accs]  # waits for the last wgmma

        return pl.run_scoped(lambda *accs: with_accumulators(*accs),
                             *(plgpu.ACC((hidden, PAIRS), jnp.float32) for _ in weight_rows))

    def store(value):
        out_smem[...] = value.astype(jnp.float16)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(out_smem, gated_gmem.at[pl.ds((group * batch + b) * hidden, hidden),
                                                        pl.ds(row0 - b * pairs_per_batch, PAIRS)])
        plgpu.wait_smem_to_gmem(0)

    @pl.when(group < 2)
    def _():
        value, gate = project([2 * group * hidden, (2 * group + 1) * hidden])
        plgpu.barrier_wait(barrier)
        store(value * _sigmoid(gate) * lax.broadcast_in_dim(mask_smem[...], (hidden, PAIRS), (1,)))

    @pl.when(group == 2)
    def _():
        (gate,) = project([4 * hidden])
        plgpu.barrier_wait(barrier)
        store(_sigmoid(gate))


def _triangle_kernel(gated_gmem, product_gmem, *scratch, batch_hidden: int, seq: int, tiles: MosaicTiling):
    """gated_gmem [3 * B * hidden * N, N], product_gmem [B * hidden * N, N]: row (bh * N + i) holds [bh, i, :].
    product = left @ right^T, the right operand read as a transposed B, on the matmul port's tile functions."""
    t, bh = lax.axis_index("tile"), lax.axis_index("bh")
    i0, j0 = (t // (seq // tiles.tile_n)) * tiles.tile_m, (t % (seq // tiles.tile_n)) * tiles.tile_n
    left = gated_gmem.at[pl.ds(bh * seq + i0, tiles.tile_m)]
    right = gated_gmem.at[pl.ds((batch_hidden + bh) * seq + j0, tiles.tile_n)]
    product = product_gmem.at[pl.ds(bh * seq + i0, tiles.tile_m), pl.ds(j0, tiles.tile_n)]
    if tiles.compute_warpgroups == 1:
        one_warpgroup_tile(left, right, product, *scratch, tiles=tiles, b_transposed=True)
    else:
        warp_specialised_tile(left, right, product, tiles=tiles, b_transposed=True)


def contraction_tiling(seq: int) -> MosaicTiling:
    """Where 256 divides N, 128 x 256 tiles, warp-specialised (a memory warpgroup feeding two compute warpgroups, 4
    stages), faster than 128 x 128 tiles in one warpgroup (results/h200/experiments/trimul-mosaic-gpu/); elsewhere
    128 x 128 (64 x 64 where 128 does not divide N) in one warpgroup, 2 stages."""
    if seq % 256 == 0:
        return MosaicTiling(tile_m=128, tile_n=256, tile_k=64, stages=4, compute_warpgroups=2)
    tile = largest_power_of_two_dividing(seq, 128)
    return MosaicTiling(tile_m=tile, tile_n=tile, tile_k=64, stages=STAGES)


def _out_norm_project_kernel(product_gmem, gated_gmem, gamma_gmem, beta_gmem, weight_t_gmem, out_gmem,
                             product_smem, gate_smem, gamma_smem, beta_smem, out_smem, barrier, *,
                             batch_hidden: int, pairs_per_batch: int, hidden: int, tile_out: int):
    """product_gmem [B * hidden', N * N] and gated_gmem's out gates, channel-major; weight_t_gmem [hidden', dim'];
    hidden' >= hidden channels, the padded ones exactly 0 in the product (see the module's docstring)."""
    channels, width = weight_t_gmem.shape
    row0 = lax.axis_index("tile") * PAIRS
    b = row0 // pairs_per_batch
    cols = pl.ds(row0 - b * pairs_per_batch, PAIRS)
    plgpu.copy_gmem_to_smem(product_gmem.at[pl.ds(b * channels, channels), cols], product_smem, barrier)
    plgpu.copy_gmem_to_smem(gated_gmem.at[pl.ds(2 * batch_hidden + b * channels, channels), cols], gate_smem,
                            barrier)
    plgpu.copy_gmem_to_smem(gamma_gmem, gamma_smem, barrier)
    plgpu.copy_gmem_to_smem(beta_gmem, beta_smem, barrier)
    plgpu.barrier_wait(barrier)

    def pairs(v):  # a per-pair value, down the channels
        return lax.broadcast_in_dim(v, (channels, PAIRS), (1,))

    def channel(ref):  # a per-channel weight, across the pairs
        return lax.broadcast_in_dim(ref[...], (channels, PAIRS), (0,))

    product = product_smem[...].astype(jnp.float32)
    mean = jnp.sum(product, axis=0) / hidden  # padded channels add 0 to the sum
    centred = product - pairs(mean)
    # and (0 - mean)^2 each to the sum of squares: taken back out
    squares = jnp.sum(centred * centred, axis=0) - (channels - hidden) * mean * mean
    rstd = lax.rsqrt(squares / hidden + LAYER_NORM_EPS)
    normed = (centred * pairs(rstd) * channel(gamma_smem) + channel(beta_smem)) * gate_smem[...].astype(jnp.float32)
    normed_smem = product_smem  # the product is in registers: its buffer takes the normed tile
    normed_smem[...] = normed.astype(jnp.float16)
    plgpu.commit_smem()

    def step(d, weight_smem):
        def with_accumulator(acc):
            plgpu.wgmma(acc, normed_smem.transpose((1, 0)), weight_smem)
            plgpu.wgmma_wait(0)
            return acc[...]

        result = pl.run_scoped(with_accumulator, plgpu.ACC((PAIRS, tile_out), jnp.float32))
        slot = d[0] % out_smem.shape[0]
        plgpu.wait_smem_to_gmem(out_smem.shape[0] - 1, wait_read_only=True)  # this buffer's last store is done
        out_smem[slot] = result
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(out_smem.at[slot], out_gmem.at[pl.ds(row0, PAIRS), pl.ds(d[0] * tile_out, tile_out)])

    plgpu.emit_pipeline(
        step, grid=(width // tile_out,), max_concurrent_steps=out_smem.shape[0],
        in_specs=[plgpu.BlockSpec((channels, tile_out), lambda d: (0, d),
                                  transforms=_layout(tile_out, jnp.float16))])(weight_t_gmem)
    plgpu.wait_smem_to_gmem(0)


@functools.partial(jax.jit, static_argnames=("hidden", "interpret"))
def _trimul(x, mask, weights, *, hidden: int, interpret: bool):
    batch, seq, _, dim = x.shape
    channels = max(hidden, MIN_HIDDEN)
    width = -(-dim // 64) * 64  # the output projection's columns
    pairs = batch * seq * seq
    tiles = pairs // PAIRS
    by_channel = lambda w: jnp.pad(w, ((0, channels - hidden),) + ((0, 0),) * (w.ndim - 1))  # noqa: E731
    proj_weight = jnp.concatenate([by_channel(weights[f"{name}.weight"]) for name in PROJECTIONS]).astype(jnp.float16)
    out_weight_t = jnp.pad(by_channel(weights["to_out.weight"].T), ((0, 0), (0, width - dim))).astype(jnp.float16)
    chunk = largest_power_of_two_dividing(dim, 64)
    pieces = dim // chunk
    normed = plgpu.kernel(
        _layer_norm_kernel,
        out_type=jax.ShapeDtypeStruct((pairs, dim), jnp.float16), grid=(tiles,), grid_names=("tile",),
        scratch_types=[plgpu.SMEM((pieces, PAIRS, chunk), jnp.float32, transforms=_layout(chunk, jnp.float32)),
                       plgpu.SMEM((pieces, chunk), jnp.float32), plgpu.SMEM((pieces, chunk), jnp.float32),
                       plgpu.SMEM((2, PAIRS, chunk), jnp.float16, transforms=_layout(chunk, jnp.float16)),
                       plgpu.Barrier(num_arrivals=pieces + 2)],
        kernel_name="trimul_layer_norm", **_params(interpret),
    )(x.reshape(pairs, dim), weights["norm.weight"].reshape(pieces, chunk),
      weights["norm.bias"].reshape(pieces, chunk))
    gated = plgpu.kernel(
        functools.partial(_gated_project_kernel, batch=batch, pairs_per_batch=seq * seq, tile_k=chunk),
        out_type=jax.ShapeDtypeStruct((3 * batch * channels, seq * seq), jnp.float16), grid=(3, tiles),
        grid_names=("group", "tile"),
        scratch_types=[plgpu.SMEM((PAIRS,), jnp.float32),
                       plgpu.SMEM((channels, PAIRS), jnp.float16, transforms=_layout(PAIRS, jnp.float16)),
                       plgpu.Barrier(num_arrivals=1)],
        kernel_name="trimul_gated_project", **_params(interpret),
    )(normed, mask.reshape(pairs).astype(jnp.float32), proj_weight)
    contraction = contraction_tiling(seq)
    threads = (dict(scratch_types=[plgpu.SMEM((contraction.tile_m, contraction.tile_n), jnp.float16,
                                              transforms=_layout(contraction.tile_n, jnp.float16))])
               if contraction.compute_warpgroups == 1 else dict(num_threads=3, thread_name="warpgroup"))
    product = plgpu.kernel(
        functools.partial(_triangle_kernel, batch_hidden=batch * channels, seq=seq, tiles=contraction),
        out_type=jax.ShapeDtypeStruct((batch * channels * seq, seq), jnp.float16),
        grid=((seq // contraction.tile_m) * (seq // contraction.tile_n), batch * channels), grid_names=("tile", "bh"),
        kernel_name="trimul_triangle", **threads, **_params(interpret),
    )(gated.reshape(3 * batch * channels * seq, seq))
    tile_out = largest_power_of_two_dividing(width, 128)
    out = plgpu.kernel(
        functools.partial(_out_norm_project_kernel, batch_hidden=batch * channels, pairs_per_batch=seq * seq,
                          hidden=hidden, tile_out=tile_out),
        out_type=jax.ShapeDtypeStruct((pairs, width), jnp.float32), grid=(tiles,), grid_names=("tile",),
        scratch_types=[plgpu.SMEM((channels, PAIRS), jnp.float16, transforms=_layout(PAIRS, jnp.float16)),
                       plgpu.SMEM((channels, PAIRS), jnp.float16, transforms=_layout(PAIRS, jnp.float16)),
                       plgpu.SMEM((channels,), jnp.float32), plgpu.SMEM((channels,), jnp.float32),
                       plgpu.SMEM((min(STAGES, width // tile_out), PAIRS, tile_out), jnp.float32,
                                  transforms=_layout(tile_out, jnp.float32)),
                       plgpu.Barrier(num_arrivals=4)],
        kernel_name="trimul_out_norm_project", **_params(interpret),
    )(product.reshape(batch * channels, seq * seq), gated, by_channel(weights["to_out_norm.weight"]),
      by_channel(weights["to_out_norm.bias"]), out_weight_t)
    out = (out if width == dim else out[:, :dim]).reshape(batch, seq, seq, dim)
    return out, jnp.sum(out[..., 0])


def trimul(data):
    """TriMul forward for `(x, mask, weights, config)` as JAX arrays; returns [B, N, N, dim] float32.

    Runs the compiled kernels on a GPU and Mosaic GPU's interpreter elsewhere. Raises Float16RangeError where the
    input overflows the float16 intermediates (`refuse_non_finite`).
    """
    validate(data, "jax")
    check_platform("x", data[0])
    x, mask, weights, config = data
    batch, length, _, dim = x.shape
    seq = padded_length(length, SEQUENCE_MULTIPLE)
    check_kernel_sizes(batch, seq, dim, config["hidden_dim"])
    if dim > MAX_DIM:
        raise ValueError(f"the Mosaic GPU port holds a [64, dim] float32 tile in shared memory: dim must be at most "
                         f"{MAX_DIM}, got {dim}")
    if seq != length:  # zeros, with mask 0: see padded_length
        x, mask = zero_padded(x, shape=(batch, seq, seq, dim)), zero_padded(mask, shape=(batch, seq, seq))
    out, column_sum = _trimul(x, mask, weights, hidden=config["hidden_dim"], interpret=interpreted())
    refuse_non_finite(column_sum, "mosaic_gpu")
    return out if seq == length else cut_to(out, shape=(batch, length, length, dim))
