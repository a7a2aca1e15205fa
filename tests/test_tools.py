"""The research tools: one_call, hunt and kernel_times on TriMul, the Hopper compile of a variant, call_cost."""
import os
import sys
from types import SimpleNamespace

import json

import pytest
import torch

import ports
from ports import trimul as spec

ON_GPU = torch.cuda.is_available()
SMOKE = spec.SMOKE_CASES


def test_one_call_calls_each_implementation_and_reports_a_failure(tmp_path, capsys, trimul_variant):
    # the process an outside profiler (ncu) wraps: each implementation called --calls times on the case's input,
    # a failing one named on one line while the others still run
    from compare.tools.one_call import main as one_call_main

    counted, broken = trimul_variant("counted"), tmp_path / "trimul_broken.py"
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


def test_hunt_names_the_seeds_whose_inputs_fail_and_checks_them_again(tmp_path, capsys, trimul_variant):
    # fresh inputs seed by seed, each output checked: the seeds an implementation gets wrong are named (and
    # recorded), the others pass; --seeds checks exactly the given inputs again
    from compare.tools.hunt import main as hunt_main, seed_order

    case = SMOKE[0]
    order, ranged = seed_order(case, None, None), seed_order(case, 200, None)
    assert [next(order) for _ in range(3)] == [case["seed"], 1, 2] and list(seed_order(case, 1, [9, 4])) == [9, 4]
    assert [next(ranged) for _ in range(2)] == [200, 201]  # a range given: the case's own seed is not drawn again
    seeds = [case["seed"], 1, 2, 3, 4, 5]
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the hunt's: the generator's device sets the input
    wrong = [seed for seed in seeds if float(spec.make_inputs(case, seed, device)[0].flatten()[0]) > 0]
    assert 0 < len(wrong) < len(seeds)  # the variant fails some of these inputs, not all
    sign, path = trimul_variant("sign"), tmp_path / "hunt.json"
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


def test_a_hunt_stops_where_the_cuda_context_is_lost(tmp_path, capsys, monkeypatch):
    # a kernel's fault makes every later call fail with it: the hunt stops at that input, says so, and keeps the
    # failures before it (the device-wide synchronisation that finds a lost context is stood in for on a CPU)
    import compare.tools.hunt as hunt

    checked = []

    def lost(device):
        checked.append(device)
        return "AcceleratorError: an illegal memory access"

    monkeypatch.setattr(hunt, "context_lost", lost)
    faulting, path = tmp_path / "trimul_faulting.py", tmp_path / "hunt.json"
    faulting.write_text("def trimul(data):\n    raise RuntimeError('CUDA error: an illegal memory access')\n")
    code = hunt.main(["trimul", "--case", "smoke:0", "--impl", "faulting,triton", "--variant",
                      f"faulting=triton:{faulting}", "--seeds", "1,2,3", "--json", str(path)])
    results = json.loads(path.read_text())["results"]
    assert code == 1 and len(checked) == 1 and "stopped: the CUDA context was lost" in capsys.readouterr().out
    assert results["faulting"]["inputs"] == 1 and [f["seed"] for f in results["faulting"]["failures"]] == [1]
    assert results["triton"]["inputs"] == 0 and all("seed 1" in entry["stopped"] for entry in results.values())


