"""Batched symmetric eigendecomposition in Pallas (Triton lowering): the algorithms of triton_kernels/eigh.py.

n <= 64: one program per matrix (padded to a power of two N >= 16) holds A and the
accumulated rotations V. A sweep is the N - 1 rounds m = 1 .. N - 1 of the XOR pairing (i meets
i ^ m); each round's N/2 disjoint plane rotations form one orthogonal J, applied elementwise as
in the Triton port: (A J)[:, i] = c_i A[:, i] - s_i A[:, i ^ m], likewise for the rows and for V.
The Triton port exchanges rows or columns i and i ^ m with a register gather;
Pallas's Triton lowering has no gather of values, but it loads from a ref at gathered indices: each
round writes A and V to a buffer in global memory and, after one barrier, reads back A's partner
columns, rows and both, and V's partner columns, so that J^T A J is formed elementwise in one step
(the Triton port forms A J, then J^T (A J)). This made the 20x32 kernel faster, though still behind the Triton
port's (results/h200/NOTES.md); the exchange it replaced was a float32
product with the 0/1 permutation, and three bfloat16 products or halves exchanged by reshapes once per
set bit of m were slower still (all at the sweep cap then). The matrix is scaled by 1/max|A| and symmetrised
first; both members of a pair use the same averaged A[p, q], and each round sets its pairs' A[p, q] to zero (the
Triton port's docstring says why). Sweeps stop once every off-diagonal element is below eps. Sorting the
eigenvalues is glue outside the kernel.

n > 64: the Triton port's pipeline, kernel for kernel: Householder tridiagonalisation
T = H^T (A / max|A|) H (`_symmetrize_kernel`, then, the trailing matrix in global memory, either
`_tridiagonalize_blocked_kernel`, one launch of one program per matrix in panels, or, by
ports.eigh.one_launch, the same panels over launches: a column and a product launch per column,
the product with several programs per matrix, and a closing update launch per panel),
bisection on Sturm counts (one lane per eigenvalue), INVERSE_ITERATIONS rounds of inverse iteration
(group shifts, splitting at negligible off-diagonals) each followed by the clusters' panel
Gram-Schmidt (EARLY_CLUSTER_GAP, CLUSTER_GAP in the last round; from n = 512 its projections are
tensor-core products shared among programs a matrix), the repair of vectors whose
residual is above REPAIR_RESIDUAL eps ||T||, and the back-transformation Q = H Z. Its scratch
buffers are pallas_call outputs, carried between launches through input_output_aliases. The
differences: a pallas_call's grid is static, so the launches per column are a jax.lax.fori_loop
over the column (an operand of the kernels) whose product and update launches keep column 0's
number of programs throughout, programs past the trailing matrix's last tile idling (the Triton
port sizes each launch to its column; unrolling n launches in Python would compile for too long at n = 2048); the
barriers (pltriton.debug_barrier) are left out under the interpreter, which has no lowering for
them and runs each program in order; and the loads of what a program wrote itself carry no ".cg"
cache modifier (this JAX's Triton lowering rejects every cache modifier). The input's checks come, as in the
Triton port, from the kernels that read A first (`_checked`); the call reads their bounds after its jitted call.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from ports.eigh import (BACK_TRANSFORM_CHUNK, BACK_TRANSFORM_PRECISION, BACK_TRANSFORM_REFLECTORS,
                        BACK_TRANSFORM_VECTORS, BACK_TRANSFORM_WARPS, BISECTION_ITERATIONS, CLUSTER_GAP,
                        COLUMN_KERNEL_WARPS, EARLY_CLUSTER_GAP, GRAM_SCHMIDT_CHUNK, GRAM_SCHMIDT_PRECISION,
                        GRAM_SCHMIDT_WARPS, GROUP_GAP, INVERSE_ITERATIONS, JACOBI_MAX_N,
                        JACOBI_MAX_SWEEPS, LANES, OVER_LAUNCHES_PRODUCT_BLOCKS, OVER_LAUNCHES_PRODUCT_ROWS,
                        OVER_LAUNCHES_PRODUCT_WARPS, PANEL, PANEL_CHUNK, PANEL_UPDATE_COLS, PIVOT_FLOOR,
                        REPAIR_RESIDUAL, SYMMETRIC_PRODUCT_COLS, SYMMETRIC_PRODUCT_WARP_ROWS, TRIDIAGONAL_COLS,
                        TRIDIAGONAL_PANEL, TRIDIAGONAL_ROWS, SECOND_PASS_BELOW, SPARSE_GROUP_GAP, check_offsets,
                        check_shape, check_values, column_panel_chunk, gram_schmidt_finish_warps, gram_schmidt_shares,
                        gram_schmidt_unrolled, jacobi_size, one_launch, product_programs, row_blocks, shares_the_sms,
                        split_gram_schmidt, tridiagonal_tile, vector_panel_warps)

JACOBI_EXCHANGE_WARPS = 8  # the on-chip Jacobi, whose rounds wait on the exchange through memory (the fastest of 1
# to 8 warps at 20x32; results/h200/NOTES.md)
JACOBI_EXCHANGE_SLOTS = 4  # A and V, each in two slots used in turn: 4 N x N arrays a matrix in the buffer
GRAM_SCHMIDT_PROJECT_STAGES = 1  # software-pipelining stages (Pallas's Triton num_stages) of the split Gram-Schmidt's
# project kernel and of the back-transformation's products: XLA's Triton slows the project kernel's two loops when it
BACK_TRANSFORM_STAGES = 2  # pipelines them over the default 3 stages, and the back-transformation runs fastest on 2.
# The Triton port's kernels, compiled by Triton itself, ran alike at 1, 2 and 3 stages and keep Triton's default 3
# (results/h200/NOTES.md)
EPS = float(jnp.finfo(jnp.float32).eps)
DOT_ALGORITHMS = {"tf32x3": jax.lax.DotAlgorithmPreset.TF32_TF32_F32_X3,  # Triton's input_precision names
                  "ieee": jax.lax.DotAlgorithmPreset.F32_F32_F32}


def _dot_ieee(a, b):
    """a b in float32 arithmetic throughout (Triton's input_precision="ieee": no TF32)."""
    return jnp.dot(a, b, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)


def _barrier(interpret):
    """tl.debug_barrier() between a program's global-memory writes and its reads of them. The
    interpreter runs each program's operations in order, and debug_barrier has no CPU lowering."""
    if not interpret:
        pltriton.debug_barrier()


def _load(ref, mask, other=0.0):
    # No cache modifier: the Triton port loads what the program itself wrote with ".cg", but this
    # JAX's Triton lowering fails on every cache_modifier (its table is keyed "cg", not ".cg"); the
    # barrier before each such load is what makes the writes visible.
    return pltriton.load(ref, mask=mask, other=other)


def _checked(tile, transposed, bounds_ref, first):
    """As the Triton port's `_checked`: the tile of A and the same of A^T with the entries that are not finite
    zeroed, and the tile's max |A|; of the tile as read, the count of such entries, max |A| and max |A - A^T| in
    bounds[first:first + 3]."""
    finite = jnp.abs(tile) < jnp.inf  # NaN fails the comparison too
    bounds_ref[first] = jnp.sum(jnp.sum(jnp.where(finite, 0.0, 1.0), axis=1), axis=0)
    tile = jnp.where(finite, tile, 0.0)
    transposed = jnp.where(jnp.abs(transposed) < jnp.inf, transposed, 0.0)
    largest = jnp.max(jnp.max(jnp.abs(tile), axis=1), axis=0)  # one axis at a time, as Triton reduces
    bounds_ref[first + 1] = largest
    bounds_ref[first + 2] = jnp.max(jnp.max(jnp.abs(tile - transposed), axis=1), axis=0)
    return tile, transposed, largest


def _jacobi_kernel(a_ref, q_ref, l_ref, sweeps_ref, bounds_ref, exchange_ref, *, size, max_sweeps, tolerance,
                   interpret):
    """Diagonalises one size x size matrix (the sweeps it took in sweeps_ref, its checks' bounds in bounds_ref).
    Each round writes A and V to exchange_ref (two slots, used in turn from round to round, across sweeps too, so
    that a round's writes never race the previous round's reads) and reads back the partners' rows and columns at
    gathered indices: one barrier a round."""
    rows = jnp.arange(size)
    a = a_ref[...]
    a, transposed, scale = _checked(a, a.T, bounds_ref, 0)
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
        _barrier(interpret)
        partner = rows ^ m

        def gathered(slot, at_rows, at_cols):
            return _load(exchange_ref.at[slot, at_rows, at_cols], None, None)

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


def _on_chip(a, max_sweeps=JACOBI_MAX_SWEEPS, *, interpret):
    """(V, diagonal, the sweeps taken [batch, 1] int32, the checks' bounds [batch, 3]) of the on-chip Jacobi,
    unsorted, for each matrix of a [batch, N, N]."""
    count, size, _ = a.shape
    vectors, values, sweeps, bounds, _ = pl.pallas_call(
        functools.partial(_jacobi_kernel, size=size, max_sweeps=max_sweeps, tolerance=EPS, interpret=interpret),
        out_shape=(_f32((count, size, size)), _f32((count, size)), jax.ShapeDtypeStruct((count, 1), jnp.int32),
                   _f32((count, 3)), _f32((count, JACOBI_EXCHANGE_SLOTS, size, size))),  # the exchange's buffer
        grid=(count,), in_specs=[_per_matrix(size, size)],
        out_specs=(_per_matrix(size, size), _per_matrix(size), _per_matrix(1), _per_matrix(3),
                   _per_matrix(JACOBI_EXCHANGE_SLOTS, size, size)),
        compiler_params=pltriton.CompilerParams(num_warps=JACOBI_EXCHANGE_WARPS, num_stages=1),
        interpret=interpret, name="jacobi_eigh",
    )(a)
    return vectors, values, sweeps, bounds


def _symmetrize_kernel(a_ref, w_ref, partial_ref, bounds_ref, *, n, block_n, rows_per_tile):
    """As the Triton port's `_symmetrize_kernel`: program (b, block), rows [block R, (block + 1) R)
    (R = rows_per_tile) of w = (A + A^T) / 2, A's entries that are not finite read as zero, their max |A| in
    partial[b, block] (the tridiagonalisation's first panel scales by the largest) and their checks' bounds in
    bounds[b, 3 block:3 block + 3]."""
    block = pl.program_id(1)
    rows, cols = block * rows_per_tile + jnp.arange(rows_per_tile), jnp.arange(block_n)
    mask = (rows < n)[:, None] & (cols < n)[None, :]
    rows_block = (pl.ds(block * rows_per_tile, rows_per_tile), pl.ds(0, block_n))
    tile, transposed, largest = _checked(_load(a_ref.at[rows_block], mask),
                                         _load(a_ref.at[cols[None, :], rows[:, None]], mask), bounds_ref, 3 * block)
    pltriton.store(w_ref.at[rows_block], 0.5 * tile + 0.5 * transposed, mask=mask)
    partial_ref[block] = largest


def _sums(quantities, axis):
    """The sums of two or four equally shaped arrays over `axis` (three: add a zero array) as one reduction (one
    round through shared memory, not one a sum): joined on new trailing axes, summed, split again. Pallas's Triton
    lowering has no reduction of several operands (the Triton port's `tl.reduce` of a tuple); its stack and unstack
    of two on the last axis are Triton's join and split."""
    if quantities[0].ndim == 1:  # through rows of one: a split down to no axes lowers to a rank-0 tensor
        return tuple(jnp.sum(total) for total in _sums(tuple(q[None, :] for q in quantities), 1))
    if len(quantities) == 4:
        pairs = jnp.sum(jnp.stack([jnp.stack(quantities[:2], axis=-1), jnp.stack(quantities[2:], axis=-1)], axis=-1),
                        axis=axis)
        first, second = jnp.unstack(pairs, axis=-1)
        return *jnp.unstack(first, axis=-1), *jnp.unstack(second, axis=-1)
    return jnp.unstack(jnp.sum(jnp.stack(quantities, axis=-1), axis=axis), axis=-1)


def _householder(row, k, cols):
    """As the Triton port's `_householder`: (v, tau, d_k, e_k) of row k, its three sums one reduction."""
    alpha, sigma, diagonal, _ = _sums((jnp.where(cols == k + 1, row, 0.0), jnp.where(cols > k + 1, row * row, 0.0),
                                      jnp.where(cols == k, row, 0.0), jnp.zeros_like(row)), 0)
    norm = jnp.sqrt(alpha * alpha + sigma)
    beta = jnp.where(alpha >= 0, -norm, norm)
    trivial = sigma == 0.0  # nothing to annihilate (and the last two steps)
    inverse = jnp.where(trivial, 0.0, 1.0 / jnp.where(trivial, 1.0, alpha - beta))
    v = jnp.where(cols == k + 1, 1.0, jnp.where(cols > k + 1, row * inverse, 0.0))
    tau = jnp.where(trivial, 0.0, (beta - alpha) / jnp.where(trivial, 1.0, beta))
    return v, tau, diagonal, jnp.where(trivial, alpha, beta)  # e[n - 1] = 0


def _scale(partial_ref, partials, needed):
    """As the Triton port's `_scale`: max|A| from the symmetrisation's per-program maxima (1 for a
    zero matrix); read only where `needed`."""
    index = jnp.arange(pl.next_power_of_2(partials))
    biggest = jnp.max(_load(partial_ref.at[pl.ds(0, index.size)], needed & (index < partials)))
    return jnp.where(biggest > 0, biggest, 1.0)


def _panel_tiles(panel_ref, used, first, count, c0, width, *, n, nb):
    """As the Triton port's `_panel_tiles`: members first .. first + count - 1 of the panel's V and W
    (panel rows 0 .. nb - 1 and nb .. 2 nb - 1) before member `used`, columns c0 .. c0 + width - 1:
    count x width tiles, zero beyond."""
    rows, cols = first + jnp.arange(count), c0 + jnp.arange(width)
    return tuple(_load(panel_ref.at[pl.ds(part * nb + first, count), pl.ds(c0, width)],
                       (rows < used)[:, None] & (cols < n)[None, :]) for part in (0, 1))


def _panel_reflector(w_ref, d_ref, e_ref, tau_ref, panel_ref, j, i, factor, correction, *, n, block_n):
    """As the Triton port's `_panel_reflector`: row j (read as column j on and below the diagonal) up
    to date with the panel's earlier reflectors (less `correction`, from `_panel_w`), v_j into V's row
    i, d_j, e_j, tau_j stored: (v_j, tau_j)."""
    cols = jnp.arange(block_n)
    row = _load(w_ref.at[pl.ds(0, block_n), j], (cols >= j) & (cols < n)) * factor - correction
    v, tau, d_ref[j], e_ref[j] = _householder(row, j, cols)
    tau_ref[j] = tau
    panel_ref[i, :] = v
    return v, tau


def _panel_w(panel_ref, p, v, tau, below, j, i, *, n, block_n, nb, chunk):
    """As the Triton port's `_panel_w`: W's row for column j = member i from p = A v, and row j + 1's
    correction from the panel's members up to i, V and W read chunk members at a time: (w, correction)."""
    cols = jnp.arange(block_n)
    next_row = cols == j + 1

    def members(c, sums):
        projection, correction = sums
        v_panel, w_panel = _panel_tiles(panel_ref, i, c * chunk, chunk, 0, block_n, n=n, nb=nb)
        w_v, v_v, v_next, w_next = _sums((w_panel * v[None, :], v_panel * v[None, :],
                                          jnp.where(next_row[None, :], v_panel, 0.0),
                                          jnp.where(next_row[None, :], w_panel, 0.0)), 1)
        return (projection + jnp.sum(w_v[:, None] * v_panel + v_v[:, None] * w_panel, axis=0),
                correction + jnp.sum(v_next[:, None] * w_panel + w_next[:, None] * v_panel, axis=0))

    zeros = jnp.zeros((block_n,), jnp.float32)
    projection, correction = jax.lax.fori_loop(0, pl.cdiv(i, chunk), members, (zeros, zeros))
    p = jnp.where(below, tau * (p - projection), 0.0)
    p_v, p_next = _sums((p * v, jnp.where(next_row, p, 0.0)), 0)
    half = 0.5 * tau * p_v
    w_row = p - half * v
    return w_row, correction + w_row + (p_next - half) * v  # v[j + 1] = 1: w_row's own and its entry j + 1 terms


def _lower_blocks(rows, cols, j, n):
    """As the Triton port's `_lower_blocks`: (lower, what a row tile of p = A v_j reads, whole 4-column
    blocks from the one holding j + 1 to the one holding the row's diagonal; mirrored, the blocks left of
    the diagonal's, which also give the column sums)."""
    four = jnp.int32(4)  # lax.div, not //: jnp's floor division of a loaded index may fail as its % does
    lower = (cols >= jax.lax.div(j + 1, four) * four)[None, :] & (cols < n)[None, :] & _lower_block_triangle(rows, cols)
    return lower, jax.lax.div(cols, four)[None, :] < jax.lax.div(rows, four)[:, None]


def _lower_tile(w_ref, r0, rows, c0, cols, j, n, factor):
    """As the Triton port's `_lower_tile`, rows = r0 + arange and cols = c0 + arange: (factor times the tile, the
    mask of its mirrored part)."""
    lower, mirrored = _lower_blocks(rows, cols, j, n)
    tile = _load(w_ref.at[pl.ds(r0, rows.shape[0]), pl.ds(c0, cols.shape[0])], (rows < n)[:, None] & lower)
    return tile * factor, mirrored


def _lower_block_triangle(rows, cols):
    """As the Triton port's `_lower_block_triangle`: the blocks of 4 columns up to each row's diagonal block."""
    four = jnp.int32(4)
    return jax.lax.div(cols, four)[None, :] <= jax.lax.div(rows, four)[:, None]


def _symmetric_product(w_ref, panel_ref, products_ref, i, j, factor, below, *, n, block_n, nb, rows, cols,
                       interpret):
    """As the Triton port's `_symmetric_product`: p = factor A v_i (panel's row i, zero up to j) on the rows
    below j from the lower triangle, in blocks of `cols` columns from the one holding j + 1, each swept `rows`
    rows at a time from its diagonal down; a tile's rows' sums go to products_ref[block], its mirrored part to
    a rows x cols accumulator of the block's column sums, stored in panel's row 2 nb."""
    local = jnp.arange(rows)
    first_block = jax.lax.div(j + 1, jnp.int32(cols))

    @pl.loop(0, pl.cdiv(n, cols) - first_block)
    def _(b):
        c0 = (first_block + b) * cols
        block_cols = c0 + jnp.arange(cols)
        v_cols = _load(panel_ref.at[i, pl.ds(c0, cols)], block_cols < n)
        top = jnp.maximum(j + 1, c0)

        def row_tile(t, column_sums):
            r0 = top + t * rows
            tile_rows = r0 + local
            inside = tile_rows < n
            tile, mirrored = _lower_tile(w_ref, r0, tile_rows, c0, block_cols, j, n, factor)
            pltriton.store(products_ref.at[first_block + b, pl.ds(r0, rows)], jnp.sum(tile * v_cols[None, :], axis=1),
                           mask=inside)
            v_rows = _load(panel_ref.at[i, pl.ds(r0, rows)], inside)
            return column_sums + jnp.where(mirrored, tile, 0.0) * v_rows[:, None]

        column_sums = jax.lax.fori_loop(0, pl.cdiv(n - top, rows), row_tile, jnp.zeros((rows, cols), jnp.float32))
        pltriton.store(panel_ref.at[jnp.int32(2 * nb), pl.ds(c0, cols)], jnp.sum(column_sums, axis=0),
                       mask=block_cols < n)

    _barrier(interpret)
    all_cols = jnp.arange(block_n)
    blocks = jnp.arange(block_n // cols)[:, None]
    written = (blocks >= first_block) & (blocks <= jax.lax.div(all_cols, jnp.int32(cols))[None, :]) & below[None, :]
    parts = _load(products_ref.at[pl.ds(0, block_n // cols), pl.ds(0, block_n)], written)
    return jnp.sum(parts, axis=0) + _load(panel_ref.at[jnp.int32(2 * nb), pl.ds(0, block_n)], below)


def _row_sweep_product(w_ref, panel_ref, v, i, j, factor, below, *, n, block_n, nb, rows, interpret):
    """p = factor A v (v zero up to j) on the rows below j from the lower triangle, `rows` whole padded rows at a
    time: each row tile stores its rows' sums in panel's row 2 nb and adds its mirrored part to every column's sum.
    Where many matrices share the SMs (2 warps), XLA's Triton ran this faster than `_symmetric_product`'s column
    blocks, which the Triton port uses throughout (results/h200/NOTES.md)."""
    cols = jnp.arange(block_n)
    local = jnp.arange(rows)

    def row_tile(t, above_diagonal):
        r0 = j + 1 + t * rows
        tile_rows = r0 + local
        inside = tile_rows < n
        tile, mirrored = _lower_tile(w_ref, r0, tile_rows, 0, cols, j, n, factor)
        pltriton.store(panel_ref.at[jnp.int32(2 * nb), pl.ds(r0, rows)], jnp.sum(tile * v[None, :], axis=1),
                       mask=inside)
        v_rows = _load(panel_ref.at[i, pl.ds(r0, rows)], inside)
        return above_diagonal + jnp.sum(jnp.where(mirrored, tile, 0.0) * v_rows[:, None], axis=0)

    above_diagonal = jax.lax.fori_loop(0, pl.cdiv(n - j - 1, rows), row_tile, jnp.zeros((block_n,), jnp.float32))
    _barrier(interpret)
    return _load(panel_ref.at[jnp.int32(2 * nb), pl.ds(0, block_n)], below) + above_diagonal


def _tridiagonalize_blocked_kernel(partial_ref, _, w_ref, d_ref, e_ref, tau_ref, scale_ref, panel_ref, products_ref, *,
                                   n, block_n, partials, rows_per_tile, cols_per_tile, product_rows, product_cols, nb,
                                   chunk, interpret):
    """As the Triton port's `_tridiagonalize_blocked_kernel`: program b reduces its matrix in panels
    of nb columns (LAPACK's dlatrd): column j is brought up to date with the panel's earlier
    reflectors, gives v_j, and w_j = tau_j (A v_j - V W^T v_j - W V^T v_j) less half tau_j
    (w_j . v_j) v_j, A as at the panel's start (one read of the trailing matrix's lower triangle a
    column: `_symmetric_product`, its parts in products_ref, or where product_cols is None `_row_sweep_product`);
    the panel's end applies A -= V W^T + W V^T below it (one read and write a panel). panel's rows 0 .. nb - 1
    hold V, nb .. 2 nb - 1 W, and row 2 nb the product's column sums (the row sweep's row sums). w (the input,
    aliased) is read and written through the output ref."""
    cols = jnp.arange(block_n)
    local = jnp.arange(rows_per_tile)
    in_cols = cols < n
    scale = _scale(partial_ref, partials, True)
    scale_ref[...] = scale
    sizes = dict(n=n, block_n=block_n, nb=nb)
    members = jnp.arange(nb)

    @pl.loop(0, pl.cdiv(n, nb))
    def _(panel):
        factor = jnp.where(panel == 0, 1.0 / scale, 1.0)
        first = panel * nb
        width = jnp.minimum(nb, n - first)

        def column(i, correction):
            j = first + i
            v, tau = _panel_reflector(w_ref, d_ref, e_ref, tau_ref, panel_ref, j, i, factor, correction, n=n,
                                      block_n=block_n)
            below = in_cols & (cols > j)
            _barrier(interpret)  # v, just stored as V's row i, is read back in blocks
            if product_cols is None:
                p = _row_sweep_product(w_ref, panel_ref, v, i, j, factor, below, rows=rows_per_tile,
                                       interpret=interpret, **sizes)
            else:
                p = _symmetric_product(w_ref, panel_ref, products_ref, i, j, factor, below, rows=product_rows,
                                       cols=product_cols, interpret=interpret, **sizes)
            panel_ref[nb + i, :], correction = _panel_w(panel_ref, p, v, tau, below, j, i, chunk=chunk, **sizes)
            pltriton.store(w_ref.at[j, pl.ds(0, block_n)], v, mask=below)  # for the back-transformation
            _barrier(interpret)
            return correction

        jax.lax.fori_loop(0, width, column, jnp.zeros((block_n,), jnp.float32))  # a panel's first row is up to date

        last = first + width  # the trailing matrix below the panel: A -= V W^T + W V^T on its lower triangle,
        # cols_per_tile columns at a time (V's and W's nb x cols_per_tile tiles held), two products a tile
        first_block = jax.lax.div(last, jnp.int32(cols_per_tile))

        @pl.loop(0, pl.cdiv(n, cols_per_tile) - first_block)
        def _(b):
            c0 = (first_block + b) * cols_per_tile
            chunk_cols = c0 + jnp.arange(cols_per_tile)
            right = (chunk_cols >= last) & (chunk_cols < n)
            v_panel, w_panel = _panel_tiles(panel_ref, width, 0, nb, c0, cols_per_tile, n=n, nb=nb)
            top = jnp.maximum(last, c0)  # rows above c0 hold nothing of these columns' lower triangle

            @pl.loop(0, pl.cdiv(n - top, rows_per_tile))
            def _(t):
                r0 = top + t * rows_per_tile
                inside = (r0 + local) < n
                mask = inside[:, None] & right[None, :] & _lower_block_triangle(r0 + local, chunk_cols)
                tile_rows = w_ref.at[pl.ds(r0, rows_per_tile), pl.ds(c0, cols_per_tile)]
                present = (members < width)[:, None] & inside[None, :]  # nb x rows: V's and W's columns r0 ...
                v_rows = _load(panel_ref.at[pl.ds(0, nb), pl.ds(r0, rows_per_tile)], present)
                w_rows = _load(panel_ref.at[pl.ds(nb, nb), pl.ds(r0, rows_per_tile)], present)
                update = _dot_ieee(v_rows.T, w_panel) + _dot_ieee(w_rows.T, v_panel)
                pltriton.store(tile_rows, _load(tile_rows, mask) * factor - update, mask=mask)

        _barrier(interpret)


def _column_index(first_ref, offset_ref):
    """The over-launches column j = first + offset: a panel's first column and the panel loop's counter, added
    here, where adding them in XLA cost a kernel a column (results/h200/eigh-kernel-times-pallas-loop-counters.txt)."""
    return first_ref[0] + offset_ref[0]


def _panel_column_kernel(first_ref, offset_ref, partial_ref, sums_ref, *refs, n, block_n, nb, partials, share_rows,
                         finish_only, interpret):
    """As the Triton port's `_panel_column_kernel`: program b finishes W's row for column j - 1 from
    p and the column sums its product's active programs left in sums (those with a row tile below
    column j - 1, OVER_LAUNCHES_PRODUCT_ROWS rows a tile), added share_rows shares at a time, then
    (unless finish_only) forms column j's reflector; column 0 stores the scale max|A|. w, d, e, tau,
    scale and panel are outputs (the inputs after sums_ref aliased to them)."""
    w_ref, d_ref, e_ref, tau_ref, scale_ref, panel_ref = refs[-6:]
    sizes = dict(n=n, block_n=block_n, nb=nb)
    j = _column_index(first_ref, offset_ref)
    cols = jnp.arange(block_n)
    in_cols = cols < n
    # lax.rem, not %: jnp.remainder of a loaded index fails Pallas's Triton lowering (jax 0.10, 0.11)
    i = jax.lax.rem(j - 1, jnp.int32(nb)) + 1 if finish_only else jax.lax.rem(j, jnp.int32(nb))
    scale = jnp.where(j == 0, _scale(partial_ref, partials, j == 0), scale_ref[...])
    pltriton.store(scale_ref, scale, mask=j == 0)
    factor = jnp.where(j < nb, 1.0 / scale, 1.0)

    def finish_w():  # W's row for column j - 1, and row j's correction
        below = in_cols & (cols > j - 1)
        shares = jnp.minimum(sums_ref.shape[0], pl.cdiv(n - j, OVER_LAUNCHES_PRODUCT_ROWS))  # active product programs
        offsets = jnp.arange(share_rows)

        def add_shares(s, column_sums):
            inside = (s * share_rows + offsets) < shares
            return column_sums + _load(sums_ref.at[pl.ds(s * share_rows, share_rows), pl.ds(0, block_n)],
                                       inside[:, None])

        column_sums = jax.lax.fori_loop(0, pl.cdiv(shares, share_rows), add_shares,
                                        jnp.zeros((share_rows, block_n), jnp.float32))
        p = _load(panel_ref.at[jnp.int32(2 * nb), pl.ds(0, block_n)], below) + jnp.sum(column_sums, axis=0)
        v = _load(panel_ref.at[i - 1, pl.ds(0, block_n)], in_cols)
        panel_ref[nb + i - 1, :], correction = _panel_w(panel_ref, p, v, tau_ref[j - 1], below, j - 1, i - 1,
                                                        chunk=column_panel_chunk(block_n), **sizes)
        return correction

    # a panel's first row is up to date
    correction = jax.lax.cond(i > 0, finish_w, lambda: jnp.zeros((block_n,), jnp.float32))
    _barrier(interpret)
    if not finish_only:
        v, _ = _panel_reflector(w_ref, d_ref, e_ref, tau_ref, panel_ref, j, i, factor, correction, n=n,
                                block_n=block_n)
        pltriton.store(w_ref.at[j, pl.ds(0, block_n)], v, mask=in_cols & (cols > j))  # for the back-transformation


def _panel_product_kernel(first_ref, offset_ref, w_ref, scale_ref, _, _sums, panel_ref, sums_ref, *, n, block_n,
                          rows_per_tile, cols_per_tile, nb, interpret):
    """As the Triton port's `_panel_product_kernel`: p = A v_j below row j from the lower triangle,
    programs (b, s) on row tiles s, s + P, ..., each walked in cols_per_tile-column blocks up to its diagonal:
    rows' sums into the panel's row 2 nb, each block's column sums added to program s's share sums[s] (zeroed
    first). The grid is column 0's: later columns leave programs idle, and the column kernel reads only the
    active programs' shares."""
    j = _column_index(first_ref, offset_ref)
    program, programs = pl.program_id(1), pl.num_programs(1)
    local = jnp.arange(rows_per_tile)
    factor = jnp.where(j < nb, 1.0 / scale_ref[...], 1.0)
    member = jax.lax.rem(j, jnp.int32(nb))
    tiles = pl.cdiv(n - j - 1, rows_per_tile)
    first_block = jax.lax.div(j + 1, jnp.int32(cols_per_tile))

    @pl.when(program < tiles)
    def _():
        sums_ref[program, :] = jnp.zeros((block_n,), jnp.float32)
        _barrier(interpret)

        @pl.loop(0, pl.cdiv(tiles - program, programs))
        def _(t):
            r0 = j + 1 + (program + t * programs) * rows_per_tile
            rows = r0 + local
            inside = rows < n
            v_rows = _load(panel_ref.at[member, pl.ds(r0, rows_per_tile)], inside)
            last_block = jax.lax.div(jnp.minimum(r0 + rows_per_tile - 1, n - 1), jnp.int32(cols_per_tile))

            def block(c, row_sums):
                c0 = (first_block + c) * cols_per_tile
                cols = c0 + jnp.arange(cols_per_tile)
                tile, mirrored = _lower_tile(w_ref, r0, rows, c0, cols, j, n, factor)
                v_cols = _load(panel_ref.at[member, pl.ds(c0, cols_per_tile)], (cols > j) & (cols < n))
                share = sums_ref.at[program, pl.ds(c0, cols_per_tile)]
                share[...] = share[...] + jnp.sum(jnp.where(mirrored, tile, 0.0) * v_rows[:, None], axis=0)
                return row_sums + tile * v_cols[None, :]

            row_sums = jax.lax.fori_loop(0, last_block + 1 - first_block, block,
                                         jnp.zeros((rows_per_tile, cols_per_tile), jnp.float32))
            pltriton.store(panel_ref.at[jnp.int32(2 * nb), pl.ds(r0, rows_per_tile)], jnp.sum(row_sums, axis=1),
                           mask=inside)
            _barrier(interpret)


def _panel_update_kernel(last_ref, scale_ref, panel_ref, _, w_ref, *, n, rows_per_tile, cols_per_tile, nb):
    """As the Triton port's `_panel_update_kernel`: A -= V W^T + W V^T on the lower triangle of the
    tile (r, c) of program (b, r, c) below and right of the (full) panel ending at column last; the
    first panel also scales A. The grid is the first panel's: later panels leave the programs beyond
    the trailing matrix idle, and they return at once (running them masked cost much of the call), as do those
    above the diagonal blocks."""
    last = last_ref[0]
    r0 = last + pl.program_id(1) * rows_per_tile
    c0 = last + pl.program_id(2) * cols_per_tile
    rows, cols = r0 + jnp.arange(rows_per_tile), c0 + jnp.arange(cols_per_tile)
    four = jnp.int32(4)

    @pl.when((r0 < n) & (jax.lax.div(c0, four) <= jax.lax.div(r0 + rows_per_tile - 1, four)))
    def _():
        inside = rows < n
        valid = cols < n
        v_rows, w_rows = (_load(panel_ref.at[pl.ds(part * nb, nb), pl.ds(r0, rows_per_tile)], inside[None, :])
                          for part in (0, 1))  # nb x rows
        v_cols, w_cols = (_load(panel_ref.at[pl.ds(part * nb, nb), pl.ds(c0, cols_per_tile)], valid[None, :])
                          for part in (0, 1))  # nb x cols: a panel closed here is full
        tile_ref = w_ref.at[pl.ds(r0, rows_per_tile), pl.ds(c0, cols_per_tile)]
        mask = inside[:, None] & valid[None, :] & _lower_block_triangle(rows, cols)
        factor = jnp.where(last <= nb, 1.0 / scale_ref[...], 1.0)
        update = _dot_ieee(v_rows.T, w_cols) + _dot_ieee(w_rows.T, v_cols)
        pltriton.store(tile_ref, _load(tile_ref, mask) * factor - update, mask=mask)


def _reciprocal(x, *, interpret):
    """As the Triton port's `_reciprocal`: on the GPU PTX's approximate reciprocal (inline assembly, which
    interpret mode cannot run: there it divides), for x in [2^-126, 2^126]."""
    if interpret:
        return 1.0 / x
    reciprocal, = pltriton.elementwise_inline_asm("rcp.approx.ftz.f32 $0, $1;", args=[x], constraints="=r,r",
                                                  pack=1, result_shape_dtypes=[jax.ShapeDtypeStruct(x.shape,
                                                                                                    jnp.float32)])
    return reciprocal


def _sturm_counts(d_ref, e_ref, points, n, *, interpret):
    """As the Triton port's `_sturm_counts`: how many of T's eigenvalues lie below each of `points`."""
    def step(i, carry):
        count, pivot, coupling = carry  # coupling: e[i - 1]^2
        pivot = d_ref[i] - points - coupling * _reciprocal(pivot, interpret=interpret)
        pivot = jnp.where(jnp.abs(pivot) < PIVOT_FLOOR, -PIVOT_FLOOR, pivot)
        off = e_ref[i]
        return count + (pivot < 0).astype(jnp.int32), pivot, off * off

    return jax.lax.fori_loop(0, n, step, (jnp.zeros(points.shape, jnp.int32), jnp.ones_like(points),
                                          jnp.float32(0.0)))[0]


def _multisected(d_ref, e_ref, index, lo, hi, n, *, interpret):
    """As the Triton port's `_multisected`: brackets of the eigenvalues numbered `index` from LANES Sturm counts at
    evenly spaced points inside T's Gershgorin interval [lo, hi], the same points in every program of a matrix."""
    points = lo + (hi - lo) * ((jnp.arange(LANES) + 1).astype(jnp.float32) * (1.0 / (LANES + 1)))
    above = _sturm_counts(d_ref, e_ref, points, n, interpret=interpret)[None, :] > index[:, None]  # [lane, point]
    bracket_lo = jnp.max(jnp.where(above, lo, points[None, :]), axis=1)
    bracket_hi = jnp.min(jnp.where(above, points[None, :], hi), axis=1)
    kept = bracket_lo < bracket_hi  # else counts that rounding put out of order: the whole interval
    return jnp.where(kept, bracket_lo, lo), jnp.where(kept, bracket_hi, hi)


def _bisect_kernel(d_ref, e_ref, scale_ref, values_ref, norm_ref, l_ref, *, n, interpret):
    """As the Triton port's `_bisect_kernel`: program (b, block), lane j finds T_b's j-th smallest eigenvalue from
    Sturm counts inside T's Gershgorin interval, a first pass of `_multisected`, then halvings until every bracket
    is as narrow as BISECTION_ITERATIONS halvings of the interval leave it (or cannot be halved in float32); it
    writes the eigenvalue and L (times A's scale); block 0 writes the Gershgorin bound ||T||."""
    index = pl.program_id(1) * LANES + jnp.arange(LANES)
    valid = index < n

    def gershgorin(i, carry):
        lo, hi, previous = carry
        diagonal = d_ref[i]
        radius = jnp.abs(e_ref[i])
        return jnp.minimum(lo, diagonal - previous - radius), jnp.maximum(hi, diagonal + previous + radius), radius

    lo, hi, _ = jax.lax.fori_loop(0, n, gershgorin, (d_ref[0], d_ref[0], jnp.float32(0.0)))
    norm = jnp.maximum(jnp.maximum(jnp.abs(lo), jnp.abs(hi)), 1.0)  # T / max|A| has norm >= 1 unless A = 0
    limit = (hi - lo) * (0.5 ** BISECTION_ITERATIONS)

    def unfinished(carry):
        halvings, lo_lanes, hi_lanes = carry
        middle = 0.5 * (lo_lanes + hi_lanes)
        open_lanes = valid & (hi_lanes - lo_lanes > limit) & (middle > lo_lanes) & (middle < hi_lanes)
        return (halvings < BISECTION_ITERATIONS) & (jnp.max(open_lanes.astype(jnp.int32)) > 0)

    def halve(carry):
        halvings, lo_lanes, hi_lanes = carry
        middle = 0.5 * (lo_lanes + hi_lanes)
        below = _sturm_counts(d_ref, e_ref, middle, n, interpret=interpret) > index  # the j-th is below the middle
        return halvings + 1, jnp.where(below, lo_lanes, middle), jnp.where(below, middle, hi_lanes)

    brackets = _multisected(d_ref, e_ref, index, lo, hi, n, interpret=interpret)
    _, lo_lanes, hi_lanes = jax.lax.while_loop(unfinished, halve, (jnp.int32(0), *brackets))
    value = 0.5 * (lo_lanes + hi_lanes)
    block = pl.ds(pl.program_id(1) * LANES, LANES)
    pltriton.store(values_ref.at[block], value, mask=valid)
    pltriton.store(l_ref.at[block], value * scale_ref[...], mask=valid)
    pltriton.store(norm_ref, norm, mask=pl.program_id(1) == 0)


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
    below = (lanes > 0) & (value - _load(values_ref.at[lanes - 1], valid & (lanes > 0)) < link)
    above = (lanes < n - 1) & (_load(values_ref.at[lanes + 1], lanes < n - 1) - value < link)
    return valid & (below | above)


def _still_walking(carry):
    return jnp.max(carry[1].astype(jnp.int32)) > 0


def _first_of_run(values_ref, lanes, chained, link):
    """As the Triton port's: the index of the first eigenvalue of each chained lane's run (gaps below link)."""
    def walk(carry):
        first_index, walking = carry
        step = walking & (_load(values_ref.at[first_index], walking)
                          - _load(values_ref.at[first_index - 1], walking) < link)
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
    shifts (one per dense group of eigenvalues within GROUP_GAP eps ||T||, half a gap below its first; in a sparse
    one, one per run within SPARSE_GROUP_GAP eps ||T|| and its own for a lone member),
    splitting and pivot floor, and each vector's length in lengths, for the transpose that normalises it. x and
    scratch are outputs (aliased to the inputs after the first step); the lanes' elements are read from the output
    x, which holds them."""
    x_ref, factors_ref, lengths_ref = refs[-3:]
    lanes = pl.program_id(1) * LANES + jnp.arange(LANES)
    block = pl.ds(pl.program_id(1) * LANES, LANES)
    valid = lanes < n
    norm = norm_ref[...]
    floor = EPS * norm
    gap = GROUP_GAP * EPS * norm
    value = _load(values_ref.at[lanes], valid)
    grouped = _chained(values_ref, value, lanes, valid, n, gap)
    first_index = _first_of_run(values_ref, lanes, grouped, gap)  # the group's first eigenvalue; walk_up: its last

    def walk_up(carry):
        last_index, walking = carry
        step = walking & (_load(values_ref.at[last_index + 1], walking)
                          - _load(values_ref.at[last_index], walking) < gap)
        last_index += step.astype(jnp.int32)
        return last_index, step & (last_index < n - 1)

    last_index, _ = jax.lax.while_loop(_still_walking, walk_up, (lanes, grouped & (lanes < n - 1)))
    low = _load(values_ref.at[first_index], valid)
    run_gap = (SPARSE_GROUP_GAP * EPS) * norm
    dense = _load(values_ref.at[last_index], valid) - low < run_gap * (last_index - first_index).astype(jnp.float32)
    in_run = _chained(values_ref, value, lanes, valid, n, run_gap)
    run_first = _first_of_run(values_ref, lanes, in_run & grouped & ~dense, run_gap)  # only sparse groups walk runs
    run_shift = _load(values_ref.at[run_first], valid) - 0.5 * run_gap
    shift = jnp.where(grouped, jnp.where(dense, low - 0.5 * gap, jnp.where(in_run, run_shift, value)), value)
    zero = jnp.zeros((LANES,), jnp.float32)

    def right_hand_side(i):
        return _start_vector(i, lanes) if first else _load(x_ref.at[i, block], valid)

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
        kept = _load(factors_ref.at[jnp.int32(1), i, block], valid)
        swapped = kept != kept  # NaN: the row was swapped; its pivot (T[i + 1, i]), p_b and p_c are T's
        pivot = _split(e_ref[i], floor)  # not 0 where swapped: it exceeded the row's |head| >= 0
        p_b = jnp.where(swapped, (d_ref[i + 1] - shift) / pivot, kept)
        p_c = jnp.where(swapped, _split(e_ref[i + 1], floor) / pivot, 0.0)
        value, later = _load(factors_ref.at[jnp.int32(0), i, block], valid) - p_b * value - p_c * later, value
        pltriton.store(x_ref.at[i, block], value, mask=valid)
        return value, later, squares + value * value

    _, _, squares = jax.lax.fori_loop(1, n, substitute, (value, zero, value * value))
    pltriton.store(lengths_ref.at[block], jnp.sqrt(squares), mask=valid)


def _panel_needs_work(continued, inside, cluster, first_cluster):
    """As the Triton port's `_panel_needs_work`: whether the panel's first cluster continues from earlier panels or
    two of its members are in one cluster."""
    return continued | (jnp.max(cluster) - first_cluster + 1 < jnp.sum(inside.astype(jnp.int32)))


def _tolerance(values_ref, norm, cluster_gap, n):
    """Gaps up to this chain eigenvalues into one cluster: cluster_gap ||T||_2, at least GROUP_GAP eps ||T||."""
    return jnp.maximum(cluster_gap * jnp.maximum(jnp.abs(values_ref[0]), jnp.abs(values_ref[n - 1])),
                       GROUP_GAP * EPS * norm)  # values ascend


def _panel_clusters(values_ref, panel, start, tolerance, *, n):
    """As the Triton port's `_panel_clusters`: (members, inside, cluster numbers within the panel,
    the first member's cluster, whether it continues from earlier panels, where it starts, where
    the next panel's first cluster starts at the latest)."""
    local = jnp.arange(PANEL)
    members = panel * PANEL + local
    inside = members < n
    gaps = _load(values_ref.at[members], inside) - _load(values_ref.at[members - 1], inside & (members > 0))
    breaks = inside & ((members == 0) | (gaps > tolerance))
    start = jnp.maximum(start, jnp.max(jnp.where(breaks & (local == 0), members, 0)))
    # clusters numbered within the panel: the breaks up to each member (a PANEL x PANEL sum; the
    # Triton port uses tl.cumsum)
    cluster = jnp.sum(jnp.where(local[None, :] <= local[:, None], breaks[None, :], False).astype(jnp.int32), axis=1)
    cluster = jnp.where(inside, cluster, -1)
    first_cluster = jnp.sum(jnp.where(local == 0, cluster, 0))
    next_start = jnp.maximum(start, jnp.max(jnp.where(breaks, members, 0)))
    return members, inside, cluster, first_cluster, panel * PANEL > start, start, next_start


def _panel_rows(x_ref, panel, block_n):
    return x_ref.at[pl.ds(panel * PANEL, PANEL), pl.ds(0, block_n)]


def _load_panel(x_ref, panel, inside, *, n, block_n, normalise):
    """The panel's rows, normalised where `normalise` (a bool, traced or not)."""
    block = _load(_panel_rows(x_ref, panel, block_n), inside[:, None] & (jnp.arange(block_n) < n)[None, :])
    return jnp.where(normalise, block / jnp.maximum(jnp.sqrt(jnp.sum(block * block, axis=1)), 1e-30)[:, None], block)


def _projected_out(block, x_ref, first, end, chosen, *, n, block_n):
    """As the Triton port's `_projected_out`: block with its chosen rows' components along the PANEL vectors from
    first (those before end) taken out, one vector after another (modified Gram-Schmidt, row by row, in a loop)."""
    valid = jnp.arange(block_n) < n

    def project_out(q, block):
        vector = _load(x_ref.at[first + q, pl.ds(0, block_n)], valid & (first + q < end))
        return block - jnp.where(chosen[:, None], jnp.sum(block * vector[None, :], axis=1)[:, None] * vector[None, :],
                                 0.0)

    return jax.lax.fori_loop(0, PANEL, project_out, block)


def _within_clusters(block, cluster, first_cluster, continued, unrolled):
    """As the Triton port's `_within_clusters`: modified Gram-Schmidt of each cluster's members
    within the panel, normalising; a vector alone in its cluster is left as it is. Also each
    vector's norm before its normalisation (1 if untouched; a vector, as a scalar carried through
    lax.cond fails this JAX's Triton lowering). unrolled: the PANEL steps as that many copies of their code, else
    a jax.lax.fori_loop (`ports.eigh.gram_schmidt_unrolled`)."""
    local = jnp.arange(PANEL)

    def within_cluster(i, own):
        def project(carry):
            block, lengths = carry
            row = jnp.sum(jnp.where(local[:, None] == i, block, 0.0), axis=0)
            length = jnp.sqrt(jnp.sum(row * row))
            row /= jnp.maximum(length, 1e-30)
            later = jnp.sum(block * row[None, :], axis=1)
            after = (local > i) & (cluster == own)
            return (jnp.where(local[:, None] == i, row[None, :],
                              jnp.where(after[:, None], block - later[:, None] * row[None, :], block)),
                    jnp.where(local == i, length, lengths))
        return project

    def step(i, carry):
        own = jnp.sum(jnp.where(local == i, cluster, 0))
        partners = jnp.sum(((cluster == own) & (local != i)).astype(jnp.int32))
        return jax.lax.cond((partners > 0) | (continued & (own == first_cluster)), within_cluster(i, own),
                            lambda carry: carry, carry)

    carry = (block, jnp.ones((PANEL,), jnp.float32))
    if not unrolled:
        return jax.lax.fori_loop(0, PANEL, step, carry)
    for i in range(PANEL):
        carry = step(i, carry)
    return carry


def _orthonormalize_kernel(values_ref, norm_ref, _, x_ref, *, n, block_n, cluster_gap, second_pass_below, unrolled,
                           interpret):
    """As the Triton port's `_orthonormalize_kernel`: program b makes its vectors orthonormal within
    clusters (eigenvalues each within cluster_gap ||T||_2 = cluster_gap max |eigenvalue| of the
    previous, and always within GROUP_GAP eps ||T||), block Gram-Schmidt over panels of PANEL
    vectors: the members of the panel's first vector's cluster against that cluster's earlier
    members, row by row, then each cluster's members within the panel, modified Gram-Schmidt, and
    again where the first pass cancelled (a norm below second_pass_below); a panel whose members are
    each alone in their cluster within it, the first not continuing a cluster from earlier panels, is
    left as it is (its vectors come unit from `_vectors`' transpose). x (the input, aliased) is read
    and written through the output ref."""
    tolerance = _tolerance(values_ref, norm_ref[...], cluster_gap, n)
    valid = jnp.arange(block_n) < n

    def panel_step(panel, start):  # the cluster of the panel's first vector starts at `start`
        members, inside, cluster, first_cluster, continued, start, next_start = _panel_clusters(
            values_ref, panel, start, tolerance, n=n)

        def against_earlier(earlier_block, block):
            return _projected_out(block, x_ref, start + earlier_block * PANEL, panel * PANEL, cluster == first_cluster,
                                  n=n, block_n=block_n)

        def gram_schmidt_pass(block):
            # counted from zero: a loop starting at `start` skipped its body on the H200 (Triton 3.6,
            # pipelined loads)
            block = jax.lax.fori_loop(0, pl.cdiv(panel * PANEL - start, PANEL), against_earlier, block)
            return _within_clusters(block, cluster, first_cluster, continued, unrolled)

        def both_passes():
            block, lengths = gram_schmidt_pass(_load_panel(x_ref, panel, inside, n=n, block_n=block_n, normalise=True))
            # the second pass removes what the first's cancellation amplified
            block = jax.lax.cond(jnp.min(lengths) < second_pass_below, lambda b: gram_schmidt_pass(b)[0],
                                 lambda b: b, block)
            pltriton.store(_panel_rows(x_ref, panel, block_n), block, mask=inside[:, None] & valid[None, :])

        jax.lax.cond(_panel_needs_work(continued, inside, cluster, first_cluster), both_passes, lambda: None)
        _barrier(interpret)
        return next_start

    jax.lax.fori_loop(0, pl.cdiv(n, PANEL), panel_step, jnp.int32(0))


def _panel_and_pass(step_ref):
    """(panel, 1 in its first pass and 0 in its second) of the split Gram-Schmidt's step step_ref[0] (panels in
    order, two passes each), by a shift and a mask: the kernels take the loop's counter, where forming the pair in
    XLA cost a kernel a step (results/h200/eigh-kernel-times-pallas-loop-counters.txt)."""
    step = step_ref[0]
    return jax.lax.shift_right_logical(step, 1), 1 - jnp.bitwise_and(step, 1)


def _orthonormalize_project_kernel(step_ref, values_ref, norm_ref, start_ref, again_ref, x_ref, partial_ref, *, n,
                                   cluster_gap, earlier, interpret):
    """As the Triton port's `_orthonormalize_project_kernel`: program (b, s) takes the s-th `earlier` earlier
    members E of the panel's first cluster and writes the panel block P's correction (P E^T) E into
    partial_ref[s], GRAM_SCHMIDT_CHUNK columns a product step, at GRAM_SCHMIDT_PRECISION (the interpreter, which
    has no TF32 preset, runs float32), only where the panel's first cluster continues from earlier panels, the
    share holds members and the pass runs (again_ref), which is where the finish reads it. step_ref: the step
    (`_panel_and_pass`)."""
    (panel, first_pass), share = _panel_and_pass(step_ref), pl.program_id(1)
    tolerance = _tolerance(values_ref, norm_ref[...], cluster_gap, n)
    members, inside, cluster, first_cluster, continued, start, next_start = _panel_clusters(
        values_ref, panel, start_ref[...], tolerance, n=n)
    first, end = start + share * earlier, panel * PANEL
    precision = jax.lax.Precision.HIGHEST if interpret else DOT_ALGORITHMS[GRAM_SCHMIDT_PRECISION]
    chunk = jnp.arange(GRAM_SCHMIDT_CHUNK)
    vectors = first + jnp.arange(earlier)

    def columns_of(c):  # columns c * GRAM_SCHMIDT_CHUNK on
        return c * GRAM_SCHMIDT_CHUNK + chunk

    def rows_at(rows, inside_rows, columns):  # x's rows at the columns, zero outside
        return _load(x_ref.at[rows[:, None], columns[None, :]], inside_rows[:, None] & (columns < n)[None, :])

    @pl.when(continued & (first < end) & ((first_pass != 0) | (again_ref[...] != 0)))
    def _():
        def coefficients_step(c, carry):
            coefficients, squares = carry
            columns = columns_of(c)
            block, earlier_block = rows_at(members, inside, columns), rows_at(vectors, vectors < end, columns)
            product = jnp.dot(block, earlier_block.T, precision=precision, preferred_element_type=jnp.float32)
            return coefficients + product, squares + jnp.sum(block * block, axis=1)

        steps = pl.cdiv(n, GRAM_SCHMIDT_CHUNK)
        coefficients, squares = jax.lax.fori_loop(
            0, steps, coefficients_step, (jnp.zeros((PANEL, earlier), jnp.float32), jnp.zeros((PANEL,), jnp.float32)))
        # the first pass projects the normalised panel (`_load_panel`)
        coefficients = jnp.where(first_pass != 0, coefficients / jnp.maximum(jnp.sqrt(squares), 1e-30)[:, None],
                                 coefficients)

        @pl.loop(0, steps)
        def _(c):
            columns = columns_of(c)
            correction = jnp.dot(coefficients, rows_at(vectors, vectors < end, columns), precision=precision,
                                 preferred_element_type=jnp.float32)
            pltriton.store(partial_ref.at[share, pl.ds(0, PANEL), pl.ds(c * GRAM_SCHMIDT_CHUNK, GRAM_SCHMIDT_CHUNK)],
                           correction, mask=(columns < n)[None, :])


def _orthonormalize_finish_kernel(step_ref, values_ref, norm_ref, partial_ref, _start, _again, _x, start_ref,
                                  again_ref, x_ref, *, n, block_n, cluster_gap, second_pass_below, earlier, unrolled):
    """As the Triton port's `_orthonormalize_finish_kernel`: program b subtracts the summed partial
    corrections from the panel's first-cluster members, orthonormalises each cluster within the
    panel and stores it; the first pass decides whether the second runs (again), the second moves
    start on (start, again and x aliased). A panel whose members are each alone in their cluster
    within it, the first not continuing a cluster from earlier panels, is left as it is (its vectors
    come unit from `_vectors`' transpose)."""
    panel, first_pass = _panel_and_pass(step_ref)
    valid = jnp.arange(block_n) < n
    tolerance = _tolerance(values_ref, norm_ref[...], cluster_gap, n)
    members, inside, cluster, first_cluster, continued, start, next_start = _panel_clusters(
        values_ref, panel, start_ref[...], tolerance, n=n)

    def add_share(share, correction):  # a loop, not unrolled: up to 64 shares at n = 4096
        return correction + _load(partial_ref.at[share, pl.ds(0, PANEL), pl.ds(0, block_n)], valid[None, :])

    def gram_schmidt_pass():
        block = _load_panel(x_ref, panel, inside, n=n, block_n=block_n, normalise=first_pass != 0)
        zero = jnp.zeros((PANEL, block_n), jnp.float32)
        shares = pl.cdiv(panel * PANEL - start, earlier)  # those that hold members
        correction = jax.lax.cond(continued, lambda: jax.lax.fori_loop(0, shares, add_share, zero), lambda: zero)
        block -= jnp.where(continued & (cluster == first_cluster)[:, None], correction, 0.0)
        block, lengths = _within_clusters(block, cluster, first_cluster, continued, unrolled)
        pltriton.store(_panel_rows(x_ref, panel, block_n), block, mask=inside[:, None] & valid[None, :])
        return lengths

    needed = jnp.where(first_pass != 0, _panel_needs_work(continued, inside, cluster, first_cluster),
                       again_ref[...] != 0)
    lengths = jax.lax.cond(needed, gram_schmidt_pass, lambda: jnp.ones((PANEL,), jnp.float32))
    cancelled = jnp.min(lengths) < second_pass_below
    again_ref[...] = jnp.where(first_pass != 0, cancelled.astype(jnp.int32), again_ref[...])
    start_ref[...] = jnp.where(first_pass == 0, next_start, start_ref[...])


def _row_residuals(x_ref, d_ref, e_ref, values_ref, rows, inside, *, n, block_n):
    """As the Triton port's `_row_residuals`: ||T x_r - value_r x_r|| for r in rows."""
    cols = jnp.arange(block_n)
    valid = cols < n
    mask = inside[:, None] & valid[None, :]
    here = _load(x_ref.at[rows[:, None], cols[None, :]], mask)
    before = _load(x_ref.at[rows[:, None], cols[None, :] - 1], mask & (cols[None, :] > 0))
    after = _load(x_ref.at[rows[:, None], cols[None, :] + 1], mask & (cols[None, :] < n - 1))
    diagonal = _load(d_ref.at[cols], valid)
    upper = _load(e_ref.at[cols], cols < n - 1)
    lower = _load(e_ref.at[cols - 1], valid & (cols > 0))
    value = _load(values_ref.at[rows], inside)
    r = (diagonal[None, :] - value[:, None]) * here + lower[None, :] * before + upper[None, :] * after
    return jnp.sqrt(jnp.sum(r * r, axis=1))


def _repair_kernel(d_ref, e_ref, values_ref, norm_ref, _, x_ref, residual_ref, *, n, block_n, interpret):
    """As the Triton port's `_repair_kernel`: program b replaces each vector whose residual exceeds
    REPAIR_RESIDUAL eps ||T|| by its part orthogonal to every sound vector (classical Gram-Schmidt
    over panels of PANEL vectors, twice), normalised; residuals go to residual_ref (a repaired
    vector's after repair). x (the input, aliased) is read and written through the output ref."""
    cols = jnp.arange(block_n)
    local = jnp.arange(PANEL)
    valid = cols < n
    bound = REPAIR_RESIDUAL * EPS * norm_ref[...]
    residuals = functools.partial(_row_residuals, x_ref, d_ref, e_ref, values_ref, n=n, block_n=block_n)

    def check(panel, unsound):
        rows = panel * PANEL + local
        inside = rows < n
        r = residuals(rows, inside)
        pltriton.store(residual_ref.at[rows], r, mask=inside)
        return unsound + jnp.sum((inside & (r > bound)).astype(jnp.int32))

    def repair(j):
        def project(panel, vector):
            rows = panel * PANEL + local
            inside = rows < n
            sound = inside & (rows != j) & (_load(residual_ref.at[rows], inside) <= bound)
            block = _load(x_ref.at[rows[:, None], cols[None, :]], sound[:, None] & valid[None, :])
            return vector - jnp.sum(jnp.sum(block * vector[None, :], axis=1)[:, None] * block, axis=0)

        vector = _load(x_ref.at[j, pl.ds(0, block_n)], valid)
        for _ in range(2):
            vector = jax.lax.fori_loop(0, pl.cdiv(n, PANEL), project, vector)
        vector /= jnp.maximum(jnp.sqrt(jnp.sum(vector * vector)), 1e-30)
        pltriton.store(x_ref.at[j, pl.ds(0, block_n)], vector, mask=valid)
        _barrier(interpret)
        rows = j + local
        pltriton.store(residual_ref.at[rows], residuals(rows, local == 0), mask=local == 0)
        _barrier(interpret)

    def each_vector(j, carry):
        pl.when(residual_ref[j] > bound)(lambda: repair(j))
        return carry

    unsound = jax.lax.fori_loop(0, pl.cdiv(n, PANEL), check, jnp.int32(0))

    @pl.when(unsound > 0)
    def _():
        _barrier(interpret)
        jax.lax.fori_loop(0, n, each_vector, 0)


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
        block = w_ref.at[pl.ds(first, reflectors), pl.ds(c * chunk, chunk)]
        inside = (rows < n)[:, None] & (cols < n)[None, :]
        reflector_chunk = jnp.where(cols[None, :] > rows[:, None], _load(block, inside), 0.0)
        pltriton.store(block, reflector_chunk, mask=inside)
        return gram + _dot_ieee(reflector_chunk, reflector_chunk.T)

    gram = jax.lax.fori_loop((first + 1) // chunk, pl.cdiv(n, chunk), gram_step,
                             jnp.zeros((reflectors, reflectors), jnp.float32))
    taus = _load(tau_ref.at[pl.ds(first, reflectors)], rows < n)

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
    BACK_TRANSFORM_PRECISION (`DOT_ALGORITHMS`; the interpreter, which has no TF32 preset, runs float32)."""
    start_vector = pl.program_id(0) * vectors_per_program
    vectors = start_vector + jnp.arange(vectors_per_program)
    precision = jax.lax.Precision.HIGHEST if interpret else DOT_ALGORITHMS[BACK_TRANSFORM_PRECISION]
    panels = pl.cdiv(n, reflectors)

    def dot(a, b):
        return jnp.dot(a, b, precision=precision, preferred_element_type=jnp.float32)

    def z_block(c):  # Z^T's chunk c: (ref, mask, columns)
        cols = c * chunk + jnp.arange(chunk)
        return (z_ref.at[pl.ds(start_vector, vectors_per_program), pl.ds(c * chunk, chunk)],
                (vectors < n)[:, None] & (cols < n)[None, :], cols)

    def reflector_block(c, first, from_column=0):  # V^T's chunk c for the panel from reflector `first`
        cols, rows = c * chunk + jnp.arange(chunk), first + jnp.arange(reflectors)
        mask = (rows >= 0)[:, None] & (rows < n)[:, None] & (cols < n)[None, :] & (cols >= from_column)[None, :]
        return _load(w_ref.at[pl.ds(first, reflectors), pl.ds(c * chunk, chunk)], mask)

    last = jnp.int32((panels - 1) * reflectors)  # traced: a static start past n would be refused

    def project_last(c, projection):
        block, mask, _ = z_block(c)
        return projection + dot(_load(block, mask), reflector_block(c, last).T)

    def apply_panel(p, projection):
        panel = panels - 1 - p
        first = panel * reflectors
        begin = (first + 1) // chunk * chunk  # the panel's reflectors are zero before column first + 1
        projection = dot(projection, t_ref[panel].T)

        def update(c, following):
            block, mask, cols = z_block(c)
            updated = _load(block, mask) - dot(projection, reflector_block(c, first, begin))

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
        _barrier(interpret)  # the next panel reads what this one wrote
        return following

    projection = jax.lax.fori_loop(((panels - 1) * reflectors + 1) // chunk, pl.cdiv(n, chunk), project_last,
                                   jnp.zeros((vectors_per_program, reflectors), jnp.float32))
    jax.lax.fori_loop(0, panels, apply_panel, projection)


_f32 = functools.partial(jax.ShapeDtypeStruct, dtype=jnp.float32)


def _per_matrix(*shape):
    """Matrix b's block of a [batch, *shape] operand, for a grid (b, ...)."""
    return pl.BlockSpec((None, *shape), lambda b, *_: (b,) + (0,) * len(shape))


LOOP_INDEX = pl.BlockSpec((1,), lambda *_: (0,))  # a (1,) int32 operand every program reads whole (`_loop_index`)


def _loop_index(value):
    """A loop's counter (or any int32 scalar) as a (1,) operand: a reshape, which costs no XLA kernel, where
    arithmetic on it in XLA would cost one a step."""
    return jnp.reshape(jnp.asarray(value, jnp.int32), (1,))


def _reduce(a, single=None, *, interpret):
    """Householder tridiagonalisation of each A / max|A|: (w, d, e, tau, scale, the checks' bounds
    [batch, blocks, 3]), the reflectors in w's rows. single: one launch, one program per matrix, blocked in panels
    of TRIDIAGONAL_PANEL columns (default: ports.eigh.one_launch); otherwise the same panels over launches
    (`_reduce_in_panels`)."""
    batch, n, _ = a.shape
    block_n, rows, blocks = row_blocks(n)
    w, partial, bounds = pl.pallas_call(
        functools.partial(_symmetrize_kernel, n=n, block_n=block_n, rows_per_tile=rows),
        out_shape=(_f32((batch, n, n)), _f32((batch, blocks)), _f32((batch, 3 * blocks))), grid=(batch, blocks),
        in_specs=[_per_matrix(n, n)], out_specs=(_per_matrix(n, n), _per_matrix(blocks), _per_matrix(3 * blocks)),
        compiler_params=pltriton.CompilerParams(num_warps=8), interpret=interpret, name="eigh_symmetrize",
    )(a)
    bounds = bounds.reshape(batch, blocks, 3)
    if not (one_launch(batch, n) if single is None else single):
        return *_reduce_in_panels(w, partial, product_programs(n - 1), interpret=interpret), bounds  # column 0's
    # The column-blocked product where each program has an SM to itself; where programs share them, the row sweep:
    # at 640x512 on 2 warps every column-blocked tile tried ran slower there, though the Triton port's gained
    # (results/h200/NOTES.md).
    product_cols = None if shares_the_sms(batch) else min(block_n, SYMMETRIC_PRODUCT_COLS)
    # w, d, e, tau, scale, panel, products (the column blocks' row sums; one unused row for the row sweep)
    shapes = ((n, n), (n,), (n,), (n,), (), (2 * TRIDIAGONAL_PANEL + 1, block_n),
              (block_n // (product_cols or block_n), block_n))
    tile_rows, warps = tridiagonal_tile(batch)
    return pl.pallas_call(
        functools.partial(_tridiagonalize_blocked_kernel, n=n, block_n=block_n, partials=blocks,
                          rows_per_tile=tile_rows, cols_per_tile=min(block_n, TRIDIAGONAL_COLS),
                          product_rows=SYMMETRIC_PRODUCT_WARP_ROWS * warps, product_cols=product_cols,
                          nb=TRIDIAGONAL_PANEL, chunk=PANEL_CHUNK, interpret=interpret),
        out_shape=tuple(_f32((batch, *shape)) for shape in shapes), grid=(batch,),
        in_specs=[_per_matrix(blocks), _per_matrix(n, n)], out_specs=tuple(_per_matrix(*shape) for shape in shapes),
        input_output_aliases={1: 0}, compiler_params=pltriton.CompilerParams(num_warps=warps),
        interpret=interpret, name="eigh_tridiagonalize_blocked",
    )(partial, w)[:5] + (bounds,)


def _reduce_in_panels(w, partial, programs, *, interpret):
    """As the Triton port's multi-launch blocked path of `_reduce`, in jax.lax.fori_loops over the panels
    and their columns: (w, d, e, tau, scale). programs: the product's programs per matrix (column 0's)."""
    batch, n, _ = w.shape
    block_n, rows, blocks = row_blocks(n)  # the symmetrize kernel's, whose partial sums the column kernel reads
    nb = TRIDIAGONAL_PANEL
    shapes = ((n, n), (n,), (n,), (n,), (), (2 * nb + 1, block_n))  # w, d, e, tau, scale, panel
    matrix, scalar, panel = _per_matrix(n, n), _per_matrix(), _per_matrix(2 * nb + 1, block_n)

    sums = _per_matrix(programs, block_n)  # each product program's column sums

    def column(first, offset, buffers, sums_buffer, finish_only):
        return pl.pallas_call(
            functools.partial(_panel_column_kernel, n=n, block_n=block_n, nb=nb, partials=blocks, share_rows=rows,
                              finish_only=finish_only, interpret=interpret),
            out_shape=tuple(_f32((batch, *shape)) for shape in shapes), grid=(batch,),
            in_specs=[LOOP_INDEX, LOOP_INDEX, _per_matrix(blocks), sums] + [_per_matrix(*shape) for shape in shapes],
            out_specs=tuple(_per_matrix(*shape) for shape in shapes), input_output_aliases={4 + i: i for i in range(6)},
            compiler_params=pltriton.CompilerParams(num_warps=COLUMN_KERNEL_WARPS), interpret=interpret,
            name="eigh_panel_column",
        )(_loop_index(first), _loop_index(offset), partial, sums_buffer, *buffers)

    def product(first, offset, w, scale, panel_buffer, sums_buffer):
        return pl.pallas_call(
            functools.partial(_panel_product_kernel, n=n, block_n=block_n, rows_per_tile=OVER_LAUNCHES_PRODUCT_ROWS,
                              cols_per_tile=block_n // OVER_LAUNCHES_PRODUCT_BLOCKS, nb=nb, interpret=interpret),
            out_shape=(_f32((batch, 2 * nb + 1, block_n)), _f32((batch, programs, block_n))), grid=(batch, programs),
            in_specs=[LOOP_INDEX, LOOP_INDEX, matrix, scalar, panel, sums], out_specs=(panel, sums),
            input_output_aliases={4: 0, 5: 1},
            compiler_params=pltriton.CompilerParams(num_warps=OVER_LAUNCHES_PRODUCT_WARPS), interpret=interpret,
            name="eigh_panel_product",
        )(_loop_index(first), _loop_index(offset), w, scale, panel_buffer, sums_buffer)

    update_cols = min(block_n, PANEL_UPDATE_COLS)

    def close(j, buffers, sums_buffer):  # the panel ending at column j: its last W row, then the trailing update
        w, d, e, tau, scale, panel_buffer = column(j, 0, buffers, sums_buffer, True)
        w = pl.pallas_call(
            functools.partial(_panel_update_kernel, n=n, rows_per_tile=TRIDIAGONAL_ROWS, cols_per_tile=update_cols,
                              nb=nb),
            out_shape=_f32((batch, n, n)),
            grid=(batch, pl.cdiv(n - nb, TRIDIAGONAL_ROWS), pl.cdiv(n - nb, update_cols)),  # the first panel's
            in_specs=[LOOP_INDEX, scalar, panel, matrix], out_specs=matrix, input_output_aliases={3: 0},
            compiler_params=pltriton.CompilerParams(num_warps=4), interpret=interpret, name="eigh_panel_update",
        )(_loop_index(j), scale, panel_buffer, w)
        return w, d, e, tau, scale, panel_buffer

    def columns(first, count, carry):  # columns first .. first + count - 1 of one panel
        def column_step(i, carry):
            buffers, sums_buffer = carry
            w, d, e, tau, scale, panel_buffer = column(first, i, buffers, sums_buffer, False)
            panel_buffer, sums_buffer = product(first, i, w, scale, panel_buffer, sums_buffer)
            return (w, d, e, tau, scale, panel_buffer), sums_buffer

        return jax.lax.fori_loop(0, count, column_step, carry)

    def panel_step(p, carry):  # every panel after the first: close the one before, then its columns
        buffers, sums_buffer = carry
        return columns(p * nb, nb, (close(p * nb, buffers, sums_buffer), sums_buffer))

    # Loops with static trip counts and no lax.cond: a lax.cond a column cost about the gap between host and kernel
    # time (results/h200/NOTES.md).
    buffers = (w,) + tuple(jnp.zeros((batch, *shape), jnp.float32) for shape in shapes[1:])
    carry = columns(0, min(nb, n), (buffers, jnp.zeros((batch, programs, block_n), jnp.float32)))
    full = n // nb
    carry = jax.lax.fori_loop(1, full, panel_step, carry)
    if n > nb and n % nb:
        carry = columns(full * nb, n % nb, (close(full * nb, *carry), carry[1]))
    return carry[0][:5]


def _eigenvalues(d, e, scale, *, interpret):
    """T's eigenvalues ascending, T's norm bound, and L (the eigenvalues times A's scale)."""
    batch, n = d.shape
    vector, scalar = _per_matrix(n), _per_matrix()
    return pl.pallas_call(
        functools.partial(_bisect_kernel, n=n, interpret=interpret),
        out_shape=(_f32((batch, n)), _f32((batch,)), _f32((batch, n))), grid=(batch, pl.cdiv(n, LANES)),
        in_specs=[vector, vector, scalar], out_specs=(vector, scalar, vector),
        compiler_params=pltriton.CompilerParams(num_warps=1), interpret=interpret, name="eigh_bisect",
    )(d, e, scale)


def _vectors(d, e, values, norm, *, interpret):
    """T's orthonormal eigenvectors as the rows of z [batch, n, n], in the order of `values`. Inverse iteration
    works on their transpose (XLA transposes between the two, the one to z dividing each vector by its length)."""
    batch, n = d.shape
    vector, scalar, matrix, factors = _per_matrix(n), _per_matrix(), _per_matrix(n, n), _per_matrix(2, n, n)
    z = scratch = None
    for step in range(INVERSE_ITERATIONS):
        carried = () if step == 0 else (jnp.swapaxes(z, 1, 2), scratch)
        columns, scratch, lengths = pl.pallas_call(
            functools.partial(_inverse_iteration_kernel, n=n, first=step == 0),
            out_shape=(_f32((batch, n, n)), _f32((batch, 2, n, n)), _f32((batch, n))),
            grid=(batch, pl.cdiv(n, LANES)),
            in_specs=[vector, vector, vector, scalar] + ([matrix, factors] if carried else []),
            out_specs=(matrix, factors, vector), input_output_aliases={4: 0, 5: 1} if carried else {},
            compiler_params=pltriton.CompilerParams(num_warps=1), interpret=interpret,
            name="eigh_inverse_iteration",
        )(d, e, values, norm, *carried)
        gap = CLUSTER_GAP if step == INVERSE_ITERATIONS - 1 else EARLY_CLUSTER_GAP
        unit = jnp.swapaxes(columns, 1, 2) / jnp.where(lengths > 0, lengths, 1.0)[:, :, None]  # one XLA transpose
        z = _orthonormalize(unit, values, norm, gap, interpret=interpret)
    return _repair(z, d, e, values, norm, interpret=interpret)[0]


def _repair(z, d, e, values, norm, *, interpret):
    """(z with every vector whose residual exceeds REPAIR_RESIDUAL eps ||T|| made orthogonal to the sound ones,
    the residuals [batch, n])."""
    batch, n, _ = z.shape
    block_n = pl.next_power_of_2(n)
    vector = _per_matrix(n)
    return pl.pallas_call(
        functools.partial(_repair_kernel, n=n, block_n=block_n, interpret=interpret),
        out_shape=(_f32((batch, n, n)), _f32((batch, n))), grid=(batch,),
        in_specs=[vector, vector, vector, _per_matrix(), _per_matrix(n, n)], out_specs=(_per_matrix(n, n), vector),
        input_output_aliases={4: 0},
        compiler_params=pltriton.CompilerParams(num_warps=vector_panel_warps(block_n)), interpret=interpret,
        name="eigh_repair",
    )(d, e, values, norm, z)


def _orthonormalize(z, values, norm, cluster_gap, split=None, *, interpret):
    """z's rows orthonormal within each cluster of `values` (gaps below cluster_gap max|values|, or GROUP_GAP eps
    norm). Its rows come unit from `_vectors`: a panel with no cluster in it or reaching into it is left as it
    is. split: each panel's projections shared among many programs per matrix, two pallas_calls twice a panel in
    a jax.lax.fori_loop (default: ports.eigh.split_gram_schmidt); otherwise one program per matrix."""
    batch, n, _ = z.shape
    block_n = pl.next_power_of_2(n)
    vector, scalar, matrix = _per_matrix(n), _per_matrix(), _per_matrix(n, n)
    unrolled = gram_schmidt_unrolled(batch)
    if not (split_gram_schmidt(n) if split is None else split):
        return pl.pallas_call(
            functools.partial(_orthonormalize_kernel, n=n, block_n=block_n, cluster_gap=cluster_gap,
                              second_pass_below=SECOND_PASS_BELOW, unrolled=unrolled, interpret=interpret),
            out_shape=_f32((batch, n, n)), grid=(batch,), in_specs=[vector, scalar, matrix], out_specs=matrix,
            input_output_aliases={2: 0}, compiler_params=pltriton.CompilerParams(num_warps=vector_panel_warps(block_n)),
            interpret=interpret, name="eigh_orthonormalize",
        )(values, norm, z)
    panels = pl.cdiv(n, PANEL)
    programs, earlier = gram_schmidt_shares(n)
    partials = _per_matrix(programs, PANEL, n)

    def project(step, start, again, z):
        return pl.pallas_call(
            functools.partial(_orthonormalize_project_kernel, n=n, cluster_gap=cluster_gap, earlier=earlier,
                              interpret=interpret),
            out_shape=_f32((batch, programs, PANEL, n)), grid=(batch, programs),
            in_specs=[LOOP_INDEX, vector, scalar, scalar, scalar, matrix], out_specs=partials,
            compiler_params=pltriton.CompilerParams(num_warps=GRAM_SCHMIDT_WARPS,
                                                    num_stages=GRAM_SCHMIDT_PROJECT_STAGES),
            interpret=interpret,
            name="eigh_orthonormalize_project",
        )(step, values, norm, start, again, z)

    def finish(step, partial, start, again, z):
        flag = jax.ShapeDtypeStruct((batch,), jnp.int32)
        return pl.pallas_call(
            functools.partial(_orthonormalize_finish_kernel, n=n, block_n=block_n, cluster_gap=cluster_gap,
                              second_pass_below=SECOND_PASS_BELOW, earlier=earlier, unrolled=unrolled),
            out_shape=(flag, flag, _f32((batch, n, n))), grid=(batch,),
            in_specs=[LOOP_INDEX, vector, scalar, partials, scalar, scalar, matrix], out_specs=(scalar, scalar, matrix),
            input_output_aliases={4: 0, 5: 1, 6: 2},
            compiler_params=pltriton.CompilerParams(num_warps=gram_schmidt_finish_warps(block_n)), interpret=interpret,
            name="eigh_orthonormalize_finish",
        )(step, values, norm, partial, start, again, z)

    def panel_pass(i, carry):  # one traced (so one compiled) kernel of each kind for every panel and pass
        start, again, z = carry
        step = _loop_index(i)
        return finish(step, project(step, start, again, z), start, again, z)

    flags = jnp.zeros((batch,), jnp.int32)
    return jax.lax.fori_loop(0, 2 * panels, panel_pass, (flags, flags, z))[2]


def _back_transform(w, tau, z, *, interpret):
    """Q = H_0 ... H_{n-3} z^T: A's eigenvectors as columns (w's and z's buffers are overwritten)."""
    batch, n, _ = z.shape
    panels = pl.cdiv(n, BACK_TRANSFORM_REFLECTORS)
    matrix = _per_matrix(n, n)
    factors = pl.BlockSpec((None, None, BACK_TRANSFORM_REFLECTORS, BACK_TRANSFORM_REFLECTORS),
                           lambda b, panel: (b, panel, 0, 0))
    w, t = pl.pallas_call(
        functools.partial(_compact_wy_kernel, n=n, reflectors=BACK_TRANSFORM_REFLECTORS, chunk=BACK_TRANSFORM_CHUNK),
        out_shape=(_f32((batch, n, n)), _f32((batch, panels, BACK_TRANSFORM_REFLECTORS, BACK_TRANSFORM_REFLECTORS))),
        grid=(batch, panels), in_specs=[_per_matrix(n), matrix], out_specs=(matrix, factors),
        input_output_aliases={1: 0}, compiler_params=pltriton.CompilerParams(num_warps=BACK_TRANSFORM_WARPS),
        interpret=interpret,
        name="eigh_compact_wy",
    )(tau, w)
    by_matrix = pl.BlockSpec((None, n, n), lambda block, b: (b, 0, 0))  # grid (block, b): see the kernel
    return pl.pallas_call(
        functools.partial(_back_transform_kernel, n=n, vectors_per_program=BACK_TRANSFORM_VECTORS,
                          reflectors=BACK_TRANSFORM_REFLECTORS, chunk=BACK_TRANSFORM_CHUNK, interpret=interpret),
        out_shape=(_f32((batch, n, n)), _f32((batch, n, n))), grid=(pl.cdiv(n, BACK_TRANSFORM_VECTORS), batch),
        in_specs=[by_matrix, pl.BlockSpec((None, panels, BACK_TRANSFORM_REFLECTORS, BACK_TRANSFORM_REFLECTORS),
                                          lambda block, b: (b, 0, 0, 0)), by_matrix],
        out_specs=(by_matrix, by_matrix), input_output_aliases={2: 0},
        compiler_params=pltriton.CompilerParams(num_warps=BACK_TRANSFORM_WARPS, num_stages=BACK_TRANSFORM_STAGES),
        interpret=interpret,
        name="eigh_back_transform",
    )(w, t, z)[1]


def _tridiagonal(a, *, interpret):
    """(Q, L, the checks' bounds) by tridiagonalisation, bisection, inverse iteration and back-transformation
    (n > 64), the Triton port's kernels: the scratch buffers are outputs, updated in place across launches through
    input_output_aliases."""
    w, d, e, tau, scale, bounds = _reduce(a, interpret=interpret)
    values, norm, eigenvalues = _eigenvalues(d, e, scale, interpret=interpret)
    z = _vectors(d, e, values, norm, interpret=interpret)
    return _back_transform(w, tau, z, interpret=interpret), eigenvalues, jnp.max(bounds, axis=(0, 1))


def _jacobi(a, *, interpret):
    """(Q, L, the checks' bounds) by the on-chip Jacobi (n <= 64)."""
    batch, n, _ = a.shape
    size = jacobi_size(n)
    check_offsets(batch, size, JACOBI_EXCHANGE_SLOTS)
    vectors, values, _, bounds = _on_chip(jnp.pad(a, ((0, 0), (0, size - n), (0, size - n))), interpret=interpret)
    vectors, values = vectors[:, :n, :n], values[:, :n]
    order = jnp.argsort(values, axis=-1)
    return (jnp.take_along_axis(vectors, order[:, None, :], axis=-1), jnp.take_along_axis(values, order, axis=-1),
            jnp.max(bounds, axis=0))


@functools.partial(jax.jit, static_argnames=("interpret",))
def _eigh(a, *, interpret):
    """(Q, L, the input's checks' bounds), the kernels of one path in one jitted call."""
    return (_tridiagonal if a.shape[1] > JACOBI_MAX_N else _jacobi)(a, interpret=interpret)


def eigh(a):
    """(Q, L) for a [batch, n, n] float32 symmetric JAX array: A Q = Q diag(L), L ascending.

    Runs the compiled kernels on a GPU and Pallas interpret mode elsewhere. Waits for its kernels: the input's
    checks are read after the last.
    """
    check_shape(a)
    if a.size == 0:
        return jnp.zeros_like(a), jnp.zeros(a.shape[:2], a.dtype)
    q, values, bounds = _eigh(a, interpret=jax.default_backend() != "gpu")
    nonfinite, largest, asymmetry = jax.device_get(bounds).tolist()
    check_values(nonfinite == 0, largest, asymmetry)
    return q, values
