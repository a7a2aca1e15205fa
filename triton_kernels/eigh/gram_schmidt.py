"""The eigh Triton port's block Gram-Schmidt within clusters of close eigenvalues.

From n = 512 (`kernel_support.eigh_common.GramSchmidt.split`) over launches: `_orthonormalize_project_kernel` forms
each panel's projections as tensor-core products among many programs a matrix and `_orthonormalize_finish_kernel`
applies them; below, `_orthonormalize_kernel`, one program per matrix.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel_support.eigh_common import GRAM_SCHMIDT, INVERSE_ITERATION
from .common import EPS, empty, register_cap, registers_for


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
    (`kernel_support.eigh_common.GramSchmidt.unrolled`)."""
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
    # counted from zero: a loop starting at `start` skipped its body on the GPU (Triton's pipelined loads)
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
    row reductions across the program's warps (one a member) bound the older form (docs/findings.md, "The eigh
    kernels, port by port")."""
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


def _project_register_cap(programs: int, block_n: int, device: torch.device) -> int | None:
    """Register cap a thread for the split Gram-Schmidt's project kernel at a padded 512, where its programs
    outnumber the two four-warp programs an SM holds uncapped: three an SM. Set only where driver A/Bs measured it
    faster (results/h200/experiments/eigh-variants/eigh-variants-gram-schmidt-register-caps.json; the figures:
    docs/findings.md, "The eigh ports' tuning constants")."""
    if block_n != 512:
        return None
    return register_cap(programs, uncapped_an_sm=2, programs_an_sm=3, warps=GRAM_SCHMIDT.warps, device=device)


def _two_programs_an_sm(programs: int, warps: int, device: torch.device) -> int | None:
    """Register cap a thread for the one-program-a-matrix Gram-Schmidt: where its programs queue for the SMs, so
    that two fit an SM (`registers_for`) instead of the one its uncapped register count lets in, if that leaves at
    least 128 registers; None (no cap) otherwise. Measured faster where its programs queued, though each thread
    spills (docs/findings.md, "The eigh ports' tuning constants"). The Pallas port cannot do this: Pallas's
    Triton compiler parameters have no register cap."""
    if not 128 <= registers_for(2, warps) < 255:
        return None
    return register_cap(programs, uncapped_an_sm=1, programs_an_sm=2, warps=warps, device=device)


def orthonormalize(z: torch.Tensor, values: torch.Tensor, norm: torch.Tensor, cluster_gap: float,
                   split: bool | None = None):
    """z's rows orthonormal within each cluster of `values` (gaps below cluster_gap max|values|, or
    `INVERSE_ITERATION.group_gap` eps norm): z, changed in place. Its rows come unit from `_transposed`: a panel with
    no cluster in it or reaching into it is left as it is. split: each panel's projections shared among many
    programs per matrix, four launches a panel (default: kernel_support.eigh_common.GramSchmidt.split); otherwise
    one program per matrix."""
    batch, n, _ = z.shape
    block_n = triton.next_power_of_2(n)
    unrolled = GRAM_SCHMIDT.unrolled(batch)
    group_gap = INVERSE_ITERATION.group_gap * EPS
    if not (GRAM_SCHMIDT.split(n) if split is None else split):
        warps = GRAM_SCHMIDT.vector_panel_warps(block_n)
        _orthonormalize_kernel[(batch,)](z, values, norm, cluster_gap, group_gap, GRAM_SCHMIDT.second_pass_below, n,
                                         BLOCK_N=block_n, PANEL=GRAM_SCHMIDT.panel, UNROLLED=unrolled, num_warps=warps,
                                         maxnreg=_two_programs_an_sm(batch, warps, z.device))
        return z
    panels = triton.cdiv(n, GRAM_SCHMIDT.panel)
    programs, earlier = GRAM_SCHMIDT.shares(n)
    start, again = (torch.zeros(batch, device=z.device, dtype=torch.int32) for _ in range(2))
    partial = empty(batch, programs, GRAM_SCHMIDT.panel, n, device=z.device)
    project_cap = _project_register_cap(batch * programs, block_n, z.device)
    finish_warps = GRAM_SCHMIDT.finish_warps(block_n)
    args = (z, values, norm, start, again, partial, cluster_gap, group_gap, GRAM_SCHMIDT.second_pass_below, n)
    for panel in range(panels):
        for first_pass in (1, 0):
            _orthonormalize_project_kernel[(batch, programs)](*args, panel, first_pass, BLOCK_N=block_n,
                                                              PANEL=GRAM_SCHMIDT.panel, EARLIER=earlier,
                                                              CHUNK=GRAM_SCHMIDT.chunk,
                                                              PRECISION=GRAM_SCHMIDT.precision,
                                                              num_warps=GRAM_SCHMIDT.warps, maxnreg=project_cap)
            _orthonormalize_finish_kernel[(batch,)](*args, panel, first_pass, programs, BLOCK_N=block_n,
                                                    PANEL=GRAM_SCHMIDT.panel, EARLIER=earlier, UNROLLED=unrolled,
                                                    num_warps=finish_warps)
    return z
