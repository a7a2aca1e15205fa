"""The eigh Pallas port's block Gram-Schmidt within clusters of close eigenvalues: from n = 512 its projections are
tensor-core products shared among programs a matrix (the Triton port's `gram_schmidt`).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from kernel_support.eigh_common import GRAM_SCHMIDT, INVERSE_ITERATION
from .common import DOT_ALGORITHMS, EPS, LOOP_INDEX, barrier, f32, loop_index, masked_load, per_matrix, window


@dataclass(frozen=True)
class PallasGramSchmidt:
    """The Pallas port's own tunables of the clusters' Gram-Schmidt."""

    project_stages: int = 1  # software-pipelining stages (Pallas's Triton num_stages) of the split project kernel:
    # XLA's Triton slows its two loops when it pipelines them over the default 3 (docs/findings.md, "The eigh
    # kernels, port by port")


PALLAS_GRAM_SCHMIDT = PallasGramSchmidt()


def _panel_needs_work(continued, inside, cluster, first_cluster):
    """As the Triton port's `_panel_needs_work`: whether the panel's first cluster continues from earlier panels or
    two of its members are in one cluster."""
    return continued | (jnp.max(cluster) - first_cluster + 1 < jnp.sum(inside.astype(jnp.int32)))


def _tolerance(values_ref, norm, cluster_gap, n):
    """Gaps up to this chain eigenvalues into one cluster: cluster_gap ||T||_2, at least
    `INVERSE_ITERATION.group_gap` eps ||T||."""
    return jnp.maximum(cluster_gap * jnp.maximum(jnp.abs(values_ref[0]), jnp.abs(values_ref[n - 1])),
                       INVERSE_ITERATION.group_gap * EPS * norm)  # values ascend


def _panel_clusters(values_ref, panel, start, tolerance, *, n):
    """As the Triton port's `_panel_clusters`: (members, inside, cluster numbers within the panel,
    the first member's cluster, whether it continues from earlier panels, where it starts, where
    the next panel's first cluster starts at the latest)."""
    local = jnp.arange(GRAM_SCHMIDT.panel)
    members = panel * GRAM_SCHMIDT.panel + local
    inside = members < n
    gaps = masked_load(values_ref.at[members], inside) - masked_load(values_ref.at[members - 1], inside & (members > 0))
    breaks = inside & ((members == 0) | (gaps > tolerance))
    start = jnp.maximum(start, jnp.max(jnp.where(breaks & (local == 0), members, 0)))
    # clusters numbered within the panel: the breaks up to each member (a panel x panel sum; the Triton port uses
    # tl.cumsum)
    cluster = jnp.sum(jnp.where(local[None, :] <= local[:, None], breaks[None, :], False).astype(jnp.int32), axis=1)
    cluster = jnp.where(inside, cluster, -1)
    first_cluster = jnp.sum(jnp.where(local == 0, cluster, 0))
    next_start = jnp.maximum(start, jnp.max(jnp.where(breaks, members, 0)))
    return members, inside, cluster, first_cluster, panel * GRAM_SCHMIDT.panel > start, start, next_start


def _panel_rows(x_ref, panel, block_n):
    return x_ref.at[window(panel * GRAM_SCHMIDT.panel, GRAM_SCHMIDT.panel), window(0, block_n)]


def _load_panel(x_ref, panel, inside, *, n, block_n, normalise):
    """The panel's rows, normalised where `normalise` (a bool, traced or not)."""
    block = masked_load(_panel_rows(x_ref, panel, block_n), inside[:, None] & (jnp.arange(block_n) < n)[None, :])
    return jnp.where(normalise, block / jnp.maximum(jnp.sqrt(jnp.sum(block * block, axis=1)), 1e-30)[:, None], block)


def _projected_out(block, x_ref, first, end, chosen, *, n, block_n):
    """As the Triton port's `_projected_out`: block with its chosen rows' components along the
    `GRAM_SCHMIDT.panel` vectors from first (those before end) taken out, one vector after another (modified
    Gram-Schmidt, row by row, in a loop)."""
    valid = jnp.arange(block_n) < n

    def project_out(q, block):
        vector = masked_load(x_ref.at[first + q, window(0, block_n)], valid & (first + q < end))
        return block - jnp.where(chosen[:, None], jnp.sum(block * vector[None, :], axis=1)[:, None] * vector[None, :],
                                 0.0)

    return jax.lax.fori_loop(0, GRAM_SCHMIDT.panel, project_out, block)


