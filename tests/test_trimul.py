"""TriMul: both ports against the float64 reference, against each other, through the driver.

On CPU the kernels run in the Triton interpreter and Pallas interpret mode on the smoke cases;
on a machine with CUDA the GPU tests also run GPU MODE's 18 test cases.
"""
import dataclasses
import inspect
import json
import math
import os
import sys
from types import SimpleNamespace

import pytest
import torch

import ports
from compare.__main__ import main as compare_main
from compare.driver import Settings, run
from ports import Implementation, to_framework, to_torch
from ports import trimul as spec

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU (runs GPU MODE's test cases)")
SMOKE = spec.SMOKE_CASES
PORTS = tuple(impl.name for impl in spec.WORKLOAD.implementations if impl.ported)


def run_port(name, data, *, skip_what_cannot_run=True):
    """The port's output as torch. A port that takes `poison` starts its buffers as NaN (unwritten tiles show), as
    the interpreters' fresh outputs do. A port this machine cannot run is skipped, with the registry's reason."""
    impl = spec.WORKLOAD.implementation(name)
    missing = impl.needs.missing()
    if missing and skip_what_cannot_run:
        pytest.skip(f"{name}: {missing}")
    function = impl.load()
    poison = dict(poison=True) if "poison" in inspect.signature(function).parameters else {}
    return to_torch(function(to_framework(impl.framework, data), **poison))


def fresh_inputs(case, device=DEVICE):
    """Inputs from a seed other than the case's own, so nothing can be tuned to one draw."""
    return spec.make_inputs(case, case["seed"] * 31 + 7, device)


@pytest.mark.parametrize("case", SMOKE, ids=spec.case_name)
@pytest.mark.parametrize("port", PORTS)
def test_port_matches_float64_reference(port, case):
    data = fresh_inputs(case)
    out = run_port(port, data)
    assert torch.isfinite(out).all(), "unwritten (NaN-poisoned) or non-finite elements"
    verdict = spec.check(data, out, spec.reference(data))
    assert verdict.passed, verdict.reason
    assert verdict.errors["rel_fro"] < 5e-3  # fp16 operands: far inside the 2e-2 gate


@pytest.mark.parametrize("case", SMOKE, ids=spec.case_name)
@pytest.mark.parametrize("port", PORTS[1:])
def test_ports_agree_with_the_reference_port(port, case):
    data = fresh_inputs(case)  # the reference port: the first registered, as in the driver's bitwise comparisons
    other = run_port(port, data)
    scale = spec.reference(data).abs().max()
    assert float((run_port(PORTS[0], data).double() - other.double()).abs().max()) <= 1e-3 * float(scale)


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


# --- the driver ------------------------------------------------------------------------------

def cached_trimul(data, _memory={}):
    """A planted cheat: computes once, then returns that first answer for every later call."""
    if "out" not in _memory:
        _memory["out"] = spec.trimul_torch_fp32(data)
    return _memory["out"]


def address_cached_trimul(data, _memory={}):
    """A subtler cheat: remembers each answer by the input's address and returns it when the same
    tensor comes back (rotating through a fixed pool of inputs would let it look fast)."""
    key = data[0].data_ptr()
    if key not in _memory:
        _memory[key] = spec.trimul_torch_fp32(data)
    return _memory[key].clone()


def raising_trimul(data):
    raise RuntimeError("planted failure")


def nan_trimul(data):
    return torch.full_like(data[0], float("nan"))


def wrong_shape_trimul(data):
    return spec.trimul_torch_fp32(data)[:, 1:]


def planted_workload(*names):
    planted = tuple(Implementation(name, "torch", "library", name, f"test_trimul:{name}_trimul")
                    for name in names)
    return dataclasses.replace(spec.WORKLOAD, cases={"smoke": SMOKE[:1]},
                               implementations=spec.WORKLOAD.implementations + planted)


def test_driver_never_times_a_call_on_seen_data(tmp_path):
    settings = Settings(pool=2, min_iters=6, max_iters=6, min_seconds=0.0, timed=True)
    record = run(planted_workload("address_cached"), ["address_cached"], ["smoke"], tmp_path / "r.json",
                 settings, progress=lambda message: None)
    result = record["results"][0]
    # an address can come back (allocators reuse memory), but never with data seen before: a hit
    # returns another input's answer and the timed check catches it; a miss computes honestly
    calls = 2 + 6
    hits = calls - len(address_cached_trimul.__defaults__[0])
    assert (result["status"] == "fail") == (hits > 0)


@pytest.mark.parametrize("timer", ["host", "all"])
def test_driver_reports_cached_result_as_failing_not_fast(tmp_path, monkeypatch, timer):
    # under --timer all every timed input is called three ways, each output checked (the profiler stood in for here)
    import compare.timing as timing

    monkeypatch.setattr(timing, "profiled_calls", lambda function, inputs: (function(inputs), {"kernel": 0.001}))
    cached_trimul.__defaults__[0].clear()
    settings = Settings(pool=3, min_iters=4, max_iters=4, min_seconds=0.0, timed=True, timer=timer)
    record = run(planted_workload("cached"), ["cached", "torch"], ["smoke"], tmp_path / "r.json",
                 settings, progress=lambda message: None)
    status = {r["impl"]: r for r in record["results"]}
    assert status["cached"]["status"] == "fail"
    assert "outputs wrong" in status["cached"]["reason"]
    assert "geomean_ms" not in record["summary"]["smoke"]["cached"]
    calls = 2 + 4 * (3 if timer == "all" else 1)  # the first call and the warm-up, then each timed input
    assert status["torch"]["status"] == "pass" and status["torch"]["checked"] == f"{calls}/{calls} outputs passed"


def test_driver_time_budget_stops_slow_cases_after_three_runs(tmp_path):
    settings = Settings(pool=2, min_iters=40, max_iters=40, min_seconds=0.0, max_seconds=1e-9, timed=True)
    record = run(planted_workload(), ["torch"], ["smoke:0"], tmp_path / "r.json", settings,
                 progress=lambda message: None)
    result = record["results"][0]
    assert result["status"] == "pass" and result["runs"] == 3 and result["checked"] == "5/5 outputs passed"


def test_driver_isolates_failures_and_keeps_results(tmp_path):
    path = tmp_path / "r.json"
    record = run(planted_workload("raising", "nan", "wrong_shape"), ["raising", "nan", "wrong_shape", "torch"],
                 ["smoke"], path, Settings(timed=False), progress=lambda message: None)
    status = {r["impl"]: r for r in record["results"]}
    assert status["raising"]["status"] == "error" and "planted failure" in status["raising"]["reason"]
    assert 'File "tests/test_trimul.py"' in status["raising"]["traceback"]  # relative: no machine's directories
    assert status["nan"]["status"] == "fail" and "non-finite" in status["nan"]["reason"]
    assert status["wrong_shape"]["status"] == "fail" and "shape" in status["wrong_shape"]["reason"]
    assert status["torch"]["status"] == "pass"
    assert len(json.loads(path.read_text())["results"]) == 4


def test_driver_end_to_end(tmp_path, capsys):
    path, chart = tmp_path / "trimul.json", tmp_path / "trimul.png"
    code = compare_main(["trimul", "--impl", "triton,pallas", "--impl", "torch", "--cases", "smoke",
                         "--json", str(path), "--plot", str(chart), "--time", "--iters", "2", "--pool", "2"])
    assert code == 0
    record = json.loads(path.read_text())
    assert len(record["results"]) == len(SMOKE) * 3 and all(r["status"] == "pass" for r in record["results"])
    assert ON_GPU or all(r["runs"] >= 2 for r in record["results"])
    assert all(r["max_abs_diff"] < 2e-2 for r in record["cross"]) and record["cross"]
    assert chart.stat().st_size > 1000
    shown = capsys.readouterr().out
    assert "NOT GPU timings" in shown or ON_GPU


@pytest.mark.parametrize("argv", [["nope"], ["trimul", "--impl", "nope"], ["trimul", "--cases", "nope"]])
def test_cli_rejects_unknown_names_with_code_2(argv, capsys):
    assert compare_main(argv) == 2
    assert "valid:" in capsys.readouterr().err


def test_cli_runs_one_case_by_index_and_rejects_an_index_out_of_range(tmp_path, capsys):
    path = tmp_path / "one.json"
    assert compare_main(["trimul", "--impl", "triton", "--cases", "smoke:1", "--json", str(path)]) == 0
    results = json.loads(path.read_text())["results"]
    assert [r["case"] for r in results] == [spec.case_name(SMOKE[1])]
    assert compare_main(["trimul", "--cases", f"smoke:{len(SMOKE)}"]) == 2
    assert "out of range" in capsys.readouterr().err


COUNTED_VARIANT = '''"""The Triton port as a variant file: the port itself, its calls counted."""
from triton_kernels.trimul import trimul as port

CALLS = []


def trimul(data):
    CALLS.append(1)
    return port(data)
'''
ZERO_VARIANT = '''"""A variant file whose answer is wrong: zeros."""
import torch


def trimul(data):
    return torch.zeros_like(data[0])
'''


def test_cli_runs_variants_of_a_port_from_their_files(tmp_path):
    counted, zero = tmp_path / "trimul_counted.py", tmp_path / "trimul_zero.py"
    counted.write_text(COUNTED_VARIANT)
    zero.write_text(ZERO_VARIANT)
    path = tmp_path / "variants.json"
    code = compare_main(["trimul", "--impl", "triton", "--variant", f"counted=triton:{counted}",
                         "--variant", f"zero=triton:{zero}", "--cases", "smoke:0", "--json", str(path)])
    record = json.loads(path.read_text())
    results = {r["impl"]: r for r in record["results"]}
    assert code == 1 and list(results) == ["triton", "counted", "zero"]
    labels = {entry["name"]: entry["label"] for entry in record["implementations"]}  # which file each variant ran
    assert labels["counted"].endswith(f"variant from {counted}") and "variant" not in labels["triton"]
    assert results["counted"]["status"] == "pass" and results["counted"]["backend"] == "triton"
    assert ports._module_from_file(str(counted)).CALLS  # the file's function ran, not the port's module
    assert results["zero"]["status"] == "fail"  # a variant is checked as every implementation is


def test_one_call_calls_each_implementation_and_reports_a_failure(tmp_path, capsys):
    # the process an outside profiler (ncu) wraps: each implementation called --calls times on the case's input,
    # a failing one named on one line while the others still run
    from compare.one_call import main as one_call_main

    counted, broken = tmp_path / "trimul_counted.py", tmp_path / "trimul_broken.py"
    counted.write_text(COUNTED_VARIANT)
    broken.write_text("def trimul(data):\n    raise RuntimeError('no kernel')\n")
    code = one_call_main(["trimul", "--case", "smoke:0", "--impl", "broken,counted", "--calls", "2",
                          "--variant", f"counted=triton:{counted}", "--variant", f"broken=triton:{broken}"])
    out = capsys.readouterr().out
    assert code == 1 and "broken: failed: RuntimeError: no kernel" in out and "counted: 2 call(s)" in out
    assert len(ports._module_from_file(str(counted)).CALLS) == 2
    assert one_call_main(["trimul", "--case", "smoke"]) == 2  # one case, SET:INDEX


def test_tools_choose_the_triton_interpreter_without_a_gpu(monkeypatch):
    # the driver and its one-case tools run the kernels through the interpreter on a CPU (set before triton loads)
    from compare import gpu_or_interpreters

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    on_gpu = gpu_or_interpreters()
    assert on_gpu == torch.cuda.is_available()
    assert os.environ.get("TRITON_INTERPRET") == (None if on_gpu else "1")


SIGN_VARIANT = '''"""A variant file wrong on some inputs only: zeros where the input's first element is positive."""
import torch

from triton_kernels.trimul import trimul as port


def trimul(data):
    return torch.zeros_like(port(data)) if float(data[0].flatten()[0]) > 0 else port(data)
'''


def test_hunt_names_the_seeds_whose_inputs_fail_and_checks_them_again(tmp_path, capsys):
    # fresh inputs seed by seed, each output checked: the seeds an implementation gets wrong are named (and
    # recorded), the others pass; --seeds checks exactly the given inputs again
    from compare.hunt import main as hunt_main, seed_order

    case = SMOKE[0]
    order, ranged = seed_order(case, None, None), seed_order(case, 200, None)
    assert [next(order) for _ in range(3)] == [case["seed"], 1, 2] and list(seed_order(case, 1, [9, 4])) == [9, 4]
    assert [next(ranged) for _ in range(2)] == [200, 201]  # a range given: the case's own seed is not drawn again
    seeds = [case["seed"], 1, 2, 3, 4, 5]
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the hunt's: the generator's device sets the input
    wrong = [seed for seed in seeds if float(spec.make_inputs(case, seed, device)[0].flatten()[0]) > 0]
    assert 0 < len(wrong) < len(seeds)  # the variant fails some of these inputs, not all
    sign, path = tmp_path / "trimul_sign.py", tmp_path / "hunt.json"
    sign.write_text(SIGN_VARIANT)
    code = hunt_main(["trimul", "--case", "smoke:0", "--impl", "triton,sign", "--variant", f"sign=triton:{sign}",
                      "--seeds", ",".join(map(str, seeds)), "--json", str(path)])
    out = capsys.readouterr().out
    results = json.loads(path.read_text())["results"]
    assert code == 1 and results["triton"]["inputs"] == results["sign"]["inputs"] == len(seeds)
    assert results["triton"]["failures"] == [] and [f["seed"] for f in results["sign"]["failures"]] == wrong
    assert f"--variant sign=triton:{sign} --seeds {','.join(map(str, wrong))}" in out  # the command to check again
    # a time-limited hunt runs the case's own seed at least; one that does not load is named and left out
    broken = tmp_path / "trimul_broken.py"
    broken.write_text("raise ImportError('no module')\n")
    code = hunt_main(["trimul", "--case", "smoke:0", "--impl", "triton,broken", "--variant", f"broken=triton:{broken}",
                      "--seconds", "0.001", "--json", str(path)])
    record = json.loads(path.read_text())
    assert code == 1 and record["first_seed"] is None and record["results"]["triton"]["inputs"] == 1
    assert record["results"]["triton"]["failures"] == [] and "no module" in record["results"]["broken"]["load_error"]
    assert hunt_main(["trimul", "--case", "smoke:0", "--impl", "triton", "--seeds", "1,2"]) == 0
    assert hunt_main(["trimul", "--case", "smoke:0", "--seconds", "0"]) == 2
    assert hunt_main(["trimul", "--case", "smoke:0", "--seeds", ","]) == 2


@pytest.mark.parametrize("variant, message", [
    ("fast", "NAME=IMPL:FILE"), ("fast=triton", "NAME=IMPL:FILE"), ("pallas=triton:{file}", "is taken"),
    ("fast=nope:{file}", "valid:"), ("fast=triton:{missing}", "not a Python file")])
def test_cli_rejects_bad_variants_with_code_2(tmp_path, capsys, variant, message):
    file = tmp_path / "trimul_counted.py"
    file.write_text(COUNTED_VARIANT)
    spec_text = variant.format(file=file, missing=tmp_path / "missing.py")
    assert compare_main(["trimul", "--variant", spec_text, "--cases", "smoke:0"]) == 2
    assert message in capsys.readouterr().err


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
    jax = pytest.importorskip("jax")
    from pallas_kernels.trimul import _trimul
    x, mask, weights, config = to_framework("jax", spec.make_inputs(SMOKE[0], 1, "cpu"))
    lowered = _trimul.trace(x, mask, weights, hidden=config["hidden_dim"], interpret=False).lower(
        lowering_platforms=("cuda",))
    assert "triton" in lowered.as_text()


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
    lowered = _trimul.trace(jax.ShapeDtypeStruct((batch, seq, seq, dim), "float32"),
                            jax.ShapeDtypeStruct((batch, seq, seq), "float32"), weights, hidden=hidden,
                            interpret=False).lower(lowering_platforms=("cuda",))
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


@pytest.mark.skipif(ON_GPU, reason="on a GPU the other tests compile and run the kernels")
@pytest.mark.parametrize("case", ["smoke:0", "test:4"], ids=["hidden32-dim32", "dim768"])
def test_gluon_port_compiles_for_hopper(compile_for_hopper, case):
    # Triton's interpreter does not run Gluon: on a CPU its three launches are compiled for sm_90 as launched, with
    # hidden padded to 64 channels and N to 64 (smoke:0), and at dim 768 with 128-wide tiles (test:4)
    status, output = compile_for_hopper("trimul", case, "--impl", "gluon", "--specialise")
    assert status == 0 and "3 kernels compiled for sm_90" in output, output


@pytest.mark.skipif(ON_GPU, reason="on a GPU the other tests compile the kernels for it")
def test_a_variant_compiles_for_hopper(compile_for_hopper, tmp_path):
    counted = tmp_path / "trimul_counted.py"
    counted.write_text(COUNTED_VARIANT)
    status, output = compile_for_hopper("trimul", "bench:0", "--impl", "counted", "--variant",
                                        f"counted=triton:{counted}")
    assert status == 0 and ", counted: " in output and "compiled for sm_90" in output, output


def test_kernel_times_reads_registers_and_spills_from_triton_caches(monkeypatch):
    # what a launch leaves in a JIT function's per-device cache: n_regs, and n_spills in 4-byte words
    import types

    from triton.runtime.jit import JITFunction

    from compare.kernel_times import compiled_kernels

    def add(x):
        return x

    kernel = JITFunction.__new__(JITFunction)
    compiled = types.SimpleNamespace(metadata=types.SimpleNamespace(num_warps=4), n_regs=96, n_spills=18)
    unloaded = types.SimpleNamespace(metadata=types.SimpleNamespace(num_warps=8))  # never launched: no n_regs
    kernel.device_caches = {0: ({"key": compiled, "other": unloaded}, {}, None, None, None)}
    module = types.ModuleType("kernels_with_cache")
    module.launcher, module._kernel = add, kernel
    add.__module__ = module.__name__
    monkeypatch.setitem(sys.modules, module.__name__, module)
    assert compiled_kernels(add) == [("_kernel", 4, 96, 72)]


def test_kernel_times_reports_a_failing_implementation_and_goes_on(capsys):
    import types

    from compare.kernel_times import report

    def out_of_shared_memory(inputs):
        raise RuntimeError("while launching eigh_back_transform:\nShared memory size limit exceeded: requested 270336")

    impl = types.SimpleNamespace(name="broken", framework="torch", backend="triton",
                                 load=lambda: out_of_shared_memory)
    assert report(impl, (torch.zeros(2),), runs=1) is False
    expected = "broken: failed: RuntimeError: Shared memory size limit exceeded: requested 270336\n"
    assert capsys.readouterr().out == expected


def fake_profiler(recorded, trace_events=()):
    """A stand-in for torch.profiler.profile, which refuses to trace CUDA where there is none: its events() are
    `recorded` ((name, device microseconds[, "CPU"]), CUDA unless named), its Chrome trace `trace_events`."""
    class FakeProfiler:
        def __init__(self, activities):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exception):
            return False

        def events(self):
            return [SimpleNamespace(name=name, device_time=us,
                                    device_type=getattr(torch.autograd.DeviceType, kind[0] if kind else "CUDA"))
                    for name, us, *kind in recorded]

        def export_chrome_trace(self, path):
            with open(path, "w") as file:
                json.dump({"traceEvents": list(trace_events)}, file)

    return FakeProfiler


