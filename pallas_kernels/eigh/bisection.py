"""The eigh Pallas port's bisection: T's eigenvalues from Sturm counts, one lane per eigenvalue (the Triton
port's `bisection`)."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from kernel_support.eigh_common import BISECTION
from .common import f32, per_matrix, window


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
        pivot = jnp.where(jnp.abs(pivot) < BISECTION.pivot_floor, -BISECTION.pivot_floor, pivot)
        off = e_ref[i]
        return count + (pivot < 0).astype(jnp.int32), pivot, off * off

    return jax.lax.fori_loop(0, n, step, (jnp.zeros(points.shape, jnp.int32), jnp.ones_like(points),
                                          jnp.float32(0.0)))[0]


def _multisected(d_ref, e_ref, index, lo, hi, n, *, interpret):
    """As the Triton port's `_multisected`: brackets of the eigenvalues numbered `index` from `BISECTION.lanes`
    Sturm counts at evenly spaced points inside T's Gershgorin interval [lo, hi], the same points in every program
    of a matrix."""
    lanes = BISECTION.lanes
    points = lo + (hi - lo) * ((jnp.arange(lanes) + 1).astype(jnp.float32) * (1.0 / (lanes + 1)))
    above = _sturm_counts(d_ref, e_ref, points, n, interpret=interpret)[None, :] > index[:, None]  # [lane, point]
    bracket_lo = jnp.max(jnp.where(above, lo, points[None, :]), axis=1)
    bracket_hi = jnp.min(jnp.where(above, points[None, :], hi), axis=1)
    kept = bracket_lo < bracket_hi  # else counts that rounding put out of order: the whole interval
    return jnp.where(kept, bracket_lo, lo), jnp.where(kept, bracket_hi, hi)


def _bisect_kernel(d_ref, e_ref, scale_ref, values_ref, norm_ref, l_ref, *, n, interpret):
    """As the Triton port's `_bisect_kernel`: program (b, block), lane j finds T_b's j-th smallest eigenvalue from
    Sturm counts inside T's Gershgorin interval, a first pass of `_multisected`, then halvings until every bracket
    is as narrow as `BISECTION.iterations` halvings of the interval leave it (or cannot be halved in float32); it
    writes the eigenvalue and L (times A's scale); block 0 writes the Gershgorin bound ||T||."""
    index = pl.program_id(1) * BISECTION.lanes + jnp.arange(BISECTION.lanes)
    valid = index < n

    def gershgorin(i, carry):
        lo, hi, previous = carry
        diagonal = d_ref[i]
        radius = jnp.abs(e_ref[i])
        return jnp.minimum(lo, diagonal - previous - radius), jnp.maximum(hi, diagonal + previous + radius), radius

    lo, hi, _ = jax.lax.fori_loop(0, n, gershgorin, (d_ref[0], d_ref[0], jnp.float32(0.0)))
    norm = jnp.maximum(jnp.maximum(jnp.abs(lo), jnp.abs(hi)), 1.0)  # T / max|A| has norm >= 1 unless A = 0
    limit = (hi - lo) * (0.5 ** BISECTION.iterations)

    def unfinished(carry):
        halvings, lo_lanes, hi_lanes = carry
        middle = 0.5 * (lo_lanes + hi_lanes)
        open_lanes = valid & (hi_lanes - lo_lanes > limit) & (middle > lo_lanes) & (middle < hi_lanes)
        return (halvings < BISECTION.iterations) & (jnp.max(open_lanes.astype(jnp.int32)) > 0)

    def halve(carry):
        halvings, lo_lanes, hi_lanes = carry
        middle = 0.5 * (lo_lanes + hi_lanes)
        below = _sturm_counts(d_ref, e_ref, middle, n, interpret=interpret) > index  # the j-th is below the middle
        return halvings + 1, jnp.where(below, lo_lanes, middle), jnp.where(below, middle, hi_lanes)

    brackets = _multisected(d_ref, e_ref, index, lo, hi, n, interpret=interpret)
    _, lo_lanes, hi_lanes = jax.lax.while_loop(unfinished, halve, (jnp.int32(0), *brackets))
    value = 0.5 * (lo_lanes + hi_lanes)
    block = window(pl.program_id(1) * BISECTION.lanes, BISECTION.lanes)
    pltriton.store(values_ref.at[block], value, mask=valid)
    pltriton.store(l_ref.at[block], value * scale_ref[...], mask=valid)
    pltriton.store(norm_ref, norm, mask=pl.program_id(1) == 0)


def eigenvalues(d, e, scale, *, interpret):
    """T's eigenvalues ascending, T's norm bound, and L (the eigenvalues times A's scale)."""
    batch, n = d.shape
    vector, scalar = per_matrix(n), per_matrix()
    return pl.pallas_call(
        functools.partial(_bisect_kernel, n=n, interpret=interpret),
        out_shape=(f32((batch, n)), f32((batch,)), f32((batch, n))), grid=(batch, pl.cdiv(n, BISECTION.lanes)),
        in_specs=[vector, vector, scalar], out_specs=(vector, scalar, vector),
        compiler_params=pltriton.CompilerParams(num_warps=1), interpret=interpret, name="eigh_bisect",
    )(d, e, scale)
