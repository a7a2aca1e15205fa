"""The eigh Pallas port's back-transformation, Q = H Z, a panel of reflectors at a time in LAPACK's compact WY
form (the Triton port's `back_transform`).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from kernel_support.eigh_common import BACK_TRANSFORM
from .common import DOT_ALGORITHMS, barrier, dot_ieee, f32, masked_load, per_matrix, window


@dataclass(frozen=True)
class PallasBackTransform:
    """The Pallas port's own tunables of the back-transformation."""

    stages: int = 2  # software-pipelining stages (Pallas's Triton num_stages) of the products: the fastest of those
    # tried under XLA's Triton; the Triton port's kernels ran alike at 1 to 3 and keep Triton's default 3
    # (docs/findings.md, "The eigh kernels, port by port")


PALLAS_BACK_TRANSFORM = PallasBackTransform()


def _compact_wy_kernel(tau_ref, _, w_ref, t_ref, *, n, reflectors, chunk):
    """As the Triton port's `_compact_wy_kernel`: program (b, panel), the panel's triangular T of
    H_first ... H_last = I - V T V^T (LAPACK's dlarft) from G = V^T V, and zeros written over the
    tridiagonalisation's leftovers in the panel's rows of w (the input, aliased, read and written through
    the output ref) from its first chunk on."""
    first = pl.program_id(1) * reflectors
    members = jnp.arange(reflectors)
    rows = first + members

    def gram_step(c, gram):
        cols = c * chunk + jnp.arange(chunk)
        block = w_ref.at[window(first, reflectors), window(c * chunk, chunk)]
        inside = (rows < n)[:, None] & (cols < n)[None, :]
        reflector_chunk = jnp.where(cols[None, :] > rows[:, None], masked_load(block, inside), 0.0)
        pltriton.store(block, reflector_chunk, mask=inside)
        return gram + dot_ieee(reflector_chunk, reflector_chunk.T)

    gram = jax.lax.fori_loop((first + 1) // chunk, pl.cdiv(n, chunk), gram_step,
                             jnp.zeros((reflectors, reflectors), jnp.float32))
    taus = masked_load(tau_ref.at[window(first, reflectors)], rows < n)

    def column(i, t):  # T[i, i] = tau_i, T[:i, i] = -tau_i T[:i, :i] G[:i, i]
        tau = jnp.sum(jnp.where(members == i, taus, 0.0))
        g = jnp.sum(jnp.where((members[:, None] == i) & (members[None, :] < i), gram, 0.0), axis=0)
        entries = jnp.where(members == i, tau, -tau * jnp.sum(t * g[None, :], axis=1))
        return jnp.where(members[None, :] == i, entries[:, None], t)

    t_ref[...] = jax.lax.fori_loop(0, reflectors, column, jnp.zeros((reflectors, reflectors), jnp.float32))


