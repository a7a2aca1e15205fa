"""TriMul in Pallas (Triton lowering): the same four kernels as triton_kernels/trimul.py.

1. `_layer_norm_kernel`: per tile of `norm_rows` pairs (b, i, k), LayerNorm over dim (fp32
   statistics in one pass over x), written as fp16 `normed` [B*N*N, dim].
2. `_gated_project_kernel`: left and right (projection * mask * sigmoid(gate)) or
   sigmoid(out_gate): program 3t+g does group g of tile t, so a tile's three programs share
   `normed` through L2. Each writes a [hidden, rows] fp16 tile into `gated` [3*B*hidden, N*N],
   channel-major, so that the contraction reads row-major matrices.
3. `_triangle_kernel`: per (b, h), product = left @ right^T, tile_i x tile_j tiles,
   tile_k steps, fp32 accumulation, fp16 out.
4. `_out_norm_project_kernel`: per tile of `rows` pairs (b, i, j), LayerNorm over hidden of the
   product ([hidden, rows] tile), times the out gate, then the output projection, fp32 out.
The refs are whole arrays (no BlockSpecs): each kernel slices them with pl.ds at offsets it
computes from its program id, as the Triton kernels do with pointers. On a machine without a
GPU the kernels run in Pallas interpret mode, whose fresh outputs start as NaN.
`trimul_sharded` runs the same kernels on each device's rows i under `jax.shard_map`, with `trimul`'s bits.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton
from jax.sharding import NamedSharding, PartitionSpec

from kernel_support.jax_backend import check_platform, interpreted
from kernel_support.jax_padding import cut_to, zero_padded
from ports.trimul import LAYER_NORM_EPS, PROJECTIONS, validate
from kernel_support.trimul_common import kernel_tiling, padded_length, refuse_non_finite, shard_rows


def _dot_nt(a, b):
    """a @ b^T with fp32 accumulation."""
    return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def _dot_tn(a, b):
    """a^T @ b with fp32 accumulation."""
    return jax.lax.dot_general(a, b, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def _row_statistics(x_ref, row0, *, dim, rows, tile_dim):
    """Mean and 1/std of each row in one pass over x: per-chunk mean and centred sum of
    squares, merged as Chan et al. do, so no large sums of squares cancel."""

    def step(d, carry):
        mean, m2 = carry
        d0 = pl.multiple_of(d * tile_dim, tile_dim)
        x = x_ref[pl.ds(row0, rows), pl.ds(d0, tile_dim)]
        chunk_mean = jnp.sum(x, axis=1) / tile_dim
        centred = x - chunk_mean[:, None]
        delta = chunk_mean - mean
        seen = (d0 + tile_dim).astype(jnp.float32)
        return (mean + delta * (tile_dim / seen),
                m2 + jnp.sum(centred * centred, axis=1) + delta * delta * (d0 * tile_dim / seen))

    zeros = jnp.zeros((rows,), jnp.float32)
    mean, m2 = jax.lax.fori_loop(0, dim // tile_dim, step, (zeros, zeros))
    # a sum of squares past float32's range (|x| beyond about 1e19) would make rstd 0 and the row finite and wrong: NaN
    # instead, which the port refuses (refuse_non_finite)
    return mean, jnp.where(m2 < jnp.inf, 1.0 / jnp.sqrt(m2 / dim + LAYER_NORM_EPS), jnp.nan)


def _layer_norm_kernel(x_ref, norm_weight_ref, norm_bias_ref, normed_ref, *, dim, rows, tile_dim):
    row0 = pl.program_id(0) * rows
    mean, rstd = _row_statistics(x_ref, row0, dim=dim, rows=rows, tile_dim=tile_dim)

    def step(d, carry):
        d0 = pl.multiple_of(d * tile_dim, tile_dim)
        x = x_ref[pl.ds(row0, rows), pl.ds(d0, tile_dim)]
        gamma = norm_weight_ref[pl.ds(d0, tile_dim)]
        beta = norm_bias_ref[pl.ds(d0, tile_dim)]
        xn = (x - mean[:, None]) * rstd[:, None] * gamma[None, :] + beta[None, :]
        normed_ref[pl.ds(row0, rows), pl.ds(d0, tile_dim)] = xn.astype(jnp.float16)
        return carry

    jax.lax.fori_loop(0, dim // tile_dim, step, 0)


def _project(normed_ref, row0, proj_weight_ref, first, *, dim, hidden, rows, tile_dim, gated):
    """[hidden, rows] = W @ xn^T; with `gated`, times sigmoid(W_next @ xn^T)."""

    def step(d, carry):
        value, gate = carry
        d0 = pl.multiple_of(d * tile_dim, tile_dim)
        xn = normed_ref[pl.ds(row0, rows), pl.ds(d0, tile_dim)]
        value += _dot_nt(proj_weight_ref[pl.ds(first, hidden), pl.ds(d0, tile_dim)], xn)
        if gated:
            gate += _dot_nt(proj_weight_ref[pl.ds(first + hidden, hidden), pl.ds(d0, tile_dim)], xn)
        return value, gate

    zeros = jnp.zeros((hidden, rows), jnp.float32)
    value, gate = jax.lax.fori_loop(0, dim // tile_dim, step, (zeros, zeros))
    return value * jax.nn.sigmoid(gate) if gated else jax.nn.sigmoid(value)


def _gated_project_kernel(normed_ref, mask_ref, proj_weight_ref, gated_ref, *, batch, pairs_per_batch, dim,
                          hidden, rows, tile_dim):
    pid = pl.program_id(0)
    group = pid % 3  # 0 left, 1 right, 2 out gate
    row0 = (pid // 3) * rows
    project = functools.partial(_project, normed_ref, row0, proj_weight_ref, 2 * group * hidden, dim=dim,
                                hidden=hidden, rows=rows, tile_dim=tile_dim)
    b = row0 // pairs_per_batch
    dest = (pl.ds((group * batch + b) * hidden, hidden), pl.ds(row0 - b * pairs_per_batch, rows))

    @pl.when(group < 2)
    def _():
        mask = mask_ref[pl.ds(row0, rows)].astype(jnp.float32)
        gated_ref[dest] = (project(gated=True) * mask[None, :]).astype(jnp.float16)

    @pl.when(group == 2)
    def _():
        gated_ref[dest] = project(gated=False).astype(jnp.float16)


def _triangle_kernel(gated_ref, product_ref, *, batch_hidden, left_seq, seq, tile_i, tile_j, tile_k):
    """gated_ref [B*hidden*left_seq + B*hidden*N + ..., N]: row (bh*left_seq + i) holds left [bh, i, :], row
    (B*hidden*left_seq + bh*N + j) right [bh, j, :]; product_ref [B*hidden*left_seq, N]. left_seq is N but for the
    rows of a shard (`trimul_sharded`)."""
    tile = pl.program_id(0)
    bh = pl.program_id(1)
    i0 = bh * left_seq + (tile // (seq // tile_j)) * tile_i
    j0 = batch_hidden * left_seq + bh * seq + (tile % (seq // tile_j)) * tile_j

    def step(k, acc):
        k0 = pl.multiple_of(k * tile_k, tile_k)
        left = gated_ref[pl.ds(i0, tile_i), pl.ds(k0, tile_k)]
        right = gated_ref[pl.ds(j0, tile_j), pl.ds(k0, tile_k)]
        return acc + _dot_nt(left, right)

    acc = jax.lax.fori_loop(0, seq // tile_k, step, jnp.zeros((tile_i, tile_j), jnp.float32))
    product_ref[pl.ds(i0, tile_i), pl.ds((tile % (seq // tile_j)) * tile_j, tile_j)] = acc.astype(jnp.float16)


def _out_norm_project_kernel(product_ref, gated_ref, out_norm_weight_ref, out_norm_bias_ref,
                             out_weight_t_ref, out_ref, *, batch_hidden, pairs_per_batch, dim, hidden,
                             rows, tile_out):
    row0 = pl.program_id(0) * rows
    b = row0 // pairs_per_batch
    cols = pl.ds(row0 - b * pairs_per_batch, rows)
    product = product_ref[pl.ds(b * hidden, hidden), cols].astype(jnp.float32)  # [hidden, rows]
    mean = jnp.sum(product, axis=0) / hidden
    centred = product - mean[None, :]
    rstd = 1.0 / jnp.sqrt(jnp.sum(centred * centred, axis=0) / hidden + LAYER_NORM_EPS)
    gamma = out_norm_weight_ref[...]
    beta = out_norm_bias_ref[...]
    out_gate = gated_ref[pl.ds(2 * batch_hidden + b * hidden, hidden), cols].astype(jnp.float32)
    normed = ((centred * rstd[None, :] * gamma[:, None] + beta[:, None]) * out_gate).astype(jnp.float16)

    def step(d, carry):
        d0 = pl.multiple_of(d * tile_out, tile_out)
        out_ref[pl.ds(row0, rows), pl.ds(d0, tile_out)] = _dot_tn(normed, out_weight_t_ref[:, pl.ds(d0, tile_out)])
        return carry

    jax.lax.fori_loop(0, dim // tile_out, step, 0)


def _trimul_rows(x, mask, weights, *, hidden, interpret, axis_name=None):
    """TriMul's rows i of x [B, rows, N, dim] and mask [B, rows, N]: all N rows (axis_name None), or this device's
    shard of them inside `jax.shard_map` over the mesh axis `axis_name`, whose right projection (all rows j) is
    gathered from the axis's devices in device order, values moved, not summed. Returns out [B, rows, N, dim]
    float32 and the sum of its column 0 (the range check's, `refuse_non_finite`)."""
    batch, rows, seq, dim = x.shape
    tiles = kernel_tiling(batch, seq, dim, hidden)
    pairs = batch * rows * seq
    batch_hidden = batch * hidden
    proj_weight = jnp.concatenate([weights[f"{name}.weight"] for name in PROJECTIONS]).astype(jnp.float16)
    out_weight_t = weights["to_out.weight"].T.astype(jnp.float16)

    def params(warps):
        return pltriton.CompilerParams(num_warps=warps, num_stages=tiles.stages)

    normed = pl.pallas_call(
        functools.partial(_layer_norm_kernel, dim=dim, rows=tiles.norm_rows, tile_dim=tiles.tile_dim),
        out_shape=jax.ShapeDtypeStruct((pairs, dim), jnp.float16),
        grid=(pairs // tiles.norm_rows,), compiler_params=params(tiles.norm_warps), interpret=interpret,
        name="trimul_layer_norm",
    )(x.reshape(pairs, dim), weights["norm.weight"], weights["norm.bias"])
    gated = pl.pallas_call(
        functools.partial(_gated_project_kernel, batch=batch, pairs_per_batch=rows * seq, dim=dim,
                          hidden=hidden, rows=tiles.rows, tile_dim=tiles.tile_dim),
        out_shape=jax.ShapeDtypeStruct((3 * batch_hidden, rows * seq), jnp.float16),
        grid=(3 * pairs // tiles.rows,), compiler_params=params(tiles.project_warps), interpret=interpret,
        name="trimul_gated_project",
    )(normed, mask.reshape(pairs), proj_weight)
    if axis_name is None:  # left and right as written, rows i and j alike
        left_seq, triangle_in = seq, gated.reshape(3 * batch_hidden * seq, seq)
    else:  # this shard's left rows, padded to whole tiles, then every device's right rows
        left_seq = -(-rows // tiles.tile_i) * tiles.tile_i
        left, right = gated[:2 * batch_hidden].reshape(2, batch_hidden, rows, seq)
        left = jnp.pad(left, ((0, 0), (0, left_seq - rows), (0, 0)))
        right = jax.lax.all_gather(right, axis_name, axis=1, tiled=True)
        triangle_in = jnp.concatenate([left.reshape(-1, seq), right.reshape(-1, seq)])
    product = pl.pallas_call(
        functools.partial(_triangle_kernel, batch_hidden=batch_hidden, left_seq=left_seq, seq=seq,
                          tile_i=tiles.tile_i, tile_j=tiles.tile_j, tile_k=tiles.tile_k),
        out_shape=jax.ShapeDtypeStruct((batch_hidden * left_seq, seq), jnp.float16),
        grid=((left_seq // tiles.tile_i) * (seq // tiles.tile_j), batch_hidden),
        compiler_params=params(tiles.contract_warps), interpret=interpret, name="trimul_triangle",
    )(triangle_in)
    product = product.reshape(batch_hidden, left_seq, seq)[:, :rows].reshape(batch_hidden, rows * seq)
    out = pl.pallas_call(
        functools.partial(_out_norm_project_kernel, batch_hidden=batch_hidden, pairs_per_batch=rows * seq,
                          dim=dim, hidden=hidden, rows=tiles.output_rows, tile_out=tiles.tile_out),
        out_shape=jax.ShapeDtypeStruct((pairs, dim), jnp.float32),
        grid=(pairs // tiles.output_rows,), compiler_params=params(tiles.output_warps), interpret=interpret,
        name="trimul_out_norm_project",
    )(product, gated, weights["to_out_norm.weight"], weights["to_out_norm.bias"], out_weight_t)
    out = out.reshape(batch, rows, seq, dim)
    return out, jnp.sum(out[..., 0])


_trimul = jax.jit(_trimul_rows, static_argnames=("hidden", "interpret", "axis_name"))


def trimul(data):
    """TriMul forward for `(x, mask, weights, config)` as JAX arrays; returns [B, N, N, dim] float32.

    Runs the compiled kernels on a GPU and Pallas interpret mode elsewhere. Raises Float16RangeError where the
    input overflows the float16 intermediates (`refuse_non_finite`).
    """
    validate(data, "jax")
    check_platform("x", data[0])
    x, mask, weights, config = data
    batch, length, _, dim = x.shape
    seq = padded_length(length)
    if seq != length:  # zeros, with mask 0: see padded_length
        x, mask = zero_padded(x, shape=(batch, seq, seq, dim)), zero_padded(mask, shape=(batch, seq, seq))
    out, column_sum = _trimul(x, mask, weights, hidden=config["hidden_dim"], interpret=interpreted())
    refuse_non_finite(column_sum, "pallas")
    return out if seq == length else cut_to(out, shape=(batch, length, length, dim))


@functools.partial(jax.jit, static_argnames=("hidden", "interpret", "mesh", "axis_name"))
def _trimul_sharded(x, mask, weights, *, hidden, interpret, mesh, axis_name):
    rows = PartitionSpec(None, axis_name)

    def shard(x, mask, weights):
        out, column_sum = _trimul_rows(x, mask, weights, hidden=hidden, interpret=interpret, axis_name=axis_name)
        return out, jax.lax.psum(column_sum, axis_name)

    return jax.shard_map(shard, mesh=mesh, in_specs=(rows, rows, PartitionSpec()),
                         out_specs=(rows, PartitionSpec()), check_vma=False)(x, mask, weights)


def trimul_sharded(data, mesh, axis_name: str):
    """`trimul` with the rows i split evenly across the devices of `mesh`'s axis `axis_name`, by `jax.shard_map`:
    the same bits as `trimul`, [B, N, N, dim] float32 sharded by rows over the axis.

    Each device normalises and projects its own rows of pairs (b, i, k), gathers the right projection of all rows j
    (in device order: values moved, not summed), and contracts its left rows against them with `trimul`'s tile shape
    and k order, so that each product's sum over k runs on one device as in `trimul`. A device holds its rows of x,
    of the intermediates and of the output, and the whole right projection. Raises ValueError where N padded (see
    `padded_length`) does not split into rows whose pairs fill the kernels' tiles; Float16RangeError as `trimul`
    (the column sums added across the devices)."""
    validate(data, "jax")
    check_platform("x", data[0])
    x, mask, weights, config = data
    batch, length, _, dim = x.shape
    hidden = config["hidden_dim"]
    seq = padded_length(length)
    shard_rows(seq, mesh.shape[axis_name], kernel_tiling(batch, seq, dim, hidden), "devices")
    if seq != length:
        x, mask = zero_padded(x, shape=(batch, seq, seq, dim)), zero_padded(mask, shape=(batch, seq, seq))
    rows, whole = NamedSharding(mesh, PartitionSpec(None, axis_name)), NamedSharding(mesh, PartitionSpec())
    x, mask, weights = jax.device_put((x, mask, weights), (rows, rows, whole))  # no copy where already so
    out, column_sum = _trimul_sharded(x, mask, weights, hidden=hidden, interpret=interpreted(),
                                      mesh=mesh, axis_name=axis_name)
    refuse_non_finite(column_sum.addressable_data(0), "pallas")  # every device holds the sum: the first's copy
    return out if seq == length else cut_to(out, shape=(batch, length, length, dim))
