"""The eigh Triton port's inverse iteration: T's eigenvectors, with the repair of those still poor.

`_inverse_iteration_kernel`: lane j solves (T - shift_j I) x = x, pivoted, on the vectors' transpose (a warp's
step touches 128 contiguous bytes), `INVERSE_ITERATION.rounds` rounds from a fixed pseudo-random start, each
followed by the clusters' block Gram-Schmidt (`gram_schmidt`): the rounds before the last orthogonalise only the
closest eigenvalues' vectors (`INVERSE_ITERATION.early_cluster_gap`), the last every cluster
(`INVERSE_ITERATION.cluster_gap`). Then `_repair_kernel` makes any vector whose residual is above
`INVERSE_ITERATION.repair_residual` eps ||T|| orthogonal to all the sound ones.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernel_support.eigh_common import GRAM_SCHMIDT, INVERSE_ITERATION
from . import gram_schmidt
from .common import EPS, empty


@dataclass(frozen=True)
class TritonInverseIteration:
    """The Triton port's own tunables of inverse iteration."""

    transpose_tile: int = 64  # the vectors' transposes move 64 x 64 tiles (16 KB) a program


TRITON_INVERSE_ITERATION = TritonInverseIteration()


@triton.jit
def _pivot(x, floor):
    return tl.where(tl.abs(x) < floor, tl.where(x < 0, -floor, floor), x)


@triton.jit
def _split(off_diagonal, floor):
    return tl.where(tl.abs(off_diagonal) <= floor, 0.0, off_diagonal)


@triton.jit
def _start_vector(i, lanes):
    """A fixed pseudo-random start in [-0.5, 0.5) for element i of lane j's vector: an integer hash."""
    h = (lanes * 0 + i).to(tl.uint32) * 747796405 + lanes.to(tl.uint32) * 277803737
    h = (h ^ (h >> 16)) * 73244475
    h = h ^ (h >> 16)
    return (h >> 8).to(tl.float32) * (1.0 / 16777216.0) - 0.5


@triton.jit
def _chained(values, value, lanes, valid, n, link):
    """Lanes whose eigenvalue is within link of a neighbour's: members of a run chained by gaps below link."""
    below = (lanes > 0) & (value - tl.load(values + lanes - 1, mask=valid & (lanes > 0), other=0.0) < link)
    above = (lanes < n - 1) & (tl.load(values + lanes + 1, mask=lanes < n - 1, other=0.0) - value < link)
    return valid & (below | above)


@triton.jit
def _first_of_run(values, lanes, chained, link):
    """The index of the first eigenvalue of each chained lane's run (gaps below link); a lane's own elsewhere."""
    first = lanes
    walking = chained & (lanes > 0)
    while tl.max(walking.to(tl.int32)) > 0:
        step = walking & (tl.load(values + first, mask=walking, other=0.0)
                          - tl.load(values + first - 1, mask=walking, other=0.0) < link)
        first -= step.to(tl.int32)
        walking = step & (first > 0)
    return first


