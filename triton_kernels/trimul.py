"""TriMul in Triton: four kernels, fp16 tensor-core products with fp32 accumulation.

The computation is split where a reduction changes axis:
1. `_layer_norm_kernel`: per tile of `norm_rows` consecutive pairs (b, i, k), LayerNorm over dim
   (fp32 statistics in one pass over x), written as fp16 `normed` [B*N*N, dim]. Normalising
   inside the projection kernel instead ran slower (results/h200/experiments/gluon-trimul/): the
   dot operand computed in registers kept Triton from pipelining its loads.
2. `_gated_project_kernel`: the five projections as one fp16 matmul per tile. Programs
   3t+0 and 3t+1 make left and right (projection * mask * sigmoid(gate)) for tile t,
   3t+2 makes sigmoid(out_gate); the three programs of a tile run side by side, so `normed`
   comes from DRAM once and from L2 after. Each writes a [hidden, rows] tile, channel-major,
   into `gated` [3, B*hidden, N*N] fp16: the contraction then reads row-major matrices.
3. `_triangle_kernel`: for each (b, h), product = left @ right^T over k: a batched
   [N, N] x [N, N]^T matmul, tile_i x tile_j output tiles, tile_k steps, fp16 out.
4. `_out_norm_project_kernel`: per tile of `rows` pairs (b, i, j), LayerNorm over hidden of
   the product (read as [hidden, rows], coalesced along j), times the out gate, then the
   output projection to dim in tile_out chunks, fp32 out.
fp16 rather than bf16: three more mantissa bits, and every intermediate stays far inside its
range (LayerNorm bounds the projections' inputs; products are sums of N gated terms).
"""
from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl

from ports.trimul import LAYER_NORM_EPS, PROJECTIONS, validate
from kernel_support.trimul_common import (TriMulTiling, any_not_finite, float16_weights, kernel_tiling, padded_inputs,
                                          padded_length, refuse_flagged, scratch, shard_rows)
from kernel_support.triton_launch import launch


@triton.jit
def _row_statistics(x_rows, eps, DIM: tl.constexpr, ROWS: tl.constexpr, TILE_DIM: tl.constexpr):
    """Mean and 1/std of each row in one pass over x: per-chunk mean and centred sum of
    squares, merged as Chan et al. do, so no large sums of squares cancel."""
    cols = tl.arange(0, TILE_DIM)
    mean = tl.zeros([ROWS], tl.float32)
    m2 = tl.zeros([ROWS], tl.float32)
    for d0 in range(0, DIM, TILE_DIM):
        x = tl.load(x_rows + d0 + cols[None, :])
        chunk_mean = tl.sum(x, axis=1) / TILE_DIM
        centred = x - chunk_mean[:, None]
        delta = chunk_mean - mean
        seen = (d0 + TILE_DIM) * 1.0
        mean += delta * (TILE_DIM / seen)
        m2 += tl.sum(centred * centred, axis=1) + delta * delta * (d0 * TILE_DIM / seen)
    # a sum of squares past float32's range (|x| beyond about 1e19) would make rstd 0 and the row finite and wrong: NaN
    # instead, which the port refuses (refuse_flagged)
    return mean, tl.where(m2 < float("inf"), 1.0 / tl.sqrt(m2 / DIM + eps), float("nan"))


@triton.jit
def _layer_norm_kernel(x_ptr, norm_weight_ptr, norm_bias_ptr, xn_ptr, eps,
                       DIM: tl.constexpr, ROWS: tl.constexpr, TILE_DIM: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, TILE_DIM)
    x_rows = x_ptr + rows[:, None] * DIM
    mean, rstd = _row_statistics(x_rows, eps, DIM, ROWS, TILE_DIM)
    for d0 in range(0, DIM, TILE_DIM):
        x = tl.load(x_rows + d0 + cols[None, :])
        gamma = tl.load(norm_weight_ptr + d0 + cols)
        beta = tl.load(norm_bias_ptr + d0 + cols)
        xn = (x - mean[:, None]) * rstd[:, None] * gamma[None, :] + beta[None, :]
        tl.store(xn_ptr + rows[:, None] * DIM + d0 + cols[None, :], xn.to(tl.float16))


