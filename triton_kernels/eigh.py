"""Batched symmetric eigendecomposition in Triton: parallel-order Jacobi on chip, tridiagonalisation above.

n <= 64 (padded to a power of two N >= 16), on chip: one program per matrix holds its
N x N matrix A and the accumulated rotations V in registers. A sweep is the N - 1 rounds
m = 1 .. N - 1 of the XOR pairing (index i meets i ^ m: the pairs of a round are disjoint and a
sweep meets every two indices once), so one round is a single orthogonal J made of N/2 plane
rotations, each zeroing its A[p, q] (Golub & Van Loan's symmetric Schur decomposition). J is
applied elementwise, O(N^2) per round rather than a matrix product's O(N^3): with J[i, i] = c_i
and J[i ^ m, i] = -s_i, (A J)[:, i] = c_i A[:, i] - s_i A[:, i ^ m], and likewise for the rows of
J^T (A J) and for V J; exchanging rows or columns i and i ^ m is one register gather
(`tl.gather`; the Pallas port, whose Triton lowering has no gather, exchanges them through a
buffer in global memory, one barrier a round, and its kernel is slower than this one,
results/h200/NOTES.md).
Padding rows and columns are zero off the diagonal, so they never mix with the matrix. The
matrix is scaled by 1/max|A| and symmetrised first (no overflow or underflow at the extreme
magnitudes); both members of a pair compute their rotation from the same averaged
A[p, q], so they agree on it exactly. Each round then sets its pairs' A[p, q] to zero, as the rotations
make them in exact arithmetic (computed, each keeps a remnant of about eps times its pair's diagonal, which held the
largest off-diagonal element at 1 to 4 eps, so that the stop below was rarely met and most calls ran
JACOBI_MAX_SWEEPS sweeps). Sweeps stop once every off-diagonal element is below eps; the launcher sorts the
eigenvalues (glue).

The input's checks (NaN or Inf, max |A - A^T| against max |A|) come from the kernels that read A first, the Jacobi
kernel and `_symmetrize_kernel` (`_checked`): they count what they read, zero the entries that are not finite (so
that no later kernel sees them) and leave three bounds, which the call reads after its last kernel, in its one
synchronisation, raising if the input was bad. Fewer than ONE_LAUNCH_BATCH matrices replay their path's kernels from
a CUDA graph (`_replayed`).

n > 64: tridiagonalisation, bisection, inverse iteration, back-transformation (the LAPACK
dsytrd + dstebz + dstein route, each stage written for batches of matrices):
1. `_symmetrize_kernel`, then Householder reflectors T = H^T (A / max|A|) H, the trailing matrix
   in global memory. A large batch (or a small n) runs `_tridiagonalize_blocked_kernel`, one
   launch, one program per matrix, in panels (lower triangle read once per column, written once per panel);
   otherwise the same panels run over launches (`ports.eigh.one_launch`): per column,
   `_panel_column_kernel` (one program a matrix) forms the reflector and `_panel_product_kernel`
   shares p = A v_j's rows among many programs; per panel, `_panel_update_kernel` tiles the
   trailing update.
2. `_bisect_kernel`: lane j of a program finds T's j-th eigenvalue from Sturm counts, a first pass of
   32 counts at points common to the matrix's programs (`_multisected`), then halvings, each step's
   division an approximate reciprocal (`_reciprocal`; eigenvalues come out sorted; L is them times max|A|).
3. `_inverse_iteration_kernel` (lane j solves (T - shift_j I) x = x, pivoted, on the vectors'
   transpose: a warp's step touches 128 contiguous bytes) and
   the block Gram-Schmidt within clusters of close eigenvalues (from n = 512 split over launches,
   `_orthonormalize_project_kernel` forming each panel's projections as tensor-core products among many
   programs a matrix and `_orthonormalize_finish_kernel` applying them; below, `_orthonormalize_kernel`,
   one program per matrix), INVERSE_ITERATIONS rounds from a fixed pseudo-random start; the rounds before the last
   orthogonalise only the closest eigenvalues' vectors (EARLY_CLUSTER_GAP), the last every
   cluster (CLUSTER_GAP). Then `_repair_kernel` makes any vector whose residual is above
   REPAIR_RESIDUAL eps ||T|| orthogonal to all the sound ones.
4. `_compact_wy_kernel` and `_back_transform_kernel`: Q = H Z a panel of reflectors at a time in LAPACK's
   compact WY form, tensor-core products on blocks of vectors.
Nothing is kept between calls. Why the shifts, clusters and rounds are what they are:
ports/eigh.py and results/h200/NOTES.md.
"""
from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ports.eigh import (BACK_TRANSFORM_CHUNK, BACK_TRANSFORM_PRECISION, BACK_TRANSFORM_REFLECTORS,
                        BACK_TRANSFORM_VECTORS, BACK_TRANSFORM_WARPS, BISECTION_ITERATIONS, CLUSTER_GAP,
                        COLUMN_KERNEL_WARPS, CUDA_GRAPH_SHAPES, EARLY_CLUSTER_GAP, GRAM_SCHMIDT_CHUNK,
                        GRAM_SCHMIDT_PRECISION, GRAM_SCHMIDT_WARPS, GROUP_GAP, INVERSE_ITERATIONS,
                        JACOBI_MAX_N, JACOBI_MAX_SWEEPS, LANES, MANY_TRIDIAGONAL_WARPS, OVER_LAUNCHES_PRODUCT_BLOCKS,
                        OVER_LAUNCHES_PRODUCT_ROWS, OVER_LAUNCHES_PRODUCT_WARPS, PANEL, PANEL_CHUNK, PANEL_UPDATE_COLS,
                        PIVOT_FLOOR, PRODUCT_PROGRAMS, REPAIR_RESIDUAL, SECOND_PASS_BELOW, SPARSE_GROUP_GAP,
                        SYMMETRIC_PRODUCT_COLS, SYMMETRIC_PRODUCT_WARP_ROWS,
                        TRIDIAGONAL_COLS, TRIDIAGONAL_PANEL, TRIDIAGONAL_ROWS, check_offsets, check_shape,
                        check_values, column_panel_chunk, gram_schmidt_finish_warps, gram_schmidt_shares,
                        gram_schmidt_unrolled, jacobi_size, jacobi_warps, one_launch, product_programs, product_stages,
                        row_blocks, shares_the_sms, split_gram_schmidt, tridiagonal_tile, vector_panel_warps)

EPS = torch.finfo(torch.float32).eps
TRANSPOSE_TILE = 64  # the vectors' transposes move 64 x 64 tiles (16 KB) a program
TRIDIAGONAL_PROGRAMS_AN_SM = 6  # two-warp programs of the one-launch tridiagonalisation an SM, capped (168 registers)


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
def _checked(tile, transposed, bounds_ptr):
    """A tile of A and the same of A^T with the entries that are not finite zeroed, and the tile's max |A|; of the
    tile as read, the count of such entries, max |A| and max |A - A^T| in bounds[:3] (`_check_bounds`)."""
    finite = tl.abs(tile) < float("inf")  # NaN fails the comparison too
    tl.store(bounds_ptr, tl.sum(tl.sum(tl.where(finite, 0.0, 1.0), axis=1), axis=0))
    tile = tl.where(finite, tile, 0.0)
    transposed = tl.where(tl.abs(transposed) < float("inf"), transposed, 0.0)
    largest = tl.max(tl.max(tl.abs(tile), axis=1), axis=0)
    tl.store(bounds_ptr + 1, largest)
    tl.store(bounds_ptr + 2, tl.max(tl.max(tl.abs(tile - transposed), axis=1), axis=0))
    return tile, transposed, largest


