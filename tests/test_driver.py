"""The driver, its command line and `--variant`, on TriMul: its ports, its baselines and planted implementations
(a cached answer, a raise, NaN, a wrong shape) that the driver must report as failing, never as fast; and the cheats
(a port right on every input but the ones the driver might never make) that each workload's default CPU case set
must catch."""
import collections
import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest
import torch

import ports
from compare.__main__ import main as compare_main
from compare.driver import Settings, run, select_cases
from ports import Implementation
from ports import eigh as eigh_spec
from ports import matmul as matmul_spec
from ports import trimul as spec

ON_GPU = torch.cuda.is_available()
SMOKE = spec.SMOKE_CASES


def cached_trimul(data, _memory={}):
    """A planted cheat: computes once, then returns that first answer for every later call."""
    if "out" not in _memory:
        _memory["out"] = spec.trimul_torch_fp32(data)
    return _memory["out"]


def raising_trimul(data):
    raise RuntimeError("planted failure")


def cuda_error_trimul(data):
    raise RuntimeError("CUDA error: planted")  # as a kernel's fault surfaces at the next call


def nan_trimul(data):
    return torch.full_like(data[0], float("nan"))


def wrong_shape_trimul(data):
    return spec.trimul_torch_fp32(data)[:, 1:]


def planted_workload(*names):
    planted = tuple(Implementation(name, "torch", "library", name, f"test_driver:{name}_trimul")
                    for name in names)
    return dataclasses.replace(spec.WORKLOAD, cases={"smoke": SMOKE[:1]},
                               implementations=spec.WORKLOAD.implementations + planted)


def seen_trimul(data, _seen=[]):
    """The reference, recording the bits of every argument it is given (x, the mask, each weight)."""
    x, mask, weights, _ = data
    _seen.append((ports.output_digest(x), ports.output_digest(mask), ports.output_digest(list(weights.values()))))
    return spec.trimul_torch_fp32(data)


def test_driver_never_calls_on_seen_data(tmp_path):
    # timed and untimed, every call's x, mask and weights are values no earlier call had: neither a memo by an
    # argument's address nor one by its values can answer a call
    seen = seen_trimul.__defaults__[0]
    seen.clear()
    settings = Settings(pool=2, min_iters=6, max_iters=6, min_seconds=0.0, max_seconds=1e-9, timed=True)
    masked = dataclasses.replace(planted_workload("seen"), cases={"smoke": [SMOKE[1]]})  # a mask of 0s and 1s
    record = run(masked, ["seen"], ["smoke"], tmp_path / "r.json", settings, progress=lambda message: None)
    assert record["results"][0]["status"] == "pass" and len(seen) >= 2 + 6 + 1
    for argument in range(3):
        digests = [call[argument] for call in seen]
        assert len(set(digests)) == len(digests), argument


class Replayed:
    """A CPU's stand-in for `compare.timing.GraphCall`: the call "replayed" on the buffers it was captured on."""

    def __init__(self, function, buffers):
        self.function, self.buffers = function, buffers

    def __call__(self, data, sync):
        from compare.timing import _copy_into

        _copy_into(self.buffers, data)
        return self.function(self.buffers), 0.001


@pytest.mark.parametrize("timer", ["host", "all", "graph"])
def test_driver_reports_cached_result_as_failing_not_fast(tmp_path, monkeypatch, timer):
    # under --timer all every timed input is called three ways, each output checked (the profiler stood in for
    # here); under --timer graph each is replayed on the graph's buffers (a stand-in here) and checked
    import compare.driver as driver
    import compare.timing as timing

    monkeypatch.setattr(timing, "profiled_calls", lambda function, inputs: (function(inputs), {"kernel": 0.001}))
    monkeypatch.setattr(driver, "GraphCall", Replayed)
    cached_trimul.__defaults__[0].clear()
    settings = Settings(pool=3, min_iters=4, max_iters=4, min_seconds=0.0, timed=True, timer=timer)
    record = run(planted_workload("cached"), ["cached", "torch"], ["smoke"], tmp_path / "r.json",
                 settings, progress=lambda message: None)
    status = {r["impl"]: r for r in record["results"]}
    assert status["cached"]["status"] == "fail"
    assert "outputs wrong" in status["cached"]["reason"]
    assert "geomean_ms" not in record["summary"]["smoke"]["cached"]
    # the first call and the warm-up, each timed input once a timer, then untimed inputs up to the drawn count
    passed, calls = map(int, status["torch"]["checked"].split()[0].split("/"))
    assert status["torch"]["status"] == "pass" and passed == calls
    assert 4 + 1 <= calls - 2 - 4 * (2 if timer == "all" else 0) <= 4 + 2