@triton.jit
def _project(xn_rows, weight_ptr, DIM: tl.constexpr, HIDDEN: tl.constexpr, ROWS: tl.constexpr,
             TILE_DIM: tl.constexpr, GATED: tl.constexpr):
    """[HIDDEN, ROWS] = W @ xn^T; with GATED, times sigmoid(W_next @ xn^T)."""
    cols = tl.arange(0, TILE_DIM)
    w_rows = weight_ptr + tl.arange(0, HIDDEN)[:, None] * DIM + cols[None, :]
    value = tl.zeros([HIDDEN, ROWS], tl.float32)
    gate = tl.zeros([HIDDEN, ROWS], tl.float32)
    for d0 in range(0, DIM, TILE_DIM):
        xn = tl.load(xn_rows + d0 + cols[None, :])
        value += tl.dot(tl.load(w_rows + d0), tl.trans(xn))
        if GATED:
            gate += tl.dot(tl.load(w_rows + HIDDEN * DIM + d0), tl.trans(xn))
    if GATED:
        return value * tl.sigmoid(gate)
    return tl.sigmoid(value)


@triton.jit
def _gated_project_kernel(xn_ptr, mask_ptr, proj_weight_ptr, gated_ptr, batch, pairs_per_batch,
                          DIM: tl.constexpr, HIDDEN: tl.constexpr, ROWS: tl.constexpr,
                          TILE_DIM: tl.constexpr):
    pid = tl.program_id(0)
    group = pid % 3  # 0 left, 1 right, 2 out gate
    row0 = (pid // 3) * ROWS
    rows = row0 + tl.arange(0, ROWS)
    xn_rows = xn_ptr + rows[:, None] * DIM
    weight_ptr = proj_weight_ptr + 2 * group * HIDDEN * DIM
    if group < 2:
        mask = tl.load(mask_ptr + rows).to(tl.float32)
        tile = _project(xn_rows, weight_ptr, DIM, HIDDEN, ROWS, TILE_DIM, True) * mask[None, :]
    else:
        tile = _project(xn_rows, weight_ptr, DIM, HIDDEN, ROWS, TILE_DIM, False)
    b = row0 // pairs_per_batch
    dest = (gated_ptr + ((group * batch + b) * HIDDEN + tl.arange(0, HIDDEN)[:, None]) * pairs_per_batch
            + (row0 - b * pairs_per_batch) + tl.arange(0, ROWS)[None, :])
    tl.store(dest, tile.to(tl.float16))


@triton.jit
def _triangle_kernel(gated_ptr, product_ptr, batch_hidden, LEFT_SEQ: tl.constexpr, SEQ: tl.constexpr,
                     TILE_I: tl.constexpr, TILE_J: tl.constexpr, TILE_K: tl.constexpr):
    # gated: left [B*hidden, LEFT_SEQ, N], then right [B*hidden, N, N]; product [B*hidden, LEFT_SEQ, N]. LEFT_SEQ is
    # N but for the rows of a shard (trimul_rows).
    tile = tl.program_id(0)
    bh = tl.program_id(1)
    i = (tile // (SEQ // TILE_J)) * TILE_I + tl.arange(0, TILE_I)
    j = (tile % (SEQ // TILE_J)) * TILE_J + tl.arange(0, TILE_J)
    k = tl.arange(0, TILE_K)
    left = gated_ptr + bh * LEFT_SEQ * SEQ + i[:, None] * SEQ + k[None, :]
    right = gated_ptr + batch_hidden * LEFT_SEQ * SEQ + bh * SEQ * SEQ + j[:, None] * SEQ + k[None, :]
    acc = tl.zeros([TILE_I, TILE_J], tl.float32)
    for k0 in range(0, SEQ, TILE_K):
        acc += tl.dot(tl.load(left + k0), tl.trans(tl.load(right + k0)))
    dest = product_ptr + bh * LEFT_SEQ * SEQ + i[:, None] * SEQ + j[None, :]
    tl.store(dest, acc.to(tl.float16))


@triton.jit
def _out_norm_project_kernel(product_ptr, gated_ptr, out_norm_weight_ptr, out_norm_bias_ptr,
                             out_weight_t_ptr, out_ptr, flags_ptr, batch_hidden, pairs_per_batch, eps,
                             DIM: tl.constexpr, HIDDEN: tl.constexpr, ROWS: tl.constexpr,
                             TILE_OUT: tl.constexpr):
    row0 = tl.program_id(0) * ROWS
    b = row0 // pairs_per_batch
    hidden = tl.arange(0, HIDDEN)
    offsets = ((b * HIDDEN + hidden[:, None]) * pairs_per_batch
               + (row0 - b * pairs_per_batch) + tl.arange(0, ROWS)[None, :])
    product = tl.load(product_ptr + offsets).to(tl.float32)  # [HIDDEN, ROWS]
    mean = tl.sum(product, axis=0) / HIDDEN
    centred = product - mean[None, :]
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=0) / HIDDEN + eps)
    gamma = tl.load(out_norm_weight_ptr + hidden)
    beta = tl.load(out_norm_bias_ptr + hidden)
    out_gate = tl.load(gated_ptr + 2 * batch_hidden * pairs_per_batch + offsets).to(tl.float32)
    normed = ((centred * rstd[None, :] * gamma[:, None] + beta[:, None]) * out_gate).to(tl.float16)
    tl.store(flags_ptr, 1, mask=any_not_finite(normed) > 0)  # the range check's flag (refuse_flagged)
    cols = tl.arange(0, TILE_OUT)
    out_rows = out_ptr + (row0 + tl.arange(0, ROWS))[:, None] * DIM + cols[None, :]
    for d0 in range(0, DIM, TILE_OUT):
        w = tl.load(out_weight_t_ptr + hidden[:, None] * DIM + d0 + cols[None, :])  # [HIDDEN, TILE_OUT]
        tl.store(out_rows + d0, tl.dot(tl.trans(normed), w))


@functools.lru_cache(maxsize=4096)  # a share of a call's host path otherwise (experiments/cached-launch)
def triton_tiling(batch: int, seq: int, dim: int, hidden: int) -> TriMulTiling:
    """The ports' shared tiles (`kernel_tiling`), with 64-row output tiles on 4 warps where dim <= 128: faster
    here, while the Pallas port's lowering runs the shared 128-row tiling as fast already
    (results/h200/experiments/trimul-output-rows/)."""
    tiles = kernel_tiling(batch, seq, dim, hidden)
    return dataclasses.replace(tiles, output_rows=64, output_warps=4) if dim <= 128 else tiles


def trimul(data, *, poison: bool = False, host_check: bool = False) -> torch.Tensor:
    """TriMul forward for GPU MODE's `(x, mask, weights, config)`; returns [B, N, N, dim] float32.

    poison=True fills every buffer with NaN first, so a tile a kernel fails to write shows. An input that overflows
    the float16 intermediates is refused (`refuse_flagged`): by a device-side assertion, with no synchronisation in
    the call, or with host_check=True (and always under Triton's interpreter) by Float16RangeError, after one read
    back.
    """
    validate(data, "torch")
    x, mask, weights, config = data
    batch, length, _, dim = x.shape
    hidden = config["hidden_dim"]
    seq = padded_length(length)
    x, mask = padded_inputs(x, mask, seq)  # zeros, with mask 0: see padded_length
    tiles = triton_tiling(batch, seq, dim, hidden)
    pairs = batch * seq * seq
    allocate = scratch(x.device, poison)

    normed = allocate((pairs, dim), torch.float16)
    launch(_layer_norm_kernel, (pairs // tiles.norm_rows,),
        x.contiguous(), weights["norm.weight"].contiguous(), weights["norm.bias"].contiguous(), normed,
        LAYER_NORM_EPS, DIM=dim, ROWS=tiles.norm_rows, TILE_DIM=tiles.tile_dim, num_warps=tiles.norm_warps,
        num_stages=tiles.stages)
    # the rest is set up while the LayerNorm runs: the GPU waits for no host work it does not need
    proj_weight, out_weight_t, flags = float16_weights([weights[f"{name}.weight"] for name in PROJECTIONS],
                                                       weights["to_out.weight"], hidden, hidden, dim, launch)
    gated = allocate((3 * batch * hidden, seq * seq), torch.float16)
    product = allocate((batch * hidden, seq * seq), torch.float16)
    out = allocate((pairs, dim), torch.float32)
    launch(_gated_project_kernel, (3 * pairs // tiles.rows,),
        normed, mask.contiguous(), proj_weight, gated, batch, seq * seq, DIM=dim, HIDDEN=hidden,
        ROWS=tiles.rows, TILE_DIM=tiles.tile_dim, num_warps=tiles.project_warps, num_stages=tiles.stages)
    launch(_triangle_kernel, ((seq // tiles.tile_i) * (seq // tiles.tile_j), batch * hidden),
        gated, product, batch * hidden, LEFT_SEQ=seq, SEQ=seq, TILE_I=tiles.tile_i, TILE_J=tiles.tile_j,
        TILE_K=tiles.tile_k, num_warps=tiles.contract_warps, num_stages=tiles.stages)
    launch(_out_norm_project_kernel, (pairs // tiles.output_rows,),
        product, gated, weights["to_out_norm.weight"].contiguous(), weights["to_out_norm.bias"].contiguous(),
        out_weight_t, out, flags, batch * hidden, seq * seq, LAYER_NORM_EPS, DIM=dim, HIDDEN=hidden,
        ROWS=tiles.output_rows, TILE_OUT=tiles.tile_out, num_warps=tiles.output_warps, num_stages=tiles.stages)
    out = out.view(batch, seq, seq, dim)
    refuse_flagged(flags, "triton", launch, on_host=host_check)
    return out if seq == length else out[:, :length, :length].contiguous()


def trimul_rows(data, group, *, poison: bool = False, host_check: bool = False) -> torch.Tensor:
    """This rank's rows i of TriMul's output, the sequence's rows split evenly across the ranks of a torch.distributed
    group (None: one process, all rows): the same bits as `trimul`'s rows.

    Every rank gets the whole input; it normalises and projects its own rows of pairs (b, i, k) alone, and the right
    projection is gathered (all rows j, in rank order: values moved, not summed), so each product's sum over k runs
    on one rank with `trimul`'s tile shape and k order. The triangle kernel contracts this rank's left rows, padded
    to whole tiles (so a row may sit at another place in its tile than in `trimul`: the same bits where a row's
    products do not depend on the tile's other rows, as on the GPU), against all the right rows; the output kernel
    runs on the rank's pairs. A rank's intermediates hold its rows and the whole right projection.
    Returns [B, rows, N, dim] for the rank's rows below N (padded rows cut). The range flags are reduced across the
    ranks (a maximum, exact), so all refuse together. poison and host_check: as `trimul`'s."""
    import torch.distributed as dist

    validate(data, "torch")
    x, mask, weights, config = data
    batch, length, _, dim = x.shape
    hidden = config["hidden_dim"]
    seq = padded_length(length)
    ranks, rank = (1, 0) if group is None else (dist.get_world_size(group), dist.get_rank(group))
    tiles = triton_tiling(batch, seq, dim, hidden)
    rows = shard_rows(seq, ranks, tiles, "ranks")
    x, mask = padded_inputs(x, mask, seq)
    mine = slice(rank * rows, (rank + 1) * rows)
    x, mask = x[:, mine].contiguous(), mask[:, mine].contiguous()
    pairs = batch * rows * seq
    allocate = scratch(x.device, poison)

    normed = allocate((pairs, dim), torch.float16)
    launch(_layer_norm_kernel, (pairs // tiles.norm_rows,),
        x, weights["norm.weight"].contiguous(), weights["norm.bias"].contiguous(), normed,
        LAYER_NORM_EPS, DIM=dim, ROWS=tiles.norm_rows, TILE_DIM=tiles.tile_dim, num_warps=tiles.norm_warps,
        num_stages=tiles.stages)
    proj_weight, out_weight_t, flags = float16_weights([weights[f"{name}.weight"] for name in PROJECTIONS],
                                                       weights["to_out.weight"], hidden, hidden, dim, launch)
    gated = allocate((3 * batch * hidden, rows * seq), torch.float16)
    launch(_gated_project_kernel, (3 * pairs // tiles.rows,),
        normed, mask.reshape(pairs), proj_weight, gated, batch, rows * seq, DIM=dim, HIDDEN=hidden,
        ROWS=tiles.rows, TILE_DIM=tiles.tile_dim, num_warps=tiles.project_warps, num_stages=tiles.stages)
    left, right, _ = gated.view(3, batch * hidden, rows, seq).unbind(0)  # the out gate stays in gated
    pieces = [torch.empty_like(right) for _ in range(ranks)] if ranks > 1 else [right]
    if ranks > 1:
        dist.all_gather(pieces, right.contiguous(), group=group)
    left_seq = -(-rows // tiles.tile_i) * tiles.tile_i  # this rank's left rows, padded to whole tiles
    left = torch.nn.functional.pad(left, (0, 0, 0, left_seq - rows))
    triangle_in = torch.cat([left.flatten(), torch.cat(pieces, dim=1).flatten()])
    product = allocate((batch * hidden, left_seq, seq), torch.float16)
    launch(_triangle_kernel, ((left_seq // tiles.tile_i) * (seq // tiles.tile_j), batch * hidden),
        triangle_in, product, batch * hidden, LEFT_SEQ=left_seq, SEQ=seq, TILE_I=tiles.tile_i, TILE_J=tiles.tile_j,
        TILE_K=tiles.tile_k, num_warps=tiles.contract_warps, num_stages=tiles.stages)
    out = allocate((pairs, dim), torch.float32)
    launch(_out_norm_project_kernel, (pairs // tiles.output_rows,),
        product[:, :rows].contiguous(), gated,
        weights["to_out_norm.weight"].contiguous(), weights["to_out_norm.bias"].contiguous(),
        out_weight_t, out, flags, batch * hidden, rows * seq, LAYER_NORM_EPS, DIM=dim, HIDDEN=hidden,
        ROWS=tiles.output_rows, TILE_OUT=tiles.tile_out, num_warps=tiles.output_warps, num_stages=tiles.stages)
    if ranks > 1:
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)
    refuse_flagged(flags, "triton", launch, on_host=host_check)
    kept = max(0, min(rows, length - rank * rows))
    return out.view(batch, rows, seq, dim)[:, :kept, :length].contiguous()