@triton.jit
def _inverse_iteration_kernel(d_ptr, e_ptr, values_ptr, norm_ptr, x_ptr, scratch_ptr, lengths_ptr, n, pivot_relative,
                              group_gap, sparse_group_gap, FIRST: tl.constexpr, LANES: tl.constexpr):
    """Program (b, block): lane j solves (T_b - shift_j I) x_j = x_j (FIRST: a fixed pseudo-random
    right-hand side) by Gaussian elimination with partial pivoting, elementwise across the lanes
    (each lane's recurrence runs down T's n rows). x is [batch, n elements, n vectors] (lanes
    contiguous, so a warp's step reads or writes 128 bytes, not 32 sectors: `vectors` transposes);
    the eliminated right-hand side and the upper triangular factor's first superdiagonal, each over the row's pivot,
    wait in scratch [batch, 2, n, n] (lanes contiguous too) for the back substitution; NaN in place of the
    superdiagonal marks a row that partial pivoting swapped, whose pivot and two superdiagonal entries are T's,
    which the back substitution reads again (elsewhere the second superdiagonal is 0). The kernel is bound by this
    scratch's traffic: two arrays, not the four of the factor's three diagonals and the right-hand side. Each
    vector's length goes to lengths [batch, n], summed as the back substitution writes it, for the transpose that
    normalises it (`_transposed`), so that the Gram-Schmidt need not touch a vector alone in its cluster.

    The shift is eigenvalue j itself (T - shift I is singular to working accuracy, so x_j grows
    along its eigenvector), except in a group, a chain of eigenvalues each within group_gap ||T||
    of the next. In a dense group (mean gap below sparse_group_gap ||T||) one shift serves the whole
    group, half a gap below its first eigenvalue, so that every group direction grows alike and the
    group's vectors stay independent for the Gram-Schmidt that follows (with a shift on one of its
    eigenvalues they all turn into that one's vector). A sparse group, where a shared shift would sit
    nearer the eigenvalue above the group than the group's top members, is cut into runs of
    eigenvalues closer than sparse_group_gap ||T||, each shifted as a dense group (half that gap
    below its first), and lone members, shifted by their own eigenvalue. Off-diagonals below
    pivot_relative ||T|| count as zero (T splits there: no growth across a block of negligible
    entries); smaller pivots are raised to pivot_relative ||T||."""
    matrix = tl.program_id(0).to(tl.int64)
    lanes = tl.program_id(1) * LANES + tl.arange(0, LANES)
    valid = lanes < n
    d, e, values = d_ptr + matrix * n, e_ptr + matrix * n, values_ptr + matrix * n
    x = x_ptr + matrix * n * n + lanes
    factors = scratch_ptr + matrix * 2 * n * n + lanes
    norm = tl.load(norm_ptr + matrix)
    floor = pivot_relative * norm
    gap = group_gap * norm
    value = tl.load(values + lanes, mask=valid, other=0.0)
    grouped = _chained(values, value, lanes, valid, n, gap)
    first = _first_of_run(values, lanes, grouped, gap)  # indices of the group's first eigenvalue; the walk: its last
    last = lanes
    walking = grouped & (lanes < n - 1)
    while tl.max(walking.to(tl.int32)) > 0:
        step = walking & (tl.load(values + last + 1, mask=walking, other=0.0)
                          - tl.load(values + last, mask=walking, other=0.0) < gap)
        last += step.to(tl.int32)
        walking = step & (last < n - 1)
    low = tl.load(values + first, mask=valid, other=0.0)
    run_gap = sparse_group_gap * norm
    dense = tl.load(values + last, mask=valid, other=0.0) - low < run_gap * (last - first).to(tl.float32)
    in_run = _chained(values, value, lanes, valid, n, run_gap)
    run_first = _first_of_run(values, lanes, in_run & grouped & ~dense, run_gap)  # only sparse groups walk their runs
    run_shift = tl.load(values + run_first, mask=valid, other=0.0) - 0.5 * run_gap
    shift = tl.where(grouped, tl.where(dense, low - 0.5 * gap, tl.where(in_run, run_shift, value)), value)
    zero = tl.zeros((LANES,), tl.float32)
    head = tl.load(d) - shift  # row i's diagonal and superdiagonal after elimination, and its right-hand side
    head_next = zero + _split(tl.load(e), floor)
    rhs = _start_vector(0, lanes) if FIRST else tl.load(x, mask=valid, other=0.0)
    for i in range(n - 1):
        sub = _split(tl.load(e + i), floor)  # T[i + 1, i]
        diagonal = tl.load(d + i + 1) - shift
        above = zero + _split(tl.load(e + i + 1), floor)
        rhs_next = _start_vector(i + 1, lanes) if FIRST else tl.load(x + (i + 1) * n, mask=valid, other=0.0)
        swap = tl.abs(sub) > tl.abs(head)
        pivot = _pivot(tl.where(swap, sub, head), floor)
        p_b, p_c = tl.where(swap, diagonal, head_next), tl.where(swap, above, 0.0)
        p_r = tl.where(swap, rhs_next, rhs)
        multiplier = tl.where(swap, head, sub) / pivot
        head = tl.where(swap, head_next, diagonal) - multiplier * p_b
        head_next = tl.where(swap, 0.0, above) - multiplier * p_c
        rhs = tl.where(swap, rhs, rhs_next) - multiplier * p_r
        row = factors + i * n  # row i of U x = rhs over its pivot: x_i = p_r' - p_b' x_{i+1} - p_c' x_{i+2}
        tl.store(row, p_r / pivot, mask=valid)
        tl.store(row + n * n, tl.where(swap, float("nan"), p_b / pivot), mask=valid)  # swapped: all but p_r are T's
    value = rhs / _pivot(head, floor)
    tl.store(x + (n - 1) * n, value, mask=valid)
    later = zero
    squares = value * value
    for t in range(1, n):
        i = n - 1 - t
        row = factors + i * n
        kept = tl.load(row + n * n, mask=valid, other=0.0)
        swapped = kept != kept  # NaN: the row was swapped; its pivot (T[i + 1, i]), p_b and p_c are T's
        pivot = _split(tl.load(e + i), floor)  # not 0 where swapped: it exceeded the row's |head| >= 0
        p_b = tl.where(swapped, (tl.load(d + i + 1) - shift) / pivot, kept)
        p_c = tl.where(swapped, _split(tl.load(e + i + 1), floor) / pivot, 0.0)
        value, later = tl.load(row, mask=valid, other=0.0) - p_b * value - p_c * later, value
        tl.store(x + i * n, value, mask=valid)
        squares += value * value
    tl.store(lengths_ptr + matrix * n + lanes, tl.sqrt_rn(squares), mask=valid)