@triton.jit
def _jacobi_kernel(a_ptr, q_ptr, l_ptr, sweeps_ptr, bounds_ptr, tolerance, N: tl.constexpr,
                   MAX_SWEEPS: tl.constexpr):
    """Program i diagonalises the N x N matrix i of `a` (the sweeps it took in sweeps[i], its checks' bounds in
    bounds[i, :3])."""
    matrix = tl.program_id(0)
    rows = tl.arange(0, N)
    a = tl.load(a_ptr + matrix * N * N + rows[:, None] * N + rows[None, :])
    a, transposed, scale = _checked(a, tl.trans(a), bounds_ptr + matrix * 3)
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
    tile, transposed, largest = _checked(tl.load(a_ptr + offsets, mask=mask, other=0.0),
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


@triton.jit
def _reciprocal(x, APPROXIMATE: tl.constexpr):
    """1 / x. APPROXIMATE (compiled for the GPU; the interpreter divides): PTX's approximate reciprocal (1 ulp,
    one instruction), without the operand rescaling that a float32 division adds for divisors outside
    [2^-126, 2^126] (in a Sturm step, 6 of its 20 instructions, 2 on its dependent chain); for x known to lie inside
    that range (the pivots here, kept at least a floor from zero)."""
    if APPROXIMATE:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True,
                                         pack=1)
    return 1.0 / x


@triton.jit
def _sturm_counts(d, e, points, n, pivot_floor, APPROXIMATE: tl.constexpr):
    """How many of T's eigenvalues lie below each of `points`: the negative pivots of (T - x I)'s LDL^T, each
    pivot at least pivot_floor from zero. So |pivot| lies in [pivot_floor, |d - x| + e^2 / pivot_floor], inside
    `_reciprocal`'s range while |e| is below about 9e3 (T is A / max|A|: |e| <= n); beyond, the reciprocal of a
    larger pivot comes out 0 where the quotient is negligible anyway."""
    count = tl.zeros(points.shape, tl.int32)
    pivot = tl.full(points.shape, 1.0, tl.float32)
    coupling = 0.0  # e[i - 1]^2
    for i in range(n):
        pivot = tl.load(d + i) - points - coupling * _reciprocal(pivot, APPROXIMATE)
        pivot = tl.where(tl.abs(pivot) < pivot_floor, -pivot_floor, pivot)
        count += (pivot < 0).to(tl.int32)
        off = tl.load(e + i)
        coupling = off * off
    return count


@triton.jit
def _multisected(d, e, index, lo, hi, n, pivot_floor, APPROXIMATE: tl.constexpr, LANES: tl.constexpr):
    """Brackets of the eigenvalues numbered `index` from one pass of LANES Sturm counts, one a lane, at evenly
    spaced points inside T's Gershgorin interval [lo, hi]: the two points (or ends) around each eigenvalue, a
    (LANES + 1)-th of the interval, where a bisection pass halves it. Every warp of a matrix counts at the same
    points, so that close eigenvalues found by different warps stay on one grid, which the halvings refine (a
    second pass, over each warp's own span of brackets, gave the H200 psd test matrices' orthogonality figures a
    heavier tail: results/h200/NOTES.md)."""
    points = lo + (hi - lo) * ((tl.arange(0, LANES) + 1).to(tl.float32) * (1.0 / (LANES + 1)))
    above = _sturm_counts(d, e, points, n, pivot_floor, APPROXIMATE)[None, :] > index[:, None]  # [lane, point]
    bracket_lo = tl.max(tl.where(above, lo, points[None, :]), axis=1)
    bracket_hi = tl.min(tl.where(above, points[None, :], hi), axis=1)
    kept = bracket_lo < bracket_hi  # else counts that rounding put out of order: the whole interval
    return tl.where(kept, bracket_lo, lo), tl.where(kept, bracket_hi, hi)


@triton.jit
def _unfinished(lo, hi, valid, limit):
    """Whether any valid lane's bracket is wider than limit and can still be halved in float32."""
    middle = 0.5 * (lo + hi)
    return tl.max((valid & (hi - lo > limit) & (middle > lo) & (middle < hi)).to(tl.int32), axis=0) > 0


@triton.jit
def _bisect_kernel(d_ptr, e_ptr, scale_ptr, values_ptr, norm_ptr, l_ptr, n, pivot_floor,
                   ITERATIONS: tl.constexpr, LANES: tl.constexpr, APPROXIMATE: tl.constexpr):
    """Program (b, block): lane j of the block finds T_b's j-th smallest eigenvalue from Sturm counts (the number
    of negative pivots of T - x I's LDL^T is the number of eigenvalues below x), inside T's Gershgorin interval:
    a first pass of `_multisected`, then halvings until every bracket is as narrow as ITERATIONS halvings of the
    interval leave it (or cannot be halved in float32; at most ITERATIONS halvings). It writes the eigenvalue and
    L (the eigenvalue times A's scale); block 0 writes the Gershgorin bound ||T|| used as T's norm."""
    matrix = tl.program_id(0).to(tl.int64)
    index = tl.program_id(1) * LANES + tl.arange(0, LANES)
    valid = index < n
    d, e = d_ptr + matrix * n, e_ptr + matrix * n
    lo = tl.load(d)
    hi = lo
    previous = 0.0
    for i in range(n):
        diagonal = tl.load(d + i)
        radius = tl.abs(tl.load(e + i))
        lo = tl.minimum(lo, diagonal - previous - radius)
        hi = tl.maximum(hi, diagonal + previous + radius)
        previous = radius
    norm = tl.maximum(tl.maximum(tl.abs(lo), tl.abs(hi)), 1.0)  # T / max|A| has norm >= 1 unless A = 0
    limit = (hi - lo) * (0.5 ** ITERATIONS)
    lo_lanes, hi_lanes = _multisected(d, e, index, lo, hi, n, pivot_floor, APPROXIMATE, LANES)
    halvings = 0
    while (halvings < ITERATIONS) & _unfinished(lo_lanes, hi_lanes, valid, limit):
        middle = 0.5 * (lo_lanes + hi_lanes)
        below = _sturm_counts(d, e, middle, n, pivot_floor, APPROXIMATE) > index  # the j-th is below the middle
        hi_lanes = tl.where(below, middle, hi_lanes)
        lo_lanes = tl.where(below, lo_lanes, middle)
        halvings += 1
    value = 0.5 * (lo_lanes + hi_lanes)
    tl.store(values_ptr + matrix * n + index, value, mask=valid)
    tl.store(l_ptr + matrix * n + index, value * tl.load(scale_ptr + matrix), mask=valid)
    tl.store(norm_ptr + matrix, norm, mask=tl.program_id(1) == 0)


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
    contiguous, so a warp's step reads or writes 128 bytes, not 32 sectors: `_vectors` transposes);
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
def _panel_clusters(values, panel, start, tolerance, n, PANEL: tl.constexpr):
    """The panel's members, which are inside n, their clusters numbered within the panel (breaks
    where a gap exceeds tolerance), the first member's cluster, whether that cluster has members
    in earlier panels, where it starts, and where the next panel's first cluster starts at the
    latest (start: the previous panel's value)."""
    local = tl.arange(0, PANEL)
    members = panel * PANEL + local
    inside = members < n
    gaps = (tl.load(values + members, mask=inside, other=0.0)
            - tl.load(values + members - 1, mask=inside & (members > 0), other=0.0))
    breaks = inside & ((members == 0) | (gaps > tolerance))
    start = tl.maximum(start, tl.max(tl.where(breaks & (local == 0), members, 0)))
    cluster = tl.where(inside, tl.cumsum(breaks.to(tl.int32), axis=0), -1)
    first_cluster = tl.sum(tl.where(local == 0, cluster, 0))
    next_start = tl.maximum(start, tl.max(tl.where(breaks, members, 0)))
    return members, inside, cluster, first_cluster, panel * PANEL > start, start, next_start


