"""The eigh Pallas port's inverse iteration (group shifts, splitting at negligible off-diagonals): T's
eigenvectors, `INVERSE_ITERATION.rounds` rounds each followed by the clusters' Gram-Schmidt (`gram_schmidt`:
`INVERSE_ITERATION.early_cluster_gap`, `INVERSE_ITERATION.cluster_gap` in the last round), then the repair of
vectors whose residual is above `INVERSE_ITERATION.repair_residual` eps ||T|| (the Triton port's
`inverse_iteration`).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from kernel_support.eigh_common import GRAM_SCHMIDT, INVERSE_ITERATION
from . import gram_schmidt
from .common import EPS, barrier, f32, masked_load, per_matrix, window


def _pivot(x, floor):
    return jnp.where(jnp.abs(x) < floor, jnp.where(x < 0, -floor, floor), x)


def _split(off_diagonal, floor):
    return jnp.where(jnp.abs(off_diagonal) <= floor, 0.0, off_diagonal)


def _start_vector(i, lanes):
    """The Triton port's start vector, bit for bit: element i of lane j's vector, an integer hash in uint32."""
    h = (lanes * 0 + i).astype(jnp.uint32) * 747796405 + lanes.astype(jnp.uint32) * 277803737
    h = (h ^ (h >> 16)) * 73244475
    h = h ^ (h >> 16)
    return (h >> 8).astype(jnp.float32) * (1.0 / 16777216.0) - 0.5


def _chained(values_ref, value, lanes, valid, n, link):
    """As the Triton port's: lanes whose eigenvalue is within link of a neighbour's."""
    below = (lanes > 0) & (value - masked_load(values_ref.at[lanes - 1], valid & (lanes > 0)) < link)
    above = (lanes < n - 1) & (masked_load(values_ref.at[lanes + 1], lanes < n - 1) - value < link)
    return valid & (below | above)


def _still_walking(carry):
    return jnp.max(carry[1].astype(jnp.int32)) > 0


def _first_of_run(values_ref, lanes, chained, link):
    """As the Triton port's: the index of the first eigenvalue of each chained lane's run (gaps below link)."""
    def walk(carry):
        first_index, walking = carry
        step = walking & (masked_load(values_ref.at[first_index], walking)
                          - masked_load(values_ref.at[first_index - 1], walking) < link)
        first_index -= step.astype(jnp.int32)
        return first_index, step & (first_index > 0)

    return jax.lax.while_loop(_still_walking, walk, (lanes, chained & (lanes > 0)))[0]


def _inverse_iteration_kernel(d_ref, e_ref, values_ref, norm_ref, *refs, n, first):
    """As the Triton port's `_inverse_iteration_kernel`: program (b, block), lane j solves
    (T_b - shift_j I) x_j = x_j (first: the pseudo-random start) by Gaussian elimination with
    partial pivoting, elementwise across the lanes; x is [element, vector] (lanes contiguous), the eliminated
    right-hand side and the factor's first superdiagonal, each over the row's pivot (NaN for the superdiagonal where
    the row was swapped: there the pivot and both superdiagonals are T's), wait in scratch [2, row, lane] for the
    back substitution. Same
    shifts (one per dense group of eigenvalues within `INVERSE_ITERATION.group_gap` eps ||T||, half a gap below its
    first; in a sparse one, one per run within `INVERSE_ITERATION.sparse_group_gap` eps ||T|| and its own for a lone
    member),
    splitting and pivot floor, and each vector's length in lengths, for the transpose that normalises it. x and
    scratch are outputs (aliased to the inputs after the first step); the lanes' elements are read from the output
    x, which holds them."""
    x_ref, factors_ref, lengths_ref = refs[-3:]
    width = INVERSE_ITERATION.lanes
    lanes = pl.program_id(1) * width + jnp.arange(width)
    block = window(pl.program_id(1) * width, width)
    valid = lanes < n
    norm = norm_ref[...]
    floor = EPS * norm
    gap = INVERSE_ITERATION.group_gap * EPS * norm
    value = masked_load(values_ref.at[lanes], valid)
    grouped = _chained(values_ref, value, lanes, valid, n, gap)
    first_index = _first_of_run(values_ref, lanes, grouped, gap)  # the group's first eigenvalue; walk_up: its last

    def walk_up(carry):
        last_index, walking = carry
        step = walking & (masked_load(values_ref.at[last_index + 1], walking)
                          - masked_load(values_ref.at[last_index], walking) < gap)
        last_index += step.astype(jnp.int32)
        return last_index, step & (last_index < n - 1)

    last_index, _ = jax.lax.while_loop(_still_walking, walk_up, (lanes, grouped & (lanes < n - 1)))
    low = masked_load(values_ref.at[first_index], valid)
    run_gap = (INVERSE_ITERATION.sparse_group_gap * EPS) * norm
    span = (last_index - first_index).astype(jnp.float32)
    dense = masked_load(values_ref.at[last_index], valid) - low < run_gap * span
    in_run = _chained(values_ref, value, lanes, valid, n, run_gap)
    run_first = _first_of_run(values_ref, lanes, in_run & grouped & ~dense, run_gap)  # only sparse groups walk runs
    run_shift = masked_load(values_ref.at[run_first], valid) - 0.5 * run_gap
    shift = jnp.where(grouped, jnp.where(dense, low - 0.5 * gap, jnp.where(in_run, run_shift, value)), value)
    zero = jnp.zeros((width,), jnp.float32)

    def right_hand_side(i):
        return _start_vector(i, lanes) if first else masked_load(x_ref.at[i, block], valid)

    def eliminate(i, carry):  # row i's diagonal and superdiagonal after elimination, and its right-hand side
        head, head_next, rhs = carry
        sub = _split(e_ref[i], floor)  # T[i + 1, i]
        diagonal = d_ref[i + 1] - shift
        above = zero + _split(e_ref[i + 1], floor)
        rhs_next = right_hand_side(i + 1)
        swap = jnp.abs(sub) > jnp.abs(head)
        pivot = _pivot(jnp.where(swap, sub, head), floor)
        p_b, p_c = jnp.where(swap, diagonal, head_next), jnp.where(swap, above, 0.0)
        p_r = jnp.where(swap, rhs_next, rhs)
        multiplier = jnp.where(swap, head, sub) / pivot
        head = jnp.where(swap, head_next, diagonal) - multiplier * p_b
        head_next = jnp.where(swap, 0.0, above) - multiplier * p_c
        rhs = jnp.where(swap, rhs, rhs_next) - multiplier * p_r
        # row i of U x = rhs over its pivot: x_i = p_r' - p_b' x_{i+1} - p_c' x_{i+2}; swapped: all but p_r are T's
        for part, factor in enumerate((p_r / pivot, jnp.where(swap, jnp.nan, p_b / pivot))):
            pltriton.store(factors_ref.at[jnp.int32(part), i, block], factor, mask=valid)
        return head, head_next, rhs

    start = (d_ref[0] - shift, zero + _split(e_ref[0], floor), right_hand_side(jnp.int32(0)))
    head, _, rhs = jax.lax.fori_loop(0, n - 1, eliminate, start)
    value = rhs / _pivot(head, floor)
    pltriton.store(x_ref.at[jnp.int32(n - 1), block], value, mask=valid)

    def substitute(t, carry):
        value, later, squares = carry
        i = n - 1 - t
        kept = masked_load(factors_ref.at[jnp.int32(1), i, block], valid)
        swapped = kept != kept  # NaN: the row was swapped; its pivot (T[i + 1, i]), p_b and p_c are T's
        pivot = _split(e_ref[i], floor)  # not 0 where swapped: it exceeded the row's |head| >= 0
        p_b = jnp.where(swapped, (d_ref[i + 1] - shift) / pivot, kept)
        p_c = jnp.where(swapped, _split(e_ref[i + 1], floor) / pivot, 0.0)
        value, later = masked_load(factors_ref.at[jnp.int32(0), i, block], valid) - p_b * value - p_c * later, value
        pltriton.store(x_ref.at[i, block], value, mask=valid)
        return value, later, squares + value * value

    _, _, squares = jax.lax.fori_loop(1, n, substitute, (value, zero, value * value))
    pltriton.store(lengths_ref.at[block], jnp.sqrt(squares), mask=valid)


def _row_residuals(x_ref, d_ref, e_ref, values_ref, rows, inside, *, n, block_n):
    """As the Triton port's `_row_residuals`: ||T x_r - value_r x_r|| for r in rows."""
    cols = jnp.arange(block_n)
    valid = cols < n
    mask = inside[:, None] & valid[None, :]
    here = masked_load(x_ref.at[rows[:, None], cols[None, :]], mask)
    before = masked_load(x_ref.at[rows[:, None], cols[None, :] - 1], mask & (cols[None, :] > 0))
    after = masked_load(x_ref.at[rows[:, None], cols[None, :] + 1], mask & (cols[None, :] < n - 1))
    diagonal = masked_load(d_ref.at[cols], valid)
    upper = masked_load(e_ref.at[cols], cols < n - 1)
    lower = masked_load(e_ref.at[cols - 1], valid & (cols > 0))
    value = masked_load(values_ref.at[rows], inside)
    r = (diagonal[None, :] - value[:, None]) * here + lower[None, :] * before + upper[None, :] * after
    return jnp.sqrt(jnp.sum(r * r, axis=1))


def _repair_kernel(d_ref, e_ref, values_ref, norm_ref, _, x_ref, residual_ref, *, n, block_n, interpret):
    """As the Triton port's `_repair_kernel`: program b replaces each vector whose residual exceeds
    `INVERSE_ITERATION.repair_residual` eps ||T|| by its part orthogonal to every sound vector (classical
    Gram-Schmidt over panels of `GRAM_SCHMIDT.panel` vectors, twice), normalised; residuals go to residual_ref (a
    repaired vector's after repair). x (the input, aliased) is read and written through the output ref."""
    cols = jnp.arange(block_n)
    size = GRAM_SCHMIDT.panel
    local = jnp.arange(size)
    valid = cols < n
    bound = INVERSE_ITERATION.repair_residual * EPS * norm_ref[...]
    residuals = functools.partial(_row_residuals, x_ref, d_ref, e_ref, values_ref, n=n, block_n=block_n)

    def check(panel, unsound):
        rows = panel * size + local
        inside = rows < n
        r = residuals(rows, inside)
        pltriton.store(residual_ref.at[rows], r, mask=inside)
        return unsound + jnp.sum((inside & (r > bound)).astype(jnp.int32))

    def repair(j):
        def project(panel, vector):
            rows = panel * size + local
            inside = rows < n
            sound = inside & (rows != j) & (masked_load(residual_ref.at[rows], inside) <= bound)
            block = masked_load(x_ref.at[rows[:, None], cols[None, :]], sound[:, None] & valid[None, :])
            return vector - jnp.sum(jnp.sum(block * vector[None, :], axis=1)[:, None] * block, axis=0)

        vector = masked_load(x_ref.at[j, window(0, block_n)], valid)
        for _ in range(2):
            vector = jax.lax.fori_loop(0, pl.cdiv(n, size), project, vector)
        vector /= jnp.maximum(jnp.sqrt(jnp.sum(vector * vector)), 1e-30)
        pltriton.store(x_ref.at[j, window(0, block_n)], vector, mask=valid)
        barrier(interpret)
        rows = j + local
        pltriton.store(residual_ref.at[rows], residuals(rows, local == 0), mask=local == 0)
        barrier(interpret)

    def each_vector(j, carry):
        pl.when(residual_ref[j] > bound)(lambda: repair(j))
        return carry

    unsound = jax.lax.fori_loop(0, pl.cdiv(n, size), check, jnp.int32(0))

    @pl.when(unsound > 0)
    def _():
        barrier(interpret)
        jax.lax.fori_loop(0, n, each_vector, 0)


def vectors(d, e, values, norm, *, interpret):
    """T's orthonormal eigenvectors as the rows of z [batch, n, n], in the order of `values`. Inverse iteration
    works on their transpose (XLA transposes between the two, the one to z dividing each vector by its length)."""
    batch, n = d.shape
    vector, scalar, matrix, factors = per_matrix(n), per_matrix(), per_matrix(n, n), per_matrix(2, n, n)
    z = scratch = None
    rounds = INVERSE_ITERATION.rounds
    for step in range(rounds):
        carried = () if step == 0 else (jnp.swapaxes(z, 1, 2), scratch)
        columns, scratch, lengths = pl.pallas_call(
            functools.partial(_inverse_iteration_kernel, n=n, first=step == 0),
            out_shape=(f32((batch, n, n)), f32((batch, 2, n, n)), f32((batch, n))),
            grid=(batch, pl.cdiv(n, INVERSE_ITERATION.lanes)),
            in_specs=[vector, vector, vector, scalar] + ([matrix, factors] if carried else []),
            out_specs=(matrix, factors, vector), input_output_aliases={4: 0, 5: 1} if carried else {},
            compiler_params=pltriton.CompilerParams(num_warps=1), interpret=interpret,
            name="eigh_inverse_iteration",
        )(d, e, values, norm, *carried)
        gap = INVERSE_ITERATION.cluster_gap if step == rounds - 1 else INVERSE_ITERATION.early_cluster_gap
        unit = jnp.swapaxes(columns, 1, 2) / jnp.where(lengths > 0, lengths, 1.0)[:, :, None]  # one XLA transpose
        z = gram_schmidt.orthonormalize(unit, values, norm, gap, interpret=interpret)
    return repair(z, d, e, values, norm, interpret=interpret)[0]


def repair(z, d, e, values, norm, *, interpret):
    """(z with every vector whose residual exceeds `INVERSE_ITERATION.repair_residual` eps ||T|| made orthogonal to
    the sound ones, the residuals [batch, n])."""
    batch, n, _ = z.shape
    block_n = pl.next_power_of_2(n)
    vector = per_matrix(n)
    return pl.pallas_call(
        functools.partial(_repair_kernel, n=n, block_n=block_n, interpret=interpret),
        out_shape=(f32((batch, n, n)), f32((batch, n))), grid=(batch,),
        in_specs=[vector, vector, vector, per_matrix(), per_matrix(n, n)], out_specs=(per_matrix(n, n), vector),
        input_output_aliases={4: 0},
        compiler_params=pltriton.CompilerParams(num_warps=GRAM_SCHMIDT.vector_panel_warps(block_n)),
        interpret=interpret, name="eigh_repair",
    )(d, e, values, norm, z)
