"""The eigh Pallas port's divide and conquer: T's eigenvalues and eigenvectors (the Triton port's `divide_conquer`,
kernel for kernel: tears down to single rows, each merge of a level prepared and deflated, its secular equation
solved in float64, Gu and Eisenstat's z, the vectors, the order, the product on tensor cores).

The differences the language forces:
- float64. JAX computes in float64 only with x64 on, and a pallas_call is lowered with the x64 setting of its
  jitted function's first call, not of the trace around it. So the stage is its own jitted call, made under a
  scoped `jax.enable_x64` (`solve`), between the jitted reduction and back-transformation (the Triton port's path is
  one function); every integer is int32 by name (x64 makes JAX's default integers 64-bit).
- Gu and Eisenstat's product over the roots (`_zhat_kernel`): the Triton lowering has no product reduction, so the
  product of the ratios is the exponential of the sum of their logarithms, in float64 (its rounding, about n float64
  units, is far below the float32 vectors'); the sign is z's, as in the Triton port.
- Each kept entry's kept predecessor (the Triton port's running maximum, `tl.associative_scan`, which has no
  lowering here): each kept entry stored at its rank among the kept, its predecessor read one rank down.
- The scratch buffers are pallas_call outputs passed from kernel to kernel; q is updated through
  input_output_aliases: the buffer a level writes (`merge_levels`) and the next eigenvalues (a copy) are aliased.
- Barriers and loads of what a program wrote itself, as in the other stages (`common.barrier`, `masked_load`).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from kernel_support.eigh_common import BACK_TRANSFORM, DIVIDE_CONQUER, merge_levels
from .common import DOT_ALGORITHMS, EPS, barrier, masked_load, per_matrix

I32, F64 = jnp.int32, jnp.float64


def _indices(size):
    return jnp.arange(size, dtype=I32)


def _steps(size, step):
    """The number of steps of `step` entries that cover `size` (a traced int32)."""
    return (size + step - 1) // step


def _whole(shape):
    return pl.BlockSpec(shape, lambda *_: (0,) * len(shape))


def _per_merge(*shape, merges_of=lambda m: m):
    """Merge m's block of a [batch, merges, *shape] scratch buffer, for a grid (b, merge_of(m), ...)."""
    return pl.BlockSpec((None, None, *shape), lambda b, m, *_: (b, merges_of(m)) + (0,) * len(shape))


def _scatter(ref, indices, value, mask):
    """pltriton.store at gathered indices, the masked lanes sent out of range. Interpret mode's store writes every
    lane, a masked one its old value, so a masked lane whose index repeats an unmasked lane's could undo its write;
    out of range, interpret mode drops it (on the GPU a masked lane stores nothing either way)."""
    indices = tuple(jnp.where(mask, index, size) for index, size in zip(indices, ref.shape))
    pltriton.store(ref.at[indices], value, mask=mask)


def _count_kept(mask, dtype=I32):
    return jnp.sum(mask.astype(dtype), dtype=dtype)


