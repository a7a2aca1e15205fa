"""The eigh Triton port's bisection: the tridiagonal T's eigenvalues, ascending.

Lane j of a program finds T's j-th eigenvalue from Sturm counts, a first pass of 32 counts at points common to
the matrix's programs (`_multisected`), then halvings, each step's division an approximate reciprocal
(`_reciprocal`). L is the eigenvalues times max|A|.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel_support.eigh_common import BISECTION
from .common import empty


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
    second pass, over each warp's own span of brackets, gave the psd test matrices' orthogonality figures a
    heavier tail on the GPU: docs/findings.md, "The eigh kernels, port by port")."""
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


def eigenvalues(d: torch.Tensor, e: torch.Tensor, scale: torch.Tensor):
    """T's eigenvalues ascending, T's norm bound, and L (the eigenvalues times A's scale)."""
    batch, n = d.shape
    values, eigenvalues = empty(batch, n, device=d.device), empty(batch, n, device=d.device)
    norm = empty(batch, device=d.device)
    _bisect_kernel[(batch, triton.cdiv(n, BISECTION.lanes))](
        d, e, scale, values, norm, eigenvalues, n, BISECTION.pivot_floor, ITERATIONS=BISECTION.iterations,
        LANES=BISECTION.lanes, APPROXIMATE=not triton.knobs.runtime.interpret, num_warps=1)
    return values, norm, eigenvalues