def _within_clusters(block, cluster, first_cluster, continued, unrolled):
    """As the Triton port's `_within_clusters`: modified Gram-Schmidt of each cluster's members
    within the panel, normalising; a vector alone in its cluster is left as it is. Also each
    vector's norm before its normalisation (1 if untouched; a vector, as a scalar carried through
    lax.cond fails this JAX's Triton lowering). unrolled: the `GRAM_SCHMIDT.panel` steps as that many copies of their
    code, else a jax.lax.fori_loop (`kernel_support.eigh_common.GramSchmidt.unrolled`)."""
    local = jnp.arange(GRAM_SCHMIDT.panel)

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

    carry = (block, jnp.ones((GRAM_SCHMIDT.panel,), jnp.float32))
    if not unrolled:
        return jax.lax.fori_loop(0, GRAM_SCHMIDT.panel, step, carry)
    for i in range(GRAM_SCHMIDT.panel):
        carry = step(i, carry)
    return carry


def _orthonormalize_kernel(values_ref, norm_ref, _, x_ref, *, n, block_n, cluster_gap, second_pass_below, unrolled,
                           interpret):
    """As the Triton port's `_orthonormalize_kernel`: program b makes its vectors orthonormal within
    clusters (eigenvalues each within cluster_gap ||T||_2 = cluster_gap max |eigenvalue| of the
    previous, and always within `INVERSE_ITERATION.group_gap` eps ||T||), block Gram-Schmidt over panels of
    `GRAM_SCHMIDT.panel` vectors: the members of the panel's first vector's cluster against that cluster's earlier
    members, row by row, then each cluster's members within the panel, modified Gram-Schmidt, and
    again where the first pass cancelled (a norm below second_pass_below); a panel whose members are
    each alone in their cluster within it, the first not continuing a cluster from earlier panels, is
    left as it is (its vectors come unit from `inverse_iteration.vectors`' transpose). x (the input, aliased) is read
    and written through the output ref."""
    tolerance = _tolerance(values_ref, norm_ref[...], cluster_gap, n)
    valid = jnp.arange(block_n) < n
    size = GRAM_SCHMIDT.panel

    def panel_step(panel, start):  # the cluster of the panel's first vector starts at `start`
        members, inside, cluster, first_cluster, continued, start, next_start = _panel_clusters(
            values_ref, panel, start, tolerance, n=n)

        def against_earlier(earlier_block, block):
            return _projected_out(block, x_ref, start + earlier_block * size, panel * size, cluster == first_cluster,
                                  n=n, block_n=block_n)

        def gram_schmidt_pass(block):
            # counted from zero: a loop starting at `start` skipped its body on the GPU (Triton's pipelined
            # loads)
            block = jax.lax.fori_loop(0, pl.cdiv(panel * size - start, size), against_earlier, block)
            return _within_clusters(block, cluster, first_cluster, continued, unrolled)

        def both_passes():
            block, lengths = gram_schmidt_pass(_load_panel(x_ref, panel, inside, n=n, block_n=block_n, normalise=True))
            # the second pass removes what the first's cancellation amplified
            block = jax.lax.cond(jnp.min(lengths) < second_pass_below, lambda b: gram_schmidt_pass(b)[0],
                                 lambda b: b, block)
            pltriton.store(_panel_rows(x_ref, panel, block_n), block, mask=inside[:, None] & valid[None, :])

        jax.lax.cond(_panel_needs_work(continued, inside, cluster, first_cluster), both_passes, lambda: None)
        barrier(interpret)
        return next_start

    jax.lax.fori_loop(0, pl.cdiv(n, size), panel_step, jnp.int32(0))


def _panel_and_pass(step_ref):
    """(panel, 1 in its first pass and 0 in its second) of the split Gram-Schmidt's step step_ref[0] (panels in
    order, two passes each), by a shift and a mask: the kernels take the loop's counter, where forming the pair in
    XLA cost a kernel a step (results/h200/experiments/eigh-speed/eigh-kernel-times-pallas-loop-counters.txt)."""
    step = step_ref[0]
    return jax.lax.shift_right_logical(step, 1), 1 - jnp.bitwise_and(step, 1)