def _prepare_kernel(merges_ref, values_ref, e_ref, _, q_ref, perm_ref, dsort_ref, zsort_ref, live_ref, livepos_ref,
                    cd_ref, cz_ref, cidx_ref, kind_ref, by_kind_ref, splits_ref, count_ref, rho_ref, *, block, chunk,
                    interpret):
    """As the Triton port's `_prepare_kernel`: program (b, m) merges merge m of matrix b: D in one sorted order, z,
    rho, the deflation (tiny z; close pairs turned by a Givens rotation of their columns of q, read and written
    through the aliased output), the kept entries compacted and sorted apart by the rows their columns live on."""
    m = pl.program_id(1)
    start, n1, k = merges_ref[3 * m], merges_ref[3 * m + 1], merges_ref[3 * m + 2]
    idx = _indices(block)
    inside, left = idx < k, idx < n1
    d = masked_load(values_ref.at[start + idx], inside)
    beta = e_ref[start + n1 - 1]
    z = masked_load(q_ref.at[start + jnp.where(left, n1 - 1, n1), start + idx], inside)
    z = jnp.where(left, z, jnp.where(beta < 0, -z, z))

    def count_before(step, before):  # the other half's entries before each (left first on ties)
        cols = step * chunk + _indices(chunk)
        other = masked_load(values_ref.at[start + cols], cols < k)
        other_left = (cols < n1)[None, :]
        earlier = jnp.where(left[:, None], ~other_left & (other[None, :] < d[:, None]),
                            other_left & (other[None, :] <= d[:, None]))
        return before + jnp.sum((earlier & (cols < k)[None, :]).astype(I32), axis=1, dtype=I32)

    before = jax.lax.fori_loop(0, _steps(k, chunk), count_before, jnp.zeros((block,), I32))
    rank = jnp.where(left, idx, idx - n1) + before
    _scatter(perm_ref, (rank,), idx, inside)
    _scatter(dsort_ref, (rank,), d.astype(F64), inside)
    _scatter(zsort_ref, (rank,), z.astype(F64), inside)
    _scatter(kind_ref, (rank,), jnp.where(left, 0, 2).astype(I32), inside)  # top rows 0, bottom 2
    barrier(interpret)
    ds, zs = masked_load(dsort_ref.at[idx], inside), masked_load(zsort_ref.at[idx], inside)
    norm2 = jnp.sum(zs * zs)
    rho = jnp.abs(beta).astype(F64) * norm2
    zs = zs / jnp.sqrt(norm2)
    tol = 8 * EPS * jnp.maximum(jnp.max(jnp.abs(ds)), rho)
    keep = inside & (jnp.abs(rho * zs) > tol)
    pltriton.store(zsort_ref.at[idx], jnp.where(keep, zs, 0.0), mask=inside)
    pltriton.store(live_ref.at[idx], keep.astype(I32), mask=inside)
    # each kept entry's kept predecessor: the kept entries stored at their ranks, read one rank down; where no such
    # pair is close, no rotation happens and the pass in order below is skipped (most merges of most matrices)
    kept_rank = jax.lax.cumsum(keep.astype(I32), axis=0) - 1
    _scatter(livepos_ref, (kept_rank,), idx, keep)
    barrier(interpret)
    has_previous = keep & (kept_rank > 0)
    previous = masked_load(livepos_ref.at[kept_rank - 1], has_previous, other=0)
    z_previous = masked_load(zsort_ref.at[previous], has_previous)
    d_previous = masked_load(dsort_ref.at[previous], has_previous)
    pair = jnp.sqrt(z_previous * z_previous + zs * zs)
    close = has_previous & (jnp.abs((ds - d_previous) * (zs / pair) * (z_previous / pair)) <= tol)

    def rotate(p, last):  # a close pair's two columns turned so that one z entry vanishes
        z_last, z_p = zsort_ref[last], zsort_ref[p]
        r = jnp.sqrt(z_last * z_last + z_p * z_p)
        c, s = z_p / r, -z_last / r
        d_last, d_p = dsort_ref[last], dsort_ref[p]

        @pl.when(jnp.abs((d_p - d_last) * c * s) <= tol)
        def _():
            zsort_ref[last] = jnp.zeros((), F64)
            zsort_ref[p] = r
            dsort_ref[last] = d_last * c * c + d_p * s * s
            dsort_ref[p] = d_last * s * s + d_p * c * c
            live_ref[last] = jnp.zeros((), I32)
            kind_p = kind_ref[p]  # a column turned with one of the other half's lives on both halves' rows
            kind_ref[p] = jnp.where(kind_p == kind_ref[last], kind_p, 1).astype(I32)
            rows = start + idx
            col_last, col_p = start + perm_ref[last], start + perm_ref[p]
            q_last = masked_load(q_ref.at[rows, col_last + 0 * idx], inside).astype(F64)
            q_p = masked_load(q_ref.at[rows, col_p + 0 * idx], inside).astype(F64)
            pltriton.store(q_ref.at[rows, col_last + 0 * idx], (c * q_last + s * q_p).astype(jnp.float32), mask=inside)
            pltriton.store(q_ref.at[rows, col_p + 0 * idx], (c * q_p - s * q_last).astype(jnp.float32), mask=inside)
            barrier(interpret)

    def in_order(p, last):  # the last entry kept, in order
        alive = live_ref[p] != 0
        pl.when(alive & (last >= 0))(lambda: rotate(p, last))
        return jnp.where(alive, p, last)

    passes = jnp.where(jnp.max(close.astype(I32)) > 0, k, 0)
    jax.lax.fori_loop(0, passes, in_order, jnp.int32(-1))
    barrier(interpret)
    keep = masked_load(live_ref.at[idx], inside, other=0) != 0
    position = jax.lax.cumsum(keep.astype(I32), axis=0) - 1
    _scatter(cd_ref, (position,), masked_load(dsort_ref.at[idx], inside), keep)
    _scatter(cz_ref, (position,), masked_load(zsort_ref.at[idx], inside), keep)
    _scatter(cidx_ref, (position,), idx, keep)
    pltriton.store(livepos_ref.at[idx], jnp.where(keep, position, -1).astype(I32), mask=inside)
    # the kept columns by the rows they live on (top, both, bottom), for the product's block structure
    kinds = masked_load(kind_ref.at[idx], inside, other=0)
    top, both = _count_kept(keep & (kinds == 0)), _count_kept(keep & (kinds == 1))
    for v, first in enumerate((0, top, top + both)):
        chosen = keep & (kinds == v)
        _scatter(by_kind_ref, (first + jax.lax.cumsum(chosen.astype(I32), axis=0) - 1,), position, chosen)
    splits_ref[0] = top
    splits_ref[1] = top + both
    count_ref[...] = _count_kept(keep)
    rho_ref[...] = rho


