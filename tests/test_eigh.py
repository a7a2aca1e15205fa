"""Eigendecomposition workload: generators of every family, the identity checks, the baselines.

They pin down the definition the ports are judged by (a library solver passes every family, the
check fails wrong answers) and run the ports whole on every family: on-chip Jacobi for n <= 64, the
n > 64 path at n = 70 and 96 on CPU, where the interpreters are slow (GPU MODE's 39 test cases on
CUDA). The ports' stages one at a time: tests/test_eigh_stages.py.
"""
import dataclasses
import functools
import json
import importlib

import pytest
import torch

import ports
from compare.tools.hopper_compile import lower_for_hopper, triton_kernels_in
from ports import eigh as spec
from kernel_support import eigh_common as common

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SMOKE = spec.SMOKE_CASES
# minutes each in the Triton interpreter: on a CPU they run with --run-slow only (conftest); the Pallas port's
# twins, and one case of each Triton path, stay in the default run
SLOW = pytest.mark.slow


def solve(a):
    values, vectors = torch.linalg.eigh(a)
    return vectors, values


@pytest.mark.parametrize("case", SMOKE, ids=spec.case_name)
def test_every_family_is_symmetric_finite_and_passes_a_library_solver(case):
    a = spec.make_inputs(case, case["seed"] + 1, DEVICE)
    assert a.shape == (case["batch"], case["n"], case["n"]) and a.dtype == torch.float32
    assert torch.isfinite(a).all() and torch.equal(a, a.transpose(-1, -2))
    verdict = spec.check(a, solve(a), spec.reference(a))
    assert verdict.passed, verdict.reason


def test_planted_spectra_are_what_the_family_says():
    a = spec.make_inputs(spec._case(2, 32, 3, 1, "spectrum"), 1, DEVICE)
    planted = spec._signed_log_spectrum(2, 32, 3, DEVICE).sort(dim=-1).values
    assert torch.allclose(spec.reference(a), planted.double(), atol=1e-5)
    rank_deficient = spec.make_inputs(spec._case(1, 32, 0, 2, "rankdef"), 2, DEVICE)
    assert int((spec.reference(rank_deficient).abs() < 1e-5).sum()) == 32 - 24
    diagonal = spec.make_inputs(spec._case(1, 16, 2, 3, "diagonal"), 3, DEVICE)
    assert torch.equal(diagonal, torch.diag_embed(torch.diagonal(diagonal, dim1=-2, dim2=-1)))


@pytest.mark.parametrize("spoil, reason", [
    (lambda q, l: (q * 1.01, l), "reconstruction"),
    (lambda q, l: (q, l.flip(-1)), ""),
    (lambda q, l: (q.roll(1, dims=-1), l), "residual"),
    (lambda q, l: (q.nan_to_num() * float("nan"), l), "NaN"),
    (lambda q, l: (q.double(), l), "float32"),
    (lambda q, l: (q, l[:, :-1]), "shape"),
])
def test_check_fails_wrong_answers(spoil, reason):
    a = spec.make_inputs(spec._case(2, 16, 1, 9, "dense"), 9, DEVICE)
    q, values = solve(a)
    verdict = spec.check(a, spoil(q, values), spec.reference(a))
    assert not verdict.passed and reason in verdict.reason


def test_eigenvalue_gate_compares_with_float64_eigenvalues():
    a = spec.make_inputs(spec._case(2, 16, 1, 9, "dense"), 9, DEVICE)
    verdict = spec.check(a, solve(a), spec.reference(a) + 1e-2)  # a consistent (Q, L) of the wrong values
    assert not verdict.passed and "eigenvalues" in verdict.reason


def _symmetric_with(value, n=5):
    """Two n x n identities, the second with one symmetric pair of entries set to value."""
    a = torch.eye(n).repeat(2, 1, 1)
    a[1, 2, n - 2] = a[1, n - 2, 2] = value
    return a


def _asymmetric(n):
    a = torch.eye(n).repeat(2, 1, 1)
    a[1, n - 1, 0] = 0.5  # its mirror stays 0
    return a


