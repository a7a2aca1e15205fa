"""The eigh Pallas port's on-chip Jacobi, for n <= 64 (padded to a power of two N >= 16).

One program per matrix holds A and the accumulated rotations V. A sweep is the N - 1 rounds m = 1 .. N - 1 of the
XOR pairing (i meets i ^ m); each round's N/2 disjoint plane rotations form one orthogonal J, applied elementwise
as in the Triton port: (A J)[:, i] = c_i A[:, i] - s_i A[:, i ^ m], likewise for the rows and for V. The Triton
port exchanges rows or columns i and i ^ m with a register gather; Pallas's Triton lowering has no gather of
values, but it loads from a ref at gathered indices: each round writes A and V to a buffer in global memory and,
after one barrier, reads back A's partner columns, rows and both, and V's partner columns, so that J^T A J is
formed elementwise in one step (the Triton port forms A J, then J^T (A J)). This kernel is still behind the Triton
port's (docs/findings.md, "The eigh kernels, port by port"); the exchanges it replaced (a float32 product with
the 0/1 permutation; three bfloat16 products, or halves exchanged by reshapes once per set bit of m) were slower
still. The matrix is scaled by 1/max|A| and symmetrised first; both members of a pair use the same averaged
A[p, q], and each round sets its pairs' A[p, q] to zero (triton_kernels/eigh/jacobi.py says why). Sweeps stop once
every off-diagonal element is below eps.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from kernel_support.eigh_common import JACOBI
from .common import EPS, barrier, checked, f32, masked_load, per_matrix


@dataclass(frozen=True)
class PallasJacobi:
    """The Pallas port's own tunables of the on-chip Jacobi."""

    exchange_warps: int = 8  # the on-chip Jacobi, whose rounds wait on the exchange through memory (the fastest of
    # 1 to 8 warps at 20x32; docs/findings.md, "The eigh kernels, port by port")
    exchange_slots: int = 4  # A and V, each in two slots used in turn: 4 N x N arrays a matrix in the buffer


PALLAS_JACOBI = PallasJacobi()


def _jacobi_kernel(a_ref, q_ref, l_ref, sweeps_ref, bounds_ref, exchange_ref, *, size, max_sweeps, tolerance,
                   interpret):
    """Diagonalises one size x size matrix (the sweeps it took in sweeps_ref, its checks' bounds in bounds_ref).
    Each round writes A and V to exchange_ref (two slots, used in turn from round to round, across sweeps too, so
    that a round's writes never race the previous round's reads) and reads back the partners' rows and columns at
    gathered indices: one barrier a round."""
    rows = jnp.arange(size)
    a = a_ref[...]
    a, transposed, scale = checked(a, a.T, bounds_ref, 0)
    eye = rows[:, None] == rows[None, :]
    scale = jnp.where(scale > 0, scale, 1.0)
    a = 0.5 * (a / scale + transposed / scale)

    def diagonal_of(a):
        return jnp.sum(jnp.where(eye, a, 0.0), axis=1)

    def off_diagonal(a):
        return jnp.max(jnp.max(jnp.where(eye, 0.0, jnp.abs(a)), axis=1), axis=0)

    def round_(count, m, carry):  # round m of sweep `count` pairs i with i ^ m
        a, v = carry
        a_slot = 2 * ((count + m) & 1)  # size - 1 rounds a sweep, an odd number: the parity alternates throughout
        v_slot = a_slot + 1
        pltriton.store(exchange_ref.at[a_slot], a)
        pltriton.store(exchange_ref.at[v_slot], v)
        barrier(interpret)
        partner = rows ^ m

        def gathered(slot, at_rows, at_cols):
            return masked_load(exchange_ref.at[slot, at_rows, at_cols], None, None)

        diagonal, d_j = gathered(a_slot, rows, rows), gathered(a_slot, partner, partner)
        # A[i, i ^ m] and A[i ^ m, i] averaged: the same value for both members of a pair, as in the Triton port
        a_ij = 0.5 * (gathered(a_slot, rows, partner) + gathered(a_slot, partner, rows))
        first = rows < partner  # row i is p (else q) of its pair
        tau = jnp.where(first, d_j - diagonal, diagonal - d_j) / (2.0 * a_ij)
        t = jnp.where(tau >= 0, 1.0, -1.0) / (jnp.abs(tau) + jnp.sqrt(1.0 + tau * tau))
        t = jnp.where(a_ij == 0.0, 0.0, t)
        c = 1.0 / jnp.sqrt(1.0 + t * t)
        s = jnp.where(first, t * c, -t * c)  # J[i, i] = c_i, J[i ^ m, i] = -s_i
        # J^T A J elementwise from A and its partners' columns, rows, and both: one exchange instead of two
        a_cols = gathered(a_slot, rows[:, None], partner[None, :])
        a_rows = gathered(a_slot, partner[:, None], rows[None, :])
        a_both = gathered(a_slot, partner[:, None], partner[None, :])
        a = (c[:, None] * (c[None, :] * a - s[None, :] * a_cols)
             - s[:, None] * (c[None, :] * a_rows - s[None, :] * a_both))
        a = jnp.where(rows[None, :] == partner[:, None], 0.0, a)  # the pairs' A[p, q], zero in exact arithmetic
        v_cols = gathered(v_slot, rows[:, None], partner[None, :])
        return a, c[None, :] * v - s[None, :] * v_cols

    def sweep(carry):
        count, a, v, _ = carry
        a, v = jax.lax.fori_loop(1, size, functools.partial(round_, count), (a, v))
        return count + 1, a, v, off_diagonal(a)

    def unconverged(carry):
        count, _, _, off = carry
        return (count < max_sweeps) & (off > tolerance)

    count, a, v, _ = jax.lax.while_loop(unconverged, sweep, (0, a, eye.astype(jnp.float32), off_diagonal(a)))
    q_ref[...] = v
    l_ref[...] = diagonal_of(a) * scale
    sweeps_ref[0] = count


def on_chip(a, max_sweeps=JACOBI.max_sweeps, *, interpret):
    """(V, diagonal, the sweeps taken [batch, 1] int32, the checks' bounds [batch, 3]) of the on-chip Jacobi,
    unsorted, for each matrix of a [batch, N, N]."""
    count, size, _ = a.shape
    vectors, values, sweeps, bounds, _ = pl.pallas_call(
        functools.partial(_jacobi_kernel, size=size, max_sweeps=max_sweeps, tolerance=EPS, interpret=interpret),
        out_shape=(f32((count, size, size)), f32((count, size)), jax.ShapeDtypeStruct((count, 1), jnp.int32),
                   f32((count, 3)), f32((count, PALLAS_JACOBI.exchange_slots, size, size))),  # the exchange's buffer
        grid=(count,), in_specs=[per_matrix(size, size)],
        out_specs=(per_matrix(size, size), per_matrix(size), per_matrix(1), per_matrix(3),
                   per_matrix(PALLAS_JACOBI.exchange_slots, size, size)),
        compiler_params=pltriton.CompilerParams(num_warps=PALLAS_JACOBI.exchange_warps, num_stages=1),
        interpret=interpret, name="jacobi_eigh",
    )(a)
    return vectors, values, sweeps, bounds
