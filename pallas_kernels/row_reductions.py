"""The sum over the last dimension whose bits never depend on the number of rows, for the batch-invariant JAX
transformation (batch_invariant.jax_mode): the Triton row kernels' order (triton_kernels/row_reductions.py), in
Pallas.

One program sums one row, in CHUNK-element chunks taken in order into a float32 vector, which is then summed as a
pairwise tree written out (`_tree_sum`, as the Triton kernels' `_tree_sum`): the order of every addition depends on
the row's length alone, never on the register layout the compiler picks (a reduction's own tree follows the layout,
and the layout follows what the compiler can prove of a row's alignment, which differs between one row and many).
Every floating-point `reduce_sum` reaches this kernel (softmax's, log-softmax's, a mean's, a variance's, a norm's;
over other axes than the last through a transposed copy); the maximum that softmax takes is exact in any order and
is left to XLA.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from kernel_support.jax_backend import interpreted

CHUNK = 1024  # elements of a row a step, as the Triton kernels' CHUNK


def _tree_sum(values):
    """The sum of a power-of-two-long vector as a fixed pairwise tree, as a 1-element vector: its halves added
    element by element, then the halves of that, down to one element. Split and added, not reduced: interpret
    mode's compiler merges a chain of reductions into one, in its own order."""
    while values.shape[0] > 1:
        low, high = jnp.split(values, 2)
        values = low + high
    return values


def _row_sum_kernel(x_ref, y_ref, *, cols, chunk):
    row = pl.program_id(0)
    offsets = jnp.arange(chunk)

    def step(i, total):
        start = i * chunk
        values = pltriton.load(x_ref.at[row, pl.ds(start, chunk)], mask=start + offsets < cols, other=0.0)
        return total + values.astype(jnp.float32)

    total = jax.lax.fori_loop(0, pl.cdiv(cols, chunk), step, jnp.zeros((chunk,), jnp.float32))
    pltriton.store(y_ref.at[pl.ds(row, 1)], _tree_sum(total).astype(y_ref.dtype))


@functools.partial(jax.jit, static_argnames=("interpret",))
def _row_sum(x, *, interpret):
    rows, cols = x.shape
    chunk = min(CHUNK, pl.next_power_of_2(cols))
    return pl.pallas_call(
        functools.partial(_row_sum_kernel, cols=cols, chunk=chunk),
        out_shape=jax.ShapeDtypeStruct((rows,), x.dtype), grid=(rows,),
        compiler_params=pltriton.CompilerParams(num_warps=4), interpret=interpret, name="batch_invariant_row_sum",
    )(x)


def row_sum(x):
    """x summed over its last dimension, in x's dtype (float32 arithmetic): a Pallas kernel on a GPU, interpret mode
    elsewhere."""
    rows = x.size // x.shape[-1] if x.shape[-1] else 0
    if rows == 0 or x.shape[-1] == 0:
        return jnp.zeros(x.shape[:-1], x.dtype)
    return _row_sum(x.reshape(rows, x.shape[-1]), interpret=interpreted()).reshape(x.shape[:-1])
