"""T's eigenvalues and eigenvectors by divide and conquer (Cuppen's tear, Gu and Eisenstat's z): the candidate
replacement of `bisection` and `inverse_iteration` (issue 55), written for batches of matrices, level by level.

T is torn at the middle of each segment, recursively, down to single rows: at a tear between rows j - 1 and j,
beta = e[j - 1] leaves T as diag(T1', T2') + |beta| v v^T, v = e_{j-1} + sign(beta) e_j, T1' and T2' with |beta|
taken from their touching diagonal entries. A single row is its own eigenpair. (Leaves of up to 32 rows solved by
the on-chip Jacobi cost accuracy against single rows, whose small merges cost little: docs/findings.md,
"Divide and conquer's leaves and first GPU run".) Each
merge of a level (all merges of every matrix in one launch a kernel):
1. `_prepare_kernel`, one program a merge: D (the halves' eigenvalues) merged into one sorted order, z = Q^T v
   (the last row of the left half's vectors, the first of the right's), rho = |beta| |z|^2, z normalised; the
   deflation: a z entry below tol = 8 eps max(|D|, rho) drops out (its pair is already an eigenpair), and two
   entries of D closer than tol after a Givens rotation of their columns of Q drop one (a pass in order, run only
   where some kept pair is that close); the rest compacted, and sorted apart by the rows their columns live on.
2. `_secular_kernel`: each root of 1 + rho sum z_j^2 / (d_j - x) in float64, by `DIVIDE_CONQUER.secular_steps`
   bisection steps on its offset from the nearer pole (no convergence test: nothing data-dependent, nothing that
   can diverge).
3. `_zhat_kernel`: Gu and Eisenstat's z, for which the computed roots are exact, so that the vectors are orthogonal
   without any Gram-Schmidt: zhat_j^2 = prod_i (lambda_i - d_j) / (d_i - d_j) (i = j: rho), in float64.
4. `_vectors_kernel`: U's columns zhat_j / (d_j - lambda_i), normalised, rounded to float32.
5. `_order_kernel`: the merge's eigenvalues (the roots and the deflated D) sorted, the deflated columns copied.
6. `_product_kernel`: the merge's new vectors Q U for the roots' columns, the level's one O(k^3) work, each row
   tile over only the columns that live on its rows.
Every difference lambda_i - d_j is formed from the root's offset and the exact difference of two float32 poles,
never from two rounded eigenvalues. The CPU prototype with the same steps, and what it measured against the gates:
results/h200/experiments/eigh-prototypes/divide_conquer.py; docs/findings.md, "Divide and conquer's leaves and first
GPU run".
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kernel_support.eigh_common import BACK_TRANSFORM, DIVIDE_CONQUER, merge_levels
from .common import EPS


@triton.jit
def _reread(pointer):
    """A load of what this program stored itself (after a barrier): through L2, where a line in L1 may be stale, as
    the other eigh kernels read back what they wrote."""
    return tl.load(pointer, cache_modifier=".cg")


@triton.jit
def _reread_masked(pointer, mask):
    """`_reread` of a block, the masked entries 0."""
    return tl.load(pointer, mask=mask, other=0, cache_modifier=".cg")


@triton.jit
def _maximum(a, b):
    return tl.maximum(a, b)


@triton.jit
def _prepare_kernel(q, values, e, merges, perm, dsort, zsort, live, livepos, cd, cz, cidx, kind, by_kind, splits,
                    counts, rhos, n, eps, K: tl.constexpr, CH: tl.constexpr):
    matrix, m = tl.program_id(0).to(tl.int64), tl.program_id(1)
    start, n1, k = tl.load(merges + 3 * m), tl.load(merges + 3 * m + 1), tl.load(merges + 3 * m + 2)
    base = (matrix * tl.num_programs(1) + m) * K
    block = q + matrix * n * n + start * n + start  # the merge's k x k block: (r, c) at block + r n + c
    idx = tl.arange(0, K)
    inside, left = idx < k, idx < n1
    d = tl.load(values + matrix * n + start + idx, mask=inside, other=0.0)
    beta = tl.load(e + matrix * n + start + n1 - 1)
    z = tl.load(block + tl.where(left, n1 - 1, n1) * n + idx, mask=inside, other=0.0)
    z = tl.where(left, z, tl.where(beta < 0, -z, z))
    # the merged order: an entry's place in its half plus the other half's entries before it (left first on ties)
    before = tl.zeros([K], tl.int32)
    for c0 in range(0, k, CH):
        cols = c0 + tl.arange(0, CH)
        other = tl.load(values + matrix * n + start + cols, mask=cols < k, other=0.0)
        other_left = (cols < n1)[None, :]
        earlier = tl.where(left[:, None], (~other_left) & (other[None, :] < d[:, None]),
                           other_left & (other[None, :] <= d[:, None]))
        before += tl.sum((earlier & (cols < k)[None, :]).to(tl.int32), axis=1)
    rank = tl.where(left, idx, idx - n1) + before
    tl.store(perm + base + rank, idx, mask=inside)
    tl.store(dsort + base + rank, d.to(tl.float64), mask=inside)
    tl.store(zsort + base + rank, z.to(tl.float64), mask=inside)
    tl.store(kind + base + rank, tl.where(left, 0, 2), mask=inside)  # the rows a column lives on: top 0, bottom 2
    tl.debug_barrier()
    ds, zs = _reread_masked(dsort + base + idx, inside), _reread_masked(zsort + base + idx, inside)
    norm2 = tl.sum(zs * zs, axis=0)
    rho = tl.abs(beta).to(tl.float64) * norm2
    zs = zs / tl.sqrt(norm2)
    tol = 8 * eps * tl.maximum(tl.max(tl.abs(ds), axis=0), rho)
    keep = inside & (tl.abs(rho * zs) > tol)
    tl.store(zsort + base + idx, tl.where(keep, zs, 0.0), mask=inside)
    tl.store(live + base + idx, keep.to(tl.int32), mask=inside)
    # each kept entry's kept predecessor (a running maximum, read back one place on): where no such pair is close,
    # no rotation happens and the pass in order below is skipped (most merges of most matrices)
    tl.store(livepos + base + idx, tl.associative_scan(tl.where(keep, idx, -1), 0, _maximum), mask=inside)
    tl.debug_barrier()
    previous = _reread_masked(livepos + base + idx - 1, inside & (idx > 0)) + tl.where(idx > 0, 0, -1)
    z_previous = _reread_masked(zsort + base + previous, keep & (previous >= 0))
    d_previous = _reread_masked(dsort + base + previous, keep & (previous >= 0))
    pair = tl.sqrt(z_previous * z_previous + zs * zs)
    close = keep & (previous >= 0) & (tl.abs((ds - d_previous) * (zs / pair) * (z_previous / pair)) <= tol)
    # the last entry kept, in order: a close pair's two columns turned so that one z entry vanishes
    last = tl.full([], -1, tl.int32)
    for p in range(0, tl.where(tl.max(close.to(tl.int32), axis=0) > 0, k, 0)):
        if _reread(live + base + p) != 0:
            if last >= 0:
                z_last, z_p = _reread(zsort + base + last), _reread(zsort + base + p)
                r = tl.sqrt(z_last * z_last + z_p * z_p)
                c, s = z_p / r, -z_last / r
                d_last, d_p = _reread(dsort + base + last), _reread(dsort + base + p)
                if tl.abs((d_p - d_last) * c * s) <= tol:
                    tl.store(zsort + base + last, 0.0)
                    tl.store(zsort + base + p, r)
                    tl.store(dsort + base + last, d_last * c * c + d_p * s * s)
                    tl.store(dsort + base + p, d_last * s * s + d_p * c * c)
                    tl.store(live + base + last, 0)
                    kind_p = _reread(kind + base + p)  # a column turned with one of the other half's lives on both
                    tl.store(kind + base + p, tl.where(kind_p == _reread(kind + base + last), kind_p, 1))
                    col_last, col_p = _reread(perm + base + last), _reread(perm + base + p)
                    q_last = _reread_masked(block + idx * n + col_last, inside).to(tl.float64)
                    q_p = _reread_masked(block + idx * n + col_p, inside).to(tl.float64)
                    tl.store(block + idx * n + col_last, (c * q_last + s * q_p).to(tl.float32), mask=inside)
                    tl.store(block + idx * n + col_p, (c * q_p - s * q_last).to(tl.float32), mask=inside)
                    tl.debug_barrier()
            last = p
    tl.debug_barrier()
    keep = _reread_masked(live + base + idx, inside) != 0
    position = tl.cumsum(keep.to(tl.int32), axis=0) - 1
    tl.store(cd + base + position, _reread_masked(dsort + base + idx, inside), mask=keep)
    tl.store(cz + base + position, _reread_masked(zsort + base + idx, inside), mask=keep)
    tl.store(cidx + base + position, idx, mask=keep)
    tl.store(livepos + base + idx, tl.where(keep, position, -1), mask=inside)
    # the kept columns by the rows they live on (top, both, bottom), for the product's block structure
    kinds = _reread_masked(kind + base + idx, inside)
    top, both = tl.sum((keep & (kinds == 0)).to(tl.int32), axis=0), tl.sum((keep & (kinds == 1)).to(tl.int32), axis=0)
    for v in tl.static_range(3):
        chosen = keep & (kinds == v)
        first = 0 if v == 0 else (top if v == 1 else top + both)
        tl.store(by_kind + base + first + tl.cumsum(chosen.to(tl.int32), axis=0) - 1, position, mask=chosen)
    tl.store(splits + 2 * (matrix * tl.num_programs(1) + m), top)
    tl.store(splits + 2 * (matrix * tl.num_programs(1) + m) + 1, top + both)
    tl.store(counts + matrix * tl.num_programs(1) + m, tl.sum(keep.to(tl.int32), axis=0))
    tl.store(rhos + matrix * tl.num_programs(1) + m, rho)


@triton.jit
def _lanes(counts, K: tl.constexpr, R: tl.constexpr):
    """This program's merge (its index, its scratch's offset, its entries kept) and its R lanes (roots or poles),
    with which of them exist."""
    merge = tl.program_id(0).to(tl.int64) * tl.num_programs(1) + tl.program_id(1)
    count = tl.load(counts + merge)
    lanes = tl.program_id(2) * R + tl.arange(0, R)
    return merge, merge * K, count, lanes, lanes < count


@triton.jit
def _secular(d, z, count, d_origin, offset, rho, R: tl.constexpr, CH: tl.constexpr):
    """1 + rho sum_j z_j^2 / (d_j - x) at x = d_origin + offset, for R roots, each difference d_j - x formed as
    (d_j - d_origin) - offset."""
    f = tl.zeros([R], tl.float64) + 1.0
    for j0 in range(0, count, CH):
        j = j0 + tl.arange(0, CH)
        d_j = tl.load(d + j, mask=j < count, other=0.0)
        z_j = tl.load(z + j, mask=j < count, other=0.0)
        pole = (d_j[None, :] - d_origin[:, None]) - offset[:, None]
        f += rho * tl.sum(tl.where((j < count)[None, :], z_j[None, :] * z_j[None, :] / pole, 0.0), axis=1)
    return f


@triton.jit
def _secular_kernel(cd, cz, counts, rhos, origin, taus, K: tl.constexpr, R: tl.constexpr, CH: tl.constexpr,
                    STEPS: tl.constexpr):
    merge, base, count, i, valid = _lanes(counts, K, R)
    rho = tl.load(rhos + merge)
    last = i == count - 1
    d_i = tl.load(cd + base + i, mask=valid, other=0.0)
    d_next = tl.load(cd + base + i + 1, mask=valid & ~last, other=0.0)
    total = tl.full([], 0.0, tl.float64)  # |z|^2 of the entries kept
    for j0 in range(0, count, CH):
        j = j0 + tl.arange(0, CH)
        z_j = tl.load(cz + base + j, mask=j < count, other=0.0)
        total += tl.sum(z_j * z_j, axis=0)
    half = tl.where(last, rho * total / 2, (d_next - d_i) / 2)
    # f rises between poles: f(middle) > 0 puts the root below the middle, nearer d_i (the last root is above d_k)
    below = (_secular(cd + base, cz + base, count, d_i, half, rho, R, CH) > 0) | last
    d_origin = tl.where(below, d_i, d_next)
    low = tl.where(below, 0.0, -half)
    high = tl.where(below, tl.where(last, rho * total, half), 0.0)
    for _ in range(STEPS):
        tau = (low + high) / 2
        f = _secular(cd + base, cz + base, count, d_origin, tau, rho, R, CH)
        low, high = tl.where(f < 0, tau, low), tl.where(f < 0, high, tau)
    tl.store(origin + base + i, tl.where(below, i, i + 1), mask=valid)
    tl.store(taus + base + i, (low + high) / 2, mask=valid)


@triton.jit
def _multiply(a, b):
    return a * b


@triton.jit
def _zhat_kernel(cd, cz, counts, rhos, origin, taus, zhat, K: tl.constexpr, R: tl.constexpr, CH: tl.constexpr):
    merge, base, count, j, valid = _lanes(counts, K, R)
    rho = tl.load(rhos + merge)
    d_j = tl.load(cd + base + j, mask=valid, other=0.0)
    product = tl.zeros([R], tl.float64) + 1.0
    for i0 in range(0, count, CH):
        i = i0 + tl.arange(0, CH)
        inside = i < count
        d_i = tl.load(cd + base + i, mask=inside, other=0.0)
        d_origin = tl.load(cd + base + tl.load(origin + base + i, mask=inside, other=0), mask=inside, other=0.0)
        tau = tl.load(taus + base + i, mask=inside, other=0.0)
        gap = tau[:, None] - (d_j[None, :] - d_origin[:, None])  # lambda_i - d_j
        apart = tl.where(i[:, None] == j[None, :], rho, d_i[:, None] - d_j[None, :])
        ratio = tl.where(inside[:, None], gap / apart, 1.0)
        product *= tl.reduce(ratio, 0, _multiply)
    z_j = tl.load(cz + base + j, mask=valid, other=0.0)
    tl.store(zhat + base + j, tl.where(z_j < 0, -1.0, 1.0) * tl.sqrt(tl.abs(product)), mask=valid)


@triton.jit
def _vector_entries(d, zhat, j, count, d_origin, tau):
    """zhat_j / (d_j - lambda_i), [j, i], each difference formed as (d_j - d_origin(i)) - tau_i."""
    return tl.load(zhat + j, mask=j < count, other=0.0)[:, None] / (
        (tl.load(d + j, mask=j < count, other=0.0)[:, None] - d_origin[None, :]) - tau[None, :])


@triton.jit
def _vectors_kernel(cd, counts, origin, taus, zhat, u, lam, K: tl.constexpr, R: tl.constexpr, CH: tl.constexpr):
    merge, base, count, i, valid = _lanes(counts, K, R)
    d_origin = tl.load(cd + base + tl.load(origin + base + i, mask=valid, other=0), mask=valid, other=0.0)
    tau = tl.load(taus + base + i, mask=valid, other=0.0)
    norm2 = tl.zeros([R], tl.float64)
    for j0 in range(0, count, CH):
        j = j0 + tl.arange(0, CH)
        entry = _vector_entries(cd + base, zhat + base, j, count, d_origin, tau)
        norm2 += tl.sum(tl.where((j < count)[:, None] & valid[None, :], entry * entry, 0.0), axis=0)
    scale = 1 / tl.sqrt(norm2)
    for j0 in range(0, count, CH):
        j = j0 + tl.arange(0, CH)
        entry = _vector_entries(cd + base, zhat + base, j, count, d_origin, tau)
        tl.store(u + merge * K * K + j[:, None] * K + i[None, :], (entry * scale[None, :]).to(tl.float32),
                 mask=(j < count)[:, None] & valid[None, :])
    tl.store(lam + base + i, d_origin + tau, mask=valid)


@triton.jit
def _order_kernel(q, q_next, values_next, merges, perm, dsort, livepos, lam, dest, n, K: tl.constexpr,
                  CH: tl.constexpr):
    matrix, m = tl.program_id(0).to(tl.int64), tl.program_id(1)
    start, k = tl.load(merges + 3 * m), tl.load(merges + 3 * m + 2)
    base = (matrix * tl.num_programs(1) + m) * K
    idx = tl.arange(0, K)
    inside = idx < k
    position = tl.load(livepos + base + idx, mask=inside, other=-1)
    value = tl.where(position >= 0, tl.load(lam + base + position, mask=inside & (position >= 0), other=0.0),
                     tl.load(dsort + base + idx, mask=inside, other=0.0))
    rank = tl.zeros([K], tl.int32)
    for c0 in range(0, k, CH):
        cols = c0 + tl.arange(0, CH)
        there = cols < k
        other_position = tl.load(livepos + base + cols, mask=there, other=-1)
        other = tl.where(other_position >= 0, tl.load(lam + base + other_position, mask=there & (other_position >= 0),
                                                      other=0.0), tl.load(dsort + base + cols, mask=there, other=0.0))
        tie = (other[None, :] == value[:, None]) & (cols[None, :] < idx[:, None])
        earlier = (other[None, :] < value[:, None]) | tie
        rank += tl.sum((earlier & there[None, :]).to(tl.int32), axis=1)
    tl.store(dest + base + idx, rank, mask=inside)
    tl.store(values_next + matrix * n + start + rank, value.to(tl.float32), mask=inside)
    block = q + matrix * n * n + start * n + start
    block_next = q_next + matrix * n * n + start * n + start
    tl.debug_barrier()  # dest, as this program stored it (read through L2: a line in L1 may be stale)
    for c0 in range(0, k, CH):  # the deflated pairs' columns, as they are, CH at a time
        cols = c0 + tl.arange(0, CH)
        deflated = (cols < k) & (tl.load(livepos + base + cols, mask=cols < k, other=0) < 0)
        moved = inside[:, None] & deflated[None, :]
        columns = tl.load(block + idx[:, None] * n + tl.load(perm + base + cols, mask=deflated, other=0)[None, :],
                          mask=moved, other=0.0)
        tl.store(block_next + idx[:, None] * n + _reread_masked(dest + base + cols, deflated)[None, :],
                 columns, mask=moved)


@triton.jit
def _product_kernel(q, q_next, merges, perm, cidx, by_kind, splits, counts, dest, u, n, merge_count, K: tl.constexpr,
                    TILE: tl.constexpr, TILE_K: tl.constexpr, PRECISION: tl.constexpr):
    """A TILE x TILE tile of the merge's new vectors: rows of the block times the roots' columns of U, over the
    kept columns that live on those rows (a tile of top rows skips the columns that live on the bottom ones, and
    the other way round: about half the products of a dense k x k x k, as LAPACK's dlaed3 groups the columns)."""
    program = tl.program_id(0).to(tl.int64)
    matrix, m = program // merge_count, program % merge_count
    start, n1, k = tl.load(merges + 3 * m), tl.load(merges + 3 * m + 1), tl.load(merges + 3 * m + 2)
    merge = matrix * merge_count + m
    base = merge * K
    count = tl.load(counts + merge)
    rows = tl.program_id(1) * TILE + tl.arange(0, TILE)
    roots = tl.program_id(2) * TILE + tl.arange(0, TILE)
    if tl.program_id(2) * TILE < count:
        low = tl.where(tl.program_id(1) * TILE >= n1, tl.load(splits + 2 * merge), 0)
        high = tl.where((tl.program_id(1) + 1) * TILE <= n1, tl.load(splits + 2 * merge + 1), count)
        block = q + matrix * n * n + start * n + start
        acc = tl.zeros([TILE, TILE], tl.float32)
        for t0 in range(low, high, TILE_K):
            t = t0 + tl.arange(0, TILE_K)
            there = t < high
            s = tl.load(by_kind + base + t, mask=there, other=0)
            column = tl.load(perm + base + tl.load(cidx + base + s, mask=there, other=0), mask=there, other=0)
            a = tl.load(block + rows[:, None] * n + column[None, :], mask=(rows < k)[:, None] & there[None, :],
                        other=0.0)
            b = tl.load(u + merge * K * K + s[:, None] * K + roots[None, :],
                        mask=there[:, None] & (roots < count)[None, :], other=0.0)
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
        target = tl.load(dest + base + tl.load(cidx + base + roots, mask=roots < count, other=0), mask=roots < count,
                         other=0)
        tl.store(q_next + matrix * n * n + (start + rows[:, None]) * n + start + target[None, :], acc,
                 mask=(rows < k)[:, None] & (roots < count)[None, :])


@functools.lru_cache(maxsize=None)
def _tears(n: int, device: torch.device) -> torch.Tensor:
    """The rows j - 1 after which T is torn (every merge's), on the device, made once."""
    return torch.tensor([start + left - 1 for _, groups, _ in merge_levels(n) for start, left, _ in groups],
                        device=device)


@functools.lru_cache(maxsize=None)
def _merges(groups: tuple, device: torch.device) -> torch.Tensor:
    """A level's merges on the device, made once (metadata: a CUDA graph's capture cannot copy from the host)."""
    return torch.tensor(groups, device=device, dtype=torch.int32)


@functools.lru_cache(maxsize=None)
def _carried(blocks: tuple, n: int, device: torch.device) -> torch.Tensor:
    """The flat offsets (row n + column) of a level's carried blocks' entries, on the device, made once."""
    return torch.tensor([(start + r) * n + start + c for start, size in blocks for r in range(size)
                         for c in range(size)], device=device)


def solve(d: torch.Tensor, e: torch.Tensor, scale: torch.Tensor):
    """(z, T's eigenvalues, L): T's orthonormal eigenvectors as the rows of z [batch, n, n], T's eigenvalues
    ascending and L (the eigenvalues times A's scale), for the tridiagonal (d, e) of each matrix."""
    batch, n = d.shape
    tears = _tears(n, d.device)  # the leaves' eigenvalues: T's diagonal less |beta| on both sides of every tear
    coupling = e[:, tears].abs()
    values = d.index_add(1, tears, -coupling).index_add_(1, tears + 1, -coupling)
    # the leaves' eigenvectors, in two buffers the levels write in turn (`merge_levels`)
    q, q_next = (torch.eye(n, device=d.device).expand(batch, n, n).contiguous() for _ in range(2))
    for block, groups, carried in merge_levels(n):
        if carried:  # halves written by a level of this one's parity, into the buffer this level reads
            entries = _carried(tuple(carried), n, d.device)
            q.view(batch, n * n)[:, entries] = q_next.view(batch, n * n)[:, entries]
        merges = _merges(tuple(groups), d.device)
        count = len(groups)

        def scratch(dtype, *shape):
            return torch.empty(batch, count, *shape, device=d.device, dtype=dtype)

        perm, live, livepos, cidx, origin, dest, kind, by_kind = (scratch(torch.int32, block) for _ in range(8))
        splits = scratch(torch.int32, 2)
        dsort, zsort, cd, cz, taus, zhat, lam = (scratch(torch.float64, block) for _ in range(7))
        counts, rhos = scratch(torch.int32), scratch(torch.float64)
        u = scratch(torch.float32, block, block)
        merge = DIVIDE_CONQUER.tiling(block)
        _prepare_kernel[(batch, count)](q, values, e, merges, perm, dsort, zsort, live, livepos, cd, cz, cidx, kind,
                                        by_kind, splits, counts, rhos, n, EPS, K=block, CH=merge.ranked,
                                        num_warps=merge.warps)
        roots = (batch, count, triton.cdiv(block, merge.lanes))
        _secular_kernel[roots](cd, cz, counts, rhos, origin, taus, K=block, R=merge.lanes, CH=merge.chunk,
                               STEPS=DIVIDE_CONQUER.secular_steps)
        _zhat_kernel[roots](cd, cz, counts, rhos, origin, taus, zhat, K=block, R=merge.lanes, CH=merge.chunk)
        _vectors_kernel[roots](cd, counts, origin, taus, zhat, u, lam, K=block, R=merge.lanes, CH=merge.chunk)
        values_next = values.clone()  # the eigenvalues that no merge of this level touches
        _order_kernel[(batch, count)](q, q_next, values_next, merges, perm, dsort, livepos, lam, dest, n, K=block,
                                      CH=merge.ranked, num_warps=merge.warps)
        tiles = triton.cdiv(block, merge.tile)
        _product_kernel[(batch * count, tiles, tiles)](
            q, q_next, merges, perm, cidx, by_kind, splits, counts, dest, u, n, count, K=block, TILE=merge.tile,
            TILE_K=merge.tile_k, PRECISION=BACK_TRANSFORM.precision)
        q, q_next, values = q_next, q, values_next
    return q.transpose(1, 2).contiguous(), values, values * scale[:, None]
