"""The eigh Triton port's on-chip Jacobi, for n <= 64 (padded to a power of two N >= 16).

One program per matrix holds its N x N matrix A and the accumulated rotations V in registers. A sweep is the
N - 1 rounds m = 1 .. N - 1 of the XOR pairing (index i meets i ^ m: the pairs of a round are disjoint and a
sweep meets every two indices once), so one round is a single orthogonal J made of N/2 plane rotations, each
zeroing its A[p, q] (Golub & Van Loan's symmetric Schur decomposition). J is applied elementwise, O(N^2) per
round rather than a matrix product's O(N^3): with J[i, i] = c_i and J[i ^ m, i] = -s_i,
(A J)[:, i] = c_i A[:, i] - s_i A[:, i ^ m], and likewise for the rows of J^T (A J) and for V J; exchanging rows
or columns i and i ^ m is one register gather (`tl.gather`; the Pallas port, whose Triton lowering has no gather,
exchanges them through a buffer in global memory, one barrier a round, and its kernel is slower than this one:
docs/findings.md, "The eigh kernels, port by port").

Padding rows and columns are zero off the diagonal, so they never mix with the matrix. The matrix is scaled by
1/max|A| and symmetrised first (no overflow or underflow at the extreme magnitudes); both members of a pair
compute their rotation from the same averaged A[p, q], so they agree on it exactly. Each round then sets its
pairs' A[p, q] to zero, as the rotations make them in exact arithmetic (computed, each keeps a remnant of about
eps times its pair's diagonal, which held the largest off-diagonal element at a few eps, so that the stop below
was rarely met and most calls ran `JACOBI.max_sweeps` sweeps). Sweeps stop once every off-diagonal element is
below eps.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel_support.eigh_common import JACOBI
from .common import EPS, bounds_buffer, checked


@triton.jit
def _exchange(x, partner, AXIS: tl.constexpr, N: tl.constexpr):
    """x (N x N) with its rows (AXIS 0) or columns (AXIS 1) i and partner[i] exchanged: a register gather."""
    if AXIS == 1:
        return tl.gather(x, tl.broadcast_to(partner[None, :], (N, N)), 1)
    return tl.gather(x, tl.broadcast_to(partner[:, None], (N, N)), 0)


@triton.jit
def _diagonal(a, eye):
    return tl.sum(tl.where(eye, a, 0.0), axis=1)  # a row reduction: within a warp


@triton.jit
def _off_diagonal_max(a, eye):
    return tl.max(tl.max(tl.where(eye, 0.0, tl.abs(a)), axis=1), axis=0)


@triton.jit
def _jacobi_kernel(a_ptr, q_ptr, l_ptr, sweeps_ptr, bounds_ptr, tolerance, N: tl.constexpr,
                   MAX_SWEEPS: tl.constexpr):
    """Program i diagonalises the N x N matrix i of `a` (the sweeps it took in sweeps[i], its checks' bounds in
    bounds[i, :3])."""
    matrix = tl.program_id(0)
    rows = tl.arange(0, N)
    a = tl.load(a_ptr + matrix * N * N + rows[:, None] * N + rows[None, :])
    a, transposed, scale = checked(a, tl.trans(a), bounds_ptr + matrix * 3)
    eye = rows[:, None] == rows[None, :]
    scale = tl.where(scale > 0, scale, 1.0)
    a = 0.5 * (a / scale + transposed / scale)
    v = eye.to(tl.float32)
    off = _off_diagonal_max(a, eye)
    sweep = 0
    while (sweep < MAX_SWEEPS) & (off > tolerance):
        for m in range(1, N):  # round m pairs i with i ^ m
            partner = rows ^ m
            pairs = rows[None, :] == partner[:, None]  # the entries (i, i ^ m)
            diagonal = _diagonal(a, eye)
            a_row = tl.sum(tl.where(pairs, a, 0.0), axis=1)  # A[i, i ^ m], within a warp
            a_ij = 0.5 * (a_row + tl.gather(a_row, partner, 0))  # the same value for both members of a pair
            d_j = tl.gather(diagonal, partner, 0)
            first = rows < partner  # row i is p (else q) of its pair
            tau = tl.where(first, d_j - diagonal, diagonal - d_j) / (2.0 * a_ij)
            t = tl.where(tau >= 0, 1.0, -1.0) / (tl.abs(tau) + tl.sqrt_rn(1.0 + tau * tau))
            t = tl.where(a_ij == 0.0, 0.0, t)
            c = 1.0 / tl.sqrt_rn(1.0 + t * t)  # IEEE square roots, as the Pallas lowering takes
            s = tl.where(first, t * c, -t * c)  # J[i, i] = c_i, J[i ^ m, i] = -s_i
            a = c[None, :] * a - s[None, :] * _exchange(a, partner, 1, N)  # A J
            a = c[:, None] * a - s[:, None] * _exchange(a, partner, 0, N)  # J^T (A J)
            a = tl.where(pairs, 0.0, a)  # the pairs' A[p, q], zero in exact arithmetic
            v = c[None, :] * v - s[None, :] * _exchange(v, partner, 1, N)
        off = _off_diagonal_max(a, eye)
        sweep += 1
    tl.store(q_ptr + matrix * N * N + rows[:, None] * N + rows[None, :], v)
    tl.store(l_ptr + matrix * N + rows, _diagonal(a, eye) * scale)
    tl.store(sweeps_ptr + matrix, sweep)


def on_chip(a: torch.Tensor, max_sweeps: int = JACOBI.max_sweeps):
    """(V, diagonal, the sweeps taken [batch, 1] int32, the checks' bounds [batch, 3]) of the on-chip Jacobi,
    unsorted, for each matrix of a [batch, N, N]."""
    count, size, _ = a.shape
    vectors = torch.empty((count, size, size), device=a.device, dtype=torch.float32)
    values = torch.empty((count, size), device=a.device, dtype=torch.float32)
    sweeps = torch.empty((count, 1), device=a.device, dtype=torch.int32)
    bounds = bounds_buffer(count, device=a.device)
    _jacobi_kernel[(count,)](a, vectors, values, sweeps, bounds, EPS, N=size, MAX_SWEEPS=max_sweeps,
                             num_warps=JACOBI.warps(size))
    return vectors, values, sweeps, bounds
