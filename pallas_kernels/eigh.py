"""Batched symmetric eigendecomposition in Pallas (Triton lowering): the Jacobi of triton_kernels/eigh.py.

One program per matrix (n <= 64 so far, padded to a power of two N >= 16) holds A and the
accumulated rotations V. A sweep is N - 1 rounds of the round-robin pairing (a table from
ports.eigh.round_robin_partners, shared with the Triton port); each round's N/2
disjoint plane rotations form one orthogonal J, applied as A <- J^T A J and V <- V J with fp32
products at precision HIGHEST (IEEE, no TF32), A symmetrised at the start and after each round.
The matrix is scaled by 1/max|A| first; sweeps stop once every off-diagonal element is below eps. Sorting the
eigenvalues is glue outside the kernel.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from ports.eigh import JACOBI_MAX_SWEEPS, jacobi_size, jacobi_warps, round_robin_partners, validate


def _dot(a, b):
    return jnp.dot(a, b, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)


def _jacobi_kernel(a_ref, partners_ref, q_ref, l_ref, *, size, max_sweeps, tolerance):
    rows = jnp.arange(size)
    eye = (rows[:, None] == rows[None, :]).astype(jnp.float32)
    a = a_ref[...]
    scale = jnp.max(jnp.max(jnp.abs(a), axis=1), axis=0)  # one axis at a time, as Triton reduces
    scale = jnp.where(scale > 0, scale, 1.0)
    a = a / scale
    a = 0.5 * (a + a.T)  # exactly symmetric from the start: both rows of a pair must agree on J

    def off_diagonal(a):
        return jnp.max(jnp.max(jnp.abs(a) * (1.0 - eye), axis=1), axis=0)

    def round_(r, carry):
        a, v = carry
        partner = jnp.sum(partners_ref[pl.ds(r, 1), :], axis=0)  # the round-robin pairing of round r
        meets = (rows[None, :] == partner[:, None]).astype(jnp.float32)  # row i has a 1 at its partner
        diagonal = jnp.sum(a * eye, axis=1)
        a_ij = jnp.sum(a * meets, axis=1)
        d_j = jnp.sum(diagonal[None, :] * meets, axis=1)
        first = rows < partner  # row i is p (else q) of its pair
        tau = jnp.where(first, d_j - diagonal, diagonal - d_j) / (2.0 * a_ij)
        t = jnp.where(tau >= 0, 1.0, -1.0) / (jnp.abs(tau) + jnp.sqrt(1.0 + tau * tau))
        t = jnp.where(a_ij == 0.0, 0.0, t)
        c = 1.0 / jnp.sqrt(1.0 + t * t)
        s = jnp.where(first, t * c, -t * c)
        j = eye * c[:, None] + meets * s[:, None]
        a = _dot(j.T, _dot(a, j))
        a = 0.5 * (a + a.T)  # keep A exactly symmetric, so both rows of a pair agree on J
        return a, _dot(v, j)

    def sweep(carry):
        count, a, v, _ = carry
        a, v = jax.lax.fori_loop(0, size - 1, round_, (a, v))
        return count + 1, a, v, off_diagonal(a)

    def unconverged(carry):
        count, _, _, off = carry
        return (count < max_sweeps) & (off > tolerance)

    _, a, v, _ = jax.lax.while_loop(unconverged, sweep, (0, a, eye, off_diagonal(a)))
    q_ref[...] = v
    l_ref[...] = jnp.sum(a * eye, axis=1) * scale


@functools.partial(jax.jit, static_argnames=("interpret",))
def _eigh(a, *, interpret):
    batch, n, _ = a.shape
    size = jacobi_size(n)
    padded = jnp.pad(a, ((0, 0), (0, size - n), (0, size - n)))
    vectors, values = pl.pallas_call(
        functools.partial(_jacobi_kernel, size=size, max_sweeps=JACOBI_MAX_SWEEPS,
                          tolerance=float(jnp.finfo(jnp.float32).eps)),
        out_shape=(jax.ShapeDtypeStruct((batch, size, size), jnp.float32),
                   jax.ShapeDtypeStruct((batch, size), jnp.float32)),
        grid=(batch,),
        in_specs=[pl.BlockSpec((None, size, size), lambda b: (b, 0, 0)),
                  pl.BlockSpec((size - 1, size), lambda b: (0, 0))],
        out_specs=(pl.BlockSpec((None, size, size), lambda b: (b, 0, 0)), pl.BlockSpec((None, size), lambda b: (b, 0))),
        compiler_params=pltriton.CompilerParams(num_warps=jacobi_warps(size), num_stages=1),
        interpret=interpret, name="jacobi_eigh",
    )(padded, jnp.array(round_robin_partners(size), jnp.int32))
    order = jnp.argsort(values[:, :n], axis=-1)
    return (jnp.take_along_axis(vectors[:, :n, :n], order[:, None, :], axis=-1),
            jnp.take_along_axis(values[:, :n], order, axis=-1))


def eigh(a):
    """(Q, L) for a [batch, n, n] float32 symmetric JAX array: A Q = Q diag(L), L ascending.

    Runs the compiled kernel on a GPU and Pallas interpret mode elsewhere.
    """
    validate(a)
    if a.shape[0] == 0:
        jacobi_size(a.shape[-1])
        return jnp.zeros_like(a), jnp.zeros(a.shape[:2], a.dtype)
    return _eigh(a, interpret=jax.default_backend() != "gpu")
