"""The eigh ports stage by stage, each stage module of both ports on its own: the on-chip Jacobi's stop, the
tridiagonalisation (an orthogonal similarity, in one launch and over launches, in small tiles and many panels), the
input's checks in the first kernel, bisection, inverse iteration through swapped rows and wide shift groups, the
clusters' Gram-Schmidt, the repair of spoiled vectors, the back-transformation, divide and conquer for T (the Triton
port's candidate), the heuristics and register caps, and a stage varied as a copy of its port's package.
"""
import dataclasses
import importlib
import pathlib

import numpy as np
import pytest
import torch

import ports
from ports import eigh as spec
from kernel_support import eigh_common as common

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SLOW = pytest.mark.slow  # minutes each in the Triton interpreter: on a CPU with --run-slow only (conftest)
PORTS = tuple(impl.name for impl in spec.WORKLOAD.implementations if impl.ported)


def stage_module(port: str, stage: str):
    """The module of one stage of a port (`jacobi`, `tridiagonal`, `bisection`, `inverse_iteration`, `gram_schmidt`,
    `back_transform`): a module of its registered function's package, named alike in every port."""
    return importlib.import_module(f'{spec.WORKLOAD.implementation(port).target.rsplit(":", 1)[0]}.{stage}')


def retune(monkeypatch, stage: str, modules, **fields):
    """The instance `stage` of kernel_support.eigh_common (`TRIDIAGONAL`, `GRAM_SCHMIDT`, ...) replaced, in each of
    `modules` that reads it, by a copy with `fields` changed."""
    tuned = dataclasses.replace(getattr(common, stage), **fields)
    for module in modules:
        monkeypatch.setattr(module, stage, tuned)


def tridiagonal(d, e):
    """T [batch, n, n] in float64 from its diagonal d and off-diagonal e [batch, n] (e's last entry unused)."""
    off = e[:, :-1].double()
    return torch.diag_embed(d.double()) + torch.diag_embed(off, 1) + torch.diag_embed(off, -1)


def port_stage(port, stage, name):
    """A stage's function (`jacobi.on_chip`; the n > 64 path's `tridiagonal.reduce`, `bisection.eigenvalues`,
    `inverse_iteration.vectors` and `.repair`, `gram_schmidt.orthonormalize`, `back_transform.apply`) of a port on
    torch tensors: the Pallas port's through DLPack, as ports.custom_kernel, interpreted off the GPU."""
    stage = getattr(stage_module(port, stage), name)
    if port == "triton":
        return stage
    return lambda *args: ports.to_torch(stage(*ports.to_framework("jax", args), interpret=DEVICE != "cuda"))


@pytest.mark.parametrize("port", PORTS)
def test_on_chip_jacobi_stops_at_eps(port):
    # Sweeps stop once every off-diagonal element is below eps, well before JACOBI.max_sweeps. Before each round set
    # its pairs' A[p, q] to zero, their rounding remnants of 1 to 4 eps kept dense matrices sweeping to the cap.
    a = spec.make_inputs(spec._case(4, 32, 0, 91, "dense"), 91, DEVICE)
    a[2:] = spec.make_inputs(spec._case(2, 32, 0, 92, "clustered"), 92, DEVICE)
    _, _, sweeps, _ = port_stage(port, "jacobi", "on_chip")(a)
    assert int(sweeps[:2].max()) <= 8 and int(sweeps.max()) < common.JACOBI.max_sweeps, sweeps.flatten().tolist()


@pytest.mark.parametrize("one_launch", [True, False], ids=["one-launch", "over-launches"])
@pytest.mark.parametrize("port", PORTS)
def test_tridiagonalisation_is_an_orthogonal_similarity(port, one_launch):
    # a batch of three families: dense, LAPACK's dense with a geometric spectrum, and the zero matrix
    assert_reduction_is_an_orthogonal_similarity(port, one_launch, ("dense", "lapack_dense_geometric_spectrum",
                                                                    "lapack_zero"))


