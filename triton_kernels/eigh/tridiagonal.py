"""The eigh Triton port's Householder tridiagonalisation, T = H^T (A / max|A|) H, for n > 64.

`_symmetrize_kernel` first (with the input's checks), then the reflectors, the trailing matrix in global memory.
A large batch (or a small n) runs `_tridiagonalize_blocked_kernel`, one launch, one program per matrix, in panels
(lower triangle read once per column, written once per panel); otherwise the same panels run over launches
(`kernel_support.eigh_common.Tridiagonal.one_launch`): per column, `_panel_column_kernel` (one program a matrix)
forms the reflector and `_panel_product_kernel` shares p = A v_j's rows among many programs; per panel,
`_panel_update_kernel` tiles the trailing update.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernel_support.eigh_common import TRIDIAGONAL
from .common import bounds_buffer, checked, empty, register_cap


@dataclass(frozen=True)
class TritonTridiagonal:
    """The Triton port's own tunables of the tridiagonalisation."""

    programs_an_sm: int = 6  # two-warp programs of the one-launch tridiagonalisation an SM, capped (168 registers)


TRITON_TRIDIAGONAL = TritonTridiagonal()


@triton.jit
def _symmetrize_kernel(a_ptr, w_ptr, partial_ptr, bounds_ptr, n, BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    """Program (b, block): rows [block ROWS, (block + 1) ROWS) of w = (A + A^T) / 2, A's entries that are not
    finite read as zero, their max |A| in partial[b, block] (the tridiagonalisation's first panel scales by the
    largest) and their checks' bounds in bounds[b, block, :3]."""
    block = tl.program_id(0).to(tl.int64) * tl.num_programs(1) + tl.program_id(1)
    rows = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < n)[:, None] & (cols < n)[None, :]
    offsets = tl.program_id(0).to(tl.int64) * n * n + rows[:, None] * n + cols[None, :]
    transposed_offsets = tl.program_id(0).to(tl.int64) * n * n + cols[None, :] * n + rows[:, None]
    tile, transposed, largest = checked(tl.load(a_ptr + offsets, mask=mask, other=0.0),
                                        tl.load(a_ptr + transposed_offsets, mask=mask, other=0.0),
                                        bounds_ptr + block * 3)
    tl.store(w_ptr + offsets, 0.5 * tile + 0.5 * transposed, mask=mask)
    tl.store(partial_ptr + block, largest)


# combiners of `tl.reduce` over tuples: several sums in one reduction, one round through shared memory where
# separate sums take one each (a column's chain of reductions bounds the tridiagonalisation with few matrices)
@triton.jit
def _add_pairs(a, b, c, d):
    return a + c, b + d


@triton.jit
def _add_triples(a, b, c, d, e, f):
    return a + d, b + e, c + f


@triton.jit
def _add_quadruples(a, b, c, d, e, f, g, h):
    return a + e, b + f, c + g, d + h


@triton.jit
def _householder(row, k, cols):
    """The reflector of row k (up to date): (v with v[k + 1] = 1 and zeros up to k, tau, T's d_k and
    e_k). Nothing to annihilate (and the last two steps): tau = 0, e_k the entry itself. Its three sums are one
    reduction."""
    alpha, sigma, diagonal = tl.reduce((tl.where(cols == k + 1, row, 0.0), tl.where(cols > k + 1, row * row, 0.0),
                                        tl.where(cols == k, row, 0.0)), 0, _add_triples)
    norm = tl.sqrt_rn(alpha * alpha + sigma)
    beta = tl.where(alpha >= 0, -norm, norm)
    trivial = sigma == 0.0
    inverse = tl.where(trivial, 0.0, 1.0 / tl.where(trivial, 1.0, alpha - beta))
    v = tl.where(cols == k + 1, 1.0, tl.where(cols > k + 1, row * inverse, 0.0))
    tau = tl.where(trivial, 0.0, (beta - alpha) / tl.where(trivial, 1.0, beta))
    return v, tau, diagonal, tl.where(trivial, alpha, beta)  # e[n - 1] = 0