def _lanes(count_ref, roots):
    """This program's merge's count of kept entries and its `roots` lanes (roots or poles), with which exist."""
    count = count_ref[...]
    lanes = pl.program_id(2) * roots + _indices(roots)
    return count, lanes, lanes < count


def _secular(cd_ref, cz_ref, count, d_origin, offset, rho, chunk):
    """1 + rho sum_j z_j^2 / (d_j - x) at x = d_origin + offset for each lane, each difference d_j - x formed as
    (d_j - d_origin) - offset."""
    def step(s, f):
        j = s * chunk + _indices(chunk)
        there = j < count
        d_j, z_j = masked_load(cd_ref.at[j], there), masked_load(cz_ref.at[j], there)
        pole = (d_j[None, :] - d_origin[:, None]) - offset[:, None]
        return f + rho * jnp.sum(jnp.where(there[None, :], z_j[None, :] * z_j[None, :] / pole, 0.0), axis=1)

    return jax.lax.fori_loop(0, _steps(count, chunk), step, jnp.ones(d_origin.shape, F64))


def _secular_kernel(cd_ref, cz_ref, count_ref, rho_ref, origin_ref, tau_ref, *, roots, chunk, steps):
    """As the Triton port's `_secular_kernel`: each root by `steps` bisection steps on its offset from the nearer
    pole (the last root lies above the last pole)."""
    count, i, valid = _lanes(count_ref, roots)
    rho = rho_ref[...]
    last = i == count - 1
    d_i = masked_load(cd_ref.at[i], valid)
    d_next = masked_load(cd_ref.at[i + 1], valid & ~last)

    def squares(s, total):
        j = s * chunk + _indices(chunk)
        z_j = masked_load(cz_ref.at[j], j < count)
        return total + jnp.sum(z_j * z_j)

    total = jax.lax.fori_loop(0, _steps(count, chunk), squares, jnp.zeros((), F64))  # |z|^2 of the kept entries
    half = jnp.where(last, rho * total / 2, (d_next - d_i) / 2)
    # f rises between poles: f(middle) > 0 puts the root below the middle, nearer d_i
    below = (_secular(cd_ref, cz_ref, count, d_i, half, rho, chunk) > 0) | last
    d_origin = jnp.where(below, d_i, d_next)

    def bisect(_, bracket):
        low, high = bracket
        tau = (low + high) / 2
        f = _secular(cd_ref, cz_ref, count, d_origin, tau, rho, chunk)
        return jnp.where(f < 0, tau, low), jnp.where(f < 0, high, tau)

    start = (jnp.where(below, 0.0, -half), jnp.where(below, jnp.where(last, rho * total, half), 0.0))
    low, high = jax.lax.fori_loop(0, steps, bisect, start)
    pltriton.store(origin_ref.at[i], jnp.where(below, i, i + 1), mask=valid)
    pltriton.store(tau_ref.at[i], (low + high) / 2, mask=valid)


