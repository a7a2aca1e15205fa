"""The registry (ports/__init__.py): backends and needs declared as data, and the driver taking every port from it.

A fake workload (y = 2 x) with ports that double exactly, one that doubles by another route (equal bits only where
the rounding agrees), one that needs what no machine has, and a library baseline: the driver must skip the port it
cannot run with the reason, compare every pair of passing ports, and know none of them by name.
"""
import hashlib
import importlib
import importlib.metadata
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time

import pytest
import torch

import ports
from compare.__main__ import main as compare_main
from compare.driver import Settings, run, with_variants
from ports import Check, Implementation, Needs, Workload


def twice(x):
    return 2 * x


def twice_by_thirds(x):
    return (x / 3 + x / 3 + x / 3) * 2  # not the same bits as 2 x for every x


def twice_slowly(x):
    time.sleep(0.02)
    return 2 * x


def twice_then_stopped(x):
    if x.numel() > 50:  # the second case: the run is stopped from outside, as a time limit stops it
        raise KeyboardInterrupt
    return 2 * x


PLANTED_CALLS = {}  # calls of each planted port so far


def _doubles_except(name, wrong):
    """A port that doubles, except on the calls `wrong(call number)` picks, where it returns zeros."""
    def port(x):
        count = PLANTED_CALLS[name] = PLANTED_CALLS.get(name, 0) + 1
        return torch.zeros_like(x) if wrong(count) else 2 * x
    return port


wrong_one_call_in_ten = _doubles_except("wrong_one_call_in_ten", lambda count: count % 10 == 0)
wrong_on_its_first_call = _doubles_except("wrong_on_its_first_call", lambda count: count == 1)
wrong_on_its_second_call = _doubles_except("wrong_on_its_second_call", lambda count: count == 2)


def workload(*extra):
    cases = [dict(n=n, seed=n) for n in (3, 100)]
    return Workload(
        name="double", cases={"smoke": cases, "test": [dict(n=n, seed=n) for n in (17, 64)]},
        make_inputs=lambda case, seed, device: torch.randn(
            case["n"], generator=torch.Generator().manual_seed(seed)),
        reference=lambda x: 2 * x.double(), case_name=lambda case: f"n{case['n']}",
        check=lambda x, out, expected: Check(bool(torch.allclose(out.double(), expected, atol=1e-5))),
        cost=lambda case: (case["n"], 8 * case["n"]), baseline="library",
        vary=lambda x, expected, generator: (x.flip(0), expected.flip(0)),
        implementations=(Implementation("first", "torch", "triton", "exact", "tests.test_ports:twice"),
                         Implementation("second", "torch", "gluon", "exact too", "tests.test_ports:twice"),
                         Implementation("thirds", "torch", "pallas-mosaic-gpu", "by thirds",
                                        "tests.test_ports:twice_by_thirds"),
                         Implementation("library", "torch", "library", "a baseline", "tests.test_ports:twice"),
                         *extra))


def test_a_backend_or_framework_not_declared_is_refused():
    with pytest.raises(ValueError, match="backend 'cuda' is not one of triton, gluon"):
        Implementation("x", "torch", "cuda", "", "m:f")
    with pytest.raises(ValueError, match="framework 'numpy'"):
        Implementation("x", "numpy", "triton", "", "m:f")


def test_needs_name_what_is_missing(monkeypatch):
    assert Needs().missing() is None
    assert Needs(versions=(("torch", "1.0"),)).missing() is None
    assert Needs(versions=(("torch", "999.0"),)).missing().startswith("needs torch >= 999.0, found ")
    assert Needs(versions=(("no-such-package", "1"),)).missing() == "needs no-such-package >= 1, not installed"
    assert Needs(modules=("json",)).missing() is None
    assert Needs(modules=("no_such_module",), gpu=True).missing() == "needs no_such_module, not installed"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert Needs(gpu=True).missing() == "needs a CUDA GPU (no interpreter runs it)"
    assert Needs(capability=(9, 0)).missing() is None  # an interpreter runs it
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda: (8, 0))
    assert Needs(gpu=True, capability=(9, 0)).missing() == "needs compute capability 9.0, found 8.0"
    assert Needs(gpu=True, capability=(8, 0)).missing() is None
    assert Needs(capability=(9, 0)).missing() == "needs compute capability 9.0, found 8.0"