@triton.jit
def _panel_rows(panel_ptr, matrix, NB: tl.constexpr, BLOCK_N: tl.constexpr):
    """Matrix's panel buffer [2 NB + 1, BLOCK_N]: pointers to its V rows, W rows and p."""
    vs = panel_ptr + matrix * (2 * NB + 1) * BLOCK_N
    return vs, vs + NB * BLOCK_N, vs + 2 * NB * BLOCK_N


@triton.jit
def _scale(partial_ptr, matrix, partials, PARTIALS: tl.constexpr):
    """max|A| from the symmetrisation's per-program maxima (1 for a zero matrix)."""
    index = tl.arange(0, PARTIALS)
    biggest = tl.max(tl.load(partial_ptr + matrix * partials + index, mask=index < partials, other=0.0), axis=0)
    return tl.where(biggest > 0, biggest, 1.0)


@triton.jit
def _panel_tiles(vs, ws, used, members, cols, BLOCK_N: tl.constexpr):
    """The panel's reflectors V and W before member `used`, as NB x BLOCK_N tiles (zero beyond)."""
    tile = members[:, None] * BLOCK_N + cols[None, :]
    earlier = (members < used)[:, None]
    return (tl.load(vs + tile, mask=earlier, other=0.0, cache_modifier=".cg"),
            tl.load(ws + tile, mask=earlier, other=0.0, cache_modifier=".cg"))


@triton.jit
def _panel_reflector(w, d, e, tau_ptr, vs, j, i, factor, correction, n, cols, BLOCK_N: tl.constexpr):
    """Column j = member i of its panel: row j (read as column j on and below the diagonal, the
    part the trailing updates keep) brought up to date with the panel's earlier reflectors (row j
    -= correction, sum_q v_q[j] w_q + w_q[j] v_q over them, from `_panel_w`), its reflector v_j
    stored as V's row i, d_j, e_j and tau_j stored: (v_j, tau_j)."""
    row = tl.load(w + cols * n + j, mask=(cols >= j) & (cols < n), other=0.0, cache_modifier=".cg") * factor
    row -= correction
    v, tau, diagonal, off = _householder(row, j, cols)
    tl.store(d + j, diagonal)
    tl.store(e + j, off)
    tl.store(tau_ptr + j, tau)
    tl.store(vs + i * BLOCK_N + cols, v)
    return v, tau


@triton.jit
def _panel_w(p, v, tau, below, vs, ws, j, i, cols, BLOCK_N: tl.constexpr, CHUNK: tl.constexpr):
    """W's row for column j = member i (reflector v, tau) from p = A v, A as at the panel's start:
    w = tau (p - V W^T v - W V^T v) less half tau (w . v) v, V and W the members before i. Also
    row j + 1's correction for its reflector, sum_q v_q[j + 1] w_q + w_q[j + 1] v_q over the
    members up to i, while V and W are loaded (one load of the panel a column, not two): (w, correction).
    V and W are read CHUNK members at a time (a loop, not unrolled): a whole NB x BLOCK_N pair of
    tiles would set the kernels' register peak. A chunk's four sums (W v, V v, and V's and W's entries j + 1)
    are one reduction, as are w's two (w . v and w[j + 1])."""
    projection = tl.zeros((BLOCK_N,), tl.float32)
    correction = tl.zeros((BLOCK_N,), tl.float32)
    next_row = cols == j + 1
    for first in range(0, tl.cdiv(i, CHUNK)):  # zero-based: see _gram_schmidt_pass
        v_panel, w_panel = _panel_tiles(vs, ws, i, first * CHUNK + tl.arange(0, CHUNK), cols, BLOCK_N)
        w_v, v_v, v_next, w_next = tl.reduce((w_panel * v[None, :], v_panel * v[None, :],
                                              tl.where(next_row[None, :], v_panel, 0.0),
                                              tl.where(next_row[None, :], w_panel, 0.0)), 1, _add_quadruples)
        projection += tl.sum(w_v[:, None] * v_panel + v_v[:, None] * w_panel, axis=0)
        correction += tl.sum(v_next[:, None] * w_panel + w_next[:, None] * v_panel, axis=0)
    p = tl.where(below, tau * (p - projection), 0.0)
    p_v, p_next = tl.reduce((p * v, tl.where(next_row, p, 0.0)), 0, _add_pairs)
    half = 0.5 * tau * p_v
    w_row = p - half * v
    return w_row, correction + w_row + (p_next - half) * v  # v[j + 1] = 1: w_row's own and its entry j + 1 terms