@pytest.mark.parametrize("port", PORTS)
def test_one_launch_tile_for_many_matrices(port, monkeypatch):
    # From TRIDIAGONAL.one_launch_batch matrices on, the one-launch kernel sweeps TRIDIAGONAL.many_rows rows at a time
    # (and the Pallas port's product takes its row sweep: `shares_the_sms`; the Triton port's product loop is
    # pipelined, which the interpreter runs as a plain loop: the GPU's test sets and the sm_90 compile below check that
    # form).
    retune(monkeypatch, "TRIDIAGONAL", (common, stage_module(port, "tridiagonal")), one_launch_batch=2)
    tridiagonal = common.TRIDIAGONAL
    assert tridiagonal.tile(2) == (tridiagonal.many_rows, tridiagonal.many_warps)
    assert tridiagonal.many_rows != tridiagonal.rows
    assert tridiagonal.product_stages(2) == tridiagonal.many_product_stages > 1 == tridiagonal.product_stages(1)
    assert_reduction_is_an_orthogonal_similarity(port, True)


def poison_triton_buffers(port, kernels, monkeypatch):
    """The Triton port's scratch buffers start as NaN (Pallas interpret mode fills its outputs with NaN already), so
    a kernel that reads an entry nothing wrote fails the test."""
    if port == "triton":
        monkeypatch.setattr(kernels, "empty", lambda *shape, device: torch.full(shape, float("nan"), device=device))


@pytest.mark.parametrize("port", PORTS)
def test_one_launch_product_in_small_tiles(port, monkeypatch):
    # The one-launch kernel's product p = A v walks the lower triangle in column blocks, each from its diagonal
    # down: with 8 x 16 tiles (2 rows a warp on 4 warps), n = 70 takes 5 blocks (the last partial) of up to 9 row
    # tiles, and most columns start inside a block. Its parts buffer holds entries no column writes: poisoned, so
    # reading one fails.
    kernels = stage_module(port, "tridiagonal")
    settings = {"product_warp_rows": 2, "product_cols": 16}
    assert all(getattr(kernels.TRIDIAGONAL, name) != value for name, value in settings.items())
    retune(monkeypatch, "TRIDIAGONAL", (kernels,), **settings)
    poison_triton_buffers(port, kernels, monkeypatch)
    assert_reduction_is_an_orthogonal_similarity(port, True)


@pytest.mark.parametrize("port", PORTS)
def test_over_launches_product_in_column_blocks_from_few_programs(port, monkeypatch):
    # Over launches each product program walks several row tiles of the lower triangle, each in column blocks up to
    # its diagonal, and adds every block's column sums to its one share: with 4 x 16 tiles and at most 3 programs,
    # n = 70 gives row tiles of up to 5 blocks, 6 a program, and the column kernel adds the 3 shares 2 at a time
    # (symmetrize_tile / 128 rows: the ports' row blocks, `row_blocks`). Poisoned buffers: a share read before it is
    # zeroed fails.
    kernels = stage_module(port, "tridiagonal")
    retune(monkeypatch, "TRIDIAGONAL", (common, kernels), symmetrize_tile=256, over_launches_product_rows=4,
           max_product_programs=3, over_launches_product_blocks=8)
    assert kernels.TRIDIAGONAL.product_programs(69) == 3
    poison_triton_buffers(port, kernels, monkeypatch)
    assert_reduction_is_an_orthogonal_similarity(port, False)


@pytest.mark.parametrize("port", PORTS)
def test_over_launches_column_reads_the_panel_in_chunks(port, monkeypatch):
    # Over launches the column kernel reads V and W TRIDIAGONAL.panel_chunk members at a time only from a padded
    # 2048; here (a padded 128) it does so too, as the one-launch kernel always does.
    monkeypatch.setattr(common.Tridiagonal, "column_panel_chunk", lambda self, block_n: self.panel_chunk)
    assert common.TRIDIAGONAL.panel_chunk < common.TRIDIAGONAL.panel
    assert_reduction_is_an_orthogonal_similarity(port, False)


@pytest.mark.parametrize("reflectors, chunk", [(16, 16), (16, 32)])
@pytest.mark.parametrize("port", PORTS)
def test_back_transformation_in_many_panels(port, reflectors, chunk, monkeypatch):
    # With 16 reflectors a panel and 32 vectors a program, n = 70 takes 5 panels (the last one partial) and 3
    # programs a matrix (the last partial); with 32-column chunks a panel's first chunk also holds columns before
    # its first reflector, which the update must leave alone.
    kernels = stage_module(port, "back_transform")
    assert kernels.BACK_TRANSFORM.reflectors != reflectors and kernels.BACK_TRANSFORM.vectors != 32
    retune(monkeypatch, "BACK_TRANSFORM", (kernels,), reflectors=reflectors, chunk=chunk, vectors=32)
    assert_reduction_is_an_orthogonal_similarity(port, True)