def test_the_graph_clock_skips_jax_ports_and_replays_torchs(tmp_path, monkeypatch):
    import compare.driver as driver

    if not ON_GPU:
        monkeypatch.setattr(driver, "GraphCall", Replayed)
    settings = Settings(pool=2, min_iters=3, max_iters=3, min_seconds=0.0, timed=True, timer="graph")
    record = run(planted_workload(), ["torch", "jax_xla"], ["smoke:0"], tmp_path / "r.json", settings,
                 progress=lambda message: None)
    status = {r["impl"]: r for r in record["results"]}
    assert status["jax_xla"]["status"] == "skipped" and "JAX call" in status["jax_xla"]["reason"]
    assert status["torch"]["status"] == "pass" and status["torch"]["runs"] == 3 and status["torch"]["median_ms"] > 0


def test_driver_draws_each_cases_call_count_afresh():
    from compare.driver import extra_calls

    assert {extra_calls(10) for _ in range(200)} == {1, 2, 3, 4, 5} and {extra_calls(1) for _ in range(20)} == {1}


def test_driver_time_budget_ends_the_timing_after_three_runs_never_the_checks(tmp_path):
    settings = Settings(pool=2, min_iters=40, max_iters=40, min_seconds=0.0, max_seconds=1e-9, timed=True)
    record = run(planted_workload(), ["torch"], ["smoke:0"], tmp_path / "r.json", settings,
                 progress=lambda message: None)
    result = record["results"][0]
    passed, calls = map(int, result["checked"].split()[0].split("/"))
    assert result["status"] == "pass" and result["runs"] == 3 and passed == calls >= 2 + 41


def test_driver_isolates_failures_and_keeps_results(tmp_path):
    path = tmp_path / "r.json"
    record = run(planted_workload("raising", "nan", "wrong_shape"), ["raising", "nan", "wrong_shape", "torch"],
                 ["smoke"], path, Settings(timed=False), progress=lambda message: None)
    status = {r["impl"]: r for r in record["results"]}
    assert status["raising"]["status"] == "error" and "planted failure" in status["raising"]["reason"]
    assert 'File "tests/test_driver.py"' in status["raising"]["traceback"]  # relative: no machine's directories
    assert status["nan"]["status"] == "fail" and "non-finite" in status["nan"]["reason"]
    assert status["wrong_shape"]["status"] == "fail" and "shape" in status["wrong_shape"]["reason"]
    assert status["torch"]["status"] == "pass"
    assert len(json.loads(path.read_text())["results"]) == 4
    assert list(record["summary"]["smoke"]) == ["raising", "nan", "wrong_shape", "torch"]  # the run's order


def test_driver_stops_where_the_cuda_context_is_lost_and_keeps_what_came_before(tmp_path, monkeypatch):
    """An error that leaves the CUDA context unusable (as an illegal address does) fails every later call: the run
    stops at it, says why, and keeps the results before it. The context's loss is planted: CI has no GPU."""
    import compare.driver

    monkeypatch.setattr(compare.driver, "context_lost",
                        lambda device: "AcceleratorError: planted" if device else None)
    path = tmp_path / "r.json"
    workload = dataclasses.replace(planted_workload("cuda_error", "nan"), cases={"smoke": SMOKE[:2]})
    record = run(workload, ["torch", "cuda_error", "nan"], ["smoke"], path, Settings(timed=False),
                 progress=lambda message: None)
    assert [r["impl"] for r in record["results"]] == ["torch", "cuda_error"]
    assert {r["case"] for r in record["results"]} == {spec.case_name(SMOKE[0])}
    assert "lost at smoke" in record["stopped"] and "cuda_error (AcceleratorError: planted)" in record["stopped"]
    assert json.loads(path.read_text())["stopped"] == record["stopped"] and "finished" in record


