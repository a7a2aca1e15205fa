"""The eigh Pallas port's Householder tridiagonalisation, T = H^T (A / max|A|) H, for n > 64: the Triton port's.

`_symmetrize_kernel`, then, the trailing matrix in global memory, either `_tridiagonalize_blocked_kernel`, one
launch of one program per matrix in panels, or, by kernel_support.eigh_common.Tridiagonal.one_launch, the same
panels over launches: a column and a product launch per column, the product with several programs per matrix, and a
closing update launch per panel. A pallas_call's grid is static, so the launches per column are a
jax.lax.fori_loop over the column (an operand of the kernels) whose product and update launches keep column 0's
number of programs throughout, programs past the trailing matrix's last tile idling (the Triton port sizes each
launch to its column; unrolling n launches in Python would compile for too long at n = 2048).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from kernel_support.eigh_common import TRIDIAGONAL
from .common import LOOP_INDEX, barrier, checked, dot_ieee, f32, loop_index, masked_load, per_matrix, window


def _symmetrize_kernel(a_ref, w_ref, partial_ref, bounds_ref, *, n, block_n, rows_per_tile):
    """As the Triton port's `_symmetrize_kernel`: program (b, block), rows [block R, (block + 1) R)
    (R = rows_per_tile) of w = (A + A^T) / 2, A's entries that are not finite read as zero, their max |A| in
    partial[b, block] (the tridiagonalisation's first panel scales by the largest) and their checks' bounds in
    bounds[b, 3 block:3 block + 3]."""
    block = pl.program_id(1)
    rows, cols = block * rows_per_tile + jnp.arange(rows_per_tile), jnp.arange(block_n)
    mask = (rows < n)[:, None] & (cols < n)[None, :]
    rows_block = (window(block * rows_per_tile, rows_per_tile), window(0, block_n))
    tile, transposed, largest = checked(masked_load(a_ref.at[rows_block], mask),
                                        masked_load(a_ref.at[cols[None, :], rows[:, None]], mask), bounds_ref,
                                        3 * block)
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
    biggest = jnp.max(masked_load(partial_ref.at[window(0, index.size)], needed & (index < partials)))
    return jnp.where(biggest > 0, biggest, 1.0)


def _panel_tiles(panel_ref, used, first, count, c0, width, *, n, nb):
    """As the Triton port's `_panel_tiles`: members first .. first + count - 1 of the panel's V and W
    (panel rows 0 .. nb - 1 and nb .. 2 nb - 1) before member `used`, columns c0 .. c0 + width - 1:
    count x width tiles, zero beyond."""
    rows, cols = first + jnp.arange(count), c0 + jnp.arange(width)
    return tuple(masked_load(panel_ref.at[window(part * nb + first, count), window(c0, width)],
                             (rows < used)[:, None] & (cols < n)[None, :]) for part in (0, 1))


def _panel_reflector(w_ref, d_ref, e_ref, tau_ref, panel_ref, j, i, factor, correction, *, n, block_n):
    """As the Triton port's `_panel_reflector`: row j (read as column j on and below the diagonal) up
    to date with the panel's earlier reflectors (less `correction`, from `_panel_w`), v_j into V's row
    i, d_j, e_j, tau_j stored: (v_j, tau_j)."""
    cols = jnp.arange(block_n)
    row = masked_load(w_ref.at[window(0, block_n), j], (cols >= j) & (cols < n)) * factor - correction
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
    tile = masked_load(w_ref.at[window(r0, rows.shape[0]), window(c0, cols.shape[0])], (rows < n)[:, None] & lower)
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
        v_cols = masked_load(panel_ref.at[i, window(c0, cols)], block_cols < n)
        top = jnp.maximum(j + 1, c0)

        def row_tile(t, column_sums):
            r0 = top + t * rows
            tile_rows = r0 + local
            inside = tile_rows < n
            tile, mirrored = _lower_tile(w_ref, r0, tile_rows, c0, block_cols, j, n, factor)
            pltriton.store(products_ref.at[first_block + b, window(r0, rows)], jnp.sum(tile * v_cols[None, :], axis=1),
                           mask=inside)
            v_rows = masked_load(panel_ref.at[i, window(r0, rows)], inside)
            return column_sums + jnp.where(mirrored, tile, 0.0) * v_rows[:, None]

        column_sums = jax.lax.fori_loop(0, pl.cdiv(n - top, rows), row_tile, jnp.zeros((rows, cols), jnp.float32))
        pltriton.store(panel_ref.at[jnp.int32(2 * nb), window(c0, cols)], jnp.sum(column_sums, axis=0),
                       mask=block_cols < n)

    barrier(interpret)
    all_cols = jnp.arange(block_n)
    blocks = jnp.arange(block_n // cols)[:, None]
    written = (blocks >= first_block) & (blocks <= jax.lax.div(all_cols, jnp.int32(cols))[None, :]) & below[None, :]
    parts = masked_load(products_ref.at[window(0, block_n // cols), window(0, block_n)], written)
    return jnp.sum(parts, axis=0) + masked_load(panel_ref.at[jnp.int32(2 * nb), window(0, block_n)], below)


def _row_sweep_product(w_ref, panel_ref, v, i, j, factor, below, *, n, block_n, nb, rows, interpret):
    """p = factor A v (v zero up to j) on the rows below j from the lower triangle, `rows` whole padded rows at a
    time: each row tile stores its rows' sums in panel's row 2 nb and adds its mirrored part to every column's sum.
    Where many matrices share the SMs (2 warps), XLA's Triton ran this faster than `_symmetric_product`'s column
    blocks, which the Triton port uses throughout (docs/findings.md, "The eigh kernels, port by port")."""
    cols = jnp.arange(block_n)
    local = jnp.arange(rows)

    def row_tile(t, above_diagonal):
        r0 = j + 1 + t * rows
        tile_rows = r0 + local
        inside = tile_rows < n
        tile, mirrored = _lower_tile(w_ref, r0, tile_rows, 0, cols, j, n, factor)
        pltriton.store(panel_ref.at[jnp.int32(2 * nb), window(r0, rows)], jnp.sum(tile * v[None, :], axis=1),
                       mask=inside)
        v_rows = masked_load(panel_ref.at[i, window(r0, rows)], inside)
        return above_diagonal + jnp.sum(jnp.where(mirrored, tile, 0.0) * v_rows[:, None], axis=0)

    above_diagonal = jax.lax.fori_loop(0, pl.cdiv(n - j - 1, rows), row_tile, jnp.zeros((block_n,), jnp.float32))
    barrier(interpret)
    return masked_load(panel_ref.at[jnp.int32(2 * nb), window(0, block_n)], below) + above_diagonal


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
            barrier(interpret)  # v, just stored as V's row i, is read back in blocks
            if product_cols is None:
                p = _row_sweep_product(w_ref, panel_ref, v, i, j, factor, below, rows=rows_per_tile,
                                       interpret=interpret, **sizes)
            else:
                p = _symmetric_product(w_ref, panel_ref, products_ref, i, j, factor, below, rows=product_rows,
                                       cols=product_cols, interpret=interpret, **sizes)
            panel_ref[nb + i, :], correction = _panel_w(panel_ref, p, v, tau, below, j, i, chunk=chunk, **sizes)
            pltriton.store(w_ref.at[j, window(0, block_n)], v, mask=below)  # for the back-transformation
            barrier(interpret)
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
                tile_rows = w_ref.at[window(r0, rows_per_tile), window(c0, cols_per_tile)]
                present = (members < width)[:, None] & inside[None, :]  # nb x rows: V's and W's columns r0 ...
                v_rows = masked_load(panel_ref.at[window(0, nb), window(r0, rows_per_tile)], present)
                w_rows = masked_load(panel_ref.at[window(nb, nb), window(r0, rows_per_tile)], present)
                update = dot_ieee(v_rows.T, w_panel) + dot_ieee(w_rows.T, v_panel)
                pltriton.store(tile_rows, masked_load(tile_rows, mask) * factor - update, mask=mask)

        barrier(interpret)


def _column_index(first_ref, offset_ref):
    """The over-launches column j = first + offset: a panel's first column and the panel loop's counter, added
    here, where adding them in XLA cost a kernel a column
    (results/h200/experiments/eigh-speed/eigh-kernel-times-pallas-loop-counters.txt)."""
    return first_ref[0] + offset_ref[0]


def _panel_column_kernel(first_ref, offset_ref, partial_ref, sums_ref, *refs, n, block_n, nb, partials, share_rows,
                         finish_only, interpret):
    """As the Triton port's `_panel_column_kernel`: program b finishes W's row for column j - 1 from
    p and the column sums its product's active programs left in sums (those with a row tile below
    column j - 1, `TRIDIAGONAL.over_launches_product_rows` rows a tile), added share_rows shares at a time, then
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
        # the active product programs
        shares = jnp.minimum(sums_ref.shape[0], pl.cdiv(n - j, TRIDIAGONAL.over_launches_product_rows))
        offsets = jnp.arange(share_rows)

        def add_shares(s, column_sums):
            inside = (s * share_rows + offsets) < shares
            return column_sums + masked_load(sums_ref.at[window(s * share_rows, share_rows), window(0, block_n)],
                                             inside[:, None])

        column_sums = jax.lax.fori_loop(0, pl.cdiv(shares, share_rows), add_shares,
                                        jnp.zeros((share_rows, block_n), jnp.float32))
        p = masked_load(panel_ref.at[jnp.int32(2 * nb), window(0, block_n)], below) + jnp.sum(column_sums, axis=0)
        v = masked_load(panel_ref.at[i - 1, window(0, block_n)], in_cols)
        panel_ref[nb + i - 1, :], correction = _panel_w(panel_ref, p, v, tau_ref[j - 1], below, j - 1, i - 1,
                                                        chunk=TRIDIAGONAL.column_panel_chunk(block_n), **sizes)
        return correction

    # a panel's first row is up to date
    correction = jax.lax.cond(i > 0, finish_w, lambda: jnp.zeros((block_n,), jnp.float32))
    barrier(interpret)
    if not finish_only:
        v, _ = _panel_reflector(w_ref, d_ref, e_ref, tau_ref, panel_ref, j, i, factor, correction, n=n,
                                block_n=block_n)
        pltriton.store(w_ref.at[j, window(0, block_n)], v, mask=in_cols & (cols > j))  # for the back-transformation


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
        barrier(interpret)

        @pl.loop(0, pl.cdiv(tiles - program, programs))
        def _(t):
            r0 = j + 1 + (program + t * programs) * rows_per_tile
            rows = r0 + local
            inside = rows < n
            v_rows = masked_load(panel_ref.at[member, window(r0, rows_per_tile)], inside)
            last_block = jax.lax.div(jnp.minimum(r0 + rows_per_tile - 1, n - 1), jnp.int32(cols_per_tile))

            def block(c, row_sums):
                c0 = (first_block + c) * cols_per_tile
                cols = c0 + jnp.arange(cols_per_tile)
                tile, mirrored = _lower_tile(w_ref, r0, rows, c0, cols, j, n, factor)
                v_cols = masked_load(panel_ref.at[member, window(c0, cols_per_tile)], (cols > j) & (cols < n))
                share = sums_ref.at[program, window(c0, cols_per_tile)]
                share[...] = share[...] + jnp.sum(jnp.where(mirrored, tile, 0.0) * v_rows[:, None], axis=0)
                return row_sums + tile * v_cols[None, :]

            row_sums = jax.lax.fori_loop(0, last_block + 1 - first_block, block,
                                         jnp.zeros((rows_per_tile, cols_per_tile), jnp.float32))
            pltriton.store(panel_ref.at[jnp.int32(2 * nb), window(r0, rows_per_tile)], jnp.sum(row_sums, axis=1),
                           mask=inside)
            barrier(interpret)


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
        v_rows, w_rows = (masked_load(panel_ref.at[window(part * nb, nb), window(r0, rows_per_tile)], inside[None, :])
                          for part in (0, 1))  # nb x rows
        v_cols, w_cols = (masked_load(panel_ref.at[window(part * nb, nb), window(c0, cols_per_tile)], valid[None, :])
                          for part in (0, 1))  # nb x cols: a panel closed here is full
        tile_ref = w_ref.at[window(r0, rows_per_tile), window(c0, cols_per_tile)]
        mask = inside[:, None] & valid[None, :] & _lower_block_triangle(rows, cols)
        factor = jnp.where(last <= nb, 1.0 / scale_ref[...], 1.0)
        update = dot_ieee(v_rows.T, w_cols) + dot_ieee(w_rows.T, v_cols)
        pltriton.store(tile_ref, masked_load(tile_ref, mask) * factor - update, mask=mask)