def _zhat_kernel(cd_ref, cz_ref, count_ref, rho_ref, origin_ref, tau_ref, zhat_ref, *, roots, chunk):
    """As the Triton port's `_zhat_kernel`: zhat_j^2 = prod_i (lambda_i - d_j) / (d_i - d_j) (i = j: rho), the
    product as the exponential of the sum of the ratios' logarithms (no product reduction in this lowering)."""
    count, j, valid = _lanes(count_ref, roots)
    rho = rho_ref[...]
    d_j = masked_load(cd_ref.at[j], valid)

    def step(s, logs):
        i = s * chunk + _indices(chunk)
        inside = i < count
        d_i = masked_load(cd_ref.at[i], inside)
        d_origin = masked_load(cd_ref.at[masked_load(origin_ref.at[i], inside, other=0)], inside)
        tau = masked_load(tau_ref.at[i], inside)
        gap = tau[:, None] - (d_j[None, :] - d_origin[:, None])  # lambda_i - d_j
        apart = jnp.where(i[:, None] == j[None, :], rho, d_i[:, None] - d_j[None, :])
        return logs + jnp.sum(jnp.where(inside[:, None], jnp.log(jnp.abs(gap / apart)), 0.0), axis=0)

    logs = jax.lax.fori_loop(0, _steps(count, chunk), step, jnp.zeros((roots,), F64))
    z_j = masked_load(cz_ref.at[j], valid)
    pltriton.store(zhat_ref.at[j], jnp.where(z_j < 0, -1.0, 1.0) * jnp.exp(logs / 2), mask=valid)


def _vectors_kernel(cd_ref, count_ref, origin_ref, tau_ref, zhat_ref, u_ref, lam_ref, *, roots, chunk):
    """As the Triton port's `_vectors_kernel`: U's columns zhat_j / (d_j - lambda_i), normalised, in float32, and
    the roots as eigenvalues."""
    count, i, valid = _lanes(count_ref, roots)
    d_origin = masked_load(cd_ref.at[masked_load(origin_ref.at[i], valid, other=0)], valid)
    tau = masked_load(tau_ref.at[i], valid)

    def entries(s):
        j = s * chunk + _indices(chunk)
        there = j < count
        entry = masked_load(zhat_ref.at[j], there)[:, None] / (
            (masked_load(cd_ref.at[j], there)[:, None] - d_origin[None, :]) - tau[None, :])
        return j, there[:, None] & valid[None, :], entry

    def squares(s, norm2):
        _, mask, entry = entries(s)
        return norm2 + jnp.sum(jnp.where(mask, entry * entry, 0.0), axis=0)

    scale = 1 / jnp.sqrt(jax.lax.fori_loop(0, _steps(count, chunk), squares, jnp.zeros((roots,), F64)))

    def write(s, carry):
        j, mask, entry = entries(s)
        pltriton.store(u_ref.at[j[:, None], i[None, :]], (entry * scale[None, :]).astype(jnp.float32), mask=mask)
        return carry

    jax.lax.fori_loop(0, _steps(count, chunk), write, 0)
    pltriton.store(lam_ref.at[i], d_origin + tau, mask=valid)


