"""TriMul: every port against the float64 reference and against each other, on bad input and odd lengths.

On CPU the kernels run in the Triton interpreter and Pallas interpret mode on the smoke cases;
on a machine with CUDA the GPU tests also run GPU MODE's 18 test cases.
"""
import inspect
import math
import pathlib
import subprocess
import sys

import pytest
import torch

import ports
from compare.tools.hopper_compile import lower_for_hopper, triton_kernels_in
from ports import to_framework, to_torch
from ports import trimul as spec
from kernel_support.trimul_common import Float16RangeError

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU (runs GPU MODE's test cases)")
SMOKE = spec.SMOKE_CASES
PORTS = tuple(impl.name for impl in spec.WORKLOAD.implementations if impl.ported)


def run_port(name, data, *, skip_what_cannot_run=True):
    """The port's output as torch. A port that takes `poison` starts its buffers as NaN (unwritten tiles show), as
    the interpreters' fresh outputs do; one that takes `host_check` refuses an input beyond its range with
    Float16RangeError, never with a device-side assertion, which would end every later test's CUDA context. A port
    this machine cannot run is skipped, with the registry's reason."""
    impl = spec.WORKLOAD.implementation(name)
    missing = impl.needs.missing()
    if missing and skip_what_cannot_run:
        pytest.skip(f"{name}: {missing}")
    function = impl.load()
    accepted = inspect.signature(function).parameters
    options = {option: True for option in ("poison", "host_check") if option in accepted}
    return to_torch(function(to_framework(impl.framework, data), **options))


def fresh_inputs(case, device=DEVICE):
    """Inputs from a seed other than the case's own, so nothing can be tuned to one draw."""
    return spec.make_inputs(case, case["seed"] * 31 + 7, device)


@pytest.mark.parametrize("case", SMOKE, ids=spec.case_name)
@pytest.mark.parametrize("port", PORTS)
def test_port_matches_float64_reference_and_the_reference_port(port, case):
    data = fresh_inputs(case)
    out = run_port(port, data)
    assert torch.isfinite(out).all(), "unwritten (NaN-poisoned) or non-finite elements"
    expected = spec.reference(data)
    verdict = spec.check(data, out, expected)
    assert verdict.passed, verdict.reason
    assert verdict.errors["rel_fro"] < 5e-3  # fp16 operands: far inside the 2e-2 gate
    if port != PORTS[0]:  # the reference port: the first registered, as in the driver's bitwise comparisons
        reference_port = run_port(PORTS[0], data).double()
        assert float((reference_port - out.double()).abs().max()) <= 1e-3 * float(expected.abs().max())


@pytest.mark.parametrize("impl", ["torch", "jax_xla"])
def test_library_baselines_match_reference(impl):
    case = SMOKE[1]
    data = fresh_inputs(case)
    out = ports.custom_kernel("trimul", impl)(data)
    verdict = spec.check(data, out, spec.reference(data))
    assert verdict.passed and verdict.errors["rel_fro"] < 1e-5, verdict


def test_custom_kernel_returns_torch_for_jax_port():
    data = fresh_inputs(SMOKE[0])
    out = ports.custom_kernel("trimul", "pallas")(data)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    assert spec.check(data, out, spec.reference(data)).passed


def test_check_rejects_nan_wrong_shape_and_dtype():
    data = fresh_inputs(SMOKE[0])
    expected = spec.reference(data)
    poisoned = expected.float().clone()
    poisoned[0, 0, 0, 0] = float("nan")
    assert not spec.check(data, poisoned, expected).passed
    assert not spec.check(data, expected.float()[:, :-1], expected).passed
    for dtype in (torch.float64, torch.bfloat16, torch.float16):  # the spec's output is float32
        verdict = spec.check(data, expected.to(dtype), expected)
        assert not verdict.passed and "dtype" in verdict.reason
    assert not spec.check(data, expected.float() * 1.1 + 0.1, expected).passed
    assert spec.check(data, expected.float(), expected).passed


def test_cases_are_gpumode_lists_and_cost_matches_roofline():
    assert len(spec.TEST_CASES) == 18 and len(spec.BENCH_CASES) == 7
    assert len({spec.case_name(c) for c in spec.TEST_CASES}) == 18
    from compare.records import datasheet_peaks, floor_seconds

    peaks = datasheet_peaks("NVIDIA H200")
    floors = [floor_seconds(f, b, peaks) for f, b in map(spec.cost, spec.BENCH_CASES)]
    geomean_ms = math.exp(sum(math.log(t) for t in floors) / len(floors)) * 1e3
    assert abs(geomean_ms - 0.200) < 0.005  # the datasheet floor docs/findings.md quotes for the bench set


def _mutations():
    def weights_with(name, value):
        return lambda x, m, w, c: (x, m, {**w, name: value}, c)

    def without(name):
        return lambda x, m, w, c: (x, m, {k: v for k, v in w.items() if k != name}, c)

    return {
        "x rank": (lambda x, m, w, c: (x[0], m, w, c), "x must have shape"),
        "x dtype": (lambda x, m, w, c: (x.half(), m, w, c), "x must be float32"),
        "x not square": (lambda x, m, w, c: (x[:, :, :-1], m, w, c), "x must have shape"),
        "mask shape": (lambda x, m, w, c: (x, m[:, :-1], w, c), "mask must have shape"),
        "mask dtype": (lambda x, m, w, c: (x, m.bool(), w, c), "mask must be"),
        "weight shape": (weights_with("left_gate.weight", torch.zeros(3, 3)), r"weights\['left_gate.weight'\]"),
        "weight dtype": (weights_with("to_out.weight", torch.zeros(32, 32, dtype=torch.float16)),
                         r"weights\['to_out.weight'\]"),
        "missing weight": (without("norm.bias"), r"weights\['norm.bias'\] is missing"),
        "config": (lambda x, m, w, c: (x, m, w, {"dim": 999, "hidden_dim": 32}), r"config\['dim'\]"),
        "not a tuple": (lambda x, m, w, c: x, "tuple"),
    }


@pytest.mark.parametrize("impl", PORTS + ("torch",))
@pytest.mark.parametrize("mutation", list(_mutations()))
def test_bad_input_names_the_argument(impl, mutation):
    change, message = _mutations()[mutation]
    data = change(*spec.make_inputs(SMOKE[0], 1, DEVICE))
    framework = spec.WORKLOAD.implementation(impl).framework
    function = spec.WORKLOAD.implementation(impl).load()
    with pytest.raises((TypeError, ValueError), match=message):
        function(data if framework == "torch" else to_framework("jax", data))


@pytest.mark.parametrize("port", PORTS)
@pytest.mark.parametrize("change, message", [(dict(dim=48), "dim .* multiple of 32"),
                                             (dict(hiddendim=24), "hidden_dim in")])
def test_sizes_the_kernels_cannot_tile_are_refused(port, change, message):
    case = dict(SMOKE[0], **change)
    with pytest.raises(ValueError, match=message):  # refused before any kernel runs
        run_port(port, spec.make_inputs(case, 1, DEVICE), skip_what_cannot_run=False)


# Inputs beyond the kernel ports' float16 range: the left and right projection and gate weights `scale` times GPU
# MODE's. At 50 the triangle products of some pairs pass float16's 65504; at 20000 the projections do too.
FLOAT16_MAX = 65504.0
LEFT_RIGHT = ("left_proj.weight", "left_gate.weight", "right_proj.weight", "right_gate.weight")


@pytest.mark.parametrize("scale", [50, 20000])
@pytest.mark.parametrize("impl", PORTS + ("torch", "jax_xla"))
def test_input_beyond_float16_is_refused_by_ports_and_computed_by_baselines(impl, scale):
    x, mask, weights, config = spec.make_inputs(SMOKE[0], 3, DEVICE)
    data = (x, mask, {name: value * scale if name in LEFT_RIGHT else value for name, value in weights.items()}, config)
    _, left, right = spec.gated_projections(x.double(), mask, {name: value.double() for name, value in data[2].items()})
    product = torch.einsum("bikh,bjkh->bijh", left, right)
    assert float(product.abs().max()) > FLOAT16_MAX  # the family leaves float16's range
    assert (float(left.abs().max()) > FLOAT16_MAX) == (scale == 20000)
    if spec.WORKLOAD.implementation(impl).ported:
        with pytest.raises(Float16RangeError, match="overflows its float16 intermediates"):
            run_port(impl, data)
    else:
        verdict = spec.check(data, run_port(impl, data), spec.reference(data))
        assert verdict.passed, verdict.reason


@pytest.mark.parametrize("shape", ["scaled", "zero-mean"])
@pytest.mark.parametrize("port", PORTS)
def test_x_beyond_the_layer_norms_float32_range_is_refused_by_every_kernel_port(port, shape):
    # x * 1e20: the first LayerNorm's sum of squares passes float32's range, where 1/std would be 0 and every
    # normalised value its bias, finite and wrong. Zero-mean rows (signs alternating) pass it with no large mean
    x, mask, weights, config = spec.make_inputs(SMOKE[0], 3, DEVICE)
    signs = torch.tensor([1.0, -1.0], device=DEVICE).repeat(x.shape[-1] // 2)
    big = x * 1e20 if shape == "scaled" else (1e20 * signs).expand_as(x).contiguous()
    with pytest.raises(Float16RangeError, match="overflows its float16 intermediates"):
        run_port(port, (big, mask, weights, config))


@pytest.mark.parametrize("name", ["to_out.weight", "to_out_norm.weight"])
@pytest.mark.parametrize("port", PORTS)
def test_output_weights_beyond_float16_are_refused_by_every_kernel_port(port, name):
    # x1e6: to_out's weight itself leaves float16's range as it is cast; the output LayerNorm's gain makes the
    # normalised product leave it, after every other intermediate was in range
    x, mask, weights, config = spec.make_inputs(SMOKE[0], 3, DEVICE)
    with pytest.raises(Float16RangeError, match="overflows its float16 intermediates"):
        run_port(port, (x, mask, dict(weights, **{name: weights[name] * 1e6}), config))


def range_assertion_main(port: str) -> None:
    """Run in a fresh process on a GPU: the torch port `port`, called as a caller does (no host_check), on an input
    beyond its float16 range. Prints "returned" where the call comes back without raising (it read nothing back),
    then synchronises, which must raise: the device-side assertion has stopped the CUDA context."""
    x, mask, weights, config = spec.make_inputs(SMOKE[0], 3, "cuda")
    large = {name: value * 50 if name in LEFT_RIGHT else value for name, value in weights.items()}
    out = spec.WORKLOAD.implementation(port).load()((x, mask, large, config))
    print("returned", flush=True)
    torch.cuda.synchronize()
    print("synchronised", out.shape, flush=True)


@pytest.mark.skipif(not ON_GPU, reason="under the Triton interpreter the range flags are read on the host")
@pytest.mark.parametrize("port", ("triton", "gluon"))
def test_a_torch_port_refuses_overflow_on_the_device_without_waiting_for_it(port):
    # the default call reads no flag back: it returns, and the next synchronisation raises with the assertion's
    # message, so no value of the output can be read (a fresh process: the CUDA context does not survive it)
    done = subprocess.run([sys.executable, "-c", f"from tests.test_trimul import range_assertion_main; "
                           f"range_assertion_main({port!r})"], cwd=pathlib.Path(__file__).resolve().parents[1],
                          capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode != 0 and "returned" in done.stdout and "synchronised" not in done.stdout, output
    assert "overflows its float16 intermediates" in output and "device-side assert" in output, output


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_the_torch_ports_replay_from_a_cuda_graph_on_fresh_inputs(tmp_path):
    # a call that reads nothing back can be captured: the driver's graph clock captures each torch port once, then
    # replays it on fresh inputs copied into the graph's buffers, and checks every output
    from compare.driver import Settings, run

    ported = [name for name in ("triton", "gluon") if not spec.WORKLOAD.implementation(name).needs.missing()]
    settings = Settings(pool=2, min_iters=3, max_iters=3, min_seconds=0.0, timed=True, timer="graph")
    record = run(spec.WORKLOAD, ported, ["test:0", "test:1"], tmp_path / "graph.json", settings,
                 progress=lambda message: None, check_properties=False)
    verdicts = {(r["case"], r["impl"]): (r["status"], r.get("reason")) for r in record["results"]}
    assert len(verdicts) == 2 * len(ported) and all(status == "pass" for status, _ in verdicts.values()), verdicts


class _GarbageEmpty:
    """torch, but for empty(): its buffers come filled with NaN, or 7 where the dtype is an integer."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def empty(*args, **kwargs):
        made = torch.empty(*args, **kwargs)
        return made.fill_(float("nan") if made.is_floating_point() else 7)


@pytest.mark.parametrize("port", PORTS)
def test_a_refused_call_leaves_nothing_that_refuses_the_next(port, monkeypatch):
    # the torch ports' range flags are set inside the call's kernels: a refusal's flags must not survive into the
    # next call, and every flag the check reads is written by the call (the weights' buffer and the flags come
    # from trimul_common's torch.empty, filled with garbage here)
    from kernel_support import trimul_common

    monkeypatch.setattr(trimul_common, "torch", _GarbageEmpty())
    x, mask, weights, config = spec.make_inputs(SMOKE[0], 3, DEVICE)
    large = {name: value * 50 if name in LEFT_RIGHT else value for name, value in weights.items()}
    with pytest.raises(Float16RangeError):
        run_port(port, (x, mask, large, config))
    data = (x, mask, weights, config)
    verdict = spec.check(data, run_port(port, data), spec.reference(data))
    assert verdict.passed, verdict.reason


@pytest.mark.parametrize("port", PORTS)
def test_strided_weights_give_the_contiguous_weights_bits(port):
    # a caller's weights may be views (a transposed copy's transpose here): the ports cast them to float16 in their
    # own kernels, which read them contiguous
    data = spec.make_inputs(SMOKE[0], 5, DEVICE)
    x, mask, weights, config = data
    strided = {name: value.t().contiguous().t() if value.dim() == 2 else torch.stack([value, value], -1)[:, 0]
               for name, value in weights.items()}
    assert not any(value.is_contiguous() for value in strided.values())
    assert torch.equal(run_port(port, (x, mask, strided, config)), run_port(port, data))


@pytest.mark.parametrize("impl", [impl.name for impl in spec.WORKLOAD.implementations])
def test_hidden_dim_zero_gets_one_answer_from_every_implementation(impl):
    x, mask, weights, config = spec.make_inputs(SMOKE[0], 1, DEVICE)
    empty = {name: value[:, :0] if name == "to_out.weight" else value if name.startswith("norm.") else value[:0]
             for name, value in weights.items()}  # every hidden-sized axis of length 0, as validation expects
    with pytest.raises(ValueError, match=r"config\['hidden_dim'\] must be a positive integer, got 0"):
        run_port(impl, (x, mask, empty, dict(config, hidden_dim=0)))


def test_a_jax_port_refuses_inside_a_callers_jit():
    # under a caller's jit the range check cannot read the sum while tracing: it runs as a callback, and the refusal
    # comes back inside JAX's runtime error; input in range passes through the same jitted function
    jax = pytest.importorskip("jax")
    port = spec.WORKLOAD.implementation("pallas").load()
    x, mask, weights, config = spec.make_inputs(SMOKE[0], 3, DEVICE)
    jitted = jax.jit(lambda x, mask, weights: port((x, mask, weights, config)))
    out = to_torch(jitted(*to_framework("jax", (x, mask, weights))))
    assert spec.check((x, mask, weights, config), out, spec.reference((x, mask, weights, config))).passed
    large = {name: value * 50 if name in LEFT_RIGHT else value for name, value in weights.items()}
    with pytest.raises(Exception, match="overflows its float16 intermediates"):
        jax.block_until_ready(jitted(*to_framework("jax", (x, mask, large))))


# Sequence lengths that are no multiple of 16: the ports pad N with zeros (mask 0) and cut the output.
ODD_LENGTHS = [spec._case(seq, bs, 32, 40 + seq, nomask, distribution, hiddendim=32)
               for seq, bs, nomask, distribution in ((1, 1, True, "normal"), (7, 2, False, "cauchy"),
                                                      (37, 1, False, "normal"))]


@pytest.mark.parametrize("case", ODD_LENGTHS, ids=spec.case_name)
@pytest.mark.parametrize("port", PORTS)
def test_any_sequence_length_matches_float64_reference(port, case):
    data = fresh_inputs(case)
    out = run_port(port, data)
    assert out.shape == data[0].shape and torch.isfinite(out).all()
    verdict = spec.check(data, out, spec.reference(data))
    assert verdict.passed, verdict.reason
    assert verdict.errors["rel_fro"] < 5e-3


# --- on the GPU: GPU MODE's test cases --------------------------------------------------------

@needs_gpu
@pytest.mark.parametrize("case", spec.TEST_CASES, ids=spec.case_name)
@pytest.mark.parametrize("port", PORTS)
def test_port_on_gpu_test_cases(port, case):
    data = fresh_inputs(case)
    out = run_port(port, data)
    verdict = spec.check(data, out, spec.reference(data))
    assert verdict.passed, verdict.reason


def test_vary_gives_new_data_with_the_answer_it_claims():
    data = fresh_inputs(SMOKE[1])
    varied, expected = spec.vary(data, spec.reference(data), torch.Generator().manual_seed(3))
    assert not torch.equal(varied[0], data[0])
    assert torch.allclose(expected, spec.reference(varied), rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(ON_GPU, reason="on a GPU the other tests compile and run the kernels themselves")
def test_pallas_port_lowers_for_cuda():
    # Interpret mode never lowers to Triton IR; lowering for CUDA needs no GPU and catches what the GPU would reject.
    pytest.importorskip("jax")
    from pallas_kernels.trimul import _trimul
    x, mask, weights, config = to_framework("jax", spec.make_inputs(SMOKE[0], 1, "cpu"))
    lowered = lower_for_hopper(_trimul, x, mask, weights, hidden=config["hidden_dim"], interpret=False)
    assert triton_kernels_in(lowered) == ["trimul_layer_norm", "trimul_gated_project", "trimul_triangle",
                                          "trimul_out_norm_project"]


@pytest.mark.skipif(ON_GPU, reason="on a GPU the other tests compile and run the kernels themselves")
@pytest.mark.parametrize("batch, seq, dim, hidden",
                         [(1, 64, 32, 32), (2, 128, 128, 128), (1, 192, 768, 128), (1, 256, 64, 128)])
def test_mosaic_gpu_port_lowers_for_cuda(batch, seq, dim, hidden):
    # every kernel lowered to Mosaic GPU for sm_90: padded hidden, a 64-wide contraction tile, the largest dim, the
    # warp-specialised contraction (256 divides N)
    jax = pytest.importorskip("jax")
    from mosaic_gpu_kernels.trimul import _trimul
    shapes = {"norm.weight": (dim,), "norm.bias": (dim,), "to_out_norm.weight": (hidden,),
              "to_out_norm.bias": (hidden,), "to_out.weight": (dim, hidden)}
    shapes.update({f"{name}.weight": (hidden, dim) for name in spec.PROJECTIONS})
    weights = {name: jax.ShapeDtypeStruct(shape, "float32") for name, shape in shapes.items()}
    lowered = lower_for_hopper(_trimul, jax.ShapeDtypeStruct((batch, seq, seq, dim), "float32"),
                               jax.ShapeDtypeStruct((batch, seq, seq), "float32"), weights, hidden=hidden,
                               interpret=False)
    assert lowered.as_text().count("mosaic_gpu") >= 4


def test_mosaic_gpu_port_names_its_largest_dim():
    case = dict(SMOKE[0], dim=800)
    with pytest.raises(ValueError, match="dim must be at most 768"):
        run_port("mosaic_gpu", spec.make_inputs(case, 1, DEVICE), skip_what_cannot_run=False)


@pytest.mark.skipif(ON_GPU, reason="on a GPU the other tests compile the kernels for it")
@pytest.mark.parametrize("options", [(), ("--specialise",)], ids=["unspecialised", "as-launched"])
def test_triton_port_compiles_for_hopper(compile_for_hopper, options):
    # every kernel compiled for sm_90 by Triton's own pipeline, within the H200's shared memory either way
    status, output = compile_for_hopper("trimul", "bench:0", *options)
    assert status == 0 and "compiled for sm_90" in output, output


@pytest.mark.parametrize("mask_dtype", ["int64", "float32"])
def test_gluon_port_hands_its_kernel_a_contiguous_mask(mask_dtype, monkeypatch):
    # the projection kernel reads the mask as B*N*N consecutive elements in its own dtype: a strided mask at an N the
    # port does not pad (64) reaches it copied whole, never as a view whose gaps it would read (CPU tensors, the
    # launches recorded instead of run)
    from gluon_kernels import trimul as gluon

    launches = {}
    monkeypatch.setattr(gluon, "launch", lambda kernel, grid, *args, **kwargs: launches.setdefault(kernel, args))
    monkeypatch.setattr(gluon, "refuse_flagged", lambda *args, **kwargs: None)
    x, mask, weights, config = spec.make_inputs(dict(SMOKE[-1], mask_dtype=mask_dtype), 1, "cpu")
    assert x.shape[1] == 64 and not mask.is_contiguous()
    gluon.trimul((x, mask, weights, config))
    given = launches[gluon._norm_project_kernel][3]
    assert given.is_contiguous() and given.dtype == mask.dtype and torch.equal(given, mask.reshape(-1))


@pytest.mark.skipif(ON_GPU, reason="on a GPU the other tests compile and run the kernels")
@pytest.mark.parametrize("case", ["smoke:0", "test:4"], ids=["hidden32-dim32", "dim768"])
def test_gluon_port_compiles_for_hopper(compile_for_hopper, case):
    # Triton's interpreter does not run Gluon: on a CPU its five launches (the weights' Triton cast, three Gluon
    # kernels and the range flags' device-side assertion) are compiled for sm_90 as launched, with hidden padded
    # to 64 channels and N to 64 (smoke:0), and at dim 768 with 128-wide tiles (test:4)
    status, output = compile_for_hopper("trimul", case, "--impl", "gluon", "--specialise")
    assert status == 0 and "5 kernels compiled for sm_90" in output, output
    assert "_range_assertion_kernel" in output, output