@triton.jit
def _panel_needs_work(continued, inside, cluster, first_cluster):
    """Whether the Gram-Schmidt has anything to do in the panel: its first cluster continues from earlier panels,
    or two of its members are in one cluster (`_panel_clusters` numbers them in order). Otherwise its vectors,
    unit from `_transposed`, stay as they are."""
    return continued | (tl.max(cluster) - first_cluster + 1 < tl.sum(inside.to(tl.int32)))


@triton.jit
def _tolerance(values, norm, cluster_gap, group_gap, n):
    """Gaps up to this chain eigenvalues into one cluster: cluster_gap ||T||_2, at least group_gap ||T||."""
    return tl.maximum(cluster_gap * tl.maximum(tl.abs(tl.load(values)), tl.abs(tl.load(values + n - 1))),
                      group_gap * norm)


@triton.jit
def _load_panel(x, members, inside, cols, valid, n, normalise):
    block = tl.load(x + members[:, None] * n + cols[None, :], mask=inside[:, None] & valid[None, :], other=0.0)
    if normalise:
        block /= tl.maximum(tl.sqrt_rn(tl.sum(block * block, axis=1)), 1e-30)[:, None]
    return block


@triton.jit
def _projected_out(block, x, first, end, chosen, cols, valid, n, PANEL: tl.constexpr):
    """block with its chosen rows' components along the PANEL vectors from first (those before end) taken out, one
    vector after another (modified Gram-Schmidt, row by row: a tl.dot would stage all of K in shared memory; a loop,
    not unrolled, so that the vectors' loads are not all hoisted into registers)."""
    for q in range(PANEL):
        earlier = first + q + 0 * cols  # a vector: the interpreter rejects a scalar mask
        vector = tl.load(x + earlier * n + cols, mask=valid & (earlier < end), other=0.0, cache_modifier=".cg")
        block -= tl.where(chosen[:, None], tl.sum(block * vector[None, :], axis=1)[:, None] * vector[None, :], 0.0)
    return block


@triton.jit
def _cluster_step(block, shortest, i, local, cluster, first_cluster, continued):
    """`_within_clusters`' step for member i: (block, shortest)."""
    own = tl.sum(tl.where(local == i, cluster, 0))
    partners = tl.sum(((cluster == own) & (local != i)).to(tl.int32))
    if (partners > 0) | (continued & (own == first_cluster)):
        row = tl.sum(tl.where(local[:, None] == i, block, 0.0), axis=0)
        length = tl.sqrt_rn(tl.sum(row * row))
        shortest = tl.minimum(shortest, length)
        row /= tl.maximum(length, 1e-30)
        later = tl.sum(block * row[None, :], axis=1)
        after = (local > i) & (cluster == own)
        block = tl.where(local[:, None] == i, row[None, :],
                         tl.where(after[:, None], block - later[:, None] * row[None, :], block))
    return block, shortest


@triton.jit
def _within_clusters(block, cluster, first_cluster, continued, PANEL: tl.constexpr, UNROLLED: tl.constexpr):
    """Modified Gram-Schmidt of each cluster's members within the panel, normalising them; a vector
    alone in its cluster (and not continuing one from earlier panels) is left as it is. Also the
    smallest norm a vector had before its normalisation (1 if none was touched): of unit vectors,
    how much the projections cancelled. UNROLLED: the PANEL steps as that many copies of their code, else a loop
    (`ports.eigh.gram_schmidt_unrolled`)."""
    local = tl.arange(0, PANEL)
    shortest = 1.0
    if UNROLLED:
        for i in tl.static_range(PANEL):
            block, shortest = _cluster_step(block, shortest, i, local, cluster, first_cluster, continued)
    else:
        for i in range(PANEL):
            block, shortest = _cluster_step(block, shortest, i, local, cluster, first_cluster, continued)
    return block, shortest


@triton.jit
def _gram_schmidt_pass(block, x, start, panel, cluster, first_cluster, continued, cols, valid, n,
                       PANEL: tl.constexpr, UNROLLED: tl.constexpr):
    """One block Gram-Schmidt pass of the panel (modified, against its first cluster's earlier members one at a
    time, then within each cluster): (block, smallest norm before normalising)."""
    # counted from zero: a loop starting at `start` skipped its body on the H200 (Triton 3.6, pipelined loads)
    for earlier_block in range(0, tl.cdiv(panel * PANEL - start, PANEL)):
        block = _projected_out(block, x, start + earlier_block * PANEL, panel * PANEL, cluster == first_cluster, cols,
                               valid, n, PANEL)
    return _within_clusters(block, cluster, first_cluster, continued, PANEL, UNROLLED)