def test_versions_compare_as_numbers():
    assert ports._version_tuple("0.11.2") > ports._version_tuple("0.9")
    assert ports._version_tuple("2.13.0+cpu") == (2, 13, 0) and ports._version_tuple("3.6.0rc1") == (3, 6, 0)


def test_the_recorded_versions_do_not_load_a_framework_the_run_does_not_use():
    # a run of torch ports records JAX's version without importing JAX (its runtime would share the process)
    pytest.importorskip("jax")
    code = ("import sys; from compare.records import versions; found = versions(); "
            "print(found['jax'], 'jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == [importlib.metadata.version("jax"), "False"]


def test_driver_skips_what_cannot_run_and_compares_every_pair_of_ports(tmp_path):
    unrunnable = Implementation("future", "torch", "triton", "needs a newer torch", "tests.test_ports:twice",
                                Needs(versions=(("torch", "999"),)))
    record = run(workload(unrunnable), ["first", "second", "thirds", "library", "future"], ["smoke"],
                 tmp_path / "double.json", Settings(timed=False), progress=lambda message: None)
    statuses = {(r["case"], r["impl"]): r["status"] for r in record["results"]}
    assert set(statuses.values()) == {"pass", "skipped"}
    # the installed distribution's version (torch.__version__ may differ: 2.11.0+cu130 against 2.11.0 on the GPU)
    found = importlib.metadata.version("torch")
    reasons = [r["reason"] for r in record["results"] if r["impl"] == "future"]
    assert reasons == [f"needs torch >= 999, found {found}"] * 2
    pairs = {(c["case"], *c["pair"]): c["bitwise_equal"] for c in record["cross"]}
    # every pair of passing ports, the reference port (the first registered) first; no library, nothing skipped
    assert set(pairs) == {(case, a, b) for case in ("n3", "n100")
                          for a, b in (("first", "second"), ("first", "thirds"), ("second", "thirds"))}
    assert pairs[("n100", "first", "second")] and not pairs[("n100", "first", "thirds")]
    saved = json.loads((tmp_path / "double.json").read_text())["cross"]
    saved_pairs = [(c["case"], *c["pair"], c["bitwise_equal"]) for c in saved]
    assert saved_pairs == [(*key, equal) for key, equal in pairs.items()]


@pytest.mark.parametrize("timed", [False, True], ids=["untimed", "timed"])
@pytest.mark.parametrize("case_set", ["smoke", "test"])
def test_a_port_wrong_on_some_calls_fails_on_every_case_set(case_set, timed):
    """Ports wrong one call in ten, only on their first call, only on their second (the warm-up): each fails on
    every case set, timed or not, while the exact port passes."""
    names = ["wrong_one_call_in_ten", "wrong_on_its_first_call", "wrong_on_its_second_call"]
    planted = [Implementation(name, "torch", "triton", name, f"tests.test_ports:{name}") for name in names]
    importlib.import_module("tests.test_ports").PLANTED_CALLS.clear()  # the module the registry loads the ports from
    record = run(workload(*planted), ["first", *names], [case_set], None,
                 Settings(timed=timed, pool=3, min_iters=10, max_iters=10, min_seconds=0),
                 progress=lambda message: None)
    failed = {r["impl"] for r in record["results"] if r["status"] == "fail"}
    assert failed == set(names), record["results"]
    first = [r for r in record["results"] if r["impl"] == "first"]
    counts = [tuple(map(int, r["checked"].split()[0].split("/"))) for r in first]  # 10 calls and 1 to 5 more
    assert all(passed == calls and 2 + 11 <= calls <= 2 + 15 for passed, calls in counts), first


def test_a_test_leaves_the_environment_as_it_found_it_but_what_an_import_set(monkeypatch):
    """The restore after every test (conftest): a variable a test set goes, one a library's import set for its own
    later use (jax's Mosaic GPU runtime library) stays."""
    from conftest import SET_BY_IMPORTS, restore_environment

    before = dict(os.environ)
    monkeypatch.setenv("CROSSPORT_SET_BY_A_TEST", "1")
    monkeypatch.setenv(SET_BY_IMPORTS[0], "/a/library/runtime.so")
    restore_environment(before)
    assert "CROSSPORT_SET_BY_A_TEST" not in os.environ
    assert os.environ[SET_BY_IMPORTS[0]] == "/a/library/runtime.so"
    assert {**os.environ, SET_BY_IMPORTS[0]: None} == {**before, SET_BY_IMPORTS[0]: None}


@pytest.mark.parametrize("planted", ["nothing", "nan", "inf", "one element off"])
def test_the_elementwise_check_in_chunks_gives_the_whole_checks_verdict_and_figures(monkeypatch, planted):
    gen = torch.Generator().manual_seed(7)
    expected = torch.randn(4, 9, 5, generator=gen, dtype=torch.float64)
    output = (expected + 1e-3 * torch.randn(expected.shape, generator=gen, dtype=torch.float64)).float()
    if planted != "nothing":  # in the last, partial chunk of seven
        wrong = {"nan": float("nan"), "inf": float("inf"), "one element off": 1.0 + float(expected[3, 8, 4])}
        output[3, 8, 4] = wrong[planted]
    whole = ports.allclose_check(output, expected, rtol=2e-2, atol=2e-2, dtype=torch.float32)
    monkeypatch.setattr(ports, "CHECK_CHUNK", 7)
    chunked = ports.allclose_check(output, expected, rtol=2e-2, atol=2e-2, dtype=torch.float32)
    assert (chunked.passed, chunked.reason) == (whole.passed, whole.reason) and whole.passed == (planted == "nothing")
    assert chunked.errors == pytest.approx(whole.errors, rel=1e-12, nan_ok=True)


def test_cli_exits_0_when_only_skips_are_reported(tmp_path, monkeypatch, capsys):
    unrunnable = Implementation("gpu_only", "torch", "gluon", "needs a GPU", "tests.test_ports:twice", Needs(gpu=True))
    registered = workload(unrunnable)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(ports, "get_workload", lambda name: registered)
    monkeypatch.setitem(ports.WORKLOAD_MODULES, "double", "tests.test_ports")
    assert compare_main(["double", "--impl", "first,gpu_only", "--json", str(tmp_path / "d.json")]) == 0
    out = capsys.readouterr().out
    assert "skipped gpu_only: needs a CUDA GPU (no interpreter runs it)" in " ".join(out.split())
    record = json.loads((tmp_path / "d.json").read_text())
    assert {r["impl"]: r["backend"] for r in record["results"]} == {"first": "triton", "gpu_only": "gluon"}
    summary_row = next(line for line in out.splitlines() if line.split()[:2] == ["smoke", "gpu_only"])
    assert summary_row.split()[2] == "skipped"  # not "0/2 passed"


def test_every_registered_implementation_declares_a_known_backend():
    for name in ports.WORKLOAD_MODULES:
        for impl in ports.get_workload(name).implementations:
            assert impl.backend in ports.BACKENDS and impl.ported == (impl.backend != "library")


def test_a_run_records_its_commit_and_the_hash_of_every_source(tmp_path, monkeypatch):
    variant = tmp_path / "twice_again.py"
    variant.write_text("def twice(x):\n    return x + x\n")
    registered = with_variants(workload(), [f"again=first:{variant}"])

    def provenance():
        return run(registered, ["first", "library", "again"], ["smoke"], None, Settings(timed=False),
                   progress=lambda message: None)["provenance"]

    monkeypatch.setenv("CROSSPORT_COMMIT", "0123abc")  # named, it wins over git (a copied tree's stale metadata)
    named = provenance()
    assert named["commit"] == "0123abc" and named["commit_from"] == "CROSSPORT_COMMIT"
    monkeypatch.delenv("CROSSPORT_COMMIT")
    made = provenance()
    root = pathlib.Path(__file__).resolve().parents[1]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True)
    if head.returncode == 0:  # a git checkout, as in CI
        assert made["commit"] == head.stdout.strip() and isinstance(made["dirty"], bool)
    this_file = hashlib.sha256(pathlib.Path(__file__).read_bytes()).hexdigest()
    assert made["sources"]["first"] == {"file": "tests/test_ports.py", "sha256": this_file}
    assert made["sources"]["again"] == {"file": "twice_again.py",
                                        "sha256": hashlib.sha256(variant.read_bytes()).hexdigest()}