BAD_INPUTS = [
    (torch.zeros(4, 4), r"shape \[batch, n, n\]"),
    (torch.zeros(2, 4, 5), "square"),
    (torch.zeros(2, 4, 4, dtype=torch.float64), "float32|64-bit"),
    (torch.full((1, 3, 3), float("nan")), "NaN or Inf"),
    (_symmetric_with(float("nan")), "NaN or Inf"),
    (_symmetric_with(float("inf")), "NaN or Inf"),
    (_symmetric_with(-float("inf")), "NaN or Inf"),
    (torch.triu(torch.ones(1, 4, 4)), "not symmetric"),
    (_symmetric_with(float("nan"), 72), "NaN or Inf"),  # above JACOBI.max_n the ports check in the symmetrize
    (_symmetric_with(float("inf"), 72), "NaN or Inf"),  # kernel, below in the Jacobi's
    (_asymmetric(72), "not symmetric"),
]


@pytest.mark.parametrize("impl, bad, message", [
    # above JACOBI.max_n the Triton port reads its checks after its last kernel, a minute in the interpreter: there
    # its symmetrize kernel's counts of NaN, Inf and asymmetry are checked alone
    # (test_first_kernel_counts_and_zeroes_entries_...), and the raising from them at n = 4 here
    pytest.param(impl.name, bad, message,
                 marks=[SLOW] if impl.name == "triton" and bad.shape[-1] > common.JACOBI.max_n else
                 [pytest.mark.skip(reason=impl.needs.missing())] if impl.needs.missing() else [])
    for impl in spec.WORKLOAD.implementations
    for bad, message in BAD_INPUTS])
def test_bad_input_is_named(impl, bad, message):
    with pytest.raises((TypeError, ValueError), match=message):
        ports.custom_kernel("eigh", impl)(bad.to(DEVICE))


def test_jax_baseline_returns_torch_tuple_that_passes():
    a = spec.make_inputs(SMOKE[-1], 4, DEVICE)
    out = ports.custom_kernel("eigh", "jax_xla")(a)
    assert isinstance(out, tuple) and all(isinstance(t, torch.Tensor) for t in out)
    assert spec.check(a, out, spec.reference(a)).passed


def test_cases_are_gpumode_lists():
    assert len(spec.TEST_CASES) == 39 and len(spec.BENCH_CASES) == 13
    families = {c["family"] for c in spec.TEST_CASES}
    assert families == set(spec.FAMILIES) | set(spec.LAPACK_TYPES)


def test_vary_gives_new_data_with_the_answer_it_claims():
    a = spec.make_inputs(SMOKE[0], 5, DEVICE)
    varied, expected = spec.vary(a, spec.reference(a), torch.Generator().manual_seed(3))
    assert not torch.equal(varied, a)
    assert torch.allclose(expected, spec.reference(varied), rtol=0, atol=1e-12)


# --- the ports (on-chip Jacobi for n <= 64, tridiagonalisation above) ----------------------------

PORTS = tuple(impl.name for impl in spec.WORKLOAD.implementations if impl.ported)


@pytest.mark.parametrize("case", SMOKE, ids=spec.case_name)
@pytest.mark.parametrize("port", PORTS)
def test_port_passes_every_identity(port, case):
    a = spec.make_inputs(case, case["seed"] * 7 + 1, DEVICE)
    verdict = spec.check(a, ports.custom_kernel("eigh", port)(a), spec.reference(a))
    assert verdict.passed, verdict.reason
    assert verdict.errors["residual_scaled"] < 20 and verdict.errors["orthogonality_scaled"] < 20


def test_ports_agree_on_eigenvalues():
    a = spec.make_inputs(spec._case(3, 32, 2, 77, "mixed"), 77, DEVICE)
    (_, triton_values), (_, pallas_values) = (ports.custom_kernel("eigh", port)(a) for port in PORTS)
    assert torch.allclose(triton_values, pallas_values, rtol=0, atol=1e-5 * float(triton_values.abs().max()))