def _orthonormalize_project_kernel(step_ref, values_ref, norm_ref, start_ref, again_ref, x_ref, partial_ref, *, n,
                                   cluster_gap, earlier, interpret):
    """As the Triton port's `_orthonormalize_project_kernel`: program (b, s) takes the s-th `earlier` earlier
    members E of the panel's first cluster and writes the panel block P's correction (P E^T) E into
    partial_ref[s], `GRAM_SCHMIDT.chunk` columns a product step, at `GRAM_SCHMIDT.precision` (the interpreter, which
    has no TF32 preset, runs float32), only where the panel's first cluster continues from earlier panels, the
    share holds members and the pass runs (again_ref), which is where the finish reads it. step_ref: the step
    (`_panel_and_pass`)."""
    (panel, first_pass), share = _panel_and_pass(step_ref), pl.program_id(1)
    tolerance = _tolerance(values_ref, norm_ref[...], cluster_gap, n)
    members, inside, cluster, first_cluster, continued, start, next_start = _panel_clusters(
        values_ref, panel, start_ref[...], tolerance, n=n)
    size, width = GRAM_SCHMIDT.panel, GRAM_SCHMIDT.chunk
    first, end = start + share * earlier, panel * size
    precision = jax.lax.Precision.HIGHEST if interpret else DOT_ALGORITHMS[GRAM_SCHMIDT.precision]
    chunk = jnp.arange(width)
    vectors = first + jnp.arange(earlier)

    def columns_of(c):  # columns c * width on
        return c * width + chunk

    def rows_at(rows, inside_rows, columns):  # x's rows at the columns, zero outside
        return masked_load(x_ref.at[rows[:, None], columns[None, :]], inside_rows[:, None] & (columns < n)[None, :])

    @pl.when(continued & (first < end) & ((first_pass != 0) | (again_ref[...] != 0)))
    def _():
        def coefficients_step(c, carry):
            coefficients, squares = carry
            columns = columns_of(c)
            block, earlier_block = rows_at(members, inside, columns), rows_at(vectors, vectors < end, columns)
            product = jnp.dot(block, earlier_block.T, precision=precision, preferred_element_type=jnp.float32)
            return coefficients + product, squares + jnp.sum(block * block, axis=1)

        steps = pl.cdiv(n, width)
        coefficients, squares = jax.lax.fori_loop(
            0, steps, coefficients_step, (jnp.zeros((size, earlier), jnp.float32), jnp.zeros((size,), jnp.float32)))
        # the first pass projects the normalised panel (`_load_panel`)
        coefficients = jnp.where(first_pass != 0, coefficients / jnp.maximum(jnp.sqrt(squares), 1e-30)[:, None],
                                 coefficients)

        @pl.loop(0, steps)
        def _(c):
            columns = columns_of(c)
            correction = jnp.dot(coefficients, rows_at(vectors, vectors < end, columns), precision=precision,
                                 preferred_element_type=jnp.float32)
            pltriton.store(partial_ref.at[share, window(0, size), window(c * width, width)],
                           correction, mask=(columns < n)[None, :])


def _orthonormalize_finish_kernel(step_ref, values_ref, norm_ref, partial_ref, _start, _again, _x, start_ref,
                                  again_ref, x_ref, *, n, block_n, cluster_gap, second_pass_below, earlier, unrolled):
    """As the Triton port's `_orthonormalize_finish_kernel`: program b subtracts the summed partial
    corrections from the panel's first-cluster members, orthonormalises each cluster within the
    panel and stores it; the first pass decides whether the second runs (again), the second moves
    start on (start, again and x aliased). A panel whose members are each alone in their cluster
    within it, the first not continuing a cluster from earlier panels, is left as it is (its vectors
    come unit from `inverse_iteration.vectors`' transpose)."""
    panel, first_pass = _panel_and_pass(step_ref)
    valid = jnp.arange(block_n) < n
    tolerance = _tolerance(values_ref, norm_ref[...], cluster_gap, n)
    members, inside, cluster, first_cluster, continued, start, next_start = _panel_clusters(
        values_ref, panel, start_ref[...], tolerance, n=n)
    size = GRAM_SCHMIDT.panel

    def add_share(share, correction):  # a loop, not unrolled: up to 64 shares at n = 4096
        return correction + masked_load(partial_ref.at[share, window(0, size), window(0, block_n)], valid[None, :])

    def gram_schmidt_pass():
        block = _load_panel(x_ref, panel, inside, n=n, block_n=block_n, normalise=first_pass != 0)
        zero = jnp.zeros((size, block_n), jnp.float32)
        shares = pl.cdiv(panel * size - start, earlier)  # those that hold members
        correction = jax.lax.cond(continued, lambda: jax.lax.fori_loop(0, shares, add_share, zero), lambda: zero)
        block -= jnp.where(continued & (cluster == first_cluster)[:, None], correction, 0.0)
        block, lengths = _within_clusters(block, cluster, first_cluster, continued, unrolled)
        pltriton.store(_panel_rows(x_ref, panel, block_n), block, mask=inside[:, None] & valid[None, :])
        return lengths

    needed = jnp.where(first_pass != 0, _panel_needs_work(continued, inside, cluster, first_cluster),
                       again_ref[...] != 0)
    lengths = jax.lax.cond(needed, gram_schmidt_pass, lambda: jnp.ones((size,), jnp.float32))
    cancelled = jnp.min(lengths) < second_pass_below
    again_ref[...] = jnp.where(first_pass != 0, cancelled.astype(jnp.int32), again_ref[...])
    start_ref[...] = jnp.where(first_pass == 0, next_start, start_ref[...])