def test_against_a_saved_run_catches_a_planted_slowdown_and_a_bit_change(tmp_path, monkeypatch, capsys):
    """Saved: "first" and "second" double exactly. Then "first" sleeps 20 ms a call (the same bits) and "second"
    doubles by thirds (other bits): --against must report both as regressions and exit 1; an unchanged rerun
    reports nothing and exits 0."""
    import dataclasses

    monkeypatch.setitem(ports.WORKLOAD_MODULES, "double", "tests.test_ports")
    saved, rerun = tmp_path / "saved.json", tmp_path / "rerun.json"
    timed = ["--impl", "first,second", "--cases", "smoke", "--time", "--iters", "5", "--pool", "2",
             "--max-seconds", "0.5"]
    monkeypatch.setattr(ports, "get_workload", lambda name: workload())
    assert compare_main(["double", *timed, "--json", str(saved)]) == 0
    assert compare_main(["double", "--impl", "first,second", "--cases", "smoke", "--against", str(saved)]) == 0
    assert "nothing moved" in capsys.readouterr().out

    planted = {"first": "tests.test_ports:twice_slowly", "second": "tests.test_ports:twice_by_thirds"}
    changed = dataclasses.replace(workload(), implementations=tuple(
        dataclasses.replace(impl, target=planted.get(impl.name, impl.target)) for impl in workload().implementations))
    monkeypatch.setattr(ports, "get_workload", lambda name: changed)
    assert compare_main(["double", *timed, "--against", str(saved), "--json", str(rerun)]) == 1
    changes = json.loads(rerun.read_text())["against"]["changes"]
    regressions = {(c["impl"], c["change"]) for c in changes if c["regression"]}
    assert ("first", "slower") in regressions and ("second", "bits changed") in regressions
    assert ("first", "bits changed") not in regressions  # sleeping changed no bits
    assert "REGRESSION" in capsys.readouterr().out