ABOVE_64 = [("mixed", 70), ("clustered", 70), ("lapack_dense_even_low_magnitude", 70), ("lapack_identity", 70),
            ("lapack_zero", 70), ("lapack_dense_geometric_spectrum", 70), ("dense", 96)]


@pytest.mark.parametrize("port, family, n", [
    pytest.param(port, family, n, marks=SLOW if port == "triton" and family != "mixed" else ())
    for port in PORTS for family, n in ABOVE_64])
def test_port_above_64_passes_every_identity(port, family, n):
    a = spec.make_inputs(spec._case(3, n, 2, n, family), n, DEVICE)
    verdict = spec.check(a, ports.custom_kernel("eigh", port)(a), spec.reference(a))
    assert verdict.passed, verdict.reason
    assert verdict.errors["residual_scaled"] < 20 and verdict.errors["orthogonality_scaled"] < 20


@pytest.mark.parametrize("port, family", [  # dense: most panels without a cluster, left as they come
    pytest.param(port, family, marks=SLOW if port == "triton" else ())  # the Pallas port's on a CPU
    for port in PORTS for family in ("clustered", "dense")])
def test_port_with_split_gram_schmidt_passes_every_identity(port, family, monkeypatch):
    # the split Gram-Schmidt is for n >= 512, too slow to interpret: lower the threshold
    # (n = 72 is traced for this test alone, so the Pallas port's jit cache holds no unsplit version)
    package = spec.WORKLOAD.implementation(port).target.rsplit(":", 1)[0]
    gram_schmidt = importlib.import_module(f"{package}.gram_schmidt")  # the port's stage, which reads GRAM_SCHMIDT
    monkeypatch.setattr(gram_schmidt, "GRAM_SCHMIDT", dataclasses.replace(common.GRAM_SCHMIDT, split_n=72))
    a = spec.make_inputs(spec._case(2, 72, 2, 72, family), 72, DEVICE)
    verdict = spec.check(a, ports.custom_kernel("eigh", port)(a), spec.reference(a))
    assert verdict.passed, verdict.reason
    assert verdict.errors["residual_scaled"] < 20 and verdict.errors["orthogonality_scaled"] < 20


@SLOW
def test_ports_agree_on_eigenvalues_above_64():  # within 10 n eps |L|, a twentieth of the eigenvalue gate
    a = spec.make_inputs(spec._case(2, 70, 2, 71, "dense"), 71, DEVICE)
    (_, triton_values), (_, pallas_values) = (ports.custom_kernel("eigh", port)(a) for port in PORTS)
    tolerance = 10 * 70 * spec.EPS * float(triton_values.abs().max())
    assert torch.allclose(triton_values, pallas_values, rtol=0, atol=tolerance)


def test_driver_runs_eigh_ports_and_compares_eigenvalues(tmp_path):
    import json

    from compare.__main__ import main

    path = tmp_path / "eigh.json"
    # a dense family and a high-magnitude one (every smoke case runs through both ports in test_port_passes_...)
    assert main(["eigh", "--impl", "triton,pallas", "--cases", "smoke:0,smoke:21", "--iters", "1",
                 "--json", str(path)]) == 0
    record = json.loads(path.read_text())
    assert len(record["cross"]) == 2
    for comparison in record["cross"]:  # eigenvalues of magnitude up to 1 (sqrt(fp32 max) for "high")
        magnitude = spec.MAGNITUDES["high"] if "high_magnitude" in comparison["case"] else 1.0
        assert comparison["max_abs_diff"] < 1e-4 * magnitude, comparison


@pytest.mark.parametrize("n", [1, 2, 3, 17, 40, 64])
@pytest.mark.parametrize("port", PORTS)
def test_port_at_every_padding(port, n):
    a = spec.make_inputs(spec._case(2, n, 1, n, "dense"), n, DEVICE)
    verdict = spec.check(a, ports.custom_kernel("eigh", port)(a), spec.reference(a))
    assert verdict.passed, verdict.reason