def assert_reduction_is_an_orthogonal_similarity(port, one_launch, families=("dense", "dense")):
    """The port's tridiagonal reduction at n = 70 of a batch of one matrix of each of `families`."""
    batch, n = len(families), 70
    a = torch.cat([spec.make_inputs(spec._case(1, n, 2, 5 + index, family), 5 + index, DEVICE)
                   for index, family in enumerate(families)])
    w, d, e, tau, scale, bounds = port_stage(port, "tridiagonal", "reduce")(a, one_launch)
    eye = torch.eye(n, device=DEVICE).expand(batch, n, n).contiguous()
    h = port_stage(port, "back_transform", "apply")(w, tau, eye).double()
    t = tridiagonal(d, e)
    scaled = spec._symmetric(a.double()) / scale.double()[:, None, None]
    eye = torch.eye(n, device=DEVICE, dtype=torch.float64)
    assert float((h.mT @ h - eye).abs().max()) < 10 * n * spec.EPS
    assert float((h.mT @ scaled @ h - t).abs().max()) < 10 * n * spec.EPS * max(float(scaled.abs().max()), 1.0)
    assert torch.equal(e[:, -1], torch.zeros_like(e[:, -1]))


@pytest.mark.parametrize("stage, n, arguments", [(("jacobi", "on_chip"), 16, ()),
                                                 (("tridiagonal", "reduce"), 70, (True,))],
                         ids=["jacobi", "symmetrize"])
@pytest.mark.parametrize("port", PORTS)
def test_first_kernel_counts_and_zeroes_entries_that_are_not_finite(port, stage, n, arguments):
    # The checks of the kernel that reads A first: it counts NaN and Inf and passes them on as zeros, so that it and
    # the later kernels compute, bit for bit, what they compute for the input with zeros there (the call then raises).
    a = spec.make_inputs(spec._case(2, n, 1, 9, "dense"), 9, DEVICE)
    a[0, 0, n - 1] = 0.25
    zeroed = a.clone()
    zeroed[1, 5, 6] = zeroed[1, 6, 5] = zeroed[0, n - 1, 0] = 0.0
    a[1, 5, 6] = a[1, 6, 5] = float("nan")
    a[0, n - 1, 0] = -float("inf")
    *outputs, bounds = port_stage(port, *stage)(a, *arguments)
    *expected, clean_bounds = port_stage(port, *stage)(zeroed, *arguments)
    assert all(torch.equal(x, y) for x, y in zip(outputs, expected))
    assert float(bounds[..., 0].sum()) == 3 and float(clean_bounds[..., 0].sum()) == 0
    assert float(bounds[..., 1].max()) == float(zeroed.abs().max())
    assert float(bounds[..., 2].max()) == 0.25  # A[0, 0, n - 1] against its mirror, zeroed


@pytest.mark.parametrize("port", PORTS)
def test_inverse_iteration_through_swapped_rows(port, monkeypatch):
    # T = tridiag(1, d, 1) with |d| small: partial pivoting swaps most rows, whose pivot and superdiagonals the back
    # substitution forms again from T. Without the repair, the vectors must already be T's, orthonormal.
    monkeypatch.setattr(stage_module(port, "inverse_iteration"), "repair", lambda z, *_, **__: (z, None))
    batch, n = 2, 70
    d = (0.1 * torch.randn(batch, n, generator=torch.Generator().manual_seed(3))).to(DEVICE)
    e = torch.ones(batch, n, device=DEVICE)
    e[:, -1] = 0.0
    values, norm, _ = port_stage(port, "bisection", "eigenvalues")(d, e, torch.ones(batch, device=DEVICE))
    z = port_stage(port, "inverse_iteration", "vectors")(d, e, values, norm).double()
    t = tridiagonal(d, e)
    residual = float((z @ t - values.double()[:, :, None] * z).abs().max())  # z's rows are the vectors
    assert residual < 10 * n * spec.EPS * float(norm.max())
    assert float((z @ z.mT - torch.eye(n, device=DEVICE, dtype=torch.float64)).abs().max()) < 10 * n * spec.EPS