@triton.jit
def _orthonormalize_kernel(x_ptr, values_ptr, norm_ptr, cluster_gap, group_gap, second_pass_below, n,
                           BLOCK_N: tl.constexpr, PANEL: tl.constexpr, UNROLLED: tl.constexpr):
    """Program b makes T_b's vectors orthonormal where inverse iteration alone does not: within
    clusters, chains of eigenvalues each within cluster_gap ||T||_2 of the previous one (LAPACK's
    dstein criterion, with the spectral norm max |eigenvalue| in place of its 1-norm bound), and
    always within groups (eigenvalues within group_gap ||T|| that shared an inverse-iteration shift).
    Block Gram-Schmidt over panels of PANEL vectors in order: the panel's members of its first
    vector's cluster are made orthogonal to that cluster's earlier members (modified, one member
    at a time), then each cluster's members within the panel to each other (normalising),
    and both steps again where the first pass cancelled (Kahan's test: a vector's norm fell below
    second_pass_below). A panel whose members are each alone in their cluster within it, the first
    not continuing a cluster from earlier panels, is left as it is (its vectors come unit from
    `_transposed`): with short clusters, most panels are skipped."""
    matrix = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    valid = cols < n
    x, values = x_ptr + matrix * n * n, values_ptr + matrix * n
    tolerance = _tolerance(values, tl.load(norm_ptr + matrix), cluster_gap, group_gap, n)
    start = 0  # the cluster of the panel's first vector starts here
    for panel in range(0, tl.cdiv(n, PANEL)):
        members, inside, cluster, first_cluster, continued, start, next_start = _panel_clusters(
            values, panel, start, tolerance, n, PANEL)
        if _panel_needs_work(continued, inside, cluster, first_cluster):
            block = _load_panel(x, members, inside, cols, valid, n, True)
            block, shortest = _gram_schmidt_pass(block, x, start, panel, cluster, first_cluster, continued, cols, valid,
                                                 n, PANEL, UNROLLED)
            if shortest < second_pass_below:  # the second pass removes what the first's cancellation amplified
                block, _ = _gram_schmidt_pass(block, x, start, panel, cluster, first_cluster, continued, cols, valid,
                                              n, PANEL, UNROLLED)
            tl.store(x + members[:, None] * n + cols[None, :], block, mask=inside[:, None] & valid[None, :])
        start = next_start
        tl.debug_barrier()


@triton.jit
def _split_panel(x_ptr, values_ptr, norm_ptr, start_ptr, cluster_gap, group_gap, n, panel, BLOCK_N: tl.constexpr,
                 PANEL: tl.constexpr):
    """The split Gram-Schmidt kernels' common start for matrix b = program_id(0): its vectors x, the
    columns and which are inside n, and the panel's clusters (`_panel_clusters`, from start_ptr[b])."""
    matrix = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    values = values_ptr + matrix * n
    tolerance = _tolerance(values, tl.load(norm_ptr + matrix), cluster_gap, group_gap, n)
    members, inside, cluster, first_cluster, continued, start, next_start = _panel_clusters(
        values, panel, tl.load(start_ptr + matrix), tolerance, n, PANEL)
    return x_ptr + matrix * n * n, cols, cols < n, members, inside, cluster, first_cluster, continued, start, next_start


@triton.jit
def _rows_at(x, rows, inside_rows, columns, n):
    """x's rows `rows` at `columns` (earlier cluster members, read through L2), zero outside."""
    return tl.load(x + rows[:, None] * n + columns[None, :], mask=inside_rows[:, None] & (columns < n)[None, :],
                   other=0.0, cache_modifier=".cg")


@triton.jit(do_not_specialize=["panel", "first_pass"])  # one compiled kernel for every panel and both passes
def _orthonormalize_project_kernel(x_ptr, values_ptr, norm_ptr, start_ptr, again_ptr, partial_ptr, cluster_gap,
                                   group_gap, second_pass_below, n, panel, first_pass, BLOCK_N: tl.constexpr,
                                   PANEL: tl.constexpr, EARLIER: tl.constexpr, CHUNK: tl.constexpr,
                                   PRECISION: tl.constexpr):
    """The split Gram-Schmidt's first half, as two products: program (b, s) takes the s-th EARLIER earlier
    members E of the panel's first cluster and writes the panel block P's correction (P E^T) E into
    partial [batch, programs, PANEL, n] at [b, s], where the finish reads it: the coefficients P E^T over n
    CHUNK columns a step, then the correction CHUNK columns at a time (E read twice, from L2). start_ptr
    [batch]: where the previous panel's first cluster starts, or a later break; again_ptr [batch]: whether
    the panel's second pass runs (from the first pass's finish). Classical Gram-Schmidt as products, where
    row reductions across the program's warps (one a member) bound the older form (results/h200/NOTES.md)."""
    matrix = tl.program_id(0).to(tl.int64)
    share = tl.program_id(1)
    local = tl.arange(0, PANEL)
    x, cols, valid, members, inside, cluster, first_cluster, continued, start, _ = _split_panel(
        x_ptr, values_ptr, norm_ptr, start_ptr, cluster_gap, group_gap, n, panel, BLOCK_N, PANEL)
    first = start + share * EARLIER
    end = panel * PANEL
    if continued & (first < end) & ((first_pass != 0) | (tl.load(again_ptr + matrix) != 0)):
        earlier = first + tl.arange(0, EARLIER)
        present = earlier < end
        chunk = tl.arange(0, CHUNK)
        coefficients = tl.zeros((PANEL, EARLIER), tl.float32)
        squares = tl.zeros((PANEL,), tl.float32)
        for c0 in range(0, n, CHUNK):
            columns = c0 + chunk
            block = tl.load(x + members[:, None] * n + columns[None, :],
                            mask=inside[:, None] & (columns < n)[None, :], other=0.0)
            coefficients = tl.dot(block, tl.trans(_rows_at(x, earlier, present, columns, n)), coefficients,
                                  input_precision=PRECISION)
            squares += tl.sum(block * block, axis=1)
        if first_pass != 0:  # the first pass projects the normalised panel (`_load_panel`)
            coefficients /= tl.maximum(tl.sqrt_rn(squares), 1e-30)[:, None]
        out = partial_ptr + (matrix * tl.num_programs(1) + share) * PANEL * n
        for c0 in range(0, n, CHUNK):
            columns = c0 + chunk
            tl.store(out + local[:, None] * n + columns[None, :],
                     tl.dot(coefficients, _rows_at(x, earlier, present, columns, n), input_precision=PRECISION),
                     mask=(columns < n)[None, :])


@triton.jit(do_not_specialize=["panel", "first_pass"])
def _orthonormalize_finish_kernel(x_ptr, values_ptr, norm_ptr, start_ptr, again_ptr, partial_ptr, cluster_gap,
                                  group_gap, second_pass_below, n, panel, first_pass, programs, BLOCK_N: tl.constexpr,
                                  PANEL: tl.constexpr, EARLIER: tl.constexpr, UNROLLED: tl.constexpr):
    """The split Gram-Schmidt's second half: program b subtracts the summed partial corrections
    from the panel's first-cluster members, orthonormalises each cluster within the panel and
    stores the panel; the first pass decides whether the second runs (again_ptr, Kahan's test as
    `_orthonormalize_kernel`), and the second moves start_ptr on for the next panel. A panel whose
    members are each alone in their cluster within it, the first not continuing a cluster from
    earlier panels, is left as it is, neither read nor written: its vectors come unit from
    `_transposed`."""
    matrix = tl.program_id(0).to(tl.int64)
    local = tl.arange(0, PANEL)
    x, cols, valid, members, inside, cluster, first_cluster, continued, start, next_start = _split_panel(
        x_ptr, values_ptr, norm_ptr, start_ptr, cluster_gap, group_gap, n, panel, BLOCK_N, PANEL)
    if first_pass != 0:
        needed = _panel_needs_work(continued, inside, cluster, first_cluster)
    else:
        needed = tl.load(again_ptr + matrix) != 0
    if needed:
        block = _load_panel(x, members, inside, cols, valid, n, first_pass != 0)
        if continued:
            correction = tl.zeros((PANEL, BLOCK_N), tl.float32)
            for share in range(0, tl.cdiv(panel * PANEL - start, EARLIER)):  # the shares that hold members
                correction += tl.load(partial_ptr + (matrix * programs + share) * PANEL * n + local[:, None] * n
                                      + cols[None, :], mask=valid[None, :], other=0.0)
            block -= tl.where((cluster == first_cluster)[:, None], correction, 0.0)
        block, shortest = _within_clusters(block, cluster, first_cluster, continued, PANEL, UNROLLED)
        tl.store(x + members[:, None] * n + cols[None, :], block, mask=inside[:, None] & valid[None, :])
        tl.store(again_ptr + matrix, (shortest < second_pass_below).to(tl.int32), mask=first_pass != 0)
    else:
        tl.store(again_ptr + matrix, 0, mask=first_pass != 0)  # nothing done: no second pass
    tl.store(start_ptr + matrix, next_start, mask=first_pass == 0)


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
def _row_block(w, first, start, ks, members, n):
    """Pointers and mask of a block of an n x n matrix w: rows first + members, columns start + ks (a panel's
    reflectors in w, or a program's vectors in Z^T)."""
    rows, cols = first + members, start + ks
    return w + rows[:, None] * n + cols[None, :], (rows < n)[:, None] & (cols < n)[None, :]