def _order_kernel(merges_ref, q_ref, perm_ref, dsort_ref, livepos_ref, lam_ref, _, __, q_next_ref, values_next_ref,
                  dest_ref, *, block, chunk, interpret):
    """As the Triton port's `_order_kernel`: the merge's eigenvalues (the roots and the deflated D) sorted into the
    next values, and the deflated columns copied to their places in the next q."""
    m = pl.program_id(1)
    start, k = merges_ref[3 * m], merges_ref[3 * m + 2]
    idx = _indices(block)
    inside = idx < k

    def eigenvalue(entries, there):
        position = masked_load(livepos_ref.at[entries], there, other=-1)
        return jnp.where(position >= 0, masked_load(lam_ref.at[position], there & (position >= 0)),
                         masked_load(dsort_ref.at[entries], there))

    value = eigenvalue(idx, inside)

    def count_earlier(s, rank):
        cols = s * chunk + _indices(chunk)
        there = cols < k
        other = eigenvalue(cols, there)
        tie = (other[None, :] == value[:, None]) & (cols[None, :] < idx[:, None])
        earlier = (other[None, :] < value[:, None]) | tie
        return rank + jnp.sum((earlier & there[None, :]).astype(I32), axis=1, dtype=I32)

    rank = jax.lax.fori_loop(0, _steps(k, chunk), count_earlier, jnp.zeros((block,), I32))
    pltriton.store(dest_ref.at[idx], rank, mask=inside)
    _scatter(values_next_ref, (start + rank,), value.astype(jnp.float32), inside)
    barrier(interpret)
    rows = (start + idx)[:, None]

    def move(s, carry):  # the deflated pairs' columns, as they are, `chunk` at a time
        cols = s * chunk + _indices(chunk)
        deflated = (cols < k) & (masked_load(livepos_ref.at[cols], cols < k, other=0) < 0)
        moved = inside[:, None] & deflated[None, :]
        columns = masked_load(q_ref.at[rows, start + masked_load(perm_ref.at[cols], deflated, other=0)[None, :]], moved)
        _scatter(q_next_ref, (rows, start + masked_load(dest_ref.at[cols], deflated, other=0)[None, :]), columns,
                 moved)
        return carry

    jax.lax.fori_loop(0, _steps(k, chunk), move, 0)


def _product_kernel(merges_ref, q_ref, perm_ref, cidx_ref, by_kind_ref, splits_ref, count_ref, dest_ref, u_ref, _,
                    q_next_ref, *, tiles, tile, tile_k, precision):
    """As the Triton port's `_product_kernel`: program (b, m tiles + row tile, root tile) forms a tile of merge m's
    new vectors, rows of the block times the roots' columns of U, over the kept columns that live on those rows."""
    m, row_tile, root_tile = pl.program_id(1) // tiles, pl.program_id(1) % tiles, pl.program_id(2)
    start, n1, k = merges_ref[3 * m], merges_ref[3 * m + 1], merges_ref[3 * m + 2]
    count = count_ref[...]
    rows = row_tile * tile + _indices(tile)
    roots = root_tile * tile + _indices(tile)

    @pl.when(root_tile * tile < count)
    def _():
        low = jnp.where(row_tile * tile >= n1, splits_ref[0], 0)
        high = jnp.where((row_tile + 1) * tile <= n1, splits_ref[1], count)

        def step(s, acc):
            t = low + s * tile_k + _indices(tile_k)
            there = t < high
            kept = masked_load(by_kind_ref.at[t], there, other=0)
            column = masked_load(perm_ref.at[masked_load(cidx_ref.at[kept], there, other=0)], there, other=0)
            a = masked_load(q_ref.at[(start + rows)[:, None], (start + column)[None, :]],
                            (rows < k)[:, None] & there[None, :])
            b = masked_load(u_ref.at[kept[:, None], roots[None, :]], there[:, None] & (roots < count)[None, :])
            return acc + jnp.dot(a, b, precision=precision, preferred_element_type=jnp.float32)

        acc = jax.lax.fori_loop(0, _steps(high - low, tile_k), step, jnp.zeros((tile, tile), jnp.float32))
        target = masked_load(dest_ref.at[masked_load(cidx_ref.at[roots], roots < count, other=0)], roots < count,
                             other=0)
        _scatter(q_next_ref, ((start + rows)[:, None], (start + target)[None, :]), acc,
                 (rows < k)[:, None] & (roots < count)[None, :])