def reduce(a, single=None, *, interpret):
    """Householder tridiagonalisation of each A / max|A|: (w, d, e, tau, scale, the checks' bounds
    [batch, blocks, 3]), the reflectors in w's rows. single: one launch, one program per matrix, blocked in panels
    of `TRIDIAGONAL.panel` columns (default: kernel_support.eigh_common.Tridiagonal.one_launch); otherwise the same
    panels over launches (`_reduce_in_panels`)."""
    batch, n, _ = a.shape
    block_n, rows, blocks = TRIDIAGONAL.row_blocks(n)
    w, partial, bounds = pl.pallas_call(
        functools.partial(_symmetrize_kernel, n=n, block_n=block_n, rows_per_tile=rows),
        out_shape=(f32((batch, n, n)), f32((batch, blocks)), f32((batch, 3 * blocks))), grid=(batch, blocks),
        in_specs=[per_matrix(n, n)], out_specs=(per_matrix(n, n), per_matrix(blocks), per_matrix(3 * blocks)),
        compiler_params=pltriton.CompilerParams(num_warps=8), interpret=interpret, name="eigh_symmetrize",
    )(a)
    bounds = bounds.reshape(batch, blocks, 3)
    if not (TRIDIAGONAL.one_launch(batch, n) if single is None else single):
        programs = TRIDIAGONAL.product_programs(n - 1)  # column 0's
        return *_reduce_in_panels(w, partial, programs, interpret=interpret), bounds
    # The column-blocked product where each program has an SM to itself; where programs share them, the row sweep:
    # at 640x512 on 2 warps every column-blocked tile tried ran slower there, though the Triton port's gained
    # (docs/findings.md, "The eigh kernels, port by port").
    product_cols = None if TRIDIAGONAL.shares_the_sms(batch) else min(block_n, TRIDIAGONAL.product_cols)
    # w, d, e, tau, scale, panel, products (the column blocks' row sums; one unused row for the row sweep)
    shapes = ((n, n), (n,), (n,), (n,), (), (2 * TRIDIAGONAL.panel + 1, block_n),
              (block_n // (product_cols or block_n), block_n))
    tile_rows, warps = TRIDIAGONAL.tile(batch)
    return pl.pallas_call(
        functools.partial(_tridiagonalize_blocked_kernel, n=n, block_n=block_n, partials=blocks,
                          rows_per_tile=tile_rows, cols_per_tile=min(block_n, TRIDIAGONAL.cols),
                          product_rows=TRIDIAGONAL.product_warp_rows * warps, product_cols=product_cols,
                          nb=TRIDIAGONAL.panel, chunk=TRIDIAGONAL.panel_chunk, interpret=interpret),
        out_shape=tuple(f32((batch, *shape)) for shape in shapes), grid=(batch,),
        in_specs=[per_matrix(blocks), per_matrix(n, n)], out_specs=tuple(per_matrix(*shape) for shape in shapes),
        input_output_aliases={1: 0}, compiler_params=pltriton.CompilerParams(num_warps=warps),
        interpret=interpret, name="eigh_tridiagonalize_blocked",
    )(partial, w)[:5] + (bounds,)


def _reduce_in_panels(w, partial, programs, *, interpret):
    """As the Triton port's multi-launch blocked path of `reduce`, in jax.lax.fori_loops over the panels
    and their columns: (w, d, e, tau, scale). programs: the product's programs per matrix (column 0's)."""
    batch, n, _ = w.shape
    # the symmetrize kernel's row blocks, whose partial sums the column kernel reads
    block_n, rows, blocks = TRIDIAGONAL.row_blocks(n)
    nb = TRIDIAGONAL.panel
    shapes = ((n, n), (n,), (n,), (n,), (), (2 * nb + 1, block_n))  # w, d, e, tau, scale, panel
    matrix, scalar, panel = per_matrix(n, n), per_matrix(), per_matrix(2 * nb + 1, block_n)

    sums = per_matrix(programs, block_n)  # each product program's column sums

    def column(first, offset, buffers, sums_buffer, finish_only):
        return pl.pallas_call(
            functools.partial(_panel_column_kernel, n=n, block_n=block_n, nb=nb, partials=blocks, share_rows=rows,
                              finish_only=finish_only, interpret=interpret),
            out_shape=tuple(f32((batch, *shape)) for shape in shapes), grid=(batch,),
            in_specs=[LOOP_INDEX, LOOP_INDEX, per_matrix(blocks), sums] + [per_matrix(*shape) for shape in shapes],
            out_specs=tuple(per_matrix(*shape) for shape in shapes), input_output_aliases={4 + i: i for i in range(6)},
            compiler_params=pltriton.CompilerParams(num_warps=TRIDIAGONAL.column_kernel_warps), interpret=interpret,
            name="eigh_panel_column",
        )(loop_index(first), loop_index(offset), partial, sums_buffer, *buffers)

    def product(first, offset, w, scale, panel_buffer, sums_buffer):
        return pl.pallas_call(
            functools.partial(_panel_product_kernel, n=n, block_n=block_n,
                              rows_per_tile=TRIDIAGONAL.over_launches_product_rows,
                              cols_per_tile=block_n // TRIDIAGONAL.over_launches_product_blocks, nb=nb,
                              interpret=interpret),
            out_shape=(f32((batch, 2 * nb + 1, block_n)), f32((batch, programs, block_n))), grid=(batch, programs),
            in_specs=[LOOP_INDEX, LOOP_INDEX, matrix, scalar, panel, sums], out_specs=(panel, sums),
            input_output_aliases={4: 0, 5: 1},
            compiler_params=pltriton.CompilerParams(num_warps=TRIDIAGONAL.over_launches_product_warps),
            interpret=interpret,
            name="eigh_panel_product",
        )(loop_index(first), loop_index(offset), w, scale, panel_buffer, sums_buffer)

    update_cols = min(block_n, TRIDIAGONAL.panel_update_cols)

    def close(j, buffers, sums_buffer):  # the panel ending at column j: its last W row, then the trailing update
        w, d, e, tau, scale, panel_buffer = column(j, 0, buffers, sums_buffer, True)
        w = pl.pallas_call(
            functools.partial(_panel_update_kernel, n=n, rows_per_tile=TRIDIAGONAL.rows, cols_per_tile=update_cols,
                              nb=nb),
            out_shape=f32((batch, n, n)),
            grid=(batch, pl.cdiv(n - nb, TRIDIAGONAL.rows), pl.cdiv(n - nb, update_cols)),  # the first panel's
            in_specs=[LOOP_INDEX, scalar, panel, matrix], out_specs=matrix, input_output_aliases={3: 0},
            compiler_params=pltriton.CompilerParams(num_warps=4), interpret=interpret, name="eigh_panel_update",
        )(loop_index(j), scale, panel_buffer, w)
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
    # time (docs/findings.md, "The eigh kernels, port by port").
    buffers = (w,) + tuple(jnp.zeros((batch, *shape), jnp.float32) for shape in shapes[1:])
    carry = columns(0, min(nb, n), (buffers, jnp.zeros((batch, programs, block_n), jnp.float32)))
    full = n // nb
    carry = jax.lax.fori_loop(1, full, panel_step, carry)
    if n > nb and n % nb:
        carry = columns(full * nb, n % nb, (close(full * nb, *carry), carry[1]))
    return carry[0][:5]