@triton.jit
def _compact_wy_kernel(w_ptr, tau_ptr, t_ptr, n, REFLECTORS: tl.constexpr, CHUNK: tl.constexpr):
    """Program (b, panel): the triangular T of H_first ... H_last = I - V T V^T for the panel's REFLECTORS
    reflectors (LAPACK's dlarft, forward and columnwise): T[i, i] = tau_i, T[:i, i] = -tau_i T[:i, :i] G[:i, i],
    G = V^T V summed over the panel's nonzero columns CHUNK at a time. t is [batch, panels, REFLECTORS, REFLECTORS].
    Row j of w holds v_j in its columns after j, and the tridiagonalisation's leftovers before: this kernel writes
    zeros over those from the panel's first chunk on, so the back-transformation reads V^T's chunks unmasked."""
    matrix, panel = tl.program_id(0).to(tl.int64), tl.program_id(1)
    first = panel * REFLECTORS
    w = w_ptr + matrix * n * n
    members = tl.arange(0, REFLECTORS)
    ks = tl.arange(0, CHUNK)
    gram = tl.zeros((REFLECTORS, REFLECTORS), tl.float32)
    # this loop and the back-transformation's start past zero (unlike _gram_schmidt_pass's): every H200 test
    # and bench output passed with them
    for start in range((first + 1) // CHUNK * CHUNK, n, CHUNK):
        pointers, inside = _row_block(w, first, start, ks, members, n)
        chunk = tl.where((start + ks)[None, :] > (first + members)[:, None], tl.load(pointers, mask=inside, other=0.0),
                         0.0)
        tl.store(pointers, chunk, mask=inside)
        gram = tl.dot(chunk, tl.trans(chunk), gram, input_precision="ieee")
    taus = tl.load(tau_ptr + matrix * n + first + members, mask=first + members < n, other=0.0)
    rows, cols = members[:, None], members[None, :]
    t = tl.zeros((REFLECTORS, REFLECTORS), tl.float32)
    for i in range(REFLECTORS):
        tau = tl.sum(tl.where(members == i, taus, 0.0))
        g = tl.sum(tl.where((rows == i) & (cols < i), gram, 0.0), axis=0)  # G[i, :i] = G[:i, i]
        column = tl.where(members == i, tau, -tau * tl.sum(t * g[None, :], axis=1))
        t = tl.where(cols == i, column[:, None], t)
    tl.store(t_ptr + (matrix * tl.num_programs(1) + panel) * REFLECTORS * REFLECTORS + rows * REFLECTORS + cols, t)


@triton.jit
def _back_transform_kernel(w_ptr, t_ptr, z_ptr, q_ptr, n, VECTORS: tl.constexpr, REFLECTORS: tl.constexpr,
                           CHUNK: tl.constexpr, PRECISION: tl.constexpr):
    """Program (block, b): Q[:, the block's VECTORS vectors] = H_0 H_1 ... H_{n-3} Z, a panel of REFLECTORS
    reflectors at a time, last panel first, in compact WY form (`_compact_wy_kernel`): on Z^T's rows,
    Z^T -= ((Z^T V) T^T) V^T, tensor-core products whose K (the panel's nonzero columns) is walked CHUNK columns
    at a time through global memory (Z^T's rows updated in place in z, [batch, vector, n]). One pass over the
    chunks a panel: each chunk is updated by the panel and, while in registers, gives its share of the next
    panel's projection Z^T V, so Z^T is read and written once a panel; the first panel writes Q [batch, n,
    vector] instead. The grid's first axis is the block, so a matrix's programs run side by side and share its
    reflectors in L2."""
    matrix = tl.program_id(1).to(tl.int64)
    first_vector, local_vectors = tl.program_id(0) * VECTORS, tl.arange(0, VECTORS)
    vectors = first_vector + local_vectors
    members = tl.arange(0, REFLECTORS)
    ks = tl.arange(0, CHUNK)
    w, z, q = w_ptr + matrix * n * n, z_ptr + matrix * n * n, q_ptr + matrix * n * n
    panels = tl.cdiv(n, REFLECTORS)
    projection = tl.zeros((VECTORS, REFLECTORS), tl.float32)  # Z^T V of the panel to apply
    for start in range(((panels - 1) * REFLECTORS + 1) // CHUNK * CHUNK, n, CHUNK):
        block_pointers, mask = _row_block(z, first_vector, start, ks, local_vectors, n)
        pointers, inside = _row_block(w, (panels - 1) * REFLECTORS, start, ks, members, n)
        projection = tl.dot(tl.load(block_pointers, mask=mask, other=0.0),
                            tl.trans(tl.load(pointers, mask=inside, other=0.0)), projection, input_precision=PRECISION)
    for p in range(panels):
        panel = panels - 1 - p
        first = panel * REFLECTORS
        begin = (first + 1) // CHUNK * CHUNK  # the panel's reflectors are zero before column first + 1
        t_transposed = tl.load(t_ptr + (matrix * panels + panel) * REFLECTORS * REFLECTORS
                               + members[None, :] * REFLECTORS + members[:, None])
        projection = tl.dot(projection, t_transposed, input_precision=PRECISION)
        following = tl.zeros((VECTORS, REFLECTORS), tl.float32)  # the next panel's Z^T V
        for start in range(tl.maximum(first + 1 - REFLECTORS, 0) // CHUNK * CHUNK, n, CHUNK):
            cols = start + ks
            block_pointers, mask = _row_block(z, first_vector, start, ks, local_vectors, n)
            block = tl.load(block_pointers, mask=mask, other=0.0)
            pointers, inside = _row_block(w, first, start, ks, members, n)
            block -= tl.dot(projection, tl.load(pointers, mask=inside & (cols >= begin)[None, :], other=0.0),
                            input_precision=PRECISION)
            if panel == 0:
                tl.store(q + cols[None, :] * n + vectors[:, None], block, mask=mask)
            else:
                tl.store(block_pointers, block, mask=mask)
                pointers, inside = _row_block(w, first - REFLECTORS, start, ks, members, n)
                following = tl.dot(block, tl.trans(tl.load(pointers, mask=inside, other=0.0)), following,
                                   input_precision=PRECISION)
        projection = following
        tl.debug_barrier()  # the next panel reads what this one wrote


def _on_chip(a: torch.Tensor, max_sweeps: int = JACOBI_MAX_SWEEPS):
    """(V, diagonal, the sweeps taken [batch, 1] int32, the checks' bounds [batch, 3]) of the on-chip Jacobi,
    unsorted, for each matrix of a [batch, N, N]."""
    count, size, _ = a.shape
    vectors = torch.empty((count, size, size), device=a.device, dtype=torch.float32)
    values = torch.empty((count, size), device=a.device, dtype=torch.float32)
    sweeps = torch.empty((count, 1), device=a.device, dtype=torch.int32)
    bounds = _bounds(count, device=a.device)
    _jacobi_kernel[(count,)](a, vectors, values, sweeps, bounds, EPS, N=size, MAX_SWEEPS=max_sweeps,
                             num_warps=jacobi_warps(size))
    return vectors, values, sweeps, bounds


def _bounds(*shape, device):
    """The buffer for a launch's checks' bounds ([*shape, 3]): zeros, so that a launch compiled and not run
    (`compare.hopper_compile`) passes the check."""
    return torch.zeros(*shape, 3, device=device)


def _check_bounds(bounds: torch.Tensor) -> None:
    """`ports.eigh.check_values` on the three bounds the kernels left (reduced over the batch on the device by
    `_jacobi` or `_tridiagonal`): the call's one synchronisation."""
    nonfinite, largest, asymmetry = bounds.tolist()
    check_values(nonfinite == 0, largest, asymmetry)


def _empty(*shape, device):
    return torch.empty(shape, device=device, dtype=torch.float32)


def _registers_for(programs_an_sm: int, warps: int) -> int:
    """The most registers a thread that let programs_an_sm programs of `warps` warps share an SM: each of its four
    schedulers has 16384 registers and holds whole warps, and registers go to a thread 8 at a time."""
    return 16384 // (32 * -(-programs_an_sm * warps // 4)) // 8 * 8


def _register_cap(programs: int, uncapped_an_sm: int, programs_an_sm: int, warps: int,
                  device: torch.device) -> int | None:
    """The register cap a thread that lets programs_an_sm programs share an SM (`_registers_for`), for a launch
    whose programs outnumber what the SMs hold uncapped (uncapped_an_sm each, at the registers it compiles to);
    None otherwise, and on CPU tensors (`compare.hopper_compile`)."""
    if device.type != "cuda":
        return None
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return _registers_for(programs_an_sm, warps) if programs > uncapped_an_sm * sms else None


def _tridiagonal_register_cap(programs: int, warps: int, block_n: int, device: torch.device) -> int | None:
    """Register cap a thread for the one-launch tridiagonalisation of matrices padded to 512 on
    MANY_TRIDIAGONAL_WARPS warps, where its programs outnumber what the SMs hold uncapped. Each of an SM's four
    schedulers has 16384 registers and holds whole warps: at the 196 registers that kernel compiles to (H200,
    Triton 3.6) an SM holds 4 two-warp programs, at 168 (`_registers_for` TRIDIAGONAL_PROGRAMS_AN_SM) 6, so 640
    matrices run in one wave instead of two: faster in a driver A/B at 640x512, though each thread spills 72 bytes
    (results/h200/eigh-variants-register-cap-one-warp.json). Not set where it was not measured: fewer programs,
    other padded sizes (the register count differs); with 16-row tiles on 4 warps (few matrices) it was slower.
    The Pallas port's kernel runs with 168 registers uncapped (XLA's Triton on the H200, as the profiler's trace
    records it: `compare.kernel_times`), and its Triton compiler parameters have no cap. On CPU tensors
    (`compare.hopper_compile`) no cap is set."""
    if warps != MANY_TRIDIAGONAL_WARPS or block_n != 512:
        return None
    return _register_cap(programs, uncapped_an_sm=4, programs_an_sm=TRIDIAGONAL_PROGRAMS_AN_SM, warps=warps,
                         device=device)


def _product_register_cap(programs: int, block_n: int, device: torch.device) -> int | None:
    """Register cap a thread for the over-launches product of matrices padded to 1024, where column 0's programs
    outnumber the three four-warp programs an SM holds at the 159 registers it compiles to (H200, Triton 3.6): 128,
    four an SM: faster in a driver A/B at 60x1024, though each thread spills 8 bytes; a cap of 96 (five an SM) was
    slower (results/h200/eigh-variants-product-register-cap.json). Not set elsewhere: at 8x2048, whose 256 programs
    the SMs hold uncapped, a cap was slower. Pallas's Triton compiler parameters have no cap."""
    if block_n != 1024:
        return None
    return _register_cap(programs, uncapped_an_sm=3, programs_an_sm=4, warps=OVER_LAUNCHES_PRODUCT_WARPS,
                         device=device)


def _project_register_cap(programs: int, block_n: int, device: torch.device) -> int | None:
    """Register cap a thread for the split Gram-Schmidt's project kernel at a padded 512, where its programs
    outnumber the two four-warp programs an SM holds at the 224 to 229 registers it compiles to (H200, Triton 3.6):
    168, three an SM: faster at 640x512 in two driver A/Bs (results/h200/eigh-variants-gram-schmidt-register-caps.json).
    Not set elsewhere: at 60x1024 it was slower, and 128 (four an SM) tied or lost at both sizes."""
    if block_n != 512:
        return None
    return _register_cap(programs, uncapped_an_sm=2, programs_an_sm=3, warps=GRAM_SCHMIDT_WARPS, device=device)


def _reduce(a: torch.Tensor, single: bool | None = None):
    """Householder tridiagonalisation of each A / max|A|: (w, d, e, tau, scale, the checks' bounds
    [batch, blocks, 3]), the reflectors in w's rows.
    single: one launch, one program per matrix, blocked in panels of TRIDIAGONAL_PANEL columns (default:
    ports.eigh.one_launch); otherwise the same blocking over launches: two a column (the column's product
    p = A v_j over many programs, `ports.eigh.product_programs`), two more a panel."""
    batch, n, _ = a.shape
    block_n, rows, blocks = row_blocks(n)
    w, partial = _empty(batch, n, n, device=a.device), _empty(batch, blocks, device=a.device)
    d, e, tau = (_empty(batch, n, device=a.device) for _ in range(3))
    scale = _empty(batch, device=a.device)
    panel = _empty(batch, 2 * TRIDIAGONAL_PANEL + 1, block_n, device=a.device)
    bounds = _bounds(batch, blocks, device=a.device)
    _symmetrize_kernel[(batch, blocks)](a, w, partial, bounds, n, BLOCK_N=block_n, ROWS=rows, num_warps=8)
    if one_launch(batch, n) if single is None else single:
        tile_rows, warps = tridiagonal_tile(batch)
        product_cols = min(block_n, SYMMETRIC_PRODUCT_COLS)
        products = _empty(batch, block_n // product_cols, block_n, device=a.device)
        _tridiagonalize_blocked_kernel[(batch,)](w, d, e, tau, scale, partial, panel, products, n, blocks,
                                                 BLOCK_N=block_n, ROWS=tile_rows,
                                                 PARTIALS=triton.next_power_of_2(blocks), NB=TRIDIAGONAL_PANEL,
                                                 CHUNK=PANEL_CHUNK, COLS=min(block_n, TRIDIAGONAL_COLS),
                                                 PRODUCT_ROWS=SYMMETRIC_PRODUCT_WARP_ROWS * warps,
                                                 PRODUCT_COLS=product_cols, PRODUCT_STAGES=product_stages(batch),
                                                 num_warps=warps,
                                                 maxnreg=_tridiagonal_register_cap(batch, warps, block_n, a.device))
        return w, d, e, tau, scale, bounds
    sums = _empty(batch, PRODUCT_PROGRAMS, block_n, device=a.device)
    column = dict(BLOCK_N=block_n, PARTIALS=triton.next_power_of_2(blocks), NB=TRIDIAGONAL_PANEL,
                  CHUNK=column_panel_chunk(block_n), SHARES=PRODUCT_PROGRAMS, SHARE_ROWS=rows,
                  num_warps=COLUMN_KERNEL_WARPS)
    update_cols = min(block_n, PANEL_UPDATE_COLS)
    product_cap = _product_register_cap(batch * product_programs(n - 1), block_n, a.device)  # column 0's programs
    for j in range(n):
        shares = product_programs(n - j)  # the programs of column j - 1's product
        if j % TRIDIAGONAL_PANEL == 0 and j > 0:  # close the panel: its last w, then the trailing update
            _panel_column_kernel[(batch,)](w, d, e, tau, scale, partial, panel, sums, n, blocks, j, shares,
                                           FINISH_ONLY=True, **column)
            grid = (batch, triton.cdiv(n - j, TRIDIAGONAL_ROWS), triton.cdiv(n - j, update_cols))
            _panel_update_kernel[grid](w, scale, panel, n, j, BLOCK_N=block_n, ROWS=TRIDIAGONAL_ROWS, COLS=update_cols,
                                       NB=TRIDIAGONAL_PANEL, num_warps=4)
        _panel_column_kernel[(batch,)](w, d, e, tau, scale, partial, panel, sums, n, blocks, j, shares,
                                       FINISH_ONLY=False, **column)
        _panel_product_kernel[(batch, product_programs(n - j - 1))](
            w, scale, panel, sums, n, j, BLOCK_N=block_n, ROWS=OVER_LAUNCHES_PRODUCT_ROWS, NB=TRIDIAGONAL_PANEL,
            SHARES=PRODUCT_PROGRAMS, COLS=block_n // OVER_LAUNCHES_PRODUCT_BLOCKS,
            num_warps=OVER_LAUNCHES_PRODUCT_WARPS, maxnreg=product_cap)
    return w, d, e, tau, scale, bounds


def _eigenvalues(d: torch.Tensor, e: torch.Tensor, scale: torch.Tensor):
    """T's eigenvalues ascending, T's norm bound, and L (the eigenvalues times A's scale)."""
    batch, n = d.shape
    values, eigenvalues = _empty(batch, n, device=d.device), _empty(batch, n, device=d.device)
    norm = _empty(batch, device=d.device)
    _bisect_kernel[(batch, triton.cdiv(n, LANES))](
        d, e, scale, values, norm, eigenvalues, n, PIVOT_FLOOR, ITERATIONS=BISECTION_ITERATIONS, LANES=LANES,
        APPROXIMATE=not triton.knobs.runtime.interpret, num_warps=1)
    return values, norm, eigenvalues


@triton.jit
def _transpose_kernel(src_ptr, dst_ptr, lengths_ptr, n, BLOCK: tl.constexpr, NORMALISE: tl.constexpr):
    """Program (b, i, j): dst[b] = src[b]^T on the BLOCK x BLOCK tile (i, j), read and written in rows (the
    compiler exchanges the tile through shared memory), where torch's strided copy reads one of the two
    layouts a column at a time, slower (results/h200/NOTES.md). NORMALISE: src's column c over
    lengths[b, c] (dst's rows unit vectors; a zero length leaves its column as it is)."""
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
    _transpose_kernel[(batch, triton.cdiv(n, TRANSPOSE_TILE), triton.cdiv(n, TRANSPOSE_TILE))](
        src, dst, src if lengths is None else lengths, n, BLOCK=TRANSPOSE_TILE, NORMALISE=lengths is not None,
        num_warps=4)
    return dst


def _vectors(d: torch.Tensor, e: torch.Tensor, values: torch.Tensor, norm: torch.Tensor):
    """T's orthonormal eigenvectors as the rows of z [batch, n, n], in the order of `values`. Inverse iteration
    works on their transpose (`_transposed` between the two)."""
    batch, n = d.shape
    z, columns = _empty(batch, n, n, device=d.device), _empty(batch, n, n, device=d.device)
    scratch, lengths = _empty(batch, 2, n, n, device=d.device), _empty(batch, n, device=d.device)
    for step in range(INVERSE_ITERATIONS):
        if step:
            _transposed(z, columns)
        _inverse_iteration_kernel[(batch, triton.cdiv(n, LANES))](d, e, values, norm, columns, scratch, lengths, n,
                                                                  EPS, GROUP_GAP * EPS, SPARSE_GROUP_GAP * EPS,
                                                                  FIRST=step == 0, LANES=LANES, num_warps=1)
        _orthonormalize(_transposed(columns, z, lengths), values, norm,
                        CLUSTER_GAP if step == INVERSE_ITERATIONS - 1 else EARLY_CLUSTER_GAP)  # z, in place
    return _repair(z, d, e, values, norm)[0]


def _repair(z: torch.Tensor, d: torch.Tensor, e: torch.Tensor, values: torch.Tensor, norm: torch.Tensor):
    """z with every vector whose residual exceeds REPAIR_RESIDUAL eps ||T|| made orthogonal to the sound
    ones (changed in place), and the residuals [batch, n]."""
    batch, n, _ = z.shape
    block_n = triton.next_power_of_2(n)
    residual = _empty(batch, n, device=z.device)
    _repair_kernel[(batch,)](z, d, e, values, norm, residual, REPAIR_RESIDUAL * EPS, n, BLOCK_N=block_n, PANEL=PANEL,
                             num_warps=vector_panel_warps(block_n))
    return z, residual


def _two_programs_an_sm(programs: int, warps: int, device: torch.device) -> int | None:
    """Register cap a thread for the one-program-a-matrix Gram-Schmidt: where its programs queue for the SMs, so
    that two fit an SM (`_registers_for`), if that leaves at least 128 (8 warps: 128; it compiles to 255, one
    program an SM): faster where its programs queued, although each thread spills 424 bytes
    (results/h200/NOTES.md). None (no cap) otherwise. The Pallas port cannot do
    this: Pallas's Triton compiler parameters have no register cap."""
    if not 128 <= _registers_for(2, warps) < 255:
        return None
    return _register_cap(programs, uncapped_an_sm=1, programs_an_sm=2, warps=warps, device=device)


def _orthonormalize(z: torch.Tensor, values: torch.Tensor, norm: torch.Tensor, cluster_gap: float,
                    split: bool | None = None):
    """z's rows orthonormal within each cluster of `values` (gaps below cluster_gap max|values|, or GROUP_GAP eps
    norm): z, changed in place. Its rows come unit from `_transposed`: a panel with no cluster in it or reaching
    into it is left as it is. split: each panel's projections shared among many programs per matrix, four launches
    a panel (default: ports.eigh.split_gram_schmidt); otherwise one program per matrix."""
    batch, n, _ = z.shape
    block_n = triton.next_power_of_2(n)
    unrolled = gram_schmidt_unrolled(batch)
    if not (split_gram_schmidt(n) if split is None else split):
        warps = vector_panel_warps(block_n)
        _orthonormalize_kernel[(batch,)](z, values, norm, cluster_gap, GROUP_GAP * EPS, SECOND_PASS_BELOW, n,
                                         BLOCK_N=block_n, PANEL=PANEL, UNROLLED=unrolled, num_warps=warps,
                                         maxnreg=_two_programs_an_sm(batch, warps, z.device))
        return z
    panels = triton.cdiv(n, PANEL)
    programs, earlier = gram_schmidt_shares(n)
    start, again = (torch.zeros(batch, device=z.device, dtype=torch.int32) for _ in range(2))
    partial = _empty(batch, programs, PANEL, n, device=z.device)
    project_cap = _project_register_cap(batch * programs, block_n, z.device)
    finish_warps = gram_schmidt_finish_warps(block_n)
    args = (z, values, norm, start, again, partial, cluster_gap, GROUP_GAP * EPS, SECOND_PASS_BELOW, n)
    for panel in range(panels):
        for first_pass in (1, 0):
            _orthonormalize_project_kernel[(batch, programs)](*args, panel, first_pass, BLOCK_N=block_n, PANEL=PANEL,
                                                              EARLIER=earlier, CHUNK=GRAM_SCHMIDT_CHUNK,
                                                              PRECISION=GRAM_SCHMIDT_PRECISION,
                                                              num_warps=GRAM_SCHMIDT_WARPS, maxnreg=project_cap)
            _orthonormalize_finish_kernel[(batch,)](*args, panel, first_pass, programs, BLOCK_N=block_n, PANEL=PANEL,
                                                    EARLIER=earlier, UNROLLED=unrolled, num_warps=finish_warps)
    return z


def _back_transform(w: torch.Tensor, tau: torch.Tensor, z: torch.Tensor):
    """Q = H_0 ... H_{n-3} z^T: A's eigenvectors as columns (z is overwritten, and w's entries before each
    reflector)."""
    batch, n, _ = z.shape
    panels = triton.cdiv(n, BACK_TRANSFORM_REFLECTORS)
    t = _empty(batch, panels, BACK_TRANSFORM_REFLECTORS, BACK_TRANSFORM_REFLECTORS, device=z.device)
    _compact_wy_kernel[(batch, panels)](w, tau, t, n, REFLECTORS=BACK_TRANSFORM_REFLECTORS,
                                        CHUNK=BACK_TRANSFORM_CHUNK, num_warps=BACK_TRANSFORM_WARPS)
    q = _empty(batch, n, n, device=z.device)
    _back_transform_kernel[(triton.cdiv(n, BACK_TRANSFORM_VECTORS), batch)](
        w, t, z, q, n, VECTORS=BACK_TRANSFORM_VECTORS, REFLECTORS=BACK_TRANSFORM_REFLECTORS,
        CHUNK=BACK_TRANSFORM_CHUNK, PRECISION=BACK_TRANSFORM_PRECISION, num_warps=BACK_TRANSFORM_WARPS)
    return q


def _tridiagonal(a: torch.Tensor):
    """(Q, L, the checks' bounds) by tridiagonalisation, bisection, inverse iteration and back-transformation
    (n > 64)."""
    w, d, e, tau, scale, bounds = _reduce(a)
    values, norm, eigenvalues = _eigenvalues(d, e, scale)
    return _back_transform(w, tau, _vectors(d, e, values, norm)), eigenvalues, bounds.amax(dim=(0, 1))


def _jacobi(a: torch.Tensor):
    """(Q, L, the checks' bounds) by the on-chip Jacobi (n <= 64)."""
    batch, n, _ = a.shape
    size = jacobi_size(n)
    check_offsets(batch, size)
    vectors, values, _, bounds = _on_chip(F.pad(a, (0, size - n, 0, size - n)).contiguous())
    vectors, values = vectors[:, :n, :n], values[:, :n]
    values, order = values.sort(dim=-1)
    return vectors.gather(-1, order.unsqueeze(-2).expand(batch, n, n)), values, bounds.amax(dim=0)


_GRAPHS: OrderedDict = OrderedDict()  # (path, shape, device) -> (CUDA graph, its input buffer, its outputs), newest last


def _replayed(path, a: torch.Tensor):
    """path(a) (`_jacobi` or `_tridiagonal`) from a CUDA graph captured on the shape's first call, replayed on a
    copy of this call's input: every kernel runs on every call, but the graph's launches (over launches two a
    column; four a Gram-Schmidt panel from n = 512; for n <= 64 the pad's, the Jacobi's, the sort's, the gather's and
    the bounds') cost one
    launch from Python. The latest CUDA_GRAPH_SHAPES shapes keep their graphs (and memory)."""
    key = (path, tuple(a.shape), a.device)
    if key not in _GRAPHS:
        static_input = a.clone()
        path(static_input)  # compiles every kernel before the capture
        torch.cuda.synchronize(a.device)
        graph = torch.cuda.CUDAGraph()
        # thread-local: JAX's runtime threads (the driver runs both ports in one process) may call CUDA meanwhile
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            outputs = path(static_input)
        _GRAPHS[key] = (graph, static_input, outputs)
        while len(_GRAPHS) > CUDA_GRAPH_SHAPES:
            _GRAPHS.popitem(last=False)
    _GRAPHS.move_to_end(key)
    graph, static_input, outputs = _GRAPHS[key]
    static_input.copy_(a)
    graph.replay()
    return tuple(output.clone() for output in outputs)  # the graph's buffers are overwritten by the next call


def eigh(a: torch.Tensor):
    """(Q, L) for a [batch, n, n] float32 symmetric: A Q = Q diag(L), L ascending. Waits for its kernels: the
    input's checks are read after the last."""
    check_shape(a)
    batch, n, _ = a.shape
    if batch == 0 or n == 0:
        return torch.empty_like(a), torch.empty((batch, n), device=a.device, dtype=a.dtype)
    a = a.contiguous()
    path = _tridiagonal if n > JACOBI_MAX_N else _jacobi
    if a.is_cuda and CUDA_GRAPH_SHAPES and not shares_the_sms(batch):
        q, values, bounds = _replayed(path, a)
    else:
        q, values, bounds = path(a)
    _check_bounds(bounds)
    return q, values
