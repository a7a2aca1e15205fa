"""Batch-invariant matmul in Pallas (Triton lowering): the kernel of triton_kernels/matmul.py.

Each program owns one tile_m x tile_n tile of C and walks the whole of K in tile_k steps, in
order, accumulating in fp32: no split-K, so each element's sum is taken in the same order for
every M. Ragged N and K are masked loads (zeros add exactly nothing) and masked stores.

A difference the languages force: a Pallas kernel is compiled for static shapes. M is padded with
zero rows up to a multiple of tile_m (rows are independent, so the padding changes no bits of the
real rows) and the result cut back, all in one compiled call (`_product`): like XLA's own dot, each
distinct M compiles once, and a call is one dispatch.

A batch of products (`batched_matmul`, the batch-invariant JAX transformation's batched dot_general) runs on a
second grid axis, one matrix a program column, as in the Triton port; `matmul` is the batch of one. A and B may
come transposed (A^T [B, K, M], as a weight's gradient A^T g takes it; B^T [B, N, K], as g B^T): their tiles are
loaded as they lie and transposed for the dot, where the Triton port reads the same tiles through strides; the dot,
and so the bits, are the same.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from kernel_support.jax_backend import check_platform, interpreted
from kernel_support.jax_padding import cut_to, zero_padded
from ports.matmul import validate, validate_batch
from kernel_support.matmul_common import matmul_tiling


def _matmul_kernel(a_ref, b_ref, c_ref, *, n, k, tile_m, tile_n, tile_k, group_m, a_transposed, b_transposed):
    pid = pl.program_id(0)
    matrix = pl.program_id(1)
    tiles_m = c_ref.shape[1] // tile_m
    tiles_n = pl.cdiv(n, tile_n)
    per_group = group_m * tiles_n
    first_m = (pid // per_group) * group_m
    group_rows = jnp.minimum(tiles_m - first_m, group_m)
    row0 = (first_m + (pid % per_group) % group_rows) * tile_m
    col0 = ((pid % per_group) // group_rows) * tile_n
    cols = col0 + jnp.arange(tile_n)
    ks = jnp.arange(tile_k)

    def step(i, acc):
        k0 = i * tile_k
        if a_transposed:  # A^T's [tile_k, tile_m] tile, transposed for the dot
            a = pltriton.load(a_ref.at[matrix, pl.ds(k0, tile_k), pl.ds(row0, tile_m)],
                              mask=jnp.broadcast_to((k0 + ks)[:, None] < k, (tile_k, tile_m)), other=0.0).T
        else:
            a = pltriton.load(a_ref.at[matrix, pl.ds(row0, tile_m), pl.ds(k0, tile_k)],
                              mask=jnp.broadcast_to((k0 + ks)[None, :] < k, (tile_m, tile_k)), other=0.0)
        if b_transposed:  # B^T's [tile_n, tile_k] tile, transposed for the dot
            b = pltriton.load(b_ref.at[matrix, pl.ds(col0, tile_n), pl.ds(k0, tile_k)],
                              mask=(cols[:, None] < n) & ((k0 + ks)[None, :] < k), other=0.0).T
        else:
            b = pltriton.load(b_ref.at[matrix, pl.ds(k0, tile_k), pl.ds(col0, tile_n)],
                              mask=((k0 + ks)[:, None] < k) & (cols[None, :] < n), other=0.0)
        return acc + jnp.dot(a, b, preferred_element_type=jnp.float32)

    acc = jax.lax.fori_loop(0, pl.cdiv(k, tile_k), step, jnp.zeros((tile_m, tile_n), jnp.float32))
    pltriton.store(c_ref.at[matrix, pl.ds(row0, tile_m), pl.ds(col0, tile_n)], acc.astype(c_ref.dtype),
                   mask=jnp.broadcast_to(cols[None, :] < n, (tile_m, tile_n)))


@functools.partial(jax.jit, static_argnames=("tiles", "out", "interpret", "a_transposed", "b_transposed"))
def _matmul(a, b, *, tiles, out, interpret, a_transposed=False, b_transposed=False):
    """a [M, K] @ b [K, N], or a [B, M, K] @ b [B, K, N] (a_transposed: a holds A^T, [B, K, M]; b_transposed: b holds
    B^T, [B, N, K]), with M a multiple of tiles.tile_m (`_product` pads it and chooses the tiles for the M it
    had)."""
    one = a.ndim == 2
    a, b = (a[None], b[None]) if one else (a, b)
    batch, (padded_m, k) = a.shape[0], (a.shape[:0:-1] if a_transposed else a.shape[1:])
    n = b.shape[1 if b_transposed else 2]
    c = pl.pallas_call(
        functools.partial(_matmul_kernel, n=n, k=k, tile_m=tiles.tile_m, tile_n=tiles.tile_n, tile_k=tiles.tile_k,
                          group_m=tiles.group_m, a_transposed=a_transposed, b_transposed=b_transposed),
        out_shape=jax.ShapeDtypeStruct((batch, padded_m, n), jnp.float32 if out == "float32" else a.dtype),
        grid=(padded_m // tiles.tile_m * pl.cdiv(n, tiles.tile_n), batch),
        compiler_params=pltriton.CompilerParams(num_warps=tiles.warps, num_stages=tiles.stages),
        interpret=interpret, name="batch_invariant_matmul",
    )(a, b)
    return c[0] if one else c


def matmul(data):
    """C = a @ b for `(a, b, out)` as JAX arrays: a [M, K], b [K, N] bf16 (or fp16); out "same" or "float32".

    Runs the compiled kernel on a GPU and Pallas interpret mode elsewhere.
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
    """One product or a batch of them (a leading dimension): M padded to a whole tile, the kernel, and the result cut
    back, in one compiled call."""
    (m, k), n = a.shape[:-3:-1] if a_transposed else a.shape[-2:], b.shape[-2 if b_transposed else -1]
    on_gpu = not interpreted()  # a batch's programs count there (as in the Triton port), not interpreted
    tiles = matmul_tiling(m, n, a.shape[0] if a.ndim == 3 and on_gpu else 1)
    padded_m = pl.cdiv(m, tiles.tile_m) * tiles.tile_m
    static = dict(tiles=tiles, out=out, interpret=not on_gpu, a_transposed=a_transposed,
                  b_transposed=b_transposed)
    if padded_m == m:
        return _matmul(a, b, **static)
    padded = (k, padded_m) if a_transposed else (padded_m, k)
    c = _matmul(zero_padded(a, shape=(*a.shape[:-2], *padded)), b, **static)
    return cut_to(c, shape=(*a.shape[:-2], m, n))