def test_the_ledger_adds_up_hunts_over_disjoint_seeds_with_the_code_as_it_stands(tmp_path, capsys):
    # two hunts of disjoint ranges add up; one whose range meets another's is refused; one of other code (a record's
    # digest that is not the tree's) is left out, said why
    from compare.tools.hunt import main as hunt_main
    from compare.tools.hunt_ledger import main as ledger_main

    first, second, overlapping = (tmp_path / f"{name}.json" for name in ("first", "second", "overlapping"))
    for path, seed in ((first, "10"), (second, "12"), (overlapping, "11")):
        assert hunt_main(["trimul", "--case", "smoke:0", "--impl", "triton", "--first-seed", seed, "--seconds",
                          "0.001", "--json", str(path)]) == 0
    record = json.loads(first.read_text())
    assert record["results"]["triton"]["last_seed"] == 10 and len(record["code"]["triton"]) == 64
    capsys.readouterr()
    assert ledger_main([str(first), str(second)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[2].split() == ["triton", "2", "2", "0", "2", "/", "0"] and "--first-seed 13" in out
    assert ledger_main([str(first), str(overlapping), str(second)]) == 0  # 10, 11, 12: disjoint
    overlapping_record = json.loads(overlapping.read_text())
    overlapping_record["first_seed"] = 9
    overlapping.write_text(json.dumps(overlapping_record))
    assert ledger_main([str(first), str(overlapping)]) == 2
    assert "both checked" in capsys.readouterr().err
    record["code"]["triton"] = "0" * 64
    first.write_text(json.dumps(record))
    assert ledger_main([str(first), str(second)]) == 0
    assert f"left out: {first}: other code" in capsys.readouterr().out
    driver_record = tmp_path / "driver.json"
    driver_record.write_text(json.dumps({"workload": "trimul", "results": [{"impl": "triton"}]}))
    assert ledger_main([str(tmp_path / "missing.json")]) == ledger_main([str(driver_record)]) == 2
    assert "not a hunt record" in capsys.readouterr().err


@pytest.mark.skipif(ON_GPU, reason="on a GPU the other tests compile the kernels for it")
def test_a_variant_compiles_for_hopper(compile_for_hopper, trimul_variant):
    counted = trimul_variant("counted")
    status, output = compile_for_hopper("trimul", "bench:0", "--impl", "counted", "--variant",
                                        f"counted=triton:{counted}")
    assert status == 0 and ", counted: " in output and "compiled for sm_90" in output, output


def test_kernel_times_reads_registers_and_spills_from_triton_caches(monkeypatch):
    # what a launch leaves in a JIT function's per-device cache: n_regs, and n_spills in 4-byte words
    import types

    from triton.runtime.jit import JITFunction

    from compare.tools.kernel_times import compiled_kernels

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

    from compare.tools.kernel_times import report

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
    from compare.tools.kernel_times import kernel_times

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
    from compare.tools.kernel_times import launch_resources, report

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
    impl = SimpleNamespace(name="pallas", framework="torch", backend="pallas-triton",
                           load=lambda: lambda inputs: inputs)
    assert report(impl, (torch.zeros(2),), runs=1) is True
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "pallas: 7.000 ms in kernels"
    assert lines[1].split() == ["4.000", "ms", "38", "regs", "32", "thr", "0", "B", "eigh_bisect"]
    assert lines[2].split() == ["2.000", "ms", "52", "regs", "32", "thr", "512", "B;", "60", "regs", "32", "thr", "0",
                                "B", "inverse"]
    assert lines[3].split() == ["1.000", "ms", "-", "memcpy"]


def test_kernel_times_keeps_the_times_when_the_trace_cannot_be_read(monkeypatch, capsys):
    from compare.tools.kernel_times import report

    class Untraced(fake_profiler([("eigh_bisect", 4000.0)])):
        def export_chrome_trace(self, path):
            raise OSError("No space left on device")

    monkeypatch.setattr(torch.profiler, "profile", Untraced)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)
    impl = SimpleNamespace(name="pallas", framework="torch", backend="pallas-triton",
                           load=lambda: lambda inputs: inputs)
    assert report(impl, (torch.zeros(2),), runs=1) is True
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "pallas: launch resources unavailable: OSError: No space left on device"
    assert lines[1] == "pallas: 4.000 ms in kernels"
    assert lines[2].split() == ["4.000", "ms", "-", "eigh_bisect"]


@pytest.mark.parametrize("variant", ["fast=triton", "fast=nope:{file}"])
def test_kernel_times_rejects_bad_variants_with_code_2(capsys, trimul_variant, variant):
    from compare.tools.kernel_times import main as kernel_times_main
    file = trimul_variant("counted")
    assert kernel_times_main(["trimul", "--variant", variant.format(file=file)]) == 2
    assert "bad argument" in capsys.readouterr().err


def test_call_cost_measures_every_piece_of_a_timed_call(capsys, tmp_path):
    # on a CPU the figures are the CPU's; what is checked is that every piece runs and is reported
    pytest.importorskip("jax")
    from compare.tools.call_cost import main

    status = main(["--calls", "2", "--json", str(tmp_path / "cost.json")])
    out = capsys.readouterr().out
    rows = json.loads((tmp_path / "cost.json").read_text())["pieces"]
    assert {"synchronise", "jax, between synchronisations", "triton, back-to-back", "dlpack torch to jax, 13 arrays",
            "torch, a scalar read back", "jax, a scalar read back", "jax, a scalar read back through torch"} <= {
            row["piece"] for row in rows}
    assert status == 0 and all(isinstance(row["us"], float) and 0 < row["us"] < 1e7 for row in rows), rows
    assert len(out.splitlines()) == len(rows) + 1


def test_call_cost_takes_a_ports_call_from_torch_apart(capsys, tmp_path):
    # a real JAX port on a smoke case (the Pallas interpreter on a CPU): every piece runs, is positive and is saved,
    # and its profile names the functions with the most time of their own, no machine path among them
    pytest.importorskip("jax")
    import torch

    from compare.tools.call_cost import PROFILE_ROWS, main

    status = main(["--port", "trimul:pallas", "--case", "smoke:0", "--calls", "2", "--profile",
                   "--json", str(tmp_path / "p.json")])
    saved = json.loads((tmp_path / "p.json").read_text())
    figures = {row["piece"]: row["us"] for row in saved["pieces"]}
    assert status == 0 and saved["port"] == "trimul:pallas" and saved["case"] == "n16-b1-d32-h32-normal-nomask"
    assert {"to_framework", "call, converted once", "host clock", "host clock, fresh tensors",
            "host clock, 20 ms away", "host clock, 20 ms away, one call before", "to_torch", "from torch",
            "from torch, fresh tensors"} | ({"kernels"} if torch.cuda.is_available() else set()) == set(figures)
    assert all(figure is not None and figure > 0 for figure in figures.values()), figures
    profile = saved["profile"]
    assert 0 < len(profile) <= PROFILE_ROWS and all(0 < row["own_us"] <= row["total_us"] for row in profile), profile
    assert [row["own_us"] for row in profile] == sorted((row["own_us"] for row in profile), reverse=True)
    assert not any(row["function"].startswith(("/", "~")) or ":\\" in row["function"] for row in profile), profile
    # two title lines, the pieces, then a blank line, the profile's title and header, its rows
    assert len(capsys.readouterr().out.splitlines()) == 2 + len(figures) + 3 + len(profile)


STAND_IN_EVAL = '''import os, sys
from pathlib import Path
from helpers import split_case
from ports.trimul import make_inputs
from submission import custom_kernel

mode, cases = sys.argv[1], Path(sys.argv[2]).read_text().splitlines()
with os.fdopen(int(os.environ["POPCORN_FD"]), "w") as out:
    out.write(f"seed: {os.environ.get('POPCORN_SEED', 'none')}\\n")
    for index, line in enumerate(cases):
        case = split_case(line)
        data = make_inputs({"seqlen": int(case["seqlen"]), "bs": 1, "dim": 32, "hiddendim": 16, "nomask": True,
                            "distribution": "normal"}, 0)
        result = custom_kernel(data)
        good = tuple(result.shape) == (1, int(case["seqlen"]), int(case["seqlen"]), 32) and case["bad"] == "no"
        out.write(f"benchmark.{index}.spec: {line}\\n" + (f"benchmark.{index}.mean: {int(case['mean'])}\\n" if good
                  else f"benchmark.{index}.status: fail\\nbenchmark.{index}.error: mismatch\\n"))
    out.write(f"check: {'pass' if 'bad: yes' not in ''.join(cases) else 'fail'}\\n")
'''
STAND_IN_FILES = """files:
  - {"name": "submission.py", "source": "@SUBMISSION@"}
  - {"name": "eval.py", "source": "eval.py"}
  - {"name": "helpers.py", "source": "../shared/helpers.py"}
"""


def test_gpu_mode_eval_runs_a_port_as_the_harness_submission(tmp_path, capsys):
    from compare.tools import gpu_mode_eval

    pytest.importorskip("yaml", reason="task.yml is read with pyyaml (transformers, the models extra, brings it)")
    problem, shared = tmp_path / "trimul", tmp_path / "shared"
    problem.mkdir()
    shared.mkdir()
    (problem / "eval.py").write_text(STAND_IN_EVAL)
    (shared / "helpers.py").write_text(  # from outside the problem's folder, as eigh's utils.py comes
        "def split_case(line):\n    return dict(part.split(': ') for part in line.split('; '))\n")
    (problem / "task.yml").write_text(STAND_IN_FILES + 'benchmarks:\n  - {"seqlen": 4, "bad": "no", "mean": 1000000}'
                                      '\n  - {"seqlen": 5, "bad": "no", "mean": 4000000}\ntests: []\n')
    assert gpu_mode_eval.case_lines(problem / "task.yml", "benchmark") == (
        "seqlen: 4; bad: no; mean: 1000000\nseqlen: 5; bad: no; mean: 4000000\n")
    out = tmp_path / "out"
    assert gpu_mode_eval.main([str(problem), "--workload", "trimul", "--impl", "torch", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "the public cases" in printed and "torch: pass, 0 failure(s), geomean 2.0000 ms over 2" in printed
    assert (out / "trimul-torch-benchmark.txt").read_text().startswith("seed: none\n")  # no seed: the public cases
    gpu_mode_eval.main([str(problem), "--workload", "trimul", "--impl", "torch", "--seed", "7", "--out", str(out)])
    assert "POPCORN_SEED=7" in capsys.readouterr().out
    assert (out / "trimul-torch-benchmark.txt").read_text().startswith("seed: 7\n")

    (problem / "task.yml").write_text(STAND_IN_FILES + 'benchmarks:\n  - {"seqlen": 4, "bad": "yes", "mean": 1}\n')
    assert gpu_mode_eval.main([str(problem), "--workload", "trimul", "--impl", "torch"]) == 1
    printed = capsys.readouterr().out
    assert "torch: fail, 1 failure(s)" in printed and "benchmark.0.error: mismatch" in printed
    with pytest.raises(SystemExit):
        gpu_mode_eval.main([str(problem), "--workload", "trimul", "--impl", "cuda_magic"])
    assert "unknown implementation 'cuda_magic'" in capsys.readouterr().err
    (shared / "helpers.py").unlink()
    with pytest.raises(SystemExit):
        gpu_mode_eval.main([str(problem), "--workload", "trimul", "--impl", "torch"])
    assert "task.yml lists files not found" in capsys.readouterr().err


def test_gpu_mode_eval_stops_the_harness_and_its_workers_at_the_timeout(tmp_path, capsys):
    import time

    from compare.tools import gpu_mode_eval

    pytest.importorskip("yaml", reason="task.yml is read with pyyaml (transformers, the models extra, brings it)")
    problem, shared = tmp_path / "trimul", tmp_path / "shared"
    problem.mkdir()
    shared.mkdir()
    (shared / "helpers.py").write_text("")
    late, worker = tmp_path / "late.txt", tmp_path / "worker.py"  # a worker left running writes after the timeout
    worker.write_text(f"import time\ntime.sleep(3)\nopen({str(late)!r}, 'w').close()\n")
    (problem / "eval.py").write_text(
        f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, {str(worker)!r}])\ntime.sleep(30)\n")
    (problem / "task.yml").write_text(STAND_IN_FILES + 'benchmarks:\n  - {"seqlen": 4}\n')
    started = time.monotonic()
    assert gpu_mode_eval.main([str(problem), "--workload", "trimul", "--impl", "torch", "--timeout", "1"]) == 1
    assert time.monotonic() - started < 10 and "no verdict: stopped at --timeout" in capsys.readouterr().out
    time.sleep(4)
    assert not late.exists()


STAND_IN_REFERENCE = '''import torch

from ports.trimul import make_inputs


def generate_input(seqlen, bs, dim, hiddendim, seed, nomask, distribution):
    with open({log!r}, "a") as log:
        log.write(f"{{seed}} {{nomask!r}}\\n")
    return make_inputs(dict(seqlen=seqlen, bs=bs, dim=dim, hiddendim=hiddendim, nomask=nomask,
                            distribution=distribution), seed, "cuda" if torch.cuda.is_available() else "cpu")


def check_implementation(data, output):
    good = tuple(output.shape) == tuple(data[0].shape) and seqlen_ok(data)
    return good, "" if good else "mismatch"


def seqlen_ok(data):
    return data[0].shape[1] != 5
'''


def test_gpu_mode_clock_times_each_port_from_its_framework_and_from_torch(tmp_path, capsys):
    # eval.py's protocol from the port's own framework: the cases as eval.py reads them (nomask "False" a string),
    # seeds mixed with the secret seed, the same input every call (a fresh one each call in leaderboard mode), and
    # a failing check a failure
    pytest.importorskip("yaml", reason="task.yml is read with pyyaml (transformers, the models extra, brings it)")
    from compare.tools import gpu_mode_clock

    problem, log = tmp_path / "trimul", tmp_path / "seeds.txt"
    problem.mkdir()
    (problem / "reference.py").write_text(STAND_IN_REFERENCE.format(log=str(log)))
    files = 'files:\n  - {"name": "submission.py", "source": "@SUBMISSION@"}\n  - {"name": "reference.py", ' \
            '"source": "reference.py"}\n'
    case = '{"seqlen": 16, "bs": 1, "dim": 32, "hiddendim": 16, "seed": 5, "nomask": false, "distribution": "normal"}'
    (problem / "task.yml").write_text(files + f"benchmarks:\n  - {case}\n")
    assert gpu_mode_clock.as_eval_reads({"seqlen": 16, "nomask": False, "seed": -3}) == {
        "seqlen": 16, "nomask": "False", "seed": -3}
    out = tmp_path / "clock.json"
    assert gpu_mode_clock.main([str(problem), "--workload", "trimul", "--impl", "torch,pallas", "--seed", "7",
                                "--max-calls", "3", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "secret seed 7" in printed and "torch: pass, geomean own" in printed and "pallas: pass" in printed
    saved = json.loads(out.read_text())
    for port in ("torch", "pallas"):
        [row] = saved["ports"][port]["cases"]
        assert row["spec"]["nomask"] == "False" and row["own"]["runs"] == row["from_torch"]["runs"] == 3
        assert 0 < row["own"]["best_ns"] <= row["own"]["mean_ns"] <= row["own"]["worst_ns"]
    seed = gpu_mode_clock.mixed_seed(5, 7)
    assert set(log.read_text().split("\n")[:-1]) == {f"{seed} 'False'"}  # one input a case, drawn as eval.py draws it

    log.unlink()
    assert gpu_mode_clock.main([str(problem), "--workload", "trimul", "--impl", "torch", "--mode", "leaderboard",
                                "--max-calls", "3"]) == 0
    drawn = [int(line.split()[0]) for line in log.read_text().splitlines()]
    assert {5 + 13, 5 + 26, 5 + 39} <= set(drawn)  # a fresh input every timed call
    capsys.readouterr()

    (problem / "task.yml").write_text(files + "benchmarks:\n  - " + case.replace('"seqlen": 16', '"seqlen": 5') + "\n")
    assert gpu_mode_clock.main([str(problem), "--workload", "trimul", "--impl", "torch", "--max-calls", "3"]) == 1
    assert "torch: fail" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        gpu_mode_clock.main([str(problem), "--workload", "trimul", "--impl", "cuda_magic"])
    assert "unknown implementation 'cuda_magic'" in capsys.readouterr().err