def test_a_lost_cuda_context_is_what_a_synchronisation_raises(monkeypatch):
    """`context_lost` itself, its synchronisation planted (CI has no GPU): a raise is the loss, named; a return is
    none; a CPU run is never asked. Its first version named torch without importing it, which only a GPU reached."""
    from compare.driver import context_lost

    def lost():
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore lines")

    monkeypatch.setattr(torch.cuda, "synchronize", lost)
    assert context_lost("cuda") == "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert context_lost("cpu") is None
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    assert context_lost("cuda") is None


def test_driver_end_to_end(tmp_path, capsys):
    path, chart = tmp_path / "trimul.json", tmp_path / "trimul.png"
    # three smoke cases: a batch with a mask, a strided float mask, transposed input (the ports' own tests run all)
    cases = [f"smoke:{index}" for index in (1, 4, 5)]
    code = compare_main(["trimul", "--impl", "triton,pallas", "--impl", "torch", *(f"--cases={c}" for c in cases),
                         "--json", str(path), "--plot", str(chart), "--time", "--iters", "2", "--pool", "2"])
    assert code == 0
    record = json.loads(path.read_text())
    assert len(record["results"]) == len(cases) * 3 and all(r["status"] == "pass" for r in record["results"])
    assert ON_GPU or all(r["runs"] >= 2 for r in record["results"])
    assert all(r["max_abs_diff"] < 2e-2 for r in record["cross"]) and record["cross"]
    assert chart.stat().st_size > 1000
    shown = capsys.readouterr().out
    assert ON_GPU or "NOT GPU timings" in shown and "promise nothing of the GPU's bits" in shown


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


def test_cli_runs_variants_of_a_port_from_their_files(tmp_path, trimul_variant):
    counted, zero = trimul_variant("counted"), trimul_variant("zero")
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


@pytest.mark.parametrize("variant, message", [
    ("fast", "NAME=IMPL:FILE"), ("fast=triton", "NAME=IMPL:FILE"), ("pallas=triton:{file}", "is taken"),
    ("fast=nope:{file}", "valid:"), ("fast=triton:{missing}", "not a Python file")])
def test_cli_rejects_bad_variants_with_code_2(tmp_path, capsys, trimul_variant, variant, message):
    file = trimul_variant("counted")
    spec_text = variant.format(file=file, missing=tmp_path / "missing.py")
    assert compare_main(["trimul", "--variant", spec_text, "--cases", "smoke:0"]) == 2
    assert message in capsys.readouterr().err


# --- cheats: each right wherever the driver once looked, wrong where it did not; each must fail the default CPU set

def wrong(output):
    return output * 1.5


def weights_address_cached_trimul(data, _memory={}):
    key = data[2]["left_proj.weight"].data_ptr()  # the weights never changed between calls: a memo by their address
    if key not in _memory:
        _memory[key] = spec.trimul_torch_fp32(data)
    return _memory[key].clone()


def float_mask_as_ones_trimul(data):
    x, mask, weights, config = data
    return spec.trimul_torch_fp32((x, torch.ones_like(mask) if mask.is_floating_point() else mask, weights, config))


def wrong_at_batch_three_trimul(data):
    output = spec.trimul_torch_fp32(data)
    return wrong(output) if data[0].shape[0] >= 3 else output


def wrong_at_ragged_n_trimul(data):
    output = spec.trimul_torch_fp32(data)
    return wrong(output) if data[0].shape[1] % 16 else output


def wrong_on_views_trimul(data):
    output = spec.trimul_torch_fp32(data)
    return output if data[0].is_contiguous() else wrong(output)


def wrong_from_the_13th_call_trimul(data, _calls=collections.Counter()):
    shape = tuple(data[0].shape)
    _calls[shape] += 1  # --iters 10 once made exactly 12 calls a case
    output = spec.trimul_torch_fp32(data)
    return wrong(output) if _calls[shape] >= 13 else output


def wrong_from_the_6th_call_trimul(data, _calls=collections.Counter()):
    shape = tuple(data[0].shape)
    _calls[shape] += 1  # a slow port's time budget once ended its checks after 5 calls
    output = spec.trimul_torch_fp32(data)
    return wrong(output) if _calls[shape] >= 6 else output


def scales_x_in_place_trimul(data):
    output = spec.trimul_torch_fp32(data)
    data[0].mul_(2.0)  # after computing: the output LayerNorm would hide a scaled x from the check
    return output