def test_against_lists_what_it_could_not_compare_and_refuses_runs_with_nothing_in_common(tmp_path, monkeypatch,
                                                                                          capsys):
    import dataclasses

    never = Needs(versions=(("torch", "999"),))
    monkeypatch.setitem(ports.WORKLOAD_MODULES, "double", "tests.test_ports")
    saved = tmp_path / "saved.json"
    monkeypatch.setattr(ports, "get_workload", lambda name: workload(
        Implementation("future", "torch", "triton", "never runs", "tests.test_ports:twice", never)))
    assert compare_main(["double", "--impl", "first,second,library,future", "--cases", "smoke",
                         "--json", str(saved)]) == 0
    # now: "second" cannot run, "library" is not run, "thirds" is new, "future" is skipped again
    changed = workload(Implementation("future", "torch", "triton", "never runs", "tests.test_ports:twice", never))
    changed = dataclasses.replace(changed, implementations=tuple(
        dataclasses.replace(impl, needs=never) if impl.name == "second" else impl for impl in changed.implementations))
    monkeypatch.setattr(ports, "get_workload", lambda name: changed)
    capsys.readouterr()
    assert compare_main(["double", "--impl", "first,second,thirds,future", "--cases", "smoke",
                         "--against", str(saved)]) == 0
    lines = capsys.readouterr().out.splitlines()
    for change, impl in (("skipped now", "second"), ("skipped in both", "future"), ("new", "thirds"),
                         ("not rerun", "library")):
        shown = [line for line in lines if line.split()[1:3] == change.split()[:2] or change in line]
        assert any(impl in line and change in line for line in shown), (change, impl, lines)
    assert any("slower or faster" in line or "times not compared" in line for line in lines)
    # the saved run has only smoke cases: a run of the test cases shares none of them
    assert compare_main(["double", "--impl", "first", "--cases", "test", "--against", str(saved)]) == 2
    assert "nothing could be compared" in capsys.readouterr().err


def test_against_takes_its_noise_from_the_saved_run_and_bits_only_from_the_same_versions():
    from compare.regression import NOISE_RULE, compare_runs, report

    def run_record(median, iqr, digest, torch_version):
        return {"device": "GPU", "settings": {"timer": "host"}, "versions": {"torch": torch_version, "python": "3"},
                "results": [{"case_set": "bench", "case": "c", "impl": "port", "status": "pass",
                             "median_ms": median, "iqr_ms": iqr, "output_sha256": digest}]}

    saved = run_record(1.0, 0.01, "a", "2.0")
    noisy_and_slower = run_record(3.0, 0.7, "a", "2.0")  # the new run's spread is no excuse
    changes = compare_runs(saved, noisy_and_slower, library=set())
    assert [(c["change"], c["regression"]) for c in changes] == [("slower", True)]
    assert NOISE_RULE in report(changes, saved, noisy_and_slower, "saved.json")
    assert compare_runs(run_record(1.0, 0.5, "a", "2.0"), run_record(2.0, 0.0, "a", "2.0"), set()) == []  # within 3 IQR
    same_versions = compare_runs(saved, run_record(1.0, 0.01, "b", "2.0"), library=set())
    assert [(c["change"], c["regression"]) for c in same_versions] == [("bits changed", True)]
    upgraded = run_record(1.0, 0.01, "b", "2.1")
    other_versions = compare_runs(saved, upgraded, library=set())
    assert [(c["change"], c["regression"]) for c in other_versions] == [("bits differ", False)]
    assert "bits: not compared, torch 2.0 -> 2.1" in report(other_versions, saved, upgraded, "saved.json")
    with pytest.raises(ValueError, match="nothing can be compared"):
        compare_runs(saved, dict(upgraded, results=[dict(upgraded["results"][0], case="other")]), set())


