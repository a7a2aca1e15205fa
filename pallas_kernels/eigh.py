"""Batched symmetric eigendecomposition in Pallas (Triton lowering): the algorithms of triton_kernels/eigh.py.

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

n > 64: the Triton port's pipeline, kernel for kernel and launch for launch: Householder
tridiagonalisation T = H^T (A / max|A|) H (one program per matrix, the trailing matrix in global
memory), bisection on Sturm counts (one lane per eigenvalue), INVERSE_ITERATIONS rounds of inverse
iteration (group shifts, splitting at negligible off-diagonals) each followed by the clusters'
panel Gram-Schmidt, and the back-transformation Q = H Z. Its scratch buffers are pallas_call
outputs, carried between launches through input_output_aliases. The differences: the barriers
(pltriton.debug_barrier) are left out under the interpreter, which has no lowering for them and
runs each program in order, and the loads of what a program wrote itself carry no ".cg" cache
modifier (this JAX's Triton lowering rejects every cache modifier).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from ports.eigh import (BISECTION_ITERATIONS, CLUSTER_GAP, GROUP_GAP, INVERSE_ITERATIONS, JACOBI_MAX_N,
                        JACOBI_MAX_SWEEPS, LANES, PANEL, PIVOT_FLOOR, TILE, check_offsets, jacobi_size, jacobi_warps,
                        validate)

EPS = float(jnp.finfo(jnp.float32).eps)


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


def _jacobi_kernel(a_ref, q_ref, l_ref, *, size, max_sweeps, tolerance):
    """Diagonalises one size x size matrix."""
    rows = jnp.arange(size)
    a = a_ref[...]
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


def _on_chip(a, max_sweeps=JACOBI_MAX_SWEEPS, *, interpret):
    """(V, diagonal) of the on-chip Jacobi, unsorted, for each matrix of a [batch, N, N]."""
    count, size, _ = a.shape
    return pl.pallas_call(
        functools.partial(_jacobi_kernel, size=size, max_sweeps=max_sweeps, tolerance=EPS),
        out_shape=(jax.ShapeDtypeStruct((count, size, size), jnp.float32),
                   jax.ShapeDtypeStruct((count, size), jnp.float32)),
        grid=(count,),
        in_specs=[pl.BlockSpec((None, size, size), lambda i: (i, 0, 0))],
        out_specs=(pl.BlockSpec((None, size, size), lambda i: (i, 0, 0)), pl.BlockSpec((None, size), lambda i: (i, 0))),
        compiler_params=pltriton.CompilerParams(num_warps=jacobi_warps(size), num_stages=1),
        interpret=interpret, name="jacobi_eigh",
    )(a)


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


def _tridiagonalize_kernel(a_ref, w_ref, d_ref, e_ref, tau_ref, scale_ref, work_ref, *, n, block_n, rows_per_tile,
                           interpret):
    """As the Triton port's `_tridiagonalize_kernel`: program b reduces matrix b to T = H^T (A / max|A|) H,
    one Householder column per step, the trailing matrix in w (global memory), rows_per_tile (the
    Triton port's ROWS) full rows at a time; work holds v, w and p = A v_k. The row loops count
    tiles from zero."""
    cols = jnp.arange(block_n)
    local = jnp.arange(rows_per_tile)
    in_cols = cols < n
    v_at, w_at, p_at = jnp.int32(0), jnp.int32(1), jnp.int32(2)  # work's rows (a Python int index fails to interpret)

    def tile_mask(r0):
        return ((r0 + local) < n)[:, None] & in_cols[None, :]

    def biggest_of(r, biggest):
        r0 = r * rows_per_tile
        tile = _load(a_ref.at[pl.ds(r0, rows_per_tile), pl.ds(0, block_n)], tile_mask(r0))
        return jnp.maximum(biggest, jnp.abs(tile))

    biggest = jax.lax.fori_loop(0, pl.cdiv(n, rows_per_tile), biggest_of,
                                jnp.zeros((rows_per_tile, block_n), jnp.float32))
    scale = jnp.max(jnp.max(biggest, axis=1), axis=0)
    scale = jnp.where(scale > 0, scale, 1.0)
    scale_ref[...] = scale

    @pl.loop(0, pl.cdiv(n, rows_per_tile))
    def _(r):  # w = the symmetric part of A, scaled (no overflow or underflow at extreme magnitudes)
        r0 = r * rows_per_tile
        rows, mask = r0 + local, tile_mask(r0)
        tile = _load(a_ref.at[pl.ds(r0, rows_per_tile), pl.ds(0, block_n)], mask)
        transposed = _load(a_ref.at[cols[None, :], rows[:, None]], mask)
        pltriton.store(w_ref.at[pl.ds(r0, rows_per_tile), pl.ds(0, block_n)], (0.5 * tile + 0.5 * transposed) / scale,
                       mask=mask)

    v = jnp.zeros((block_n,), jnp.float32)  # step k - 1's reflector and update, not yet applied to w
    w = jnp.zeros((block_n,), jnp.float32)
    work_ref[v_at, :] = v
    work_ref[w_at, :] = w
    _barrier(interpret)

    def step(k, carry):
        v, w = carry
        row = _load(w_ref.at[k, pl.ds(0, block_n)], in_cols)
        row -= jnp.sum(jnp.where(cols == k, v, 0.0)) * w + jnp.sum(jnp.where(cols == k, w, 0.0)) * v
        d_ref[k] = jnp.sum(jnp.where(cols == k, row, 0.0))
        alpha = jnp.sum(jnp.where(cols == k + 1, row, 0.0))
        sigma = jnp.sum(jnp.where(cols > k + 1, row * row, 0.0))
        norm = jnp.sqrt(alpha * alpha + sigma)
        beta = jnp.where(alpha >= 0, -norm, norm)
        trivial = sigma == 0.0  # nothing to annihilate (and the last two steps)
        tau = jnp.where(trivial, 0.0, (beta - alpha) / jnp.where(trivial, 1.0, beta))
        inverse = jnp.where(trivial, 0.0, 1.0 / jnp.where(trivial, 1.0, alpha - beta))
        reflector = jnp.where(cols == k + 1, 1.0, jnp.where(cols > k + 1, row * inverse, 0.0))
        e_ref[k] = jnp.where(trivial, alpha, beta)  # e[n - 1] = 0
        tau_ref[k] = tau
        below = in_cols & (cols > k)
        pltriton.store(w_ref.at[k, pl.ds(0, block_n)], reflector, mask=below)

        @pl.loop(0, pl.cdiv(n - k - 1, rows_per_tile))  # zero-based: see _orthonormalize_kernel
        def _(block):
            r0 = k + 1 + block * rows_per_tile
            inside = (r0 + local) < n
            mask = inside[:, None] & below[None, :]
            tile = _load(w_ref.at[pl.ds(r0, rows_per_tile), pl.ds(0, block_n)], mask)
            v_rows = _load(work_ref.at[v_at, pl.ds(r0, rows_per_tile)], inside)
            w_rows = _load(work_ref.at[w_at, pl.ds(r0, rows_per_tile)], inside)
            tile -= v_rows[:, None] * w[None, :] + w_rows[:, None] * v[None, :]
            pltriton.store(w_ref.at[pl.ds(r0, rows_per_tile), pl.ds(0, block_n)], tile, mask=mask)
            pltriton.store(work_ref.at[p_at, pl.ds(r0, rows_per_tile)], jnp.sum(tile * reflector[None, :], axis=1),
                           mask=inside)

        _barrier(interpret)
        p = tau * _load(work_ref.at[p_at, pl.ds(0, block_n)], below)
        w = p - (0.5 * tau * jnp.sum(p * reflector)) * reflector
        v = reflector
        work_ref[v_at, :] = v
        work_ref[w_at, :] = w
        _barrier(interpret)
        return v, w

    jax.lax.fori_loop(0, n, step, (v, w))


def _bisect_kernel(d_ref, e_ref, scale_ref, values_ref, norm_ref, l_ref, *, n):
    """As the Triton port's `_bisect_kernel`: program (b, block), lane j finds T_b's j-th smallest
    eigenvalue by BISECTION_ITERATIONS halvings on Sturm counts inside T's Gershgorin interval; it
    writes the eigenvalue and L (times A's scale); block 0 writes the Gershgorin bound ||T||."""
    index = pl.program_id(1) * LANES + jnp.arange(LANES)

    def gershgorin(i, carry):
        lo, hi, previous = carry
        diagonal = d_ref[i]
        radius = jnp.abs(e_ref[i])
        return jnp.minimum(lo, diagonal - previous - radius), jnp.maximum(hi, diagonal + previous + radius), radius

    lo, hi, _ = jax.lax.fori_loop(0, n, gershgorin, (d_ref[0], d_ref[0], jnp.float32(0.0)))
    norm = jnp.maximum(jnp.maximum(jnp.abs(lo), jnp.abs(hi)), 1.0)  # T / max|A| has norm >= 1 unless A = 0

    def halve(_, carry):
        lo_lanes, hi_lanes = carry
        middle = 0.5 * (lo_lanes + hi_lanes)

        def sturm(i, carry):
            count, pivot, coupling = carry  # coupling: e[i - 1]^2
            pivot = d_ref[i] - middle - coupling / pivot
            pivot = jnp.where(jnp.abs(pivot) < PIVOT_FLOOR, -PIVOT_FLOOR, pivot)
            off = e_ref[i]
            return count + (pivot < 0).astype(jnp.int32), pivot, off * off

        count, _, _ = jax.lax.fori_loop(0, n, sturm, (jnp.zeros((LANES,), jnp.int32),
                                                       jnp.full((LANES,), 1.0, jnp.float32), jnp.float32(0.0)))
        below = count > index  # more than j eigenvalues below the middle: the j-th is below it
        return jnp.where(below, lo_lanes, middle), jnp.where(below, middle, hi_lanes)

    lanes = jnp.zeros((LANES,), jnp.float32)
    lo_lanes, hi_lanes = jax.lax.fori_loop(0, BISECTION_ITERATIONS, halve, (lanes + lo, lanes + hi))
    value = 0.5 * (lo_lanes + hi_lanes)
    valid = index < n
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


def _inverse_iteration_kernel(d_ref, e_ref, values_ref, norm_ref, *refs, n, first):
    """As the Triton port's `_inverse_iteration_kernel`: program (b, block), lane j solves
    (T_b - shift_j I) x_j = x_j (first: the pseudo-random start) by Gaussian elimination with
    partial pivoting, elementwise across the lanes; x is [vector, element], the factor and the
    eliminated right-hand side wait in scratch [4, row, lane] for the back substitution. Same
    shifts (one per group of eigenvalues within GROUP_GAP eps ||T||, half a gap below its first),
    splitting and pivot floor. x and scratch are outputs (aliased to the inputs after the first
    step); the lanes' elements are read from the output x, which holds them."""
    x_ref, factors_ref = refs[-2:]
    lanes = pl.program_id(1) * LANES + jnp.arange(LANES)
    block = pl.ds(pl.program_id(1) * LANES, LANES)
    valid = lanes < n
    norm = norm_ref[...]
    floor = EPS * norm
    gap = GROUP_GAP * EPS * norm
    value = _load(values_ref.at[lanes], valid)
    grouped = valid & (((lanes > 0) & (value - _load(values_ref.at[lanes - 1], valid & (lanes > 0)) < gap))
                       | ((lanes < n - 1) & (_load(values_ref.at[lanes + 1], lanes < n - 1) - value < gap)))

    def still_walking(carry):  # walk down each group to its first eigenvalue
        return jnp.max(carry[1].astype(jnp.int32)) > 0

    def walk(carry):
        first_index, walking = carry
        step = walking & (_load(values_ref.at[first_index], walking)
                          - _load(values_ref.at[first_index - 1], walking) < gap)
        first_index -= step.astype(jnp.int32)
        return first_index, step & (first_index > 0)

    first_index, _ = jax.lax.while_loop(still_walking, walk, (lanes, grouped & (lanes > 0)))
    shift = jnp.where(grouped, _load(values_ref.at[first_index], valid) - 0.5 * gap, value)
    zero = jnp.zeros((LANES,), jnp.float32)

    def right_hand_side(i):
        return _start_vector(i, lanes) if first else _load(x_ref.at[lanes, i], valid)

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
        for part, factor in enumerate((pivot, p_b, p_c, p_r)):
            pltriton.store(factors_ref.at[jnp.int32(part), i, block], factor, mask=valid)
        return head, head_next, rhs

    start = (d_ref[0] - shift, zero + _split(e_ref[0], floor), right_hand_side(jnp.int32(0)))
    head, _, rhs = jax.lax.fori_loop(0, n - 1, eliminate, start)
    value = rhs / _pivot(head, floor)
    pltriton.store(x_ref.at[lanes, jnp.int32(n - 1)], value, mask=valid)

    def substitute(t, carry):
        value, later = carry
        i = n - 1 - t
        factor = [factors_ref.at[jnp.int32(part), i, block] for part in range(4)]
        value, later = (_load(factor[3], valid) - _load(factor[1], valid) * value
                        - _load(factor[2], valid) * later) / _load(factor[0], valid, 1.0), value
        pltriton.store(x_ref.at[lanes, i], value, mask=valid)
        return value, later

    jax.lax.fori_loop(1, n, substitute, (value, zero))


def _orthonormalize_kernel(values_ref, norm_ref, _, x_ref, *, n, block_n, interpret):
    """As the Triton port's `_orthonormalize_kernel`: program b makes its vectors orthonormal within
    clusters (eigenvalues each within CLUSTER_GAP ||T|| of the previous), block Gram-Schmidt over
    panels of PANEL vectors, twice: against the earlier members of the panel's first vector's
    cluster, row by row, then modified Gram-Schmidt within the panel. x (the input, aliased) is
    read and written through the output ref."""
    cols = jnp.arange(block_n)
    local = jnp.arange(PANEL)
    valid = cols < n
    tolerance = CLUSTER_GAP * norm_ref[...]

    def panel_step(panel, start):  # the cluster of the panel's first vector starts at `start`
        members = panel * PANEL + local
        inside = members < n
        mask = inside[:, None] & valid[None, :]
        gaps = _load(values_ref.at[members], inside) - _load(values_ref.at[members - 1], inside & (members > 0))
        breaks = inside & ((members == 0) | (gaps > tolerance))
        start = jnp.maximum(start, jnp.max(jnp.where(breaks & (local == 0), members, 0)))
        panel_rows = x_ref.at[pl.ds(panel * PANEL, PANEL), pl.ds(0, block_n)]
        block = _load(panel_rows, mask)
        block /= jnp.maximum(jnp.sqrt(jnp.sum(block * block, axis=1)), 1e-30)[:, None]

        def against_earlier(earlier_block, block):
            correction = jnp.zeros((PANEL, block_n), jnp.float32)
            for q in range(PANEL):  # row by row, as the Triton port (no dot)
                earlier = start + earlier_block * PANEL + q
                vector = _load(x_ref.at[earlier, pl.ds(0, block_n)], valid & (earlier < panel * PANEL))
                correction += jnp.sum(block * vector[None, :], axis=1)[:, None] * vector[None, :]
            return block - correction

        for _ in range(2):  # both steps twice: the second removes what cancellation in the first amplified
            # counted from zero: a loop starting at `start` skipped its body on the H200 (Triton 3.6,
            # pipelined loads)
            block = jax.lax.fori_loop(0, pl.cdiv(panel * PANEL - start, PANEL), against_earlier, block)
            for i in range(PANEL):
                row = jnp.sum(jnp.where(local[:, None] == i, block, 0.0), axis=0)
                row /= jnp.maximum(jnp.sqrt(jnp.sum(row * row)), 1e-30)
                later = jnp.sum(block * row[None, :], axis=1)
                block = jnp.where(local[:, None] == i, row[None, :],
                                  jnp.where(local[:, None] > i, block - later[:, None] * row[None, :], block))
        pltriton.store(panel_rows, block, mask=mask)
        start = jnp.maximum(start, jnp.max(jnp.where(breaks, members, 0)))
        _barrier(interpret)
        return start

    jax.lax.fori_loop(0, pl.cdiv(n, PANEL), panel_step, jnp.int32(0))


def _back_transform_kernel(w_ref, tau_ref, z_ref, q_ref, *, n, block_n, vectors_per_program):
    """As the Triton port's `_back_transform_kernel`: program (b, block), Q[:, the block's
    vectors_per_program (COLS) vectors] = H_0 H_1 ... H_{n-3} Z, the reflectors applied last first
    to the vectors held in registers (Z is [vector, element]; Q is written [element, vector]
    through a transposed index)."""
    vectors = pl.program_id(1) * vectors_per_program + jnp.arange(vectors_per_program)
    cols = jnp.arange(block_n)
    valid = cols < n
    mask = (vectors < n)[:, None] & valid[None, :]
    z = _load(z_ref.at[pl.ds(pl.program_id(1) * vectors_per_program, vectors_per_program), pl.ds(0, block_n)], mask)

    def reflect(t, z):
        k = n - 1 - t
        v = _load(w_ref.at[k, pl.ds(0, block_n)], valid & (cols > k))
        return z - (tau_ref[k] * jnp.sum(z * v[None, :], axis=1))[:, None] * v[None, :]

    z = jax.lax.fori_loop(0, n, reflect, z)
    pltriton.store(q_ref.at[cols[None, :], vectors[:, None]], z, mask=mask)


def _tridiagonal(a, *, interpret):
    """(Q, L) by tridiagonalisation, bisection, inverse iteration and back-transformation (n > 64),
    the Triton port's launches: the scratch buffers are outputs, updated in place across launches
    through input_output_aliases."""
    batch, n, _ = a.shape
    block_n = pl.next_power_of_2(n)
    f32 = functools.partial(jax.ShapeDtypeStruct, dtype=jnp.float32)
    call = functools.partial(pl.pallas_call, interpret=interpret)
    per_matrix = lambda *shape: pl.BlockSpec((None, *shape), lambda b, *_: (b,) + (0,) * len(shape))  # noqa: E731
    matrix, vector, scalar = per_matrix(n, n), per_matrix(n), per_matrix()
    w, d, e, tau, scale, _ = call(
        functools.partial(_tridiagonalize_kernel, n=n, block_n=block_n, rows_per_tile=max(1, TILE // block_n),
                          interpret=interpret),
        out_shape=(f32((batch, n, n)), f32((batch, n)), f32((batch, n)), f32((batch, n)), f32((batch,)),
                   f32((batch, 3, block_n))),
        grid=(batch,), in_specs=[matrix], out_specs=(matrix, vector, vector, vector, scalar, per_matrix(3, block_n)),
        compiler_params=pltriton.CompilerParams(num_warps=8), name="eigh_tridiagonalize",
    )(a)
    lanes = (batch, pl.cdiv(n, LANES))
    values, norm, eigenvalues = call(
        functools.partial(_bisect_kernel, n=n),
        out_shape=(f32((batch, n)), f32((batch,)), f32((batch, n))), grid=lanes,
        in_specs=[vector, vector, scalar], out_specs=(vector, scalar, vector),
        compiler_params=pltriton.CompilerParams(num_warps=1), name="eigh_bisect",
    )(d, e, scale)
    z = scratch = None
    for step in range(INVERSE_ITERATIONS):
        carried = () if step == 0 else (z, scratch)
        z, scratch = call(
            functools.partial(_inverse_iteration_kernel, n=n, first=step == 0),
            out_shape=(f32((batch, n, n)), f32((batch, 4, n, n))), grid=lanes,
            in_specs=[vector, vector, vector, scalar] + ([matrix, per_matrix(4, n, n)] if carried else []),
            out_specs=(matrix, per_matrix(4, n, n)), input_output_aliases={4: 0, 5: 1} if carried else {},
            compiler_params=pltriton.CompilerParams(num_warps=1), name="eigh_inverse_iteration",
        )(d, e, values, norm, *carried)
        z = call(
            functools.partial(_orthonormalize_kernel, n=n, block_n=block_n, interpret=interpret),
            out_shape=f32((batch, n, n)), grid=(batch,), in_specs=[vector, scalar, matrix], out_specs=matrix,
            input_output_aliases={2: 0},
            compiler_params=pltriton.CompilerParams(num_warps=min(16, max(4, block_n // 64))),
            name="eigh_orthonormalize",
        )(values, norm, z)
    cols = max(1, min(32, TILE // block_n))
    q = call(
        functools.partial(_back_transform_kernel, n=n, block_n=block_n, vectors_per_program=cols),
        out_shape=f32((batch, n, n)), grid=(batch, pl.cdiv(n, cols)), in_specs=[matrix, vector, matrix],
        out_specs=matrix, compiler_params=pltriton.CompilerParams(num_warps=8), name="eigh_back_transform",
    )(w, tau, z)
    return q, eigenvalues


@functools.partial(jax.jit, static_argnames=("interpret",))
def _eigh(a, *, interpret):
    batch, n, _ = a.shape
    if n > JACOBI_MAX_N:
        return _tridiagonal(a, interpret=interpret)
    size = jacobi_size(n)
    check_offsets(batch, size)
    vectors, values = _on_chip(jnp.pad(a, ((0, 0), (0, size - n), (0, size - n))), interpret=interpret)
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