def test_kernel_times_waits_for_every_array_of_each_call_warm_up_included(monkeypatch):
    # A JAX call returns before its kernels have run: unless the warm-up is waited for, its kernels run (and are
    # counted) while the profiled calls start; and each array of a tuple output is waited for, not only a lone one.
    from compare.kernel_times import kernel_times

    waited = []

    class Pending:
        def __init__(self, name):
            self.name = name

        def block_until_ready(self):
            waited.append(self.name)
            return self

    calls = []

    def jax_like(inputs):
        calls.append(inputs)
        return Pending(f"Q{len(calls)}"), Pending(f"L{len(calls)}")

    # device_time in microseconds; only CUDA events count
    monkeypatch.setattr(torch.profiler, "profile", fake_profiler([("kernel", 3000.0), ("host", 5000.0, "CPU")]))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)
    assert kernel_times(jax_like, "inputs", runs=2) == {"kernel": 1.5}
    assert calls == ["inputs"] * 3
    assert waited == ["Q1", "L1", "Q2", "L2", "Q3", "L3"]


def test_kernel_times_lists_each_kernels_launch_resources_from_the_trace(monkeypatch, capsys):
    # CUPTI's records in the profiler's Chrome trace give every kernel's registers, block and shared memory, XLA's
    # included; a name launched with two specialisations lists both, and a kernel the trace has no record of a dash
    from compare.kernel_times import launch_resources, report

    events = [
        {"cat": "kernel", "name": "eigh_bisect", "args": {"registers per thread": 38, "block": [32, 1, 1],
                                                          "shared memory": 0}},
        {"cat": "kernel", "name": "eigh_bisect", "args": {"registers per thread": 38, "block": [32, 1, 1],
                                                          "shared memory": 0}},
        {"cat": "kernel", "name": "inverse", "args": {"registers per thread": 60, "block": [32, 1, 1]}},
        {"cat": "kernel", "name": "inverse", "args": {"registers per thread": 52, "block": [16, 2, 1],
                                                      "shared memory": 512}},
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "args": {"registers per thread": 1}},
        {"cat": "kernel", "name": "memcpy", "args": {}},
    ]
    assert launch_resources(events) == {"eigh_bisect": [(38, 32, 0)], "inverse": [(52, 32, 512), (60, 32, 0)]}

    monkeypatch.setattr(torch.profiler, "profile",
                        fake_profiler([("eigh_bisect", 4000.0), ("inverse", 2000.0), ("memcpy", 1000.0)], events))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)
    impl = SimpleNamespace(name="pallas", framework="torch", backend="pallas-triton", load=lambda: lambda inputs: inputs)
    assert report(impl, (torch.zeros(2),), runs=1) is True
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "pallas: 7.000 ms in kernels"
    assert lines[1].split() == ["4.000", "ms", "38", "regs", "32", "thr", "0", "B", "eigh_bisect"]
    assert lines[2].split() == ["2.000", "ms", "52", "regs", "32", "thr", "512", "B;", "60", "regs", "32", "thr", "0",
                                "B", "inverse"]
    assert lines[3].split() == ["1.000", "ms", "-", "memcpy"]