@triton.jit
def _row_residuals(x, d, e, rows, cols, valid, inside, values, n):
    """||T x_r - value_r x_r|| for the vectors x_r, r in rows (x is [vector, element], T tridiagonal)."""
    mask = inside[:, None] & valid[None, :]
    here = tl.load(x + rows[:, None] * n + cols[None, :], mask=mask, other=0.0, cache_modifier=".cg")
    before = tl.load(x + rows[:, None] * n + cols[None, :] - 1, mask=mask & (cols[None, :] > 0), other=0.0,
                     cache_modifier=".cg")
    after = tl.load(x + rows[:, None] * n + cols[None, :] + 1, mask=mask & (cols[None, :] < n - 1), other=0.0,
                    cache_modifier=".cg")
    diagonal = tl.load(d + cols, mask=valid, other=0.0)
    upper = tl.load(e + cols, mask=cols < n - 1, other=0.0)
    lower = tl.load(e + cols - 1, mask=valid & (cols > 0), other=0.0)
    value = tl.load(values + rows, mask=inside, other=0.0)
    r = (diagonal[None, :] - value[:, None]) * here + lower[None, :] * before + upper[None, :] * after
    return tl.sqrt_rn(tl.sum(r * r, axis=1))


@triton.jit
def _repair_kernel(x_ptr, d_ptr, e_ptr, values_ptr, norm_ptr, residual_ptr, limit, n, BLOCK_N: tl.constexpr,
                   PANEL: tl.constexpr):
    """Program b checks each vector's residual ||T x_j - value_j x_j|| against limit ||T|| and
    replaces a vector above it by its part orthogonal to every sound vector (classical
    Gram-Schmidt over panels of PANEL vectors, twice), normalised. Such a vector is the rare
    one whose Gram-Schmidt within its cluster cancelled almost all of it: what was left is
    mostly rounding, partly along other clusters' vectors, which the cluster's Gram-Schmidt does
    not touch. Residuals are written to residual [batch, n] (a repaired vector's after repair)."""
    matrix = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    local = tl.arange(0, PANEL)
    valid = cols < n
    x, d, e, values, residual = (x_ptr + matrix * n * n, d_ptr + matrix * n, e_ptr + matrix * n,
                                 values_ptr + matrix * n, residual_ptr + matrix * n)
    bound = limit * tl.load(norm_ptr + matrix)
    unsound = 0
    for panel in range(0, tl.cdiv(n, PANEL)):
        rows = panel * PANEL + local
        inside = rows < n
        r = _row_residuals(x, d, e, rows, cols, valid, inside, values, n)
        tl.store(residual + rows, r, mask=inside)
        unsound += tl.sum((inside & (r > bound)).to(tl.int32))
    if unsound > 0:
        tl.debug_barrier()
        for j in range(0, n):
            if tl.load(residual + j, cache_modifier=".cg") > bound:
                vector = tl.load(x + j * n + cols, mask=valid, other=0.0, cache_modifier=".cg")
                for _ in tl.static_range(2):
                    for panel in range(0, tl.cdiv(n, PANEL)):
                        rows = panel * PANEL + local
                        inside = rows < n
                        sound = inside & (rows != j) & (tl.load(residual + rows, mask=inside, other=0.0,
                                                                cache_modifier=".cg") <= bound)
                        block = tl.load(x + rows[:, None] * n + cols[None, :], mask=sound[:, None] & valid[None, :],
                                        other=0.0, cache_modifier=".cg")
                        vector -= tl.sum(tl.sum(block * vector[None, :], axis=1)[:, None] * block, axis=0)
                vector /= tl.maximum(tl.sqrt_rn(tl.sum(vector * vector)), 1e-30)
                tl.store(x + j * n + cols, vector, mask=valid)
                tl.debug_barrier()
                rows = j + local  # a panel's tile with only row j inside
                again = _row_residuals(x, d, e, rows, cols, valid, local == 0, values, n)
                tl.store(residual + rows, again, mask=local == 0)
                tl.debug_barrier()