@pytest.mark.parametrize("port", PORTS)
def test_bisection_finds_tridiagonal_eigenvalues_to_eps(port):
    # A multisection pass, then halvings until every bracket is as narrow as BISECTION.iterations halvings leave it:
    # T's eigenvalues within eps ||T||, far inside the eigenvalue gate's n eps (stopped 4 halvings early, it fails).
    # n = 70: the last warp has unused lanes. Spectra dense, in one tight cluster (at 0.01, with one eigenvalue at 1
    # setting ||T||, so that float32's spacing there is far below eps ||T||), and in two groups far apart.
    gen = torch.Generator().manual_seed(5)
    batch, n = 3, 70
    d, e = torch.randn(batch, n, generator=gen), torch.randn(batch, n, generator=gen)
    d[1], e[1] = 0.01 + 1e-8 * d[1], 1e-9 * e[1]
    d[1, 0] = 1.0
    d[2] += torch.where(torch.arange(n) < n // 2, -1e3, 1e3)
    e[:, -1] = 0.0
    eigenvalues = port_stage(port, "bisection", "eigenvalues")
    values, norm, _ = eigenvalues(d.to(DEVICE), e.to(DEVICE), torch.ones(batch, device=DEVICE))
    errors = (values.double().cpu() - torch.linalg.eigvalsh(tridiagonal(d, e))).abs().amax(dim=1)
    scaled = errors / (spec.EPS * norm.double().cpu())
    assert bool((scaled <= 1).all()), scaled.tolist()


def assert_sound_vectors(z, d, e, values, norm):
    """z's rows (one T) are T's eigenvectors for `values` to 100 eps ||T||, orthonormal within 10 n eps."""
    z = z[0].double()
    residuals = (z @ tridiagonal(d, e)[0] - values[0].double()[:, None] * z).norm(dim=1)
    assert float(residuals.max()) < 100 * spec.EPS * float(norm[0])
    eye = torch.eye(z.shape[0], device=DEVICE, dtype=torch.float64)
    assert float((z @ z.T - eye).abs().sum(dim=0).max()) < 10 * z.shape[0] * spec.EPS


@pytest.mark.parametrize("port", [pytest.param("triton", marks=SLOW), "pallas"])
def test_vectors_of_a_long_chained_cluster(port):
    # T from the H200 (a 640x512 mixed matrix, tridiagonalised with fused sums): its 358 smallest eigenvalues chain
    # into one cluster, 78 of whose gaps are below 10 eps ||T||. With shift groups of 10 eps ||T||, the last
    # Gram-Schmidt carried the groups' mixed vectors down the chain: residuals of about 2200 eps ||T|| in both ports
    # (interpreters); with INVERSE_ITERATION.group_gap = 5, 31. Sound vectors stay below about 100; orthogonality
    # within 10 n eps (the check's gate is 100). A few minutes in the Triton interpreter.
    data = torch.load(pathlib.Path(__file__).parent / "data" / "eigh_chained_cluster.pt")
    d, e = data["d"][None].to(DEVICE), data["e"][None].to(DEVICE)
    values, norm, _ = port_stage(port, "bisection", "eigenvalues")(d, e, torch.ones(1, device=DEVICE))
    assert_sound_vectors(port_stage(port, "inverse_iteration", "vectors")(d, e, values, norm), d, e, values, norm)


def divide_and_conquer_figures(port, d, e):
    """A port's divide and conquer on (d, e) [batch, n], e's last entry unused: per T, the residual
    max |T z_i - lambda_i z_i| / (n eps ||T||), the orthogonality ||Z Z^T - I||_1 / (n eps) and the eigenvalues' error
    / (n eps max(|lambda|, 1)) against float64 (the eigh gates' units)."""
    z, values, scaled = port_stage(port, "divide_conquer", "solve")(d.to(DEVICE), e.to(DEVICE),
                                                                    2 * torch.ones(len(d), device=DEVICE))
    assert torch.equal(scaled, 2 * values)
    t = tridiagonal(d, e).to(DEVICE)
    z, values = z.double(), values.double()
    unit = d.shape[1] * spec.EPS
    norm = t.abs().sum(dim=1).amax(dim=1)
    exact = torch.linalg.eigvalsh(t)
    residual = (z @ t - values[:, :, None] * z).abs().sum(dim=2).amax(dim=1) / (unit * norm)
    orthogonality = (z @ z.transpose(1, 2) - torch.eye(d.shape[1], device=DEVICE)).abs().sum(dim=1).amax(dim=1) / unit
    error = (values - exact).abs().amax(dim=1) / (unit * exact.abs().amax(dim=1).clamp_min(1))
    return residual.tolist(), orthogonality.tolist(), error.tolist()


def test_merge_levels_keep_each_half_where_its_merge_reads_it():
    # the divide and conquer's two buffers of eigenvectors, written in turn by the levels, with the carried blocks
    # copied before each level: every merge reads both halves' latest blocks (single rows: the identity, in both)
    # and nothing else in its block, for every n to 300 (halves of different heights at most n)
    for n in range(2, 301):
        buffers = [np.zeros((n, n), dtype=int), np.zeros((n, n), dtype=int)]  # the node that wrote each entry
        for level, (block, groups, carried) in enumerate(common.merge_levels(n)):
            read, written = buffers[level % 2], buffers[(level + 1) % 2]
            for start, size in carried:
                read[start:start + size, start:start + size] = written[start:start + size, start:start + size]
            for start, left, size in groups:
                assert size <= block
                for begin, rows in ((start, left), (start + left, size - left)):
                    half = read[begin:begin + rows, begin:begin + rows]
                    assert (half == (0 if rows == 1 else hash((begin, rows)))).all(), (n, level, begin, rows)
                corner = read[start + left:start + size, start:start + left]
                assert (corner == 0).all() and (read[start:start + left, start + left:start + size] == 0).all()
            for start, left, size in groups:
                written[start:start + size, start:start + size] = hash((start, size))
        assert (buffers[len(common.merge_levels(n)) % 2] == hash((0, n))).all()


@pytest.mark.parametrize("port", [pytest.param("triton", marks=SLOW), "pallas"])  # not the default path: one port
def test_divide_and_conquer_gives_ts_eigenpairs(port):  # on a CPU
    # T's eigenpairs by divide and conquer (the candidate of issue 55) far inside the gates (200, 100, 200): a random
    # T, glued Wilkinson matrices (W21 three times, glue 1e-6: eigenvalue pairs alike to about 12 digits, where
    # inverse iteration needs its Gram-Schmidt), a diagonal (every entry of z deflates) and one of equal diagonals
    # (close pairs deflated by rotation, across the halves too: columns on both halves' rows). n = 64: the products'
    # tiles take the top and the bottom rows apart (the whole port's test below has halves of unequal sizes).
    gen = torch.Generator().manual_seed(7)
    n = 64
    d, e = torch.randn(4, n, generator=gen), torch.randn(4, n, generator=gen)
    wilkinson = (torch.arange(21) - 10).abs().float()
    d[1], e[1] = torch.cat([wilkinson.repeat(3), torch.tensor([5.0])]), torch.ones(n)
    e[1, 20::21] = 1e-6
    e[2] = 0.0
    d[3], e[3] = torch.ones(n), 1e-7 * e[3]
    e[:, -1] = 0.0
    residual, orthogonality, error = divide_and_conquer_figures(port, d, e)
    assert max(residual) < 2 and max(orthogonality) < 2 and max(error) < 1, (residual, orthogonality, error)


@SLOW
def test_divide_and_conquer_on_a_long_chained_cluster():
    # the T of test_vectors_of_a_long_chained_cluster (358 eigenvalues chained, 78 gaps below 10 eps ||T||), on which
    # inverse iteration's shift groups once left residuals of 2200 eps ||T||
    data = torch.load(pathlib.Path(__file__).parent / "data" / "eigh_chained_cluster.pt")
    residual, orthogonality, error = divide_and_conquer_figures("triton", data["d"][None], data["e"][None])
    assert residual[0] < 2 and orthogonality[0] < 2 and error[0] < 1, (residual, orthogonality, error)


@SLOW  # on a CPU the stage's own tests above cover the path, which is not the default
@pytest.mark.parametrize("port", PORTS)
def test_the_port_with_divide_and_conquer_passes_the_check(port, monkeypatch):
    # the whole port (reduction, divide and conquer, back-transformation) with T's eigenpairs by divide and conquer,
    # as the H200's A/B will run it (a copy of the package with EIGENVECTORS changed); n = 66: halves of 33 rows,
    # whose halves (16 and 17) differ in height, and product tiles across the halves' rows
    package = importlib.import_module(spec.WORKLOAD.implementation(port).target.rsplit(":", 1)[0])
    monkeypatch.setattr(package, "EIGENVECTORS", "divide_conquer")
    for family in ("psd", "clustered"):
        a = spec.make_inputs(spec._case(1, 66, 2, 93, family), 93, DEVICE)
        verdict = spec.check(a, ports.custom_kernel("eigh", port)(a), spec.reference(a))
        assert verdict.passed and verdict.errors["orthogonality_scaled"] < 5, (family, verdict)


WIDE_SHIFT_GROUPS = torch.load(pathlib.Path(__file__).parent / "data" / "eigh_wide_shift_groups.pt")


# on a CPU, the Pallas port on the first and the third: one failure of each rule below
@pytest.mark.parametrize("port, index", [
    pytest.param(port, index, id=f"{port}-{group['name']}", marks=SLOW if port == "triton" or index == 1 else ())
    for port in PORTS for index, group in enumerate(WIDE_SHIFT_GROUPS)])
def test_vectors_of_a_wide_shift_group(port, index):
    # T's of 16x512 psd matrices and their eigenvalues, from the H200 (named by seed, matrix and the port that made
    # them). The smallest 29 to 37 eigenvalues chain into one shift group 37 to 64 eps ||T|| wide: a run near zero (gaps
    # below 1 eps ||T||), then a sparse stretch. With one shift for the whole group (the rule before sparse_group_gap)
    # the first two failed on the H200 (orthogonality 115 and 685, gate 100); with each member of such a group its own
    # shift the third did (107). Pallas interpreter, worst vector residual in eps ||T|| and orthogonality in n eps:
    # one shift 552 and 23.9, 5916 and 314, 29.9 and 0.19; the ports' rule 1.9 and 0.19, 2.3 and 0.13, 1.4 and 0.20.
    data = WIDE_SHIFT_GROUPS[index]
    d, e, values = (data[key][None].to(DEVICE) for key in ("d", "e", "values"))
    norm = data["norm"][None].to(DEVICE)
    assert_sound_vectors(port_stage(port, "inverse_iteration", "vectors")(d, e, values, norm), d, e, values, norm)


@pytest.mark.parametrize("unrolled", [True, False], ids=["unrolled", "loop"])
@pytest.mark.parametrize("split", [False, True], ids=["program-per-matrix", "split"])
@pytest.mark.parametrize("port", PORTS)
def test_cluster_orthonormalisation_keeps_each_cluster_span(port, split, unrolled, monkeypatch):
    # split: 16 earlier members a projection program, so that the third cluster's last panel sums two shares;
    # loop: the within-panel steps as a loop, as where programs share the SMs (`GramSchmidt.unrolled`)
    retune(monkeypatch, "GRAM_SCHMIDT", (stage_module(port, "gram_schmidt"),), earlier=16)
    retune(monkeypatch, "TRIDIAGONAL", (common,), one_launch_batch=2 if unrolled else 1)
    assert common.GRAM_SCHMIDT.unrolled(1) == unrolled
    n = 70
    basis = torch.linalg.qr(torch.randn((n, n), generator=torch.Generator().manual_seed(3), dtype=torch.float64))[0].T
    values = torch.arange(n, dtype=torch.float64) / n  # gaps of 1 / n: apart at cluster_gap max|values| (< 1)
    vectors = basis.clone()
    # the second starts before a panel boundary and crosses it; the third spans three panels (20 earlier
    # members for its last panel)
    clusters = [range(0, 3), range(20, 40), range(44, 70)]
    for cluster in clusters:
        values[list(cluster)] = values[cluster[0]] + 1e-6 * torch.arange(len(cluster), dtype=torch.float64)
        for j in cluster[1:]:
            # nearly parallel, spanning the cluster's space; each along its predecessor's own direction too, so
            # that a projection left out (a share not summed) leaves it along that predecessor, and a little along
            # every earlier member's, so that any one projection left out shows
            vectors[j] = (basis[cluster[0]] + 1e-2 * basis[j] + 1e-2 * basis[j - 1]
                          + 1e-3 * basis[cluster[0]:j].sum(dim=0))
    z = (3.0 * vectors).float()[None].to(DEVICE).contiguous()
    z = port_stage(port, "gram_schmidt", "orthonormalize")(z, values.float()[None].to(DEVICE).contiguous(),
                                                           torch.ones(1, device=DEVICE),
                                                           common.INVERSE_ITERATION.cluster_gap, split)
    z = z[0].double().cpu()
    # float32 rounding, amplified by the cancellation (about eps / 1e-2; a share left out gives 0.7)
    assert float((z @ z.T - torch.eye(n, dtype=torch.float64)).abs().max()) < 3e-5
    for cluster in clusters:  # the same space: its basis vectors lie in the span of the outputs
        inside = basis[list(cluster)]
        assert float((inside - (inside @ z[list(cluster)].T) @ z[list(cluster)]).abs().max()) < 1e-3
    alone = [j for j in range(n) if not any(j in cluster for cluster in clusters)]
    assert float((z[alone] - basis[alone]).abs().max()) < 1e-5  # in a panel with a cluster, lone vectors normalised


@pytest.mark.parametrize("split", [False, True], ids=["program-per-matrix", "split"])
@pytest.mark.parametrize("port", PORTS)
def test_gram_schmidt_leaves_panels_without_clusters(port, split):
    # Its rows come unit from the transpose after inverse iteration: a panel whose members are each alone in their
    # cluster, the first not continuing one from the panels before, is neither read nor written (rows of length 3
    # stay so, bit for bit). Panels 1 and 2 hold clusters (rows 16-17, 46-48); panel 3 holds none, but its first
    # row continues the cluster of rows 46 and 47 and lies nearly along row 47: all three panels are
    # orthonormalised, their lone vectors normalised.
    n = 70
    basis = torch.linalg.qr(torch.randn((n, n), generator=torch.Generator().manual_seed(4), dtype=torch.float64))[0].T
    values = torch.arange(n, dtype=torch.float64) / n
    values[17] = values[16] + 1e-6
    values[47], values[48] = values[46] + 1e-6, values[46] + 2e-6
    vectors = basis.clone()
    vectors[48] = basis[47] + 1e-2 * basis[48]
    z = (3.0 * vectors).float()[None].to(DEVICE).contiguous()
    orthonormalize = port_stage(port, "gram_schmidt", "orthonormalize")
    out = orthonormalize(z.clone(), values.float()[None].to(DEVICE).contiguous(), torch.ones(1, device=DEVICE),
                         common.INVERSE_ITERATION.cluster_gap, split)
    untouched = [j for j in range(n) if not 16 <= j < 64]
    assert torch.equal(out[0, untouched], z[0, untouched])
    done = out[0].double().cpu()
    # float32 rounding, amplified about eps / 1e-2 by row 48's cancellation; row 48 skipped leaves 1.0
    assert float((done[16:64] @ done[16:64].T - torch.eye(48, dtype=torch.float64)).abs().max()) < 1e-4
    clusters = ([16, 17], [46, 47, 48])
    lone = [j for j in range(16, 64) if not any(j in cluster for cluster in clusters)]
    assert float((done[lone] - basis[lone]).abs().max()) < 1e-5
    for cluster in clusters:  # each cluster's span kept
        inside = basis[cluster]
        assert float((inside - (inside @ done[cluster].T) @ done[cluster]).abs().max()) < 1e-4


@pytest.mark.parametrize("port", PORTS)
def test_repair_restores_vectors_spoiled_along_far_clusters(port):
    n = 70
    gen = torch.Generator().manual_seed(4)
    d = torch.randn(2, n, generator=gen, dtype=torch.float64)
    e = 0.5 * torch.randn(2, n, generator=gen, dtype=torch.float64)
    e[:, -1] = 0.0
    t = tridiagonal(d, e)
    values, basis = torch.linalg.eigh(t)  # the float64 reference; the basis's rows are the vectors
    basis = basis.mT.contiguous()
    z = basis.clone()
    # in different panels, spoiled along vectors far up or down the spectrum; the second matrix's 40
    # also along its 5, which it has to treat as sound once repaired
    spoiled = {0: [5, 40], 1: [5, 40, 63]}
    z[0, 5] += 1e-3 * (basis[0, 60] + basis[0, 65])
    z[0, 40] += 1e-3 * basis[0, 0]
    z[1, 5] += 1e-3 * basis[1, 69]
    z[1, 40] += 1e-3 * (basis[1, 5] + basis[1, 0])
    z[1, 63] += 1e-3 * basis[1, 2]
    z /= z.norm(dim=-1, keepdim=True)
    norm = t.abs().sum(-1).amax(-1)
    as_input = [x.float().to(DEVICE).contiguous() for x in (z, d, e, values)]
    before = as_input[0].double().cpu()
    out, residual = port_stage(port, "inverse_iteration", "repair")(*as_input, norm.float().to(DEVICE))
    out, residual = out.double().cpu(), residual.double().cpu()
    for b, rows in spoiled.items():
        sound = [j for j in range(n) if j not in rows]
        assert torch.equal(out[b, sound], before[b, sound])  # sound vectors are left alone
        assert float((out[b] @ out[b].T - torch.eye(n, dtype=torch.float64)).abs().max()) < 20 * spec.EPS
        for j in rows:  # the one direction the sound vectors leave: the spoiled vector's own
            outside = out[b, j] - (out[b, j] @ basis[b, j]) * basis[b, j]
            assert float(outside.norm()) < 1e-5  # 1.4e-3 before
    expected = (out @ t - out * values.float().double()[..., None]).norm(dim=-1)
    assert torch.allclose(residual, expected, rtol=1e-3, atol=10 * spec.EPS * float(norm.max()))
    assert bool((residual < common.INVERSE_ITERATION.repair_residual * spec.EPS * norm[:, None]).all())


def test_one_launch_tridiagonalisation_only_where_its_panels_fit_in_shared_memory():
    # one launch for many matrices or small n; never above a padded n of 1024 (its products' panels: 256 KB at 2048)
    one_launch = common.TRIDIAGONAL.one_launch
    assert one_launch(640, 512) and one_launch(40, 176) and one_launch(256, 1024)
    assert not one_launch(60, 1024) and not one_launch(256, 1025) and not one_launch(300, 2048)


def test_triton_register_caps_only_where_programs_queue(monkeypatch):
    # The Triton port caps a kernel's registers where its programs outnumber what an H200's 132 SMs hold uncapped, at
    # the padded sizes the caps were measured at, and never on CPU tensors (`compare.tools.hopper_compile`).
    tridiagonal, gram_schmidt = (stage_module("triton", stage) for stage in ("tridiagonal", "gram_schmidt"))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: type("H200", (), {
        "multi_processor_count": 132}))
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert tridiagonal._product_register_cap(60 * 32, 1024, cuda) == 128  # 4 four-warp programs an SM
    assert tridiagonal._product_register_cap(3 * 132, 1024, cuda) is None  # held uncapped, 3 an SM
    assert tridiagonal._product_register_cap(60 * 32, 2048, cuda) is None
    assert tridiagonal._product_register_cap(60 * 32, 1024, cpu) is None
    assert gram_schmidt._project_register_cap(640 * 8, 512, cuda) == 168  # 3 an SM
    assert gram_schmidt._project_register_cap(16 * 8, 512, cuda) is None
    assert gram_schmidt._project_register_cap(60 * 16, 1024, cuda) is None
    assert tridiagonal._tridiagonal_register_cap(640, common.TRIDIAGONAL.many_warps, 512, cuda) == 168  # 6 an SM
    assert tridiagonal._tridiagonal_register_cap(4 * 132, common.TRIDIAGONAL.many_warps, 512, cuda) is None
    assert gram_schmidt._two_programs_an_sm(640, 8, cuda) == 128
    assert gram_schmidt._two_programs_an_sm(640, 16, cuda) is None  # 64 registers: too few
    assert gram_schmidt._two_programs_an_sm(132, 8, cuda) is None


