"""Tensor parallelism with the JAX mode's bits: the linears of `batch_invariant.torch_tensor_parallel`, for a
function run by `jax.shard_map` over a mesh axis, with the same bits on 1, 2, 4 and 8 devices (tested on 1, 2 and 4)
and for a row in any batch.

    step = jax.shard_map(batch_invariant(layer), mesh=mesh, in_specs=..., out_specs=...)

Inside `batch_invariant` (`batch_invariant.jax_mode`) each product below runs on the port; the gathers are JAX's
`all_gather` over the axis, which moves values without arithmetic:
- `column_parallel`: this device's output features, each summed over K as one device's linear sums it;
- `row_parallel`: K cut into TENSOR_PARALLEL_PARTS pieces whatever the devices, each piece's product in float32,
  the pieces gathered and added in piece order, then the bias, rounded once.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from batch_invariant import row_parallel_pieces, tensor_parallel_share


def _linear_float32(x, weight):
    """x [..., K] @ weight [N, K]^T, summed in float32 (the port's float32 output under the mode)."""
    return jax.lax.dot_general(x, weight, (((x.ndim - 1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def shard(weight, bias, kind: str, axis_name: str):
    """This device's share of a full linear's weight [N, K] and bias [N], as `torch_tensor_parallel.shard`, by its
    index along `axis_name` (inside shard_map)."""
    share = tensor_parallel_share(weight.shape, kind, jax.lax.axis_size(axis_name))
    start = jax.lax.axis_index(axis_name) * share
    if kind == "column":
        rows = jax.lax.dynamic_slice_in_dim(weight, start, share, axis=0)
        return rows, None if bias is None else jax.lax.dynamic_slice_in_dim(bias, start, share)
    return jax.lax.dynamic_slice_in_dim(weight, start, share, axis=1), bias


def column_parallel(x, weight, bias, axis_name: str, *, gather: bool = True):
    """x [..., K] @ weight.T + bias for this device's rows of the weight, in x's dtype: all the output features in
    device order (gather), or this device's alone, the input of a row-parallel linear."""
    total = _linear_float32(x, weight)
    if bias is not None:
        total = total + bias.astype(jnp.float32)
    local = total.astype(x.dtype)
    return jax.lax.all_gather(local, axis_name, axis=local.ndim - 1, tiled=True) if gather else local


def row_parallel(x, weight, bias, axis_name: str, *, dtype=None):
    """The linear whose input features are split across the axis's devices: x [..., K / devices] this device's
    slice, weight [N, K / devices] its columns, bias [N] whole; the whole output [..., N] in `dtype` (default x's),
    the same on every device."""
    local_parts = row_parallel_pieces(x.shape[-1], jax.lax.axis_size(axis_name))
    width = x.shape[-1] // local_parts
    pieces = jnp.stack([_linear_float32(x[..., p * width:(p + 1) * width], weight[:, p * width:(p + 1) * width])
                        for p in range(local_parts)])
    pieces = jax.lax.all_gather(pieces, axis_name, axis=0, tiled=True)  # [8, ..., N], in piece order
    total = pieces[0]
    for piece in pieces[1:]:
        total = total + piece
    if bias is not None:
        total = total + bias.astype(jnp.float32)
    return total.astype(dtype or x.dtype)