@pytest.mark.parametrize("port", PORTS)
def test_port_takes_matrices_symmetric_only_up_to_roundoff(port):
    a = spec.make_inputs(spec._case(1, 16, 1, 3, "dense"), 3, DEVICE)
    a[0, 7, 8] += 0.5e-4 * float(a.abs().max())  # inside the symmetry check's tolerance
    verdict = spec.check(a, ports.custom_kernel("eigh", port)(a), spec.reference(a))
    assert verdict.passed and verdict.errors["orthogonality_scaled"] < 20, verdict


@pytest.mark.parametrize("port", PORTS)
@pytest.mark.parametrize("shape", [(0, 8, 8), (2, 0, 0)], ids=["no-matrices", "empty-matrices"])
def test_port_takes_an_empty_batch(port, shape):
    q, values = ports.custom_kernel("eigh", port)(torch.zeros(shape, device=DEVICE))
    assert tuple(q.shape) == shape and tuple(values.shape) == shape[:2]


def test_triton_port_reads_a_strided_view():
    # the kernels index contiguous rows: a view into a larger tensor must be made contiguous at the entry, before
    # either path (the on-chip Jacobi's size here: the n > 64 path is a minute in the interpreter for the same check)
    a = spec.make_inputs(spec._case(2, 24, 1, 5, "dense"), 5, DEVICE)
    larger = torch.full((2, 32, 32), float("nan"), device=DEVICE)
    larger[:, :24, :24] = a
    verdict = spec.check(a, ports.custom_kernel("eigh", "triton")(larger[:, :24, :24]), spec.reference(a))
    assert verdict.passed, verdict.reason


@pytest.mark.skipif(DEVICE != "cuda", reason="GPU MODE's test cases need a GPU")
@pytest.mark.parametrize("case", spec.TEST_CASES, ids=spec.case_name)
@pytest.mark.parametrize("port", PORTS)
def test_port_on_gpu_test_cases(port, case):
    a = spec.make_inputs(case, case["seed"], DEVICE)
    verdict = spec.check(a, ports.custom_kernel("eigh", port)(a), spec.reference(a))
    assert verdict.passed, verdict.reason


@pytest.mark.skipif(DEVICE == "cuda", reason="on a GPU the other tests compile and run the kernels themselves")
@pytest.mark.parametrize("batch, n", [(2, 32), (2, 70), (2, 512), (common.TRIDIAGONAL.one_launch_batch, 512)],
                         ids=["jacobi", "one-launch", "over-launches", "many-matrices"])
def test_pallas_port_lowers_for_cuda(batch, n):
    # Without a GPU the kernels run in the interpreter, which skips the lowering to Triton IR; some
    # code it runs fails there (jnp's % of an index loaded from a ref). Lowering for CUDA needs no GPU.
    # Many matrices: the routes where programs share the SMs (the Gram-Schmidt's within-panel loop).
    jax = pytest.importorskip("jax")
    from pallas_kernels import eigh as pallas_eigh
    a = jax.ShapeDtypeStruct((batch, n, n), jax.numpy.float32)
    kernels = triton_kernels_in(lower_for_hopper(jax.jit(functools.partial(pallas_eigh._eigh, interpret=False)), a))
    if n <= 64:
        assert kernels == ["jacobi_eigh"]
        return
    reduction = ({"eigh_tridiagonalize_blocked"} if common.TRIDIAGONAL.one_launch(batch, n) else
                 {"eigh_panel_column", "eigh_panel_product", "eigh_panel_update"})
    projection = ({"eigh_orthonormalize"} if not common.GRAM_SCHMIDT.split(n) else
                  {"eigh_orthonormalize_project", "eigh_orthonormalize_finish"})
    assert (kernels[0], kernels[-1]) == ("eigh_symmetrize", "eigh_back_transform")
    assert set(kernels) == {"eigh_symmetrize", *reduction, "eigh_bisect", "eigh_inverse_iteration", *projection,
                            "eigh_repair", "eigh_compact_wy", "eigh_back_transform"}


