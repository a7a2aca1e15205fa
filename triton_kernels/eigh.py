"""Batched symmetric eigendecomposition in Triton: parallel-order Jacobi.

n <= 64 (padded to a power of two N >= 16), on chip: one program per matrix holds its
N x N matrix A and the accumulated rotations V in registers. A sweep is the N - 1 rounds
m = 1 .. N - 1 of the XOR pairing (index i meets i ^ m: the pairs of a round are disjoint and a
sweep meets every two indices once), so one round is a single orthogonal J made of N/2 plane
rotations, each zeroing its A[p, q] (Golub & Van Loan's symmetric Schur decomposition). J is
applied elementwise, O(N^2) per round rather than a matrix product's O(N^3): with J[i, i] = c_i
and J[i ^ m, i] = -s_i, (A J)[:, i] = c_i A[:, i] - s_i A[:, i ^ m], and likewise for the rows of
J^T (A J) and for V J; exchanging rows or columns i and i ^ m is one register gather
(`tl.gather`; the Pallas port, whose Triton lowering has no gather, multiplies by the 0/1
permutation instead, and its on-chip kernel is about 4 times slower: results/h200/NOTES.md).
Padding rows and columns are zero off the diagonal, so they never mix with the matrix. The
matrix is scaled by 1/max|A| and symmetrised first (no overflow or underflow at the extreme
magnitudes); both members of a pair compute their rotation from the same averaged
A[p, q], so they agree on it exactly. Sweeps stop once every off-diagonal element is below eps;
the launcher sorts the eigenvalues (glue).

n > 64, blocked: the same parallel order over blocks of BLOCK rows, paired by the round-robin
table (ports.eigh.blocked_pairs; the block count need not be a power of two). Each round the
on-chip kernel diagonalises every pair's 2 BLOCK x 2 BLOCK principal submatrix, read in place
through the round's row table (one program per pair, at most BLOCK_SWEEPS sweeps), giving one
rotation J_P per pair, and `_rotate_blocks_kernel` applies them all in place: A[P, Q] <- J_P^T
A[P, Q] J_Q for every two pairs' rows and columns, V[R, Q] <- V[R, Q] J_Q (fp32 IEEE products;
each program reads and writes only its own elements). The matrix never moves. The row tables
come in contiguous runs (of BLOCK; one run of N on the whole-matrix path) and the kernels say so
(`tl.max_contiguous`): without the hint the indexed loads and stores are not vectorised and the
rotation kernel ran 3 to 4 times slower on the H200. Sweeps stop when the off-diagonal Frobenius
norm is below 16 eps ||A||_F for every matrix, or at a rounding floor
below 100 eps (ports.eigh.blocked_converged).
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ports.eigh import (BLOCK, BLOCK_SWEEPS, BLOCKED_MAX_SWEEPS, JACOBI_MAX_N, JACOBI_MAX_SWEEPS, blocked_converged,
                        blocked_pairs, check_offsets, jacobi_size, jacobi_warps, validate)

EPS = torch.finfo(torch.float32).eps


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
def _jacobi_kernel(a_ptr, rows_ptr, q_ptr, l_ptr, tolerance, stride, groups, N: tl.constexpr, RUN: tl.constexpr,
                   MAX_SWEEPS: tl.constexpr):
    """Program i diagonalises the N x N principal submatrix on rows (and columns)
    rows[i % groups] of matrix i // groups of `a` (stride x stride); the rows come in
    contiguous runs of RUN."""
    matrix = tl.program_id(0)
    rows = tl.arange(0, N)
    picked = tl.max_contiguous(tl.multiple_of(tl.load(rows_ptr + (matrix % groups) * N + rows), RUN), RUN)
    a = tl.load(a_ptr + (matrix // groups) * stride * stride + picked[:, None] * stride + picked[None, :])
    eye = rows[:, None] == rows[None, :]
    scale = tl.max(tl.max(tl.abs(a), axis=1), axis=0)
    scale = tl.where(scale > 0, scale, 1.0)
    a = a / scale
    a = 0.5 * (a + tl.trans(a))
    v = eye.to(tl.float32)
    off = _off_diagonal_max(a, eye)
    sweep = 0
    while (sweep < MAX_SWEEPS) & (off > tolerance):
        for m in range(1, N):  # round m pairs i with i ^ m
            partner = rows ^ m
            diagonal = _diagonal(a, eye)
            a_row = tl.sum(tl.where(rows[None, :] == partner[:, None], a, 0.0), axis=1)  # A[i, i ^ m], within a warp
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
            v = c[None, :] * v - s[None, :] * _exchange(v, partner, 1, N)
        off = _off_diagonal_max(a, eye)
        sweep += 1
    tl.store(q_ptr + matrix * N * N + rows[:, None] * N + rows[None, :], v)
    tl.store(l_ptr + matrix * N + rows, _diagonal(a, eye) * scale)


@triton.jit
def _rotate_blocks_kernel(x_ptr, rotations_ptr, rows_ptr, size, LEFT: tl.constexpr, PAIR: tl.constexpr,
                          RUN: tl.constexpr):
    """Program (matrix, R, Q), Q fastest: X[R, Q] <- X[R, Q] J_Q, and with LEFT also J_R^T on the
    left, in place. Q (and R with LEFT) is a pair's rows, rows[Q], in contiguous runs of RUN;
    without LEFT, R is rows R * PAIR onwards; J_P = rotations[matrix, P]. The matrix varies
    slowest, so the programs of one matrix share its rotations in L2."""
    pairs = size // PAIR
    program = tl.program_id(0)
    matrix, row_block, col_pair = program // (pairs * pairs), program // pairs % pairs, program % pairs
    offsets = tl.arange(0, PAIR)
    square = offsets[:, None] * PAIR + offsets[None, :]
    cols = tl.max_contiguous(tl.multiple_of(tl.load(rows_ptr + col_pair * PAIR + offsets), RUN), RUN)
    rows = tl.load(rows_ptr + row_block * PAIR + offsets) if LEFT else row_block * PAIR + offsets
    block_ptrs = x_ptr + matrix * size * size + rows[:, None] * size + cols[None, :]
    x = tl.load(block_ptrs)
    x = tl.dot(x, tl.load(rotations_ptr + (matrix * pairs + col_pair) * PAIR * PAIR + square),
               input_precision="ieee")
    if LEFT:
        left = tl.load(rotations_ptr + (matrix * pairs + row_block) * PAIR * PAIR + square)
        x = tl.dot(tl.trans(left), x, input_precision="ieee")
    tl.store(block_ptrs, x)


def _on_chip(a: torch.Tensor, rows: torch.Tensor, run: int, max_sweeps: int = JACOBI_MAX_SWEEPS):
    """(V, diagonal) of the on-chip Jacobi, unsorted, for the principal submatrix on each row of
    `rows` [groups, size] (contiguous runs of `run` indices) of each matrix of a [batch, n, n]:
    [batch * groups, size, size], [batch * groups, size]."""
    groups, size = rows.shape
    count = a.shape[0] * groups
    vectors = torch.empty((count, size, size), device=a.device, dtype=torch.float32)
    values = torch.empty((count, size), device=a.device, dtype=torch.float32)
    _jacobi_kernel[(count,)](a, rows, vectors, values, EPS, a.shape[1], groups, N=size, RUN=run,
                             MAX_SWEEPS=max_sweeps, num_warps=jacobi_warps(size))
    return vectors, values


@functools.lru_cache(maxsize=16)
def _schedule(n: int, device: torch.device) -> tuple[int, torch.Tensor]:
    """The blocked schedule (padded size, rows [rounds, pairs, 2 BLOCK]) on the device: it depends on
    n only, like compiled code."""
    size, rows = blocked_pairs(n, BLOCK)
    return size, torch.tensor(rows, device=device, dtype=torch.int32)


def _blocked(a: torch.Tensor):
    """(V, diagonal) of the blocked Jacobi for the real (unpadded) indices, unsorted."""
    batch, n, _ = a.shape
    size, schedule = _schedule(n, a.device)
    check_offsets(batch, size)
    pairs, pair = schedule.shape[1:]
    scale = a.abs().amax(dim=(1, 2), keepdim=True)
    x = F.pad(0.5 * (a + a.mT) / torch.where(scale > 0, scale, 1.0), (0, size - n, 0, size - n))
    v = torch.eye(size, device=a.device).expand(batch, size, size).contiguous()
    previous = torch.inf
    for _ in range(BLOCKED_MAX_SWEEPS):
        for rows in schedule:
            rotations, _ = _on_chip(x, rows, BLOCK, BLOCK_SWEEPS)  # each pair's principal submatrix
            for target, left in ((x, True), (v, False)):
                _rotate_blocks_kernel[(batch * pairs * pairs,)](target, rotations, rows, size, LEFT=left, PAIR=pair,
                                                                RUN=BLOCK, num_warps=4)
        diagonal = x.diagonal(dim1=1, dim2=2)
        off = ((x - torch.diag_embed(diagonal)).square().sum(dim=(1, 2)) / x.square().sum(dim=(1, 2))).sqrt()
        worst = off.nan_to_num(0.0).max().item()  # an all-zero matrix gives 0 / 0
        if blocked_converged(worst, previous):
            break
        previous = worst
    return v[:, :n, :n], diagonal[:, :n] * scale[:, :, 0]


def eigh(a: torch.Tensor):
    """(Q, L) for a [batch, n, n] float32 symmetric: A Q = Q diag(L), L ascending."""
    validate(a)
    batch, n, _ = a.shape
    if batch == 0:
        return torch.empty_like(a), torch.empty((0, n), device=a.device, dtype=a.dtype)
    if n > JACOBI_MAX_N:
        vectors, values = _blocked(a)
    else:
        size = jacobi_size(n)
        check_offsets(batch, size)
        whole = torch.arange(size, device=a.device, dtype=torch.int32)[None]
        vectors, values = _on_chip(F.pad(a, (0, size - n, 0, size - n)).contiguous(), whole, size)
        vectors, values = vectors[:, :n, :n], values[:, :n]
    values, order = values.sort(dim=-1)
    return vectors.gather(-1, order.unsqueeze(-2).expand(batch, n, n)), values
