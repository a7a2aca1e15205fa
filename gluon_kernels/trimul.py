"""TriMul in Gluon: the stages of triton_kernels/trimul.py in three kernels, with Hopper's parts written out.

1. `_norm_project_kernel`: per tile of 64 pairs (b, i, k), LayerNorm over dim (per-chunk mean and centred sum
   of squares, merged as the Triton port does) into shared memory as fp16, kept there as wgmma's B operand in
   dim chunks; all five [hidden, dim] weight blocks stream through a TMA ring, one [hidden, 64] tile a step, in a
   static schedule. A gated group's projection and gate are two accumulators that meet in registers as
   projection * sigmoid(gate) * mask; the out gate is sigmoid(projection). Written channel-major into `gated`
   [3 * B * hidden, N * N]: the normed tensor never reaches global memory.
2. `_triangle_kernel`: per (b, h), product = left @ right^T in 128 x 128 tiles (64 x 64 where N is no multiple of
   128): the matmul port's K loop (`gluon_kernels.matmul.k_loop`) with right read as a transposed B, fp16 out.
3. `_out_norm_project_kernel`: per tile of 64 pairs (b, i, j), the product's and the out gate's [hidden, 64]
   tiles by TMA, LayerNorm over hidden times the out gate, stored to shared memory as fp16, then the output
   projection on wgmma with that tile as a transposed A, in 64-wide chunks of dim, float32 out.

Differences the language forces, against the Triton port:
- wgmma takes at least 64 rows, and its shared-memory tiles tile whole arrays: N is padded to a multiple of 64
  (not 16), hidden to at least 64 channels (zero weights: a padded channel is exactly 0 in left, right and the
  product, and its out-norm weight and bias are 0), and every tile of pairs is 64 pairs (the Triton port's 128),
  as in the Mosaic GPU port.

Not forced by the language: the LayerNorm and the projections are one kernel here, two in the other ports (their
normed tensor goes through global memory). Same arithmetic, the same fp16 normed values: the bits did not move.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from gluon_kernels import fence_async_shared, gl, gluon, mbarrier, tma, tma_load, use_device_scratch, warpgroup_mma
from gluon_kernels import warpgroup_mma_wait
from gluon_kernels.matmul import k_loop, shared_layout, store_tile
from ports.trimul import LAYER_NORM_EPS, PROJECTIONS, validate
from kernel_support.trimul_common import (check_kernel_sizes, float16_weights, largest_power_of_two_dividing,
                                          padded_inputs, padded_length, refuse_flagged, scratch)
from kernel_support.triton_launch import launch

SEQUENCE_MULTIPLE = 64  # N as the kernels get it (see the module's docstring)
MIN_HIDDEN = 64  # wgmma's least M: fewer channels are padded with zero weights


@dataclass(frozen=True)
class GluonTriMulTiling:
    """The Gluon port's tiles and launch settings, named as `kernel_support.trimul_common.TriMulTiling`'s where they
    mean the same.

    rows: pairs (b, i, k) per program in the norm-projection and output kernels, one warpgroup's wgmma rows;
    tile_dim: the chunk of dim a weight tile of the norm-projection covers; tile_out: the chunk of dim written per
    step of the output projection; tile_i = tile_j: the triangle contraction's square output tiles;
    project_stages: the norm-projection's weight ring; contract_stages: the contraction's K loop.
    """

    rows: int
    tile_dim: int
    tile_out: int
    tile_i: int
    project_warps: int
    contract_warps: int
    output_warps: int = 4
    project_stages: int = 3
    contract_stages: int = 3


@functools.lru_cache(maxsize=4096)  # a share of a call's host path otherwise (experiments/cached-launch)
def gluon_trimul_tiling(seq: int, dim: int, channels: int) -> GluonTriMulTiling:
    """The tiles for N = seq (a multiple of SEQUENCE_MULTIPLE), dim and the padded channels."""
    tile = largest_power_of_two_dividing(seq, 128)
    # two warpgroups split a projection's channels where they come in 128s: fewer registers a thread, faster
    # (results/h200/experiments/gluon-trimul/, "two warpgroups")
    return GluonTriMulTiling(rows=64, tile_dim=largest_power_of_two_dividing(dim, 64),
                             tile_out=largest_power_of_two_dividing(dim, 64), tile_i=tile,
                             project_warps=8 if channels % 128 == 0 else 4, contract_warps=8 if tile == 128 else 4)


@gluon.jit
def _sigmoid(v):
    return 1.0 / (1.0 + gl.exp(-v))


@gluon.jit
def _load_weight_tile(weight_desc, w_ring, loaded, step, CHUNKS: gl.constexpr, STAGES: gl.constexpr):
    """Step `step` of the norm-projection's static schedule: weight block step // CHUNKS (left_proj, left_gate,
    right_proj, right_gate, out_gate), its chunk step % CHUNKS of dim, into ring slot step % STAGES."""
    CHANNELS: gl.constexpr = weight_desc.block_type.shape[0]
    TILE_DIM: gl.constexpr = weight_desc.block_type.shape[1]
    slot = step % STAGES
    mbarrier.expect(loaded.index(slot), weight_desc.block_type.nbytes)
    tma_load(weight_desc, [(step // CHUNKS) * CHANNELS, (step % CHUNKS) * TILE_DIM], loaded.index(slot),
             w_ring.index(slot))


@gluon.jit
def _norm_project_kernel(x_ptr, gamma_ptr, beta_ptr, mask_ptr, weight_ptr, gated_ptr, batch, pairs_per_batch, eps,
                         DIM: gl.constexpr, CHANNELS: gl.constexpr, TILE_DIM: gl.constexpr, PAIRS: gl.constexpr,
                         W_LAYOUT: gl.constexpr, G_LAYOUT: gl.constexpr, STAGES: gl.constexpr,
                         num_warps: gl.constexpr):
    """LayerNorm and all five projections of a tile of 64 pairs: the normed tile is made once, kept in shared
    memory as wgmma's B operand (fp16, in dim chunks), and the weights stream through a TMA ring one [channels,
    tile_dim] tile a step, in a static schedule; the gated groups' projection and gate are two accumulators."""
    # the TMA descriptors made here, on the device, in global scratch: none is encoded by the host at the launch
    weight_desc = tma.make_tensor_descriptor(weight_ptr, [5 * CHANNELS, DIM], [DIM, 1], [CHANNELS, TILE_DIM], W_LAYOUT)
    gated_desc = tma.make_tensor_descriptor(gated_ptr, [3 * batch * CHANNELS, pairs_per_batch], [pairs_per_batch, 1],
                                            [CHANNELS, PAIRS], G_LAYOUT)
    CHUNKS: gl.constexpr = DIM // TILE_DIM
    gl.static_assert(STAGES >= 2, "the ring's first wait needs a tile loaded before it")
    row0 = gl.program_id(0) * PAIRS
    w_ring = gl.allocate_shared_memory(weight_desc.dtype, [STAGES, CHANNELS, TILE_DIM], weight_desc.layout)
    loaded = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for buffer in gl.static_range(STAGES):
        mbarrier.init(loaded.index(buffer), count=1)
    for first in gl.static_range(STAGES - 1):  # the first weight tiles load under the norm
        _load_weight_tile(weight_desc, w_ring, loaded, first, CHUNKS, STAGES)

    blocked: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])
    rows = row0 + gl.arange(0, PAIRS, layout=gl.SliceLayout(1, blocked))
    cols = gl.arange(0, TILE_DIM, layout=gl.SliceLayout(0, blocked))
    x_rows = x_ptr + rows[:, None] * DIM + cols[None, :]
    mean = gl.zeros([PAIRS], gl.float32, gl.SliceLayout(1, blocked))
    m2 = gl.zeros([PAIRS], gl.float32, gl.SliceLayout(1, blocked))
    for d0 in gl.static_range(0, DIM, TILE_DIM):  # chunk statistics merged as Chan et al. do
        x = gl.load(x_rows + d0)
        chunk_mean = gl.sum(x, axis=1) / TILE_DIM
        centred = x - chunk_mean[:, None]
        delta = chunk_mean - mean
        seen = (d0 + TILE_DIM) * 1.0
        mean += delta * (TILE_DIM / seen)
        m2 += gl.sum(centred * centred, axis=1) + delta * delta * (d0 * TILE_DIM / seen)
    # a sum of squares past float32's range (|x| beyond about 1e19) would make rstd 0 and the row finite and wrong: NaN
    # instead, which the port refuses (refuse_flagged)
    rstd = gl.where(m2 < float("inf"), 1.0 / gl.sqrt(m2 / DIM + eps), float("nan"))
    xn_smem = gl.allocate_shared_memory(gl.float16, [CHUNKS, PAIRS, TILE_DIM],
                                        gl.NVMMASharedLayout.get_default_for([PAIRS, TILE_DIM], gl.float16))
    for chunk in gl.static_range(CHUNKS):
        x = gl.load(x_rows + chunk * TILE_DIM)
        gamma = gl.load(gamma_ptr + chunk * TILE_DIM + cols)
        beta = gl.load(beta_ptr + chunk * TILE_DIM + cols)
        xn_smem.index(chunk).store(((x - mean[:, None]) * rstd[:, None] * gamma[None, :] + beta[None, :])
                                   .to(gl.float16))
    fence_async_shared()  # the normed tile's stores, before wgmma reads it

    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                     instr_shape=[16, PAIRS, 16])
    b = row0 // pairs_per_batch
    mask = gl.load(mask_ptr + row0 + gl.arange(0, PAIRS, layout=gl.SliceLayout(0, layout))).to(gl.float32)
    for group in gl.static_range(3):  # left, right (gated), out gate
        projection = gl.zeros([CHANNELS, PAIRS], gl.float32, layout)
        gate = gl.zeros([CHANNELS, PAIRS], gl.float32, layout)
        for part in gl.static_range(2 if group < 2 else 1):
            for chunk in gl.static_range(CHUNKS):
                step = (2 * group + part) * CHUNKS + chunk
                slot = step % STAGES
                mbarrier.wait(loaded.index(slot), (step // STAGES) & 1)
                if part == 0:
                    projection = warpgroup_mma(w_ring.index(slot), xn_smem.index(chunk).permute((1, 0)), projection,
                                               is_async=True)
                    projection = warpgroup_mma_wait(1, deps=(projection,))
                else:
                    gate = warpgroup_mma(w_ring.index(slot), xn_smem.index(chunk).permute((1, 0)), gate,
                                         is_async=True)
                    gate = warpgroup_mma_wait(1, deps=(gate,))
                if step + STAGES - 1 < 5 * CHUNKS:  # the slot the step before read (its wgmma done), refilled
                    _load_weight_tile(weight_desc, w_ring, loaded, step + STAGES - 1, CHUNKS, STAGES)
        if group < 2:
            projection, gate = warpgroup_mma_wait(0, deps=(projection, gate))
            value = projection * _sigmoid(gate) * mask[None, :]
        else:
            projection = warpgroup_mma_wait(0, deps=(projection,))
            value = _sigmoid(projection)
        store_tile(value, gated_desc, (group * batch + b) * CHANNELS, row0 - b * pairs_per_batch)
    for buffer in gl.static_range(STAGES):
        mbarrier.invalidate(loaded.index(buffer))


@gluon.jit
def _triangle_kernel(gated_ptr, product_ptr, batch_channels, SEQ: gl.constexpr, TILE: gl.constexpr,
                     G_LAYOUT: gl.constexpr, P_LAYOUT: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
    """gated [3 * B * channels * N, N], product [B * channels * N, N]: row (bh * N + i) holds [bh, i, :]."""
    gated_desc = tma.make_tensor_descriptor(gated_ptr, [3 * batch_channels * SEQ, SEQ], [SEQ, 1], [TILE, 64], G_LAYOUT)
    product_desc = tma.make_tensor_descriptor(product_ptr, [batch_channels * SEQ, SEQ], [SEQ, 1], [TILE, TILE],
                                              P_LAYOUT)
    tile = gl.program_id(0)
    bh = gl.program_id(1)
    i0 = (tile // (SEQ // TILE)) * TILE
    j0 = (tile % (SEQ // TILE)) * TILE
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                     instr_shape=[16, TILE, 16])
    acc = k_loop(gated_desc, gated_desc, bh * SEQ + i0, (batch_channels + bh) * SEQ + j0, SEQ,
                 gl.zeros([TILE, TILE], gl.float32, layout), STAGES, True)
    store_tile(acc, product_desc, bh * SEQ + i0, j0)


@gluon.jit
def _out_norm_project_kernel(product_ptr, gated_ptr, gamma_ptr, beta_ptr, weight_ptr, out_ptr, flags_ptr,
                             batch_channels, pairs_per_batch, eps, HIDDEN: gl.constexpr, WIDTH: gl.constexpr,
                             CHANNELS: gl.constexpr, PAIRS: gl.constexpr, TILE_OUT: gl.constexpr,
                             IN_LAYOUT: gl.constexpr, W_LAYOUT: gl.constexpr, OUT_LAYOUT: gl.constexpr,
                             num_warps: gl.constexpr):
    """product_desc and gated_desc channel-major, [B * channels, N * N] and [3 * B * channels, N * N], in
    [channels, pairs] tiles; weight_desc: to_out's weight transposed, [channels, width], in [channels, tile_out]
    tiles; channels >= HIDDEN, the padded ones exactly 0 in the product (see the module's docstring)."""
    product_desc = tma.make_tensor_descriptor(product_ptr, [batch_channels, pairs_per_batch], [pairs_per_batch, 1],
                                              [CHANNELS, PAIRS], IN_LAYOUT)
    gated_desc = tma.make_tensor_descriptor(gated_ptr, [3 * batch_channels, pairs_per_batch], [pairs_per_batch, 1],
                                            [CHANNELS, PAIRS], IN_LAYOUT)
    weight_desc = tma.make_tensor_descriptor(weight_ptr, [CHANNELS, WIDTH], [WIDTH, 1], [CHANNELS, TILE_OUT], W_LAYOUT)
    out_desc = tma.make_tensor_descriptor(out_ptr, [(batch_channels // CHANNELS) * pairs_per_batch, WIDTH], [WIDTH, 1],
                                          [PAIRS, TILE_OUT], OUT_LAYOUT)
    row0 = gl.program_id(0) * PAIRS
    b = row0 // pairs_per_batch
    column = row0 - b * pairs_per_batch
    inputs = gl.allocate_shared_memory(product_desc.dtype, [2, CHANNELS, PAIRS], product_desc.layout)
    weights = gl.allocate_shared_memory(weight_desc.dtype, [2, CHANNELS, TILE_OUT], weight_desc.layout)
    loaded = gl.allocate_shared_memory(gl.int64, [3, 1], mbarrier.MBarrierLayout())  # weight chunks; the inputs
    for barrier in gl.static_range(3):
        mbarrier.init(loaded.index(barrier), count=1)
    mbarrier.expect(loaded.index(2), 2 * product_desc.block_type.nbytes)  # the product's tile and the out gate's
    tma_load(product_desc, [b * CHANNELS, column], loaded.index(2), inputs.index(0))
    tma_load(gated_desc, [2 * batch_channels + b * CHANNELS, column], loaded.index(2), inputs.index(1))
    mbarrier.expect(loaded.index(0), weight_desc.block_type.nbytes)  # the first chunk loads under the norm
    tma_load(weight_desc, [0, 0], loaded.index(0), weights.index(0))

    tile: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    channel = gl.arange(0, CHANNELS, layout=gl.SliceLayout(1, tile))
    mbarrier.wait(loaded.index(2), 0)
    product = inputs.index(0).load(tile).to(gl.float32)
    mean = gl.sum(product, axis=0) / HIDDEN  # padded channels add 0 to the sum
    centred = product - mean[None, :]
    # and (0 - mean)^2 each to the sum of squares: taken back out
    squares = gl.sum(centred * centred, axis=0) - (CHANNELS - HIDDEN) * mean * mean
    rstd = 1.0 / gl.sqrt(squares / HIDDEN + eps)
    gamma = gl.load(gamma_ptr + channel)
    beta = gl.load(beta_ptr + channel)
    gate = inputs.index(1).load(tile).to(gl.float32)
    normed = (centred * rstd[None, :] * gamma[:, None] + beta[:, None]) * gate
    normed = normed.to(gl.float16)
    not_finite = gl.max(gl.max(((normed != normed) | (gl.abs(normed) == float("inf"))).to(gl.int32), axis=1), axis=0)
    gl.store(flags_ptr, 1, mask=not_finite > 0)  # the range check's flag (refuse_flagged)
    normed_smem = gl.allocate_shared_memory(gl.float16, [CHANNELS, PAIRS], product_desc.layout, normed)
    fence_async_shared()  # the tile's stores, before wgmma reads it

    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                     instr_shape=[16, TILE_OUT, 16])
    for chunk in gl.static_range(WIDTH // TILE_OUT):
        if chunk + 1 < WIDTH // TILE_OUT:  # the next chunk loads under this one's product and store
            mbarrier.expect(loaded.index((chunk + 1) % 2), weight_desc.block_type.nbytes)
            tma_load(weight_desc, [0, (chunk + 1) * TILE_OUT], loaded.index((chunk + 1) % 2),
                     weights.index((chunk + 1) % 2))
        mbarrier.wait(loaded.index(chunk % 2), (chunk // 2) & 1)
        acc = warpgroup_mma(normed_smem.permute((1, 0)), weights.index(chunk % 2),
                            gl.zeros([PAIRS, TILE_OUT], gl.float32, layout), is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc,))
        store_tile(acc, out_desc, row0, chunk * TILE_OUT)
    for barrier in gl.static_range(3):
        mbarrier.invalidate(loaded.index(barrier))


def trimul(data, *, poison: bool = False, host_check: bool = False) -> torch.Tensor:
    """TriMul forward for GPU MODE's `(x, mask, weights, config)` on a CUDA GPU; returns [B, N, N, dim] float32.

    poison=True fills every buffer with NaN first, so a tile a kernel fails to write shows. An input that overflows
    the float16 intermediates is refused (`refuse_flagged`): by a device-side assertion, with no synchronisation in
    the call, or with host_check=True (and always under Triton's interpreter) by Float16RangeError, after one read
    back.
    """
    validate(data, "torch")
    x, mask, weights, config = data
    batch, length, _, dim = x.shape
    hidden = config["hidden_dim"]
    seq = padded_length(length, SEQUENCE_MULTIPLE)
    check_kernel_sizes(batch, seq, dim, hidden)
    x, mask = padded_inputs(x, mask, seq)  # zeros, with mask 0: see padded_length
    channels = max(hidden, MIN_HIDDEN)
    pairs = batch * seq * seq
    allocate = scratch(x.device, poison)

    def by_channel(w):  # a [hidden] vector padded to `channels` with zeros (no copy where none are padded)
        return w if channels == hidden else torch.nn.functional.pad(w, (0, channels - hidden))

    # the weights in float16, padded to `channels` rows, in one launch
    proj_weight, out_weight_t, flags = float16_weights([weights[f"{name}.weight"] for name in PROJECTIONS],
                                                       weights["to_out.weight"], hidden, channels, dim, launch)
    gated = allocate((3 * batch * channels, seq * seq), torch.float16)
    tiles = gluon_trimul_tiling(seq, dim, channels)
    pairs_layout = shared_layout((channels, tiles.rows), torch.float16)  # the gated and product tiles of pairs
    weight_layout = shared_layout((channels, tiles.tile_dim), torch.float16)
    gated_layout = shared_layout((tiles.tile_i, 64), torch.float16)
    product_layout = shared_layout((tiles.tile_i, tiles.tile_i), torch.float16)
    out_weight_layout = shared_layout((channels, tiles.tile_out), torch.float16)
    out_layout = shared_layout((tiles.rows, tiles.tile_out), torch.float32)
    use_device_scratch()
    launch(_norm_project_kernel, (pairs // tiles.rows,),
        x.contiguous(), weights["norm.weight"].contiguous(), weights["norm.bias"].contiguous(),
        mask.contiguous().reshape(pairs), proj_weight, gated, batch, seq * seq, LAYER_NORM_EPS, DIM=dim,
        CHANNELS=channels, TILE_DIM=tiles.tile_dim, PAIRS=tiles.rows,
        W_LAYOUT=weight_layout, G_LAYOUT=pairs_layout,
        STAGES=tiles.project_stages, num_warps=tiles.project_warps)
    # the rest is set up while the norm-projection runs: the GPU waits for no host work it does not need
    product = allocate((batch * channels * seq, seq), torch.float16)
    out = allocate((pairs, dim), torch.float32)
    launch(_triangle_kernel, ((seq // tiles.tile_i) ** 2, batch * channels),
        gated, product, batch * channels, SEQ=seq, TILE=tiles.tile_i,
        G_LAYOUT=gated_layout, P_LAYOUT=product_layout, STAGES=tiles.contract_stages, num_warps=tiles.contract_warps)
    launch(_out_norm_project_kernel, (pairs // tiles.rows,),
        product, gated, by_channel(weights["to_out_norm.weight"]).contiguous(),
        by_channel(weights["to_out_norm.bias"]).contiguous(), out_weight_t, out, flags, batch * channels, seq * seq,
        LAYER_NORM_EPS, HIDDEN=hidden, WIDTH=dim, CHANNELS=channels, PAIRS=tiles.rows, TILE_OUT=tiles.tile_out,
        IN_LAYOUT=pairs_layout, W_LAYOUT=out_weight_layout, OUT_LAYOUT=out_layout, num_warps=tiles.output_warps)
    out = out.view(batch, seq, seq, dim)
    refuse_flagged(flags, "gluon", launch, on_host=host_check)
    return out if seq == length else out[:, :length, :length].contiguous()
