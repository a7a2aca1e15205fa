"""Batched symmetric eigendecomposition in Pallas (Triton lowering): the Jacobi of triton_kernels/eigh.py.

n <= 64: one program per matrix (padded to a power of two N >= 16) holds A and the
accumulated rotations V. A sweep is the N - 1 rounds m = 1 .. N - 1 of the XOR pairing (i meets
i ^ m); each round's N/2 disjoint plane rotations form one orthogonal J, applied elementwise as
in the Triton port: (A J)[:, i] = c_i A[:, i] - s_i A[:, i ^ m], likewise for the rows and for V.
The Triton port exchanges rows or columns i and i ^ m with a register gather; Pallas's Triton
lowering has no gather, so here the exchange is a product with the 0/1 permutation on tensor
cores, exact through a three-way bfloat16 split (`_exchange`; on the H200 8% faster than
exchanging halves by reshapes once per set bit of m, and still about 4 times slower than the
Triton port's on-chip kernel: results/h200/NOTES.md). The matrix is scaled by 1/max|A| and symmetrised
first; both members of a pair use the same averaged A[p, q]. Sweeps stop once every off-diagonal
element is below eps. Sorting the eigenvalues is glue outside the kernel.

n > 64: the blocked Jacobi of the Triton port, round for round: the on-chip kernel diagonalises
each pair's 2 BLOCK x 2 BLOCK principal submatrix, read in place through the round's row table
(ports.eigh.blocked_pairs; at most BLOCK_SWEEPS sweeps); `_rotate_blocks_kernel` applies the
rotations in place (A[P, Q] <- J_P^T A[P, Q] J_Q on the pairs' rows and columns,
V[R, Q] <- V[R, Q] J_Q; the whole matrix is the block, each program touches only its own
elements, output aliased to input); a while loop runs sweeps until ports.eigh.blocked_converged.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from ports.eigh import (BLOCK, BLOCK_SWEEPS, BLOCKED_MAX_SWEEPS, JACOBI_MAX_N, JACOBI_MAX_SWEEPS, blocked_converged,
                        blocked_pairs, check_offsets, jacobi_size, jacobi_warps, validate)

EPS = float(jnp.finfo(jnp.float32).eps)


def _dot(a, b):
    return jnp.dot(a, b, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)


def _dot_f32(a, b):
    return jnp.dot(a, b, preferred_element_type=jnp.float32)


def _exchange(x, permutation, axis):
    """x (N x N) with its rows (axis 0) or columns (axis 1) exchanged by a symmetric 0/1
    permutation (bfloat16), on tensor cores: x splits into three bfloat16 parts (8 + 8 + 8
    significant bits), each part's product and their sum are exact (for |x| above about 2^-100,
    where the low part is not subnormal: A and V are scaled to entries of at most 1)."""
    high = x.astype(jnp.bfloat16)
    rest = x - high.astype(jnp.float32)
    middle = rest.astype(jnp.bfloat16)
    low = (rest - middle.astype(jnp.float32)).astype(jnp.bfloat16)
    product = (lambda part: _dot_f32(part, permutation)) if axis == 1 else (lambda part: _dot_f32(permutation, part))
    return (product(low) + product(middle)) + product(high)


def _jacobi_kernel(a_ref, rows_ref, q_ref, l_ref, *, size, run, max_sweeps, tolerance):
    """Diagonalises the principal submatrix on rows (and columns) rows_ref (contiguous runs of `run`)."""
    rows = jnp.arange(size)
    picked = pltriton.max_contiguous(pl.multiple_of(rows_ref[...], run), run)
    a = a_ref[picked[:, None], picked[None, :]]
    eye = rows[:, None] == rows[None, :]
    scale = jnp.max(jnp.max(jnp.abs(a), axis=1), axis=0)  # one axis at a time, as Triton reduces
    scale = jnp.where(scale > 0, scale, 1.0)
    a = a / scale
    a = 0.5 * (a + a.T)

    def diagonal_of(a):
        return jnp.sum(jnp.where(eye, a, 0.0), axis=1)

    def off_diagonal(a):
        return jnp.max(jnp.max(jnp.where(eye, 0.0, jnp.abs(a)), axis=1), axis=0)

    def round_(m, carry):  # round m pairs i with i ^ m
        a, v = carry
        partner = rows ^ m
        meets = rows[None, :] == partner[:, None]
        diagonal = diagonal_of(a)
        # A[i, i ^ m] and A[i ^ m, i] as masked row and column sums (the Triton port gathers the
        # partner's entry of a vector instead; the same values)
        paired = jnp.where(meets, a, 0.0)
        a_ij = 0.5 * (jnp.sum(paired, axis=1) + jnp.sum(paired, axis=0))
        d_j = jnp.sum(jnp.where(meets, diagonal[None, :], 0.0), axis=1)
        first = rows < partner  # row i is p (else q) of its pair
        tau = jnp.where(first, d_j - diagonal, diagonal - d_j) / (2.0 * a_ij)
        t = jnp.where(tau >= 0, 1.0, -1.0) / (jnp.abs(tau) + jnp.sqrt(1.0 + tau * tau))
        t = jnp.where(a_ij == 0.0, 0.0, t)
        c = 1.0 / jnp.sqrt(1.0 + t * t)
        s = jnp.where(first, t * c, -t * c)  # J[i, i] = c_i, J[i ^ m, i] = -s_i
        permutation = meets.astype(jnp.bfloat16)  # symmetric: P[i, j] = 1 where j = i ^ m
        a = c[None, :] * a - s[None, :] * _exchange(a, permutation, 1)  # A J
        a = c[:, None] * a - s[:, None] * _exchange(a, permutation, 0)  # J^T (A J)
        return a, c[None, :] * v - s[None, :] * _exchange(v, permutation, 1)

    def sweep(carry):
        count, a, v, _ = carry
        a, v = jax.lax.fori_loop(1, size, round_, (a, v))
        return count + 1, a, v, off_diagonal(a)

    def unconverged(carry):
        count, _, _, off = carry
        return (count < max_sweeps) & (off > tolerance)

    _, a, v, _ = jax.lax.while_loop(unconverged, sweep, (0, a, eye.astype(jnp.float32), off_diagonal(a)))
    q_ref[...] = v
    l_ref[...] = diagonal_of(a) * scale


def _on_chip(a, rows, run, max_sweeps=JACOBI_MAX_SWEEPS, *, interpret):
    """(V, diagonal) of the on-chip Jacobi, unsorted, for the principal submatrix on each row of
    `rows` [groups, size] (contiguous runs of `run` indices) of each matrix of a [batch, n, n]:
    [batch * groups, size, size], [batch * groups, size]."""
    groups, size = rows.shape
    count, n = a.shape[0] * groups, a.shape[1]
    return pl.pallas_call(
        functools.partial(_jacobi_kernel, size=size, run=run, max_sweeps=max_sweeps, tolerance=EPS),
        out_shape=(jax.ShapeDtypeStruct((count, size, size), jnp.float32),
                   jax.ShapeDtypeStruct((count, size), jnp.float32)),
        grid=(count,),
        in_specs=[pl.BlockSpec((None, n, n), lambda i: (i // groups, 0, 0)),
                  pl.BlockSpec((None, size), lambda i: (i % groups, 0))],
        out_specs=(pl.BlockSpec((None, size, size), lambda i: (i, 0, 0)), pl.BlockSpec((None, size), lambda i: (i, 0))),
        compiler_params=pltriton.CompilerParams(num_warps=jacobi_warps(size), num_stages=1),
        interpret=interpret, name="jacobi_eigh",
    )(a, rows)


def _rotate_blocks_kernel(x_ref, right_ref, rows_ref, *refs, pair, left):
    """Program (matrix, R, Q), Q fastest: X[R, Q] <- X[R, Q] J_Q, and J_R^T on the left with
    `left`, in place: Q (and R with `left`) is a pair's rows, two contiguous runs of pair / 2 (the
    hint vectorises the indexed loads and stores); without `left`, R is rows R * pair onwards."""
    *left_ref, out_ref = refs
    program, pairs = pl.program_id(0), rows_ref.shape[0]
    row_block, col_pair = program // pairs % pairs, program % pairs
    cols = pltriton.max_contiguous(pl.multiple_of(rows_ref[col_pair], pair // 2), pair // 2)
    rows = rows_ref[row_block] if left else row_block * pair + jnp.arange(pair)
    x = _dot(x_ref[rows[:, None], cols[None, :]], right_ref[...])
    if left:
        x = _dot(left_ref[0][...].T, x)
    out_ref[rows[:, None], cols[None, :]] = x


def _rotate_blocks(x, rotations, rows, *, left, interpret):
    batch, size, _ = x.shape
    pairs, pair = rows.shape
    per_matrix = pairs * pairs  # programs per matrix: the matrix varies slowest
    matrix = pl.BlockSpec((None, size, size), lambda i: (i // per_matrix, 0, 0))
    rotation = [pl.BlockSpec((None, None, pair, pair), lambda i: (i // per_matrix, i % pairs, 0, 0))]
    if left:
        rotation.append(pl.BlockSpec((None, None, pair, pair), lambda i: (i // per_matrix, i // pairs % pairs, 0, 0)))
    return pl.pallas_call(
        functools.partial(_rotate_blocks_kernel, pair=pair, left=left),
        out_shape=jax.ShapeDtypeStruct(x.shape, jnp.float32), grid=(batch * pairs * pairs,),
        in_specs=[matrix, rotation[0], pl.BlockSpec((pairs, pair), lambda i: (0, 0)), *rotation[1:]],
        out_specs=matrix, input_output_aliases={0: 0},
        compiler_params=pltriton.CompilerParams(num_warps=4, num_stages=1), interpret=interpret,
        name="jacobi_rotate_blocks",
    )(x, rotations, rows, *([rotations] if left else []))


def _blocked(a, *, interpret):
    """(V, diagonal) of the blocked Jacobi for the real (unpadded) indices, unsorted."""
    batch, n, _ = a.shape
    size, schedule = blocked_pairs(n, BLOCK)
    check_offsets(batch, size)
    schedule = jnp.array(schedule, jnp.int32)
    rounds, pairs, pair = schedule.shape
    scale = jnp.max(jnp.abs(a), axis=(1, 2), keepdims=True)
    scale = jnp.where(scale > 0, scale, 1.0)
    x = jnp.pad(0.5 * (a + jnp.swapaxes(a, 1, 2)) / scale, ((0, 0), (0, size - n), (0, size - n)))
    v = jnp.broadcast_to(jnp.eye(size, dtype=jnp.float32), (batch, size, size))

    def round_(r, carry):
        x, v = carry
        rows = schedule[r]
        rotations, _ = _on_chip(x, rows, BLOCK, BLOCK_SWEEPS, interpret=interpret)  # each pair's submatrix
        rotations = rotations.reshape(batch, pairs, pair, pair)
        x = _rotate_blocks(x, rotations, rows, left=True, interpret=interpret)
        return x, _rotate_blocks(v, rotations, rows, left=False, interpret=interpret)

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
    return v[:, :n, :n], jnp.diagonal(x, axis1=1, axis2=2)[:, :n] * scale[:, :, 0]


@functools.partial(jax.jit, static_argnames=("interpret",))
def _eigh(a, *, interpret):
    batch, n, _ = a.shape
    if n > JACOBI_MAX_N:
        vectors, values = _blocked(a, interpret=interpret)
    else:
        size = jacobi_size(n)
        check_offsets(batch, size)
        whole = jnp.arange(size, dtype=jnp.int32)[None]
        vectors, values = _on_chip(jnp.pad(a, ((0, 0), (0, size - n), (0, size - n))), whole, size, interpret=interpret)
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