@pytest.mark.skipif(DEVICE == "cuda", reason="on a GPU the other tests compile and run the kernels themselves")
@pytest.mark.parametrize("n", [70, 1024])
def test_pallas_divide_and_conquer_lowers_for_cuda(n):
    # the divide and conquer's jitted call, with x64 on as `solve` makes it, lowered to Triton IR: what interpret
    # mode does not check (the lowering rules, e.g. that there is no product reduction)
    jax = pytest.importorskip("jax")
    from pallas_kernels.eigh import divide_conquer
    d, scale = jax.ShapeDtypeStruct((2, n), jax.numpy.float32), jax.ShapeDtypeStruct((2,), jax.numpy.float32)
    with jax.enable_x64(True):
        lowered = lower_for_hopper(jax.jit(functools.partial(divide_conquer._solve, interpret=False)), d, d, scale)
    level = ["eigh_dc_prepare", "eigh_dc_secular", "eigh_dc_zhat", "eigh_dc_vectors", "eigh_dc_order",
             "eigh_dc_product"]
    kernels = triton_kernels_in(lowered)  # each merge level's six kernels, level after level
    assert len(kernels) > len(level) and kernels == level * (len(kernels) // len(level))


@pytest.mark.skipif(DEVICE == "cuda", reason="on a GPU the other tests compile the kernels for it")
@pytest.mark.parametrize("options", [(), ("--specialise",)], ids=["unspecialised", "as-launched"])
@pytest.mark.parametrize("case", ["test:2", "bench:3", "test:4"], ids=["one-launch", "one-launch-pipelined",
                                                                     "over-launches"])
def test_triton_port_compiles_for_hopper(compile_for_hopper, case, options):
    # every kernel of the route, compiled for sm_90 by Triton's own pipeline, within the H200's shared memory
    # either way: neither compile bounds the other's shared memory
    status, output = compile_for_hopper("eigh", case, *options)
    assert status == 0 and "compiled for sm_90" in output, output


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs need a GPU")
def test_triton_graph_replay_computes_every_call():
    # Fewer than 256 matrices take the Triton port's CUDA-graph path, over launches (n = 1000), in one launch
    # (n = 100) or on chip (n = 32): the second input replays the graph the first captured, on its own data, and
    # must give what launching every kernel from Python gives, bit for bit; bad input replayed is still named.
    triton_eigh = importlib.import_module("triton_kernels.eigh")
    for n, seed in ((1000, 1), (1000, 2), (100, 3), (100, 4), (32, 5), (32, 6)):
        a = spec.make_inputs(spec._case(3, n, 2, seed), seed, DEVICE)
        tridiagonal = common.TRIDIAGONAL
        assert not tridiagonal.shares_the_sms(3) and tridiagonal.one_launch(3, n) == (n < tridiagonal.one_launch_n)
        q, values = triton_eigh.eigh(a)
        verdict = spec.check(a, (q, values), spec.reference(a))
        assert verdict.passed, verdict.reason
        path = triton_eigh._tridiagonal if n > common.JACOBI.max_n else triton_eigh._jacobi
        eager_q, eager_values, _ = path(a)
        assert torch.equal(q, eager_q) and torch.equal(values, eager_values)
        a[1, 3, 3] = float("nan")
        with pytest.raises(ValueError, match="NaN or Inf"):
            triton_eigh.eigh(a)


@pytest.mark.skipif(DEVICE == "cuda", reason="a CPU lowering probe; on a GPU the ports themselves run")
def test_mosaic_gpu_probe_reports_what_lowers(capsys):
    # the probe behind the findings on Mosaic GPU and eigh: a full reduction lowers in every jax here, a gather in
    # none; each probe line names its way and semantics
    pytest.importorskip("jax")
    from compare.tools.mosaic_gpu_probe import main

    assert main([]) == 0
    out = capsys.readouterr().out
    probes = out.split("\n")
    total = probes.index("total: off-diagonal norm (convergence)")
    way, semantics, lowered = probes[total + 1].split()[:3]  # then "; interpreter: ..." where jax has one (0.11)
    assert (way, semantics, lowered.rstrip(";")) == ("plain", "Warpgroup", "lowered")
    gather = next(n for n, line in enumerate(probes) if line.startswith("gather rows"))
    assert all("lowered" not in line for line in probes[gather + 1:gather + 5])


def test_bounded_check_settles_sound_outputs_with_the_checks_verdict():
    # the eigenvalue gate settled by a bound from Q's own figures (spec.bounded_check), no float64 eigenvalues: on
    # every family (torch's float32 eigh as the output) it passes as the check does, the bound at least the true
    # figure and far inside the gate; an output that fails a figure before the eigenvalues gets the check's
    # verdict and reason; where the bound cannot settle the gate (planted: a gate of 1e-6) it leaves it to the check
    for index, case in enumerate(spec.SMOKE_CASES):
        a = spec.make_inputs(spec._case(2, 48, case["cond"], 700 + index, case["family"]), 700 + index, DEVICE)
        values, vectors = torch.linalg.eigh(a)
        full, bounded = spec.check(a, (vectors, values), spec.reference(a)), spec.bounded_check(a, (vectors, values))
        assert full.passed and bounded.passed, (case["family"], full, bounded)
        assert full.errors["eigenvalues_scaled"] <= bounded.errors["eigenvalues_bound_scaled"] < 10, case["family"]
    mixed = vectors.clone()
    mixed[:, :, 0] += 1e-3 * mixed[:, :, 1]  # two columns no longer orthogonal (nor eigenvectors)
    full, bounded = spec.check(a, (mixed, values), spec.reference(a)), spec.bounded_check(a, (mixed, values))
    assert not full.passed and (bounded.passed, bounded.reason) == (full.passed, full.reason)


def test_bounded_check_leaves_what_the_bound_cannot_settle_to_the_check(monkeypatch):
    monkeypatch.setattr(spec, "EIGENVALUE_FACTOR", 1e-6)
    a = spec.make_inputs(spec.SMOKE_CASES[0], 1, DEVICE)
    values, vectors = torch.linalg.eigh(a)
    assert spec.bounded_check(a, (vectors, values)) is None
    assert "eigenvalues" in spec.check(a, (vectors, values), spec.reference(a)).reason


def test_hunt_over_case_sets_counts_matrices_and_needs_the_reference_only_where_the_bound_is_open(tmp_path,
                                                                                                  monkeypatch):
    from compare.tools.hunt import main as hunt_main

    references, eigvalsh = [], torch.linalg.eigvalsh  # the reference's float64 eigenvalues, counted
    monkeypatch.setattr(torch.linalg, "eigvalsh", lambda a: references.append(a.shape) or eigvalsh(a))
    path = tmp_path / "hunt.json"
    assert hunt_main(["eigh", "--case", "smoke,smoke:0", "--impl", "torch", "--seeds", "1,2", "--json",
                      str(path)]) == 0
    record = json.loads(path.read_text())
    entry = record["results"]["torch"]
    inputs = 2 * (len(spec.SMOKE_CASES) + 1)
    assert entry["inputs"] == entry["settled_by_bound"] == inputs and entry["failures"] == [] and not references
    assert entry["items"] == 2 * (sum(case["batch"] for case in spec.SMOKE_CASES) + spec.SMOKE_CASES[0]["batch"])
    assert set(record["cases"]) == {f"smoke:{i}" for i in range(len(spec.SMOKE_CASES))}
    monkeypatch.setattr(spec, "EIGENVALUE_FACTOR", 1e-6)  # no bound settles this gate: the reference decides
    assert hunt_main(["eigh", "--case", "smoke:2", "--impl", "torch", "--seeds", "3", "--json", str(path)]) == 1
    entry = json.loads(path.read_text())["results"]["torch"]
    assert entry["settled_by_bound"] == 0 and len(references) == 1 and "eigenvalues" in entry["failures"][0]["reason"]
    assert entry["failures"][0]["case"] == "smoke:2"