def _level(q, q_next, values, e, merges, count, block, *, interpret):
    """One level of merges (every merge of every matrix in one launch a kernel): (q as read, with the deflation's
    rotations; the next q, written into the buffer q_next as `merge_levels` says; the next eigenvalues)."""
    batch, n = values.shape
    merge = DIVIDE_CONQUER.tiling(block)
    merge_table, matrix, vector = _whole((3 * count,)), per_matrix(n, n), per_matrix(n)
    shape = functools.partial(jax.ShapeDtypeStruct, (batch, count, block))
    scalar = functools.partial(jax.ShapeDtypeStruct, (batch, count))
    one, two = _per_merge(block), _per_merge()
    names = ("perm", "dsort", "zsort", "live", "livepos", "cd", "cz", "cidx", "kind", "by_kind")
    dtypes = (I32, F64, F64, I32, I32, F64, F64, I32, I32, I32)
    q, *prepared, splits, counts, rhos = pl.pallas_call(
        functools.partial(_prepare_kernel, block=block, chunk=merge.ranked, interpret=interpret),
        out_shape=(jax.ShapeDtypeStruct(q.shape, q.dtype), *(shape(dtype) for dtype in dtypes),
                   jax.ShapeDtypeStruct((batch, count, 2), I32), scalar(I32), scalar(F64)),
        grid=(batch, count), in_specs=[merge_table, vector, vector, matrix],
        out_specs=(matrix, *(one for _ in names), _per_merge(2), two, two), input_output_aliases={3: 0},
        compiler_params=pltriton.CompilerParams(num_warps=merge.warps), interpret=interpret, name="eigh_dc_prepare",
    )(merges, values, e, q)
    prepared = dict(zip(names, prepared))
    cd, cz = prepared["cd"], prepared["cz"]
    roots = (batch, count, -(-block // merge.lanes))
    params = pltriton.CompilerParams(num_warps=4)
    origin, taus = pl.pallas_call(
        functools.partial(_secular_kernel, roots=merge.lanes, chunk=merge.chunk, steps=DIVIDE_CONQUER.secular_steps),
        out_shape=(shape(I32), shape(F64)), grid=roots, in_specs=[one, one, two, two], out_specs=(one, one),
        compiler_params=params, interpret=interpret, name="eigh_dc_secular",
    )(cd, cz, counts, rhos)
    zhat = pl.pallas_call(
        functools.partial(_zhat_kernel, roots=merge.lanes, chunk=merge.chunk),
        out_shape=shape(F64), grid=roots, in_specs=[one, one, two, two, one, one], out_specs=one,
        compiler_params=params, interpret=interpret, name="eigh_dc_zhat",
    )(cd, cz, counts, rhos, origin, taus)
    u, lam = pl.pallas_call(
        functools.partial(_vectors_kernel, roots=merge.lanes, chunk=merge.chunk),
        out_shape=(jax.ShapeDtypeStruct((batch, count, block, block), jnp.float32), shape(F64)), grid=roots,
        in_specs=[one, two, one, one, one], out_specs=(_per_merge(block, block), one),
        compiler_params=params, interpret=interpret, name="eigh_dc_vectors",
    )(cd, counts, origin, taus, zhat)
    q_next, values_next, dest = pl.pallas_call(  # values_next starts as a copy of values
        functools.partial(_order_kernel, block=block, chunk=merge.ranked, interpret=interpret),
        out_shape=(jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(values.shape, values.dtype),
                   shape(I32)),
        grid=(batch, count), in_specs=[merge_table, matrix, one, one, one, one, matrix, vector],
        out_specs=(matrix, vector, one), input_output_aliases={6: 0, 7: 1},
        compiler_params=pltriton.CompilerParams(num_warps=merge.warps), interpret=interpret, name="eigh_dc_order",
    )(merges, q, prepared["perm"], prepared["dsort"], prepared["livepos"], lam, q_next, values)
    tiles = -(-block // merge.tile)

    def merge_of(p):
        return p // tiles

    tiled = _per_merge(block, merges_of=merge_of)
    precision = jax.lax.Precision.HIGHEST if interpret else DOT_ALGORITHMS[BACK_TRANSFORM.precision]
    q_next = pl.pallas_call(
        functools.partial(_product_kernel, tiles=tiles, tile=merge.tile, tile_k=merge.tile_k, precision=precision),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype), grid=(batch, count * tiles, tiles),
        in_specs=[merge_table, matrix, tiled, tiled, tiled, _per_merge(2, merges_of=merge_of),
                  _per_merge(merges_of=merge_of), tiled, _per_merge(block, block, merges_of=merge_of), matrix],
        out_specs=matrix, input_output_aliases={9: 0}, compiler_params=params, interpret=interpret,
        name="eigh_dc_product",
    )(merges, q, prepared["perm"], prepared["cidx"], prepared["by_kind"], splits, counts, dest, u, q_next)
    return q, q_next, values_next


@functools.partial(jax.jit, static_argnames=("interpret",))
def _solve(d, e, scale, *, interpret):
    batch, n = d.shape
    levels = merge_levels(n)
    tears = jnp.array([start + left - 1 for _, groups, _ in levels for start, left, _ in groups], I32)
    coupling = jnp.abs(e[:, tears])  # the leaves' eigenvalues: T's diagonal less |beta| on both sides of every tear
    values = d.at[:, tears].add(-coupling).at[:, tears + 1].add(-coupling)
    # the leaves' eigenvectors, in two buffers the levels write in turn (`merge_levels`)
    q = q_next = jnp.broadcast_to(jnp.eye(n, dtype=jnp.float32), (batch, n, n))
    for block, groups, carried in levels:
        if carried:  # halves written by a level of this one's parity, into the buffer this level reads
            entries = jnp.array([(start + r) * n + start + c for start, size in carried for r in range(size)
                                 for c in range(size)], I32)
            flat = q.reshape(batch, n * n)
            q = flat.at[:, entries].set(q_next.reshape(batch, n * n)[:, entries]).reshape(batch, n, n)
        merges = jnp.array([entry for merge in groups for entry in merge], I32)
        # the buffer this level read (turned where pairs deflated) is the one the next level writes
        q_next, q, values = _level(q, q_next, values, e, merges, len(groups), block, interpret=interpret)
    return jnp.swapaxes(q, 1, 2), values, values * scale[:, None]


def solve(d, e, scale, *, interpret):
    """(z, T's eigenvalues, L): T's orthonormal eigenvectors as the rows of z [batch, n, n], T's eigenvalues
    ascending and L (the eigenvalues times A's scale), for the tridiagonal (d, e) of each matrix; one jitted call
    with x64 on (the secular equation is float64), float32 in and out."""
    with jax.enable_x64(True):
        return _solve(d, e, scale, interpret=interpret)