def _back_transform_kernel(w_ref, t_ref, _, z_ref, q_ref, *, n, vectors_per_program, reflectors, chunk, interpret):
    """As the Triton port's `_back_transform_kernel`: program (block, b), Q[:, the block's
    vectors_per_program vectors] = H_0 ... H_{n-3} Z a panel of reflectors at a time, last first, as
    Z^T -= ((Z^T V) T^T) V^T with K walked chunk columns at a time, one pass over the chunks a panel that
    also forms the next panel's Z^T V; Z^T's rows (the input, aliased) are updated in place through the
    output ref, and the first panel writes Q through a transposed index. The products run at
    `BACK_TRANSFORM.precision` (`DOT_ALGORITHMS`; the interpreter, which has no TF32 preset, runs float32)."""
    start_vector = pl.program_id(0) * vectors_per_program
    vectors = start_vector + jnp.arange(vectors_per_program)
    precision = jax.lax.Precision.HIGHEST if interpret else DOT_ALGORITHMS[BACK_TRANSFORM.precision]
    panels = pl.cdiv(n, reflectors)

    def dot(a, b):
        return jnp.dot(a, b, precision=precision, preferred_element_type=jnp.float32)

    def z_block(c):  # Z^T's chunk c: (ref, mask, columns)
        cols = c * chunk + jnp.arange(chunk)
        return (z_ref.at[window(start_vector, vectors_per_program), window(c * chunk, chunk)],
                (vectors < n)[:, None] & (cols < n)[None, :], cols)

    def reflector_block(c, first, from_column=0):  # V^T's chunk c for the panel from reflector `first`
        cols, rows = c * chunk + jnp.arange(chunk), first + jnp.arange(reflectors)
        mask = (rows >= 0)[:, None] & (rows < n)[:, None] & (cols < n)[None, :] & (cols >= from_column)[None, :]
        return masked_load(w_ref.at[window(first, reflectors), window(c * chunk, chunk)], mask)

    last = jnp.int32((panels - 1) * reflectors)  # traced: a static start past n would be refused

    def project_last(c, projection):
        block, mask, _ = z_block(c)
        return projection + dot(masked_load(block, mask), reflector_block(c, last).T)

    def apply_panel(p, projection):
        panel = panels - 1 - p
        first = panel * reflectors
        begin = (first + 1) // chunk * chunk  # the panel's reflectors are zero before column first + 1
        projection = dot(projection, t_ref[panel].T)

        def update(c, following):
            block, mask, cols = z_block(c)
            updated = masked_load(block, mask) - dot(projection, reflector_block(c, first, begin))

            @pl.when(panel == 0)
            def _():
                pltriton.store(q_ref.at[cols[None, :], vectors[:, None]], updated, mask=mask)

            @pl.when(panel != 0)
            def _():
                pltriton.store(block, updated, mask=mask)
            # the first panel's "next" rows are negative: masked, and the zero product is not used
            return following + dot(updated, reflector_block(c, first - reflectors).T)

        following = jax.lax.fori_loop(jnp.maximum(first + 1 - reflectors, 0) // chunk, pl.cdiv(n, chunk), update,
                                      jnp.zeros_like(projection))
        barrier(interpret)  # the next panel reads what this one wrote
        return following

    projection = jax.lax.fori_loop(((panels - 1) * reflectors + 1) // chunk, pl.cdiv(n, chunk), project_last,
                                   jnp.zeros((vectors_per_program, reflectors), jnp.float32))
    jax.lax.fori_loop(0, panels, apply_panel, projection)


def apply(w, tau, z, *, interpret):
    """Q = H_0 ... H_{n-3} z^T: A's eigenvectors as columns (w's and z's buffers are overwritten)."""
    batch, n, _ = z.shape
    reflectors, chunk, warps = BACK_TRANSFORM.reflectors, BACK_TRANSFORM.chunk, BACK_TRANSFORM.warps
    panels = pl.cdiv(n, reflectors)
    matrix = per_matrix(n, n)
    factors = pl.BlockSpec((None, None, reflectors, reflectors), lambda b, panel: (b, panel, 0, 0))
    w, t = pl.pallas_call(
        functools.partial(_compact_wy_kernel, n=n, reflectors=reflectors, chunk=chunk),
        out_shape=(f32((batch, n, n)), f32((batch, panels, reflectors, reflectors))),
        grid=(batch, panels), in_specs=[per_matrix(n), matrix], out_specs=(matrix, factors),
        input_output_aliases={1: 0}, compiler_params=pltriton.CompilerParams(num_warps=warps),
        interpret=interpret,
        name="eigh_compact_wy",
    )(tau, w)
    by_matrix = pl.BlockSpec((None, n, n), lambda block, b: (b, 0, 0))  # grid (block, b): see the kernel
    return pl.pallas_call(
        functools.partial(_back_transform_kernel, n=n, vectors_per_program=BACK_TRANSFORM.vectors,
                          reflectors=reflectors, chunk=chunk, interpret=interpret),
        out_shape=(f32((batch, n, n)), f32((batch, n, n))), grid=(pl.cdiv(n, BACK_TRANSFORM.vectors), batch),
        in_specs=[by_matrix, pl.BlockSpec((None, panels, reflectors, reflectors), lambda block, b: (b, 0, 0, 0)),
                  by_matrix],
        out_specs=(by_matrix, by_matrix), input_output_aliases={2: 0},
        compiler_params=pltriton.CompilerParams(num_warps=warps, num_stages=PALLAS_BACK_TRANSFORM.stages),
        interpret=interpret,
        name="eigh_back_transform",
    )(w, t, z)[1]