def writes_the_answer_into_a_eigh(a):
    values = torch.linalg.eigvalsh(a)
    a.copy_(torch.diag_embed(values))  # then Q = I satisfies A Q = Q L for the A the check would read after the call
    return torch.eye(a.shape[-1]).expand_as(a).contiguous(), values


def wrong_above_64_eigh(a):
    vectors, values = eigh_spec.eigh_torch(a)
    return vectors, values * 1.01 if a.shape[-1] > 64 else values


def last_bit_varies_above_64_matmul(data, _calls=[0]):
    output = matmul_spec.matmul_torch(data)
    _calls[0] += 1
    if data[0].shape[0] > 64 and _calls[0] % 2:
        bits = output.view({2: torch.int16, 4: torch.int32}[output.element_size()])
        bits[0, 0] ^= 1  # within every tolerance: only the run-to-run property can see it
    return output


CHEATS = [  # (workload, planted port, settings, what the failure names)
    ("trimul", "weights_address_cached", Settings(timed=False), "outputs wrong"),
    ("trimul", "float_mask_as_ones", Settings(timed=False), "n20-b3-d32-h32-normal-fmask-strided"),
    ("trimul", "wrong_at_batch_three", Settings(timed=False), "n20-b3"),
    ("trimul", "wrong_at_ragged_n", Settings(timed=False), "n20-b3"),
    ("trimul", "wrong_on_views", Settings(timed=False), "strided"),
    ("trimul", "wrong_from_the_13th_call", Settings(timed=False), "call 13"),
    ("trimul", "wrong_from_the_6th_call", Settings(min_seconds=0.0, max_seconds=1e-9), "call 6"),
    ("trimul", "scales_x_in_place", Settings(timed=False), "wrote into its input (x)"),
    ("eigh", "writes_the_answer_into_a", Settings(timed=False), "wrote into its input (A)"),
    ("eigh", "wrong_above_64", Settings(timed=False), "1x65"),
    ("matmul", "last_bit_varies_above_64", Settings(timed=False), "run-to-run determinism"),
]


@pytest.mark.parametrize("workload, cheat, settings, named", CHEATS, ids=[cheat for _, cheat, _, _ in CHEATS])
def test_every_cheat_fails_the_driver_on_the_default_cpu_set(workload, cheat, settings, named):
    registered = ports.get_workload(workload)
    planted = Implementation(cheat, "torch", "triton", cheat, f"test_driver:{cheat}_{workload}")
    record = run(dataclasses.replace(registered, implementations=registered.implementations + (planted,)), [cheat],
                 ["smoke"], None, settings, progress=lambda message: None)
    failed = [f"{r['case']}: {r['reason']}" for r in record["results"] if r["status"] != "pass"]
    failed += [p["property"] for p in record.get("properties", []) if p["passed"] is False]
    assert failed and any(named in failure for failure in failed), failed


@pytest.mark.parametrize("command", ["compare", "compare invariance", "compare report", "compare.suite"])
def test_help_fits_100_columns_names_no_issue_and_gives_every_options_default(command):
    shown = subprocess.run([sys.executable, "-m", *command.split(), "--help"], capture_output=True, text=True,
                           env={**os.environ, "COLUMNS": "100"}, check=True).stdout
    assert shown and max(map(len, shown.splitlines())) <= 100
    assert not re.search(r"[Ii]ssue \d|session", shown)
    options = re.split(r"\n  (?=-)", "\n" + shown.split("options:\n", 1)[1]) if "options:" in shown else []
    undefaulted = [option.split()[0] for option in options
                   if option.strip() and not option.startswith("-h") and "default" not in option]
    assert not undefaulted, undefaulted


def test_cases_by_the_name_the_table_prints_and_the_list_of_every_case(capsys):
    name = spec.case_name(SMOKE[2])
    assert select_cases(spec.WORKLOAD, name) == [("smoke", SMOKE[2])]
    assert select_cases(spec.WORKLOAD, f"smoke:{name}") == [("smoke", SMOKE[2])]
    with pytest.raises(ValueError, match="`--list` names every case"):
        select_cases(spec.WORKLOAD, "n3-nothing")
    assert compare_main(["trimul", "--list"]) == 0
    listed = capsys.readouterr().out
    assert f"smoke:2    {name}" in listed and f"bench:6    {spec.case_name(spec.BENCH_CASES[6])}" in listed