@triton.jit
def _lower_blocks(rows, cols, j, n):
    """What a row tile of the product p = A v_j (v_j zero up to j) reads of the trailing matrix, in whole
    blocks of 4 columns so that its loads stay 4 wide: (lower, the blocks from the one holding j + 1 up to the
    one holding each row's diagonal; mirrored, the blocks left of the diagonal's, whose mirror images above the
    diagonal no row reads: they give the column sums). Each pair of the trailing matrix is counted once."""
    lower = (cols >= (j + 1) // 4 * 4)[None, :] & (cols < n)[None, :] & _lower_block_triangle(rows, cols)
    return lower, (cols // 4)[None, :] < (rows // 4)[:, None]


@triton.jit
def _lower_tile(w, rows, cols, j, n, factor):
    """factor times the trailing matrix's tile (rows, cols) as the product p = A v_j reads it (`_lower_blocks`),
    and the mask of its mirrored part (the part that gives column sums)."""
    lower, mirrored = _lower_blocks(rows, cols, j, n)
    tile = tl.load(w + rows[:, None] * n + cols[None, :], mask=(rows < n)[:, None] & lower, other=0.0,
                   cache_modifier=".cg")
    return tile * factor, mirrored


@triton.jit
def _lower_block_triangle(rows, cols):
    """The lower triangle in whole 4-column blocks (4-wide loads): the blocks up to each row's
    diagonal block, which is all the reflectors and products read (and the trailing updates write)."""
    return (cols // 4)[None, :] <= (rows // 4)[:, None]


@triton.jit
def _symmetric_product(w, v_ptr, p_buffer, products, j, n, factor, below, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
                       COLS: tl.constexpr, STAGES: tl.constexpr):
    """p = factor A v (v zero up to j) on the rows below j, from the trailing matrix's lower triangle
    (`_lower_blocks`), in blocks of COLS columns from the one holding j + 1, each swept ROWS rows at a time from
    its diagonal down, so that no tile is wider than the lower triangle it reads (a tile as wide as the padded
    row carried three times the triangle's elements through its masks). A tile's rows' sums are that block's part
    of those rows' entries, stored in products[block] (a [BLOCK_N / COLS, BLOCK_N] buffer, every part written
    once a column); its mirrored part adds to its columns' sums (the upper triangle's share), held as a ROWS x COLS
    accumulator and stored in p_buffer at the block's end. The parts are added up after a barrier. STAGES > 1: the
    row tiles are loaded that many stages ahead through shared memory (Triton's software pipelining), more bytes in
    flight for a program that shares its SM."""
    local = tl.arange(0, ROWS)
    first_block = (j + 1) // COLS
    for b in range(0, tl.cdiv(n, COLS) - first_block):  # zero-based: see _gram_schmidt_pass
        cols = (first_block + b) * COLS + tl.arange(0, COLS)
        v_cols = tl.load(v_ptr + cols, mask=cols < n, other=0.0, cache_modifier=".cg")
        column_sums = tl.zeros((ROWS, COLS), tl.float32)
        top = tl.maximum(j + 1, (first_block + b) * COLS)
        for t in tl.range(0, tl.cdiv(n - top, ROWS), num_stages=STAGES):
            rows = top + t * ROWS + local
            inside = rows < n
            tile, mirrored = _lower_tile(w, rows, cols, j, n, factor)
            tl.store(products + (first_block + b) * BLOCK_N + rows, tl.sum(tile * v_cols[None, :], axis=1),
                     mask=inside)
            v_rows = tl.load(v_ptr + rows, mask=inside, other=0.0, cache_modifier=".cg")
            column_sums += tl.where(mirrored, tile, 0.0) * v_rows[:, None]
        tl.store(p_buffer + cols, tl.sum(column_sums, axis=0), mask=cols < n)
    tl.debug_barrier()
    cols = tl.arange(0, BLOCK_N)
    blocks = tl.arange(0, BLOCK_N // COLS)[:, None]
    written = (blocks >= first_block) & (blocks <= cols[None, :] // COLS) & below[None, :]
    parts = tl.load(products + blocks * BLOCK_N + cols[None, :], mask=written, other=0.0, cache_modifier=".cg")
    return tl.sum(parts, axis=0) + tl.load(p_buffer + cols, mask=below, other=0.0, cache_modifier=".cg")


@triton.jit
def _tridiagonalize_blocked_kernel(w_ptr, d_ptr, e_ptr, tau_ptr, scale_ptr, partial_ptr, panel_ptr, products_ptr, n,
                                   partials, BLOCK_N: tl.constexpr, ROWS: tl.constexpr, PARTIALS: tl.constexpr,
                                   NB: tl.constexpr, CHUNK: tl.constexpr, COLS: tl.constexpr,
                                   PRODUCT_ROWS: tl.constexpr, PRODUCT_COLS: tl.constexpr,
                                   PRODUCT_STAGES: tl.constexpr):
    """Householder tridiagonalisation T = H^T (A / max|A|) H (Golub & Van Loan 8.3.1), blocked as
    LAPACK's dsytrd/dlatrd, the trailing matrix in w (global memory): program b takes the columns
    in panels of NB. Reflector v_j has v_j[j + 1] = 1; it is stored in row j of w (no later column
    reads that row) for the back-transformation, with tau_j, d_j and e_j. Column j of a panel is
    first brought up to date with the panel's earlier reflectors (row j -= sum_q v_q[j] w_q +
    w_q[j] v_q), then gives its reflector v_j, and w_j = tau_j (A v_j - V W^T v_j - W V^T v_j)
    minus half tau_j (w_j . v_j) v_j, with A as it was at the panel's start: each column reads
    the trailing matrix's lower triangle once (p = A v_j, `_symmetric_product` on PRODUCT_ROWS x PRODUCT_COLS
    tiles, its parts in products [batch, BLOCK_N / PRODUCT_COLS, BLOCK_N]) and writes nothing; the panel's end
    applies A -= V W^T + W V^T to the trailing matrix's lower triangle (`_lower_block_triangle`),
    ROWS x COLS tiles, one read and one write a panel instead of a column. panel [batch,
    2 NB + 1, BLOCK_N] holds the panel's V and W rows and the product's column sums.
    The first panel scales by 1 / max|A| (from partial[b, :partials]) as it reads: no overflow or
    underflow at the extreme magnitudes."""
    matrix = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    local = tl.arange(0, ROWS)
    members = tl.arange(0, NB)
    in_cols = cols < n
    w = w_ptr + matrix * n * n
    vs, ws, p_buffer = _panel_rows(panel_ptr, matrix, NB, BLOCK_N)
    products = products_ptr + matrix * (BLOCK_N // PRODUCT_COLS) * BLOCK_N
    scale = _scale(partial_ptr, matrix, partials, PARTIALS)
    tl.store(scale_ptr + matrix, scale)
    for panel in range(0, tl.cdiv(n, NB)):
        factor = tl.where(panel == 0, 1.0 / scale, 1.0)
        first = panel * NB
        width = tl.minimum(NB, n - first)
        correction = tl.zeros((BLOCK_N,), tl.float32)  # the panel's first row is up to date
        for i in range(0, width):
            j = first + i
            v, tau = _panel_reflector(w, d_ptr + matrix * n, e_ptr + matrix * n, tau_ptr + matrix * n, vs, j, i,
                                      factor, correction, n, cols, BLOCK_N)
            below = in_cols & (cols > j)
            tl.debug_barrier()  # v, just stored as V's row i, is read back in blocks
            p = _symmetric_product(w, vs + i * BLOCK_N, p_buffer, products, j, n, factor, below, BLOCK_N,
                                   PRODUCT_ROWS, PRODUCT_COLS, PRODUCT_STAGES)
            w_row, correction = _panel_w(p, v, tau, below, vs, ws, j, i, cols, BLOCK_N, CHUNK)
            tl.store(ws + i * BLOCK_N + cols, w_row)
            tl.store(w + j * n + cols, v, mask=below)  # for the back-transformation: row j is not read again
            tl.debug_barrier()
        last = first + width  # the trailing matrix below the panel: A -= V W^T + W V^T on its lower triangle,
        # COLS columns at a time (V's and W's NB x COLS tiles held, not NB x BLOCK_N: fewer registers), two
        # products a ROWS x COLS tile
        present = (members < width)[None, :]
        for b in range(0, tl.cdiv(n, COLS) - last // COLS):  # zero-based: see _gram_schmidt_pass
            left = (last // COLS + b) * COLS
            chunk = left + tl.arange(0, COLS)
            right = (chunk >= last) & (chunk < n)
            v_panel, w_panel = _panel_tiles(vs, ws, width, members, chunk, BLOCK_N)
            top = tl.maximum(last, left)  # rows above `left` hold nothing of these columns' lower triangle
            for t in range(0, tl.cdiv(n - top, ROWS)):
                rows = top + t * ROWS + local
                inside = rows < n
                ptrs = w + rows[:, None] * n + chunk[None, :]
                mask = inside[:, None] & right[None, :] & _lower_block_triangle(rows, chunk)
                transposed = members[None, :] * BLOCK_N + rows[:, None]  # ROWS x NB: V's and W's columns `rows`
                v_rows = tl.load(vs + transposed, mask=inside[:, None] & present, other=0.0, cache_modifier=".cg")
                w_rows = tl.load(ws + transposed, mask=inside[:, None] & present, other=0.0, cache_modifier=".cg")
                tile = tl.load(ptrs, mask=mask, other=0.0, cache_modifier=".cg") * factor
                tile -= (tl.dot(v_rows, w_panel, input_precision="ieee")
                         + tl.dot(w_rows, v_panel, input_precision="ieee"))
                tl.store(ptrs, tile, mask=mask)
        tl.debug_barrier()


@triton.jit(do_not_specialize=["j", "shares"])
def _panel_column_kernel(w_ptr, d_ptr, e_ptr, tau_ptr, scale_ptr, partial_ptr, panel_ptr, sums_ptr, n, partials, j,
                         shares, BLOCK_N: tl.constexpr, PARTIALS: tl.constexpr, NB: tl.constexpr,
                         SHARES: tl.constexpr, SHARE_ROWS: tl.constexpr, FINISH_ONLY: tl.constexpr,
                         CHUNK: tl.constexpr):
    """The blocked reduction spread over launches (panels of NB columns as `_tridiagonalize_blocked_kernel`),
    program b per matrix, column j = first + i of its panel: finishes w_{j-1} from p = A v_{j-1} (left
    by `_panel_product_kernel`: its rows' sums, plus the column sums of its `shares` programs, added up
    SHARE_ROWS at a time from sums [batch, SHARES, BLOCK_N]), then (unless FINISH_ONLY, the launch that
    closes a panel with j its last column + 1) brings row j up to date with the panel's reflectors and
    forms v_j, d_j, e_j, tau_j. Column 0 takes the scale max|A| from partial; the first panel reads A / max|A|."""
    matrix = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    in_cols = cols < n
    w = w_ptr + matrix * n * n
    vs, ws, p_buffer = _panel_rows(panel_ptr, matrix, NB, BLOCK_N)
    i = (j - 1) % NB + 1 if FINISH_ONLY else j % NB
    if j == 0:
        tl.store(scale_ptr + matrix, _scale(partial_ptr, matrix, partials, PARTIALS))
        tl.debug_barrier()
    factor = tl.where(j < NB, 1.0 / tl.load(scale_ptr + matrix), 1.0)
    correction = tl.zeros((BLOCK_N,), tl.float32)  # a panel's first row is up to date
    if i > 0:  # W's row for column j - 1, and row j's correction
        below = in_cols & (cols > j - 1)
        share_rows = tl.arange(0, SHARE_ROWS)
        column_sums = tl.zeros((SHARE_ROWS, BLOCK_N), tl.float32)
        for s in range(0, tl.cdiv(shares, SHARE_ROWS)):
            share = s * SHARE_ROWS + share_rows
            column_sums += tl.load(sums_ptr + (matrix * SHARES + share[:, None]) * BLOCK_N + cols[None, :],
                                   mask=(share < shares)[:, None], other=0.0)
        p = tl.load(p_buffer + cols, mask=below, other=0.0, cache_modifier=".cg") + tl.sum(column_sums, axis=0)
        v = tl.load(vs + (i - 1) * BLOCK_N + cols, cache_modifier=".cg")
        w_row, correction = _panel_w(p, v, tl.load(tau_ptr + matrix * n + j - 1), below, vs, ws, j - 1, i - 1,
                                     cols, BLOCK_N, CHUNK)
        tl.store(ws + (i - 1) * BLOCK_N + cols, w_row)
        tl.debug_barrier()
    if not FINISH_ONLY:
        v, _ = _panel_reflector(w, d_ptr + matrix * n, e_ptr + matrix * n, tau_ptr + matrix * n, vs, j, i, factor,
                                correction, n, cols, BLOCK_N)
        tl.store(w + j * n + cols, v, mask=in_cols & (cols > j))  # for the back-transformation


@triton.jit(do_not_specialize=["j"])
def _panel_product_kernel(w_ptr, scale_ptr, panel_ptr, sums_ptr, n, j, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
                          NB: tl.constexpr, SHARES: tl.constexpr, COLS: tl.constexpr):
    """p = A v_j for the rows below j, A as at the panel's start (read, not written), from its lower
    triangle: programs (b, s) take matrix b's row tiles s, s + P, ... (P programs), each walked in COLS-column
    blocks from the one holding j + 1 to its diagonal (no tile wider than the triangle), store their rows' sums
    in p and add each block's column sums (the upper triangle's part, by symmetry) to their share sums[b, s]
    (zeroed first; a barrier after each row tile, whose blocks may meet the next tile's)."""
    matrix = tl.program_id(0).to(tl.int64)
    program, programs = tl.program_id(1), tl.num_programs(1)
    local = tl.arange(0, ROWS)
    w = w_ptr + matrix * n * n
    vs, _, p_buffer = _panel_rows(panel_ptr, matrix, NB, BLOCK_N)
    v_ptr = vs + (j % NB) * BLOCK_N
    sums = sums_ptr + (matrix * SHARES + program) * BLOCK_N
    factor = tl.where(j < NB, 1.0 / tl.load(scale_ptr + matrix), 1.0)
    tl.store(sums + tl.arange(0, BLOCK_N), tl.zeros((BLOCK_N,), tl.float32))
    tl.debug_barrier()
    first_block = (j + 1) // COLS
    tiles = tl.cdiv(n - j - 1, ROWS)
    for t in range(0, tl.cdiv(tiles - program, programs)):  # zero-based: see _gram_schmidt_pass
        rows = j + 1 + (program + t * programs) * ROWS + local
        inside = rows < n
        v_rows = tl.load(v_ptr + rows, mask=inside, other=0.0, cache_modifier=".cg")
        row_sums = tl.zeros((ROWS, COLS), tl.float32)
        last_block = tl.minimum(j + 1 + (program + t * programs) * ROWS + ROWS - 1, n - 1) // COLS
        for c in range(0, last_block + 1 - first_block):
            cols = (first_block + c) * COLS + tl.arange(0, COLS)
            tile, mirrored = _lower_tile(w, rows, cols, j, n, factor)
            v_cols = tl.load(v_ptr + cols, mask=(cols > j) & (cols < n), other=0.0, cache_modifier=".cg")
            share = tl.load(sums + cols)  # before the reduction, as the Pallas compile orders it (no gain measured)
            row_sums += tile * v_cols[None, :]
            column = tl.sum(tl.where(mirrored, tile, 0.0) * v_rows[:, None], axis=0)
            tl.store(sums + cols, share + column)
        tl.store(p_buffer + rows, tl.sum(row_sums, axis=1), mask=inside)
        tl.debug_barrier()


@triton.jit(do_not_specialize=["last"])
def _panel_update_kernel(w_ptr, scale_ptr, panel_ptr, n, last, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
                         COLS: tl.constexpr, NB: tl.constexpr):
    """A -= V W^T + W V^T below and right of the panel ending at column last, on its lower triangle
    (`_lower_block_triangle`), program (b, r, c) on the ROWS x COLS tile (r, c) of the trailing
    matrix: two float32 products of NB-deep operands (COLS columns wide, so they fit in shared
    memory at any n); tiles above the diagonal blocks do nothing. The first panel also scales A."""
    matrix = tl.program_id(0).to(tl.int64)
    r0, c0 = last + tl.program_id(1) * ROWS, last + tl.program_id(2) * COLS
    if c0 // 4 <= (r0 + ROWS - 1) // 4:
        rows, cols = r0 + tl.arange(0, ROWS), c0 + tl.arange(0, COLS)
        members = tl.arange(0, NB)
        width = last - (last - 1) // NB * NB
        w = w_ptr + matrix * n * n
        vs, ws, _ = _panel_rows(panel_ptr, matrix, NB, BLOCK_N)
        present = (members < width)[None, :]
        inside, valid = rows < n, cols < n
        v_rows = tl.load(vs + members[None, :] * BLOCK_N + rows[:, None], mask=inside[:, None] & present, other=0.0)
        w_rows = tl.load(ws + members[None, :] * BLOCK_N + rows[:, None], mask=inside[:, None] & present, other=0.0)
        beside = (members < width)[:, None] & valid[None, :]
        v_cols = tl.load(vs + members[:, None] * BLOCK_N + cols[None, :], mask=beside, other=0.0)
        w_cols = tl.load(ws + members[:, None] * BLOCK_N + cols[None, :], mask=beside, other=0.0)
        ptrs = w + rows[:, None] * n + cols[None, :]
        mask = inside[:, None] & valid[None, :] & _lower_block_triangle(rows, cols)
        factor = tl.where(last <= NB, 1.0 / tl.load(scale_ptr + matrix), 1.0)
        tile = tl.load(ptrs, mask=mask, other=0.0, cache_modifier=".cg") * factor
        tile -= tl.dot(v_rows, w_cols, input_precision="ieee") + tl.dot(w_rows, v_cols, input_precision="ieee")
        tl.store(ptrs, tile, mask=mask)


def _tridiagonal_register_cap(programs: int, warps: int, block_n: int, device: torch.device) -> int | None:
    """Register cap a thread for the one-launch tridiagonalisation at a padded 512 on `TRIDIAGONAL.many_warps`
    warps, where its programs outnumber what the SMs hold uncapped: `TRITON_TRIDIAGONAL.programs_an_sm` programs
    share an SM instead of the four that its uncapped register count lets in, so that a large batch runs in fewer
    waves, though each thread spills. Set only where a driver A/B measured it faster
    (results/h200/experiments/eigh-variants/eigh-variants-register-cap-one-warp.json; the figures:
    docs/findings.md, "The eigh ports' tuning constants"). The Pallas port's Triton compiler parameters have
    no cap. None on CPU tensors (`compare.tools.hopper_compile`)."""
    if warps != TRIDIAGONAL.many_warps or block_n != 512:
        return None
    return register_cap(programs, uncapped_an_sm=4, programs_an_sm=TRITON_TRIDIAGONAL.programs_an_sm, warps=warps,
                        device=device)


def _product_register_cap(programs: int, block_n: int, device: torch.device) -> int | None:
    """Register cap a thread for the over-launches product at a padded 1024, where column 0's programs outnumber
    the three four-warp programs an SM holds uncapped: four an SM, though each thread spills. Set only where a
    driver A/B measured it faster (results/h200/experiments/eigh-variants/eigh-variants-product-register-cap.json;
    the figures: docs/findings.md, "The eigh ports' tuning constants"). Pallas's Triton compiler parameters
    have no cap."""
    if block_n != 1024:
        return None
    return register_cap(programs, uncapped_an_sm=3, programs_an_sm=4, warps=TRIDIAGONAL.over_launches_product_warps,
                        device=device)


def reduce(a: torch.Tensor, single: bool | None = None):
    """Householder tridiagonalisation of each A / max|A|: (w, d, e, tau, scale, the checks' bounds
    [batch, blocks, 3]), the reflectors in w's rows.
    single: one launch, one program per matrix, blocked in panels of `TRIDIAGONAL.panel` columns (default:
    kernel_support.eigh_common.Tridiagonal.one_launch); otherwise the same blocking over launches: two a column (the
    column's product p = A v_j over many programs, `Tridiagonal.product_programs`), two more a panel."""
    batch, n, _ = a.shape
    block_n, rows, blocks = TRIDIAGONAL.row_blocks(n)
    w, partial = empty(batch, n, n, device=a.device), empty(batch, blocks, device=a.device)
    d, e, tau = (empty(batch, n, device=a.device) for _ in range(3))
    scale = empty(batch, device=a.device)
    nb = TRIDIAGONAL.panel
    panel = empty(batch, 2 * nb + 1, block_n, device=a.device)
    bounds = bounds_buffer(batch, blocks, device=a.device)
    _symmetrize_kernel[(batch, blocks)](a, w, partial, bounds, n, BLOCK_N=block_n, ROWS=rows, num_warps=8)
    if TRIDIAGONAL.one_launch(batch, n) if single is None else single:
        tile_rows, warps = TRIDIAGONAL.tile(batch)
        product_cols = min(block_n, TRIDIAGONAL.product_cols)
        products = empty(batch, block_n // product_cols, block_n, device=a.device)
        _tridiagonalize_blocked_kernel[(batch,)](w, d, e, tau, scale, partial, panel, products, n, blocks,
                                                 BLOCK_N=block_n, ROWS=tile_rows,
                                                 PARTIALS=triton.next_power_of_2(blocks), NB=nb,
                                                 CHUNK=TRIDIAGONAL.panel_chunk, COLS=min(block_n, TRIDIAGONAL.cols),
                                                 PRODUCT_ROWS=TRIDIAGONAL.product_warp_rows * warps,
                                                 PRODUCT_COLS=product_cols,
                                                 PRODUCT_STAGES=TRIDIAGONAL.product_stages(batch), num_warps=warps,
                                                 maxnreg=_tridiagonal_register_cap(batch, warps, block_n, a.device))
        return w, d, e, tau, scale, bounds
    programs = TRIDIAGONAL.max_product_programs
    sums = empty(batch, programs, block_n, device=a.device)
    column = dict(BLOCK_N=block_n, PARTIALS=triton.next_power_of_2(blocks), NB=nb,
                  CHUNK=TRIDIAGONAL.column_panel_chunk(block_n), SHARES=programs, SHARE_ROWS=rows,
                  num_warps=TRIDIAGONAL.column_kernel_warps)
    update_cols = min(block_n, TRIDIAGONAL.panel_update_cols)
    product_cap = _product_register_cap(batch * TRIDIAGONAL.product_programs(n - 1), block_n, a.device)  # column 0's
    for j in range(n):
        shares = TRIDIAGONAL.product_programs(n - j)  # the programs of column j - 1's product
        if j % nb == 0 and j > 0:  # close the panel: its last w, then the trailing update
            _panel_column_kernel[(batch,)](w, d, e, tau, scale, partial, panel, sums, n, blocks, j, shares,
                                           FINISH_ONLY=True, **column)
            grid = (batch, triton.cdiv(n - j, TRIDIAGONAL.rows), triton.cdiv(n - j, update_cols))
            _panel_update_kernel[grid](w, scale, panel, n, j, BLOCK_N=block_n, ROWS=TRIDIAGONAL.rows, COLS=update_cols,
                                       NB=nb, num_warps=4)
        _panel_column_kernel[(batch,)](w, d, e, tau, scale, partial, panel, sums, n, blocks, j, shares,
                                       FINISH_ONLY=False, **column)
        _panel_product_kernel[(batch, TRIDIAGONAL.product_programs(n - j - 1))](
            w, scale, panel, sums, n, j, BLOCK_N=block_n, ROWS=TRIDIAGONAL.over_launches_product_rows, NB=nb,
            SHARES=programs, COLS=block_n // TRIDIAGONAL.over_launches_product_blocks,
            num_warps=TRIDIAGONAL.over_launches_product_warps, maxnreg=product_cap)
    return w, d, e, tau, scale, bounds