@triton.jit
def _transpose_kernel(src_ptr, dst_ptr, lengths_ptr, n, BLOCK: tl.constexpr, NORMALISE: tl.constexpr):
    """Program (b, i, j): dst[b] = src[b]^T on the BLOCK x BLOCK tile (i, j), read and written in rows (the
    compiler exchanges the tile through shared memory), where torch's strided copy reads one of the two
    layouts a column at a time, slower (docs/findings.md, "The eigh kernels, port by port"). NORMALISE: src's
    column c over lengths[b, c] (dst's rows unit vectors; a zero length leaves its column as it is)."""
    matrix = tl.program_id(0).to(tl.int64)
    rows = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    cols = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    mask = (rows < n)[:, None] & (cols < n)[None, :]
    tile = tl.load(src_ptr + matrix * n * n + rows[:, None] * n + cols[None, :], mask=mask)
    if NORMALISE:
        length = tl.load(lengths_ptr + matrix * n + cols, mask=cols < n, other=1.0)
        tile /= tl.where(length > 0, length, 1.0)[None, :]
    tl.store(dst_ptr + matrix * n * n + cols[:, None] * n + rows[None, :], tl.trans(tile), mask=tl.trans(mask))


def _transposed(src, dst, lengths=None):
    """dst [batch, n, n] = src's matrices transposed, each column of src over lengths [batch, n] if given: dst,
    written."""
    batch, n, _ = src.shape
    tile = TRITON_INVERSE_ITERATION.transpose_tile
    _transpose_kernel[(batch, triton.cdiv(n, tile), triton.cdiv(n, tile))](
        src, dst, src if lengths is None else lengths, n, BLOCK=tile, NORMALISE=lengths is not None,
        num_warps=4)
    return dst


def vectors(d: torch.Tensor, e: torch.Tensor, values: torch.Tensor, norm: torch.Tensor):
    """T's orthonormal eigenvectors as the rows of z [batch, n, n], in the order of `values`. Inverse iteration
    works on their transpose (`_transposed` between the two)."""
    batch, n = d.shape
    z, columns = empty(batch, n, n, device=d.device), empty(batch, n, n, device=d.device)
    scratch, lengths = empty(batch, 2, n, n, device=d.device), empty(batch, n, device=d.device)
    lanes, rounds = INVERSE_ITERATION.lanes, INVERSE_ITERATION.rounds
    for step in range(rounds):
        if step:
            _transposed(z, columns)
        _inverse_iteration_kernel[(batch, triton.cdiv(n, lanes))](d, e, values, norm, columns, scratch, lengths, n,
                                                                  EPS, INVERSE_ITERATION.group_gap * EPS,
                                                                  INVERSE_ITERATION.sparse_group_gap * EPS,
                                                                  FIRST=step == 0, LANES=lanes, num_warps=1)
        cluster_gap = INVERSE_ITERATION.cluster_gap if step == rounds - 1 else INVERSE_ITERATION.early_cluster_gap
        gram_schmidt.orthonormalize(_transposed(columns, z, lengths), values, norm, cluster_gap)  # z, in place
    return repair(z, d, e, values, norm)[0]


def repair(z: torch.Tensor, d: torch.Tensor, e: torch.Tensor, values: torch.Tensor, norm: torch.Tensor):
    """z with every vector whose residual exceeds `INVERSE_ITERATION.repair_residual` eps ||T|| made orthogonal to
    the sound ones (changed in place), and the residuals [batch, n]."""
    batch, n, _ = z.shape
    block_n = triton.next_power_of_2(n)
    residual = empty(batch, n, device=z.device)
    _repair_kernel[(batch,)](z, d, e, values, norm, residual, INVERSE_ITERATION.repair_residual * EPS, n,
                             BLOCK_N=block_n, PANEL=GRAM_SCHMIDT.panel,
                             num_warps=GRAM_SCHMIDT.vector_panel_warps(block_n))
    return z, residual