def test_kernel_times_keeps_the_times_when_the_trace_cannot_be_read(monkeypatch, capsys):
    from compare.kernel_times import report

    class Untraced(fake_profiler([("eigh_bisect", 4000.0)])):
        def export_chrome_trace(self, path):
            raise OSError("No space left on device")

    monkeypatch.setattr(torch.profiler, "profile", Untraced)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)
    impl = SimpleNamespace(name="pallas", framework="torch", backend="pallas-triton", load=lambda: lambda inputs: inputs)
    assert report(impl, (torch.zeros(2),), runs=1) is True
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "pallas: launch resources unavailable: OSError: No space left on device"
    assert lines[1] == "pallas: 4.000 ms in kernels"
    assert lines[2].split() == ["4.000", "ms", "-", "eigh_bisect"]


@pytest.mark.parametrize("variant", ["fast=triton", "fast=nope:{file}"])
def test_kernel_times_rejects_bad_variants_with_code_2(tmp_path, capsys, variant):
    from compare.kernel_times import main as kernel_times_main
    file = tmp_path / "trimul_counted.py"
    file.write_text(COUNTED_VARIANT)
    assert kernel_times_main(["trimul", "--variant", variant.format(file=file)]) == 2
    assert "bad argument" in capsys.readouterr().err
