"""Batched symmetric eigendecomposition in Pallas (Triton lowering): the Jacobi of triton_kernels/eigh.py.

n <= 64: one program per matrix (padded to a power of two N >= 16) holds A and the
accumulated rotations V. A sweep is N - 1 rounds of the round-robin pairing (a table from
ports.eigh.round_robin_partners, shared with the Triton port); each round's N/2
disjoint plane rotations form one orthogonal J, applied as A <- J^T A J and V <- V J with fp32
products at precision HIGHEST (IEEE, no TF32), A symmetrised at the start and after each round.
The matrix is scaled by 1/max|A| first; sweeps stop once every off-diagonal element is below
eps. Sorting the eigenvalues is glue outside the kernel.

n > 64: the blocked Jacobi of the Triton port, round for round: the on-chip kernel diagonalises
each pair's 2 BLOCK x 2 BLOCK diagonal block, read in place (at most BLOCK_SWEEPS sweeps);
`_rotate_blocks_kernel` applies the rotations blockwise (A[P, Q] <- J_P^T A[P, Q] J_Q,
V[R, Q] <- V[R, Q] J_Q); a gather moves to the next round's layout; a while loop runs sweeps
until ports.eigh.blocked_converged.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from ports.eigh import (BLOCK, BLOCK_SWEEPS, BLOCKED_MAX_SWEEPS, JACOBI_MAX_N, JACOBI_MAX_SWEEPS, blocked_converged,
                        blocked_layouts, check_offsets, jacobi_size, jacobi_warps, round_robin_partners, validate)

EPS = float(jnp.finfo(jnp.float32).eps)


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


def _on_chip(a, size, max_sweeps=JACOBI_MAX_SWEEPS, *, interpret):
    """(V, diagonal) of the on-chip Jacobi, unsorted, for each size x size diagonal block of each
    matrix of a [batch, size * blocks, size * blocks]: [batch * blocks, size, size], [batch * blocks, size]."""
    blocks = a.shape[1] // size
    count = a.shape[0] * blocks
    return pl.pallas_call(
        functools.partial(_jacobi_kernel, size=size, max_sweeps=max_sweeps, tolerance=EPS),
        out_shape=(jax.ShapeDtypeStruct((count, size, size), jnp.float32),
                   jax.ShapeDtypeStruct((count, size), jnp.float32)),
        grid=(count,),
        in_specs=[pl.BlockSpec((None, size, size), lambda i: (i // blocks, i % blocks, i % blocks)),
                  pl.BlockSpec((size - 1, size), lambda i: (0, 0))],
        out_specs=(pl.BlockSpec((None, size, size), lambda i: (i, 0, 0)), pl.BlockSpec((None, size), lambda i: (i, 0))),
        compiler_params=pltriton.CompilerParams(num_warps=jacobi_warps(size), num_stages=1),
        interpret=interpret, name="jacobi_eigh",
    )(a, jnp.array(round_robin_partners(size), jnp.int32))


def _rotate_blocks_kernel(x_ref, right_ref, *refs):
    """X[R, Q] <- X[R, Q] J_Q, and J_R^T on the left when J_R is given; pair-sized blocks."""
    *left_ref, out_ref = refs
    x = _dot(x_ref[...], right_ref[...])
    if left_ref:
        x = _dot(left_ref[0][...].T, x)
    out_ref[...] = x


def _rotate_blocks(x, rotations, *, left, interpret):
    batch, size, _ = x.shape
    pairs, pair = rotations.shape[1], rotations.shape[2]
    block = pl.BlockSpec((None, pair, pair), lambda m, r, q: (m, r, q))
    rotation = [pl.BlockSpec((None, None, pair, pair), lambda m, r, q: (m, q, 0, 0))]
    if left:
        rotation.append(pl.BlockSpec((None, None, pair, pair), lambda m, r, q: (m, r, 0, 0)))
    return pl.pallas_call(
        _rotate_blocks_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, jnp.float32), grid=(batch, size // pair, pairs),
        in_specs=[block, *rotation], out_specs=block,
        compiler_params=pltriton.CompilerParams(num_warps=4, num_stages=1), interpret=interpret,
        name="jacobi_rotate_blocks",
    )(x, *([rotations] * (2 if left else 1)))


def _blocked(a, *, interpret):
    """(V, diagonal) of the blocked Jacobi for the real (unpadded) indices, unsorted."""
    batch, n, _ = a.shape
    size, layouts, moves = blocked_layouts(n, BLOCK)
    check_offsets(batch, size)
    pair = 2 * BLOCK
    pairs, rounds = size // pair, len(layouts)
    first, moves = jnp.array(layouts[0]), jnp.array(moves)
    scale = jnp.max(jnp.abs(a), axis=(1, 2), keepdims=True)
    scale = jnp.where(scale > 0, scale, 1.0)
    x = jnp.pad(0.5 * (a + jnp.swapaxes(a, 1, 2)) / scale, ((0, 0), (0, size - n), (0, size - n)))
    x = x[:, first[:, None], first]
    v = jnp.broadcast_to(jnp.eye(size, dtype=jnp.float32)[:, first], (batch, size, size))

    def round_(r, carry):
        x, v = carry
        rotations, _ = _on_chip(x, pair, BLOCK_SWEEPS, interpret=interpret)  # each pair's diagonal block
        rotations = rotations.reshape(batch, pairs, pair, pair)
        x = _rotate_blocks(x, rotations, left=True, interpret=interpret)
        v = _rotate_blocks(v, rotations, left=False, interpret=interpret)
        move = moves[(r + 1) % rounds]  # to the next round's layout (after the last: the first's)
        return x[:, move[:, None], move], v[:, :, move]

    def sweep(carry):
        count, x, v, _, worst = carry
        x, v = jax.lax.fori_loop(0, rounds, round_, (x, v))
        diagonal = jnp.diagonal(x, axis1=1, axis2=2)
        off = jnp.sqrt(jnp.sum(jnp.square(x - diagonal[:, :, None] * jnp.eye(size)), axis=(1, 2))
                       / jnp.sum(jnp.square(x), axis=(1, 2)))
        return count + 1, x, v, worst, jnp.max(jnp.nan_to_num(off, nan=0.0))  # all-zero matrix: 0 / 0

    def unconverged(carry):
        count, _, _, previous, worst = carry
        return (count < BLOCKED_MAX_SWEEPS) & ~blocked_converged(worst, previous)

    _, x, v, _, _ = jax.lax.while_loop(unconverged, sweep, (0, x, v, jnp.inf, jnp.inf))
    keep = jnp.array([at for at, index in enumerate(layouts[0]) if index < n])  # sweeps end in the first layout
    return v[:, :n][:, :, keep], (jnp.diagonal(x, axis1=1, axis2=2) * scale[:, :, 0])[:, keep]


@functools.partial(jax.jit, static_argnames=("interpret",))
def _eigh(a, *, interpret):
    batch, n, _ = a.shape
    if n > JACOBI_MAX_N:
        vectors, values = _blocked(a, interpret=interpret)
    else:
        size = jacobi_size(n)
        check_offsets(batch, size)
        vectors, values = _on_chip(jnp.pad(a, ((0, 0), (0, size - n), (0, size - n))), size, interpret=interpret)
        vectors, values = vectors[:, :n, :n], values[:, :n]
    order = jnp.argsort(values, axis=-1)
    return jnp.take_along_axis(vectors, order[:, None, :], axis=-1), jnp.take_along_axis(values, order, axis=-1)


def eigh(a):
    """(Q, L) for a [batch, n, n] float32 symmetric JAX array: A Q = Q diag(L), L ascending.

    Runs the compiled kernels on a GPU and Pallas interpret mode elsewhere.
    """
    validate(a)
    if a.shape[0] == 0:
        return jnp.zeros_like(a), jnp.zeros(a.shape[:2], a.dtype)
    return _eigh(a, interpret=jax.default_backend() != "gpu")