def test_against_says_which_bits_it_could_not_compare_and_refuses_what_is_not_a_run(tmp_path, monkeypatch, capsys):
    """A saved run without output digests: each such result is listed as "bits not compared" and counted on the
    bits line, never "nothing moved". A file that is not JSON (a PNG) or JSON of another shape: one line naming it,
    exit 2, no traceback."""
    monkeypatch.setitem(ports.WORKLOAD_MODULES, "double", "tests.test_ports")
    monkeypatch.setattr(ports, "get_workload", lambda name: workload())
    saved = tmp_path / "saved.json"
    assert compare_main(["double", "--impl", "first", "--cases", "smoke", "--json", str(saved)]) == 0
    record = json.loads(saved.read_text())
    for result in record["results"]:
        del result["output_sha256"]
    saved.write_text(json.dumps(record))
    capsys.readouterr()
    assert compare_main(["double", "--impl", "first", "--cases", "smoke", "--against", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "nothing moved" not in out and "but not for 2 result(s) without an output digest" in out
    assert out.count("bits not compared") == 2 and "no output digest in the saved run" in out
    for name, content in (("chart.png", b"\x89PNG\r\n\x1a\n\x00\xff"), ("list.json", b"[1, 2]"),
                          ("shape.json", json.dumps({"workload": "double", "results": [{"impl": 3}]}).encode())):
        (tmp_path / name).write_bytes(content)
        assert compare_main(["double", "--impl", "first", "--cases", "smoke", "--against", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and str(tmp_path / name) in err and "Traceback" not in err


@pytest.mark.parametrize("workload_name", list(ports.WORKLOAD_MODULES))
def test_the_other_frameworks_arrays_are_a_type_error_that_names_the_way_across(workload_name):
    # a port takes its own framework's arrays; custom_kernel converts (and the driver measures what that costs)
    pytest.importorskip("jax")
    workload = ports.get_workload(workload_name)
    data = workload.make_inputs(workload.cases["smoke"][0], 1, "cuda" if torch.cuda.is_available() else "cpu")
    tried = 0
    for impl in workload.implementations:
        if impl.needs.missing():
            continue
        given = ports.to_framework("jax", data) if impl.framework == "torch" else data
        wanted = "a torch tensor" if impl.framework == "torch" else "a JAX array"
        with pytest.raises(TypeError, match=f"must be {wanted}, got .*ports.custom_kernel"):
            impl.load()(given)
        tried += 1
    assert tried >= 4


@pytest.mark.parametrize("workload_name", list(ports.WORKLOAD_MODULES))
def test_a_jax_kernel_port_names_an_input_on_another_platform_than_its_kernels(workload_name, monkeypatch):
    # on a GPU machine an array put on the CPU would fail deep in Pallas's lowering: the port names it first (on a
    # CPU machine the GPU backend is stood in for)
    jax = pytest.importorskip("jax")
    workload = ports.get_workload(workload_name)
    on_cpu = jax.devices("cpu")[0]
    data = jax.tree.map(lambda value: jax.device_put(value, on_cpu) if isinstance(value, jax.Array) else value,
                        ports.to_framework("jax", workload.make_inputs(workload.cases["smoke"][0], 1, "cpu")))
    kernel_ports = [impl for impl in workload.implementations
                    if impl.framework == "jax" and impl.ported and not impl.needs.missing()]
    functions = [impl.load() for impl in kernel_ports]
    if jax.default_backend() == "cpu":
        monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    for function in functions:
        with pytest.raises(ValueError, match=r"lives on .* \(cpu\), but this port's kernels run on JAX's default "
                                             r"backend, gpu"):
            function(data)
    assert len(functions) >= (1 if workload_name == "eigh" else 2)


def test_against_warns_when_a_library_baselines_time_moved_too():
    # on the H200, another host of the same GPU moved every host clock, torch_compile's (no code of ours) included
    from compare.regression import compare_runs, report

    def run_record(port_ms, library_ms):
        return {"device": "GPU", "settings": {"timer": "host"}, "versions": {},
                "results": [{"case_set": "bench", "case": "c", "impl": impl, "status": "pass", "median_ms": ms,
                             "iqr_ms": 0.01, "output_sha256": "a"} for impl, ms in (("port", port_ms),
                                                                                     ("library", library_ms))]}

    saved = run_record(1.0, 2.0)
    for new, warned in ((run_record(1.5, 2.6), True), (run_record(1.5, 2.0), False)):
        changes = compare_runs(saved, new, library={"library"})
        assert ("machine: 1 library baseline time(s) moved too" in report(changes, saved, new, "s.json")) == warned


@pytest.mark.parametrize("argv, message", [
    (["--impl", ","], "--impl names no implementation"), (["--cases", ","], "--cases names no case set"),
    (["--cases", "smoke:x"], "case index 'x' is not a number"), (["--cases", "smoke:9"], "out of range")])
def test_cli_refuses_empty_and_malformed_selections(monkeypatch, capsys, argv, message):
    monkeypatch.setitem(ports.WORKLOAD_MODULES, "double", "tests.test_ports")
    monkeypatch.setattr(ports, "get_workload", lambda name: workload())
    assert compare_main(["double", *argv]) == 2
    assert message in capsys.readouterr().err


def test_cli_output_fits_100_columns(monkeypatch, capsys):
    """The listing, the progress lines and the notice on stderr (a failing port's long reason included)."""
    long_label = Implementation("verbose", "torch", "triton", "a label " * 20, "tests.test_ports:twice_by_thirds")
    failing = Implementation("failing", "torch", "triton", "fails", "tests.test_ports:wrong_one_call_in_ten")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setitem(ports.WORKLOAD_MODULES, "double", "tests.test_ports")
    monkeypatch.setattr(ports, "get_workload", lambda name: workload(long_label, failing))
    importlib.import_module("tests.test_ports").PLANTED_CALLS.clear()
    assert compare_main(["double", "--list"]) == 0
    assert compare_main(["double", "--impl", "first,verbose,library,failing", "--cases", "smoke:0"]) == 1
    captured = capsys.readouterr()
    lines = (captured.out + captured.err).splitlines()
    assert lines and max(len(line) for line in lines) <= 100, max(lines, key=len)


def test_against_refuses_another_workloads_run(tmp_path, capsys):
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps({"workload": "eigh", "results": []}))
    assert compare_main(["matmul", "--impl", "torch", "--cases", "smoke:0", "--against", str(saved)]) == 2
    assert "a run of 'eigh', not of 'matmul'" in capsys.readouterr().err


@pytest.mark.parametrize("record_file", ["results/h200/matmul-kernel-times.json", "results/h200/eigh-test.json"])
def test_the_table_fits_100_columns_and_cuts_nothing(record_file):
    from rich.console import Console

    from compare.report import print_table

    record = json.loads((pathlib.Path(__file__).resolve().parents[1] / record_file).read_text())
    console = Console(width=100, record=True, force_terminal=False)
    print_table(record, console)
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 100 and not any("…" in line for line in lines)
    assert any("FAIL: finding" in line for line in lines) == any(
        p["passed"] is False and not ports.ported_backend(p["backend"]) for p in record.get("properties", []))


def test_a_run_stopped_before_its_end_keeps_its_results_and_their_summary(tmp_path):
    registered = workload(Implementation("stopped", "torch", "triton", "stopped",
                                         "tests.test_ports:twice_then_stopped"))
    with pytest.raises(KeyboardInterrupt):
        run(registered, ["stopped"], ["smoke"], tmp_path / "run.json", Settings(timed=False),
            progress=lambda message: None)
    record = json.loads((tmp_path / "run.json").read_text())
    assert [(r["case"], r["status"]) for r in record["results"]] == [("n3", "pass")]
    assert record["summary"]["smoke"]["stopped"] == {"cases": 1, "passed": 1, "skipped": 0}
    assert "finished" not in record


def test_timer_all_records_kernel_time_overhead_and_the_torch_callers_view(monkeypatch):
    """--timer all (GPU only; here the profiler is stood in for: every call's kernels take 1 us): each timed input is
    timed three ways and each output checked; the overhead is the host time above the kernels."""
    from rich.console import Console

    import compare.timing as timing
    from compare.report import print_table

    monkeypatch.setattr(timing, "profiled_calls", lambda function, inputs: (function(inputs), {"kernel": 0.001}))
    registered = workload(Implementation("slow", "torch", "triton", "sleeps", "tests.test_ports:twice_slowly"))
    record = run(registered, ["slow"], ["smoke"], None,
                 Settings(timer="all", pool=2, min_iters=3, max_iters=3, min_seconds=0),
                 progress=lambda message: None)
    for result in record["results"]:
        passed, calls = map(int, result["checked"].split()[0].split("/"))  # 3 timed three ways, then 1 untimed
        assert result["status"] == "pass" and passed == calls == 2 + 3 * 3 + 1
        assert result["kernel_ms"] == pytest.approx(0.001) and len(result["kernel_times_ms"]) == 3
        assert result["median_ms"] > 15 and result["overhead_ms"] == pytest.approx(result["median_ms"] - 0.001)
        assert result["from_torch_ms"] > 15 and len(result["from_torch_times_ms"]) == 3
    assert record["summary"]["smoke"]["slow"]["geomean_kernel_ms"] == pytest.approx(0.001)
    console = Console(width=100, record=True, force_terminal=False)
    print_table(record, console)
    text = console.export_text()
    assert "from torch" in text and "overhead" in text


def test_timer_all_gives_the_bridge_per_tensor_crossing_for_another_frameworks_port(monkeypatch):
    # a JAX port called from torch takes its input across and its output back: two tensors; a torch port none
    pytest.importorskip("jax")
    from rich.console import Console

    import compare.timing as timing
    from compare.driver import tensor_count
    from compare.report import _bridge_per_array_us, print_table
    from compare.result import Result

    monkeypatch.setattr(timing, "profiled_calls", lambda function, inputs: (function(inputs), {"kernel": 0.001}))
    registered = workload(Implementation("slow", "torch", "triton", "sleeps", "tests.test_ports:twice_slowly"),
                          Implementation("slow_jax", "jax", "pallas-triton", "sleeps", "tests.test_ports:twice_slowly"))
    record = run(registered, ["slow", "slow_jax"], ["smoke"], None,
                 Settings(timer="all", pool=2, min_iters=3, max_iters=3, min_seconds=0), progress=lambda message: None)
    arrays = {(r["impl"], r["case"]): r.get("bridge_arrays") for r in record["results"]}
    assert arrays == {("slow", "n3"): None, ("slow", "n100"): None, ("slow_jax", "n3"): 2, ("slow_jax", "n100"): 2}
    results = [Result.from_json(entry) for entry in record["results"]]
    crossing = [r for r in results if r.impl == "slow_jax"]
    assert _bridge_per_array_us(crossing) == pytest.approx(statistics.median(1e3 * r.bridge_ms / 2 for r in crossing))
    assert _bridge_per_array_us([r for r in results if r.impl == "slow"]) is None
    console = Console(width=100, record=True, force_terminal=False)
    print_table(record, console)
    assert "bridge us/array" in console.export_text()
    tensors = torch.zeros(1)
    assert tensor_count((tensors, {"a": tensors, "b": [tensors, 3]}, "config")) == 3


def test_jax_ports_pad_with_zeros_and_cut_back_in_compiled_calls():
    # the JAX ports' shared padding (kernel_support.jax_padding): zeros appended on every axis, the corner cut back
    # unchanged, each a jitted call compiled once per shape pair (never JAX's op-by-op path, which cost the Pallas
    # matmul more than its kernels: results/h200/experiments/pallas-matmul-jitted-padding/)
    jax = pytest.importorskip("jax")
    import numpy as np

    from kernel_support.jax_padding import cut_to, zero_padded

    array = jax.numpy.asarray(np.arange(1, 13, dtype=np.float32).reshape(3, 4))
    padded = zero_padded(array, shape=(5, 8))
    assert padded.shape == (5, 8) and padded.dtype == array.dtype
    assert np.array_equal(np.asarray(padded)[:3, :4], np.asarray(array)) and not np.asarray(padded)[3:].any()
    assert not np.asarray(padded)[:, 4:].any()
    assert np.array_equal(np.asarray(cut_to(padded, shape=(3, 4))), np.asarray(array))
    compiled = zero_padded._cache_size()
    zero_padded(array + 1, shape=(5, 8))
    assert zero_padded._cache_size() == compiled  # the same shapes: no new compile


def test_the_bridge_packs_small_tensors_and_keeps_every_value_and_structure(monkeypatch):
    jax = pytest.importorskip("jax")
    big = torch.randn(ports.PACKED_TENSOR_BYTES // 4 + 1)  # one element over: imported alone
    inputs = (big, {"w": torch.randn(3, 5), "b": torch.arange(4), "s": torch.tensor(2.5)},
              [torch.randn(2, 2).T, torch.ones(0), torch.randn(7).to(torch.bfloat16), torch.tensor([True, False]),
               torch.randn(3).half(), torch.arange(-3, 3, dtype=torch.int8)], {"hidden_dim": 7})
    imports = []
    real_import = ports._dlpack_import
    monkeypatch.setattr(ports, "_dlpack_import", lambda tensor: imports.append(tensor.dtype) or real_import(tensor))
    converted = ports.to_framework("jax", inputs)
    assert imports == [torch.uint8, torch.float32]  # the small tensors of every type as one buffer, big alone
    assert list(converted[1]) == ["w", "b", "s"] and isinstance(converted[2], list)
    assert converted[3] == {"hidden_dim": 7}
    pairs = [(big, converted[0]), (inputs[1]["w"], converted[1]["w"]), (inputs[1]["s"], converted[1]["s"])]
    pairs += list(zip(inputs[2], converted[2]))
    for tensor, array in pairs:
        assert isinstance(array, jax.Array) and tuple(array.shape) == tuple(tensor.shape)
        assert ports.dtype_name(array) == ports.dtype_name(tensor) and torch.equal(ports.to_torch(array), tensor)
    assert ports.dtype_name(converted[1]["b"]) == "int32" and converted[1]["b"].tolist() == [0, 1, 2, 3]
    assert converted[0].unsafe_buffer_pointer() == big.data_ptr()  # a large tensor crosses without a copy
    with pytest.raises(TypeError, match="jax_enable_x64"):  # 64-bit floats cross alone, and are refused
        ports.to_framework("jax", (torch.randn(3, dtype=torch.float64), torch.randn(2)))


EVERY_IMPLEMENTATION = [(name, impl.name) for name in ports.WORKLOAD_MODULES
                        for impl in ports.get_workload(name).implementations]


def _as_numpy(value):
    if isinstance(value, torch.Tensor):
        return value.cpu().numpy()
    if isinstance(value, dict):
        return {key: _as_numpy(item) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_as_numpy(item) for item in value)
    return value


def _emptied(workload: str, data):
    """The input with no work in it: TriMul with N = 0, matmul with M = 0, eigh with no matrix."""
    if workload == "trimul":
        x, mask, weights, config = data
        return x[:, :0, :0], mask[:, :0, :0], weights, config
    if workload == "matmul":
        a, b, out = data
        return a[:0], b, out
    return data[:0]


@pytest.mark.parametrize("workload, name", EVERY_IMPLEMENTATION)
def test_bad_input_gets_one_answer_from_every_implementation(workload, name):
    """Through `custom_kernel`: an implementation this machine cannot run is refused before its first call, naming
    its need; a NumPy array is refused with a TypeError; empty input is a ValueError for TriMul and matmul (as for
    any size under 1) and an empty output for eigh (a batch of no matrices), from ports and baselines alike."""
    spec = ports.get_workload(workload)
    missing = spec.implementation(name).needs.missing()
    if missing:
        with pytest.raises(RuntimeError, match=f"cannot run on this machine: {re.escape(missing)}"):
            ports.custom_kernel(workload, name)
        return
    call = ports.custom_kernel(workload, name)
    data = spec.make_inputs(spec.cases["smoke"][0], 1, "cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(TypeError, match="must be (a torch tensor|a JAX array), got numpy.ndarray"):
        call(_as_numpy(data))
    empty = _emptied(workload, data)
    if workload == "eigh":
        vectors, values = call(empty)
        n = data.shape[-1]
        assert tuple(vectors.shape) == (0, n, n) and tuple(values.shape) == (0, n)
    else:
        with pytest.raises(ValueError, match="must be at least 1"):
            call(empty)