def test_sizes_beyond_32_bit_offsets_are_refused():
    with pytest.raises(ValueError, match="32-bit offsets"):
        common.check_offsets(2048, 1024)
    common.check_offsets(640, 512)
    with pytest.raises(ValueError, match="32-bit offsets"):  # the Pallas Jacobi's buffer: 4 arrays a matrix
        common.check_offsets(131072, 64, 4)
    common.check_offsets(131072, 64)


def test_a_stage_is_varied_as_a_copy_of_its_port_package(tmp_path):
    # `--variant NAME=IMPL:DIR` runs a copy of the port's package (its stages import each other relatively): here the
    # copy's Jacobi stage doubles its eigenvalues, and the variant fails where the port passes; the record's
    # provenance hashes each package whole
    import json
    import shutil

    from compare.__main__ import main

    copy = tmp_path / "eigh_doubled"
    shutil.copytree(pathlib.Path(stage_module("triton", "jacobi").__file__).parent, copy,
                    ignore=shutil.ignore_patterns("__pycache__"))
    text = (copy / "jacobi.py").read_text()
    planted = text.replace("    return vectors, values, sweeps, bounds\n",
                           "    return vectors, 2 * values, sweeps, bounds\n")
    assert planted != text
    (copy / "jacobi.py").write_text(planted)
    path = tmp_path / "variant.json"
    assert main(["eigh", "--impl", "triton", "--variant", f"doubled=triton:{copy}", "--cases", "smoke:0",
                 "--iters", "1", "--json", str(path)]) == 1
    record = json.loads(path.read_text())
    assert {r["impl"]: r["status"] for r in record["results"]} == {"triton": "pass", "doubled": "fail"}
    sources = record["provenance"]["sources"]
    assert sources["triton"]["file"] == "triton_kernels/eigh" and sources["doubled"]["file"] == "eigh_doubled"
    assert sources["triton"]["sha256"] != sources["doubled"]["sha256"]