def orthonormalize(z, values, norm, cluster_gap, split=None, *, interpret):
    """z's rows orthonormal within each cluster of `values` (gaps below cluster_gap max|values|, or
    `INVERSE_ITERATION.group_gap` eps norm). Its rows come unit from `inverse_iteration.vectors`: a panel with no
    cluster in it or reaching into it is left as it is. split: each panel's projections shared among many programs
    per matrix, two pallas_calls twice a panel in a jax.lax.fori_loop (default:
    kernel_support.eigh_common.GramSchmidt.split); otherwise one program per matrix."""
    batch, n, _ = z.shape
    block_n = pl.next_power_of_2(n)
    vector, scalar, matrix = per_matrix(n), per_matrix(), per_matrix(n, n)
    unrolled = GRAM_SCHMIDT.unrolled(batch)
    if not (GRAM_SCHMIDT.split(n) if split is None else split):
        return pl.pallas_call(
            functools.partial(_orthonormalize_kernel, n=n, block_n=block_n, cluster_gap=cluster_gap,
                              second_pass_below=GRAM_SCHMIDT.second_pass_below, unrolled=unrolled,
                              interpret=interpret),
            out_shape=f32((batch, n, n)), grid=(batch,), in_specs=[vector, scalar, matrix], out_specs=matrix,
            input_output_aliases={2: 0},
            compiler_params=pltriton.CompilerParams(num_warps=GRAM_SCHMIDT.vector_panel_warps(block_n)),
            interpret=interpret, name="eigh_orthonormalize",
        )(values, norm, z)
    panels = pl.cdiv(n, GRAM_SCHMIDT.panel)
    programs, earlier = GRAM_SCHMIDT.shares(n)
    partials = per_matrix(programs, GRAM_SCHMIDT.panel, n)

    def project(step, start, again, z):
        return pl.pallas_call(
            functools.partial(_orthonormalize_project_kernel, n=n, cluster_gap=cluster_gap, earlier=earlier,
                              interpret=interpret),
            out_shape=f32((batch, programs, GRAM_SCHMIDT.panel, n)), grid=(batch, programs),
            in_specs=[LOOP_INDEX, vector, scalar, scalar, scalar, matrix], out_specs=partials,
            compiler_params=pltriton.CompilerParams(num_warps=GRAM_SCHMIDT.warps,
                                                    num_stages=PALLAS_GRAM_SCHMIDT.project_stages),
            interpret=interpret,
            name="eigh_orthonormalize_project",
        )(step, values, norm, start, again, z)

    def finish(step, partial, start, again, z):
        flag = jax.ShapeDtypeStruct((batch,), jnp.int32)
        return pl.pallas_call(
            functools.partial(_orthonormalize_finish_kernel, n=n, block_n=block_n, cluster_gap=cluster_gap,
                              second_pass_below=GRAM_SCHMIDT.second_pass_below, earlier=earlier, unrolled=unrolled),
            out_shape=(flag, flag, f32((batch, n, n))), grid=(batch,),
            in_specs=[LOOP_INDEX, vector, scalar, partials, scalar, scalar, matrix], out_specs=(scalar, scalar, matrix),
            input_output_aliases={4: 0, 5: 1, 6: 2},
            compiler_params=pltriton.CompilerParams(num_warps=GRAM_SCHMIDT.finish_warps(block_n)), interpret=interpret,
            name="eigh_orthonormalize_finish",
        )(step, values, norm, partial, start, again, z)

    def panel_pass(i, carry):  # one traced (so one compiled) kernel of each kind for every panel and pass
        start, again, z = carry
        step = loop_index(i)
        return finish(step, project(step, start, again, z), start, again, z)

    flags = jnp.zeros((batch,), jnp.int32)
    return jax.lax.fori_loop(0, 2 * panels, panel_pass, (flags, flags, z))[2]
