"""The scripts kept in results/h200/experiments run on HEAD (issue 75: every experiment runs on HEAD, or is left to
git's history). Each Python script imports, its GPU work behind its main guard; those with a CPU part run it small.
Each shell script runs with the Python it calls stood in for: what it prepares is checked, and the driver's own
parser reads the command it would run."""
import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "results" / "h200" / "experiments"
PYTHON_SCRIPTS = (
    "batch-invariant/cost_profile.py",
    "batch-invariant/cost_profile_jax.py",
    "batch-invariant/softmax_bits.py",
    "cached-launch/host_paths.py",
    "call-cost-profiles/profile_launches.py",
    "eigh-prototypes/divide_conquer.py",
    "gluon-matmul/barrier_ptx.py",
    "gluon-matmul/ragged_fix_ab.py",
    "trimul-fp16-range/emulate.py",
)
SHELL_SCRIPTS = ("cached-launch/ab.sh", "house/range_check_ab.sh")

# Stands in for `python`: records its arguments and working directory (one JSON line a call) and prints what ab.sh
# greps for.
RECORDING_PYTHON = """#!{executable}
import json, os, sys
with open({log!r}, "a") as log:
    log.write(json.dumps({{"argv": sys.argv[1:], "cwd": os.getcwd()}}) + "\\n")
print("geometric means")
"""


def load(relative: str, monkeypatch):
    """The experiment's module, imported from its file with the repository's root as the working directory and its
    own folder on sys.path (as its docstring runs it)."""
    path = EXPERIMENTS / relative
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(path.parent))
    spec = importlib.util.spec_from_file_location(f"experiment_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def recording_python(tmp_path) -> tuple[Path, Path]:
    """(a folder holding a `python` that records its calls, the file of its records)."""
    folder, log = tmp_path / "bin", tmp_path / "calls.jsonl"
    folder.mkdir()
    stand_in = folder / "python"
    stand_in.write_text(RECORDING_PYTHON.format(executable=sys.executable, log=str(log)))
    stand_in.chmod(0o755)
    return folder, log


def driver_arguments(call: dict):
    """The driver's parse of a recorded `python -m compare ...` call."""
    from compare.__main__ import parse_args

    assert call["argv"][:2] == ["-m", "compare"], call["argv"]
    return parse_args(call["argv"][2:])


def test_every_experiment_script_is_one_this_file_runs():
    found = {str(path.relative_to(EXPERIMENTS)) for path in EXPERIMENTS.rglob("*")
             if path.suffix in {".py", ".sh", ".diff", ".patch"}}
    assert found == set(PYTHON_SCRIPTS) | set(SHELL_SCRIPTS)


@pytest.mark.parametrize("relative", PYTHON_SCRIPTS)
def test_script_imports_on_head(relative, monkeypatch):
    load(relative, monkeypatch)


def test_softmax_bits_variants_find_their_place_in_the_row_kernels(monkeypatch):
    softmax_bits = load("batch-invariant/softmax_bits.py", monkeypatch)
    source = Path(softmax_bits.row_reductions.__file__).read_text()
    assert [source.count(old) for old, _ in softmax_bits.VARIANTS.values()] == [1] * len(softmax_bits.VARIANTS)


def test_ragged_fix_variants_each_change_the_gluon_matmul(monkeypatch):
    ragged_fix_ab = load("gluon-matmul/ragged_fix_ab.py", monkeypatch)
    assert len(set(ragged_fix_ab.VARIANTS.values())) == len(ragged_fix_ab.VARIANTS)


def test_divide_conquer_prototype_holds_the_gates_on_a_small_tridiagonal(monkeypatch, capsys):
    divide_conquer = load("eigh-prototypes/divide_conquer.py", monkeypatch)
    assert divide_conquer.main(["--n", "64", "--matrices", "1", "--families", "psd", "--leaf", "16"]) == 0
    assert "every gate held" in capsys.readouterr().out


def test_fp16_emulation_passes_at_gpu_modes_scale(monkeypatch):
    from ports import trimul as spec

    emulate = load("trimul-fp16-range/emulate.py", monkeypatch)
    case = spec._case(64, 1, 128, 11, False, "normal")
    data = spec.make_inputs(case, case["seed"])
    assert spec.check(data, emulate.emulate(data, "fp16"), spec.reference(data)).passed


@pytest.mark.parametrize("port", ["matmul:triton", "matmul:gluon"])
def test_host_paths_profiles_a_port_with_its_launches_stubbed(port):
    # in a process of its own, as its docstring runs it: the script stubs the kernel modules' launch for good, and
    # measures the compiled path's host code, which the interpreter's (chosen by conftest on a CPU) is not
    environment = {**{name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"},
                   "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, str(EXPERIMENTS / "cached-launch" / "host_paths.py"), port], cwd=ROOT,
                         env=environment, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert f"{port}: " in run.stdout and "launches stubbed" in run.stdout


@pytest.mark.parametrize("relative", SHELL_SCRIPTS)
def test_shell_script_parses(relative):
    run = subprocess.run(["bash", "-n", str(EXPERIMENTS / relative)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_range_check_ab_drops_each_ports_check_and_the_driver_reads_its_command(tmp_path):
    folder, log = recording_python(tmp_path)
    environment = {**os.environ, "PYTHON": str(folder / "python")}
    run = subprocess.run(["bash", str(EXPERIMENTS / "house" / "range_check_ab.sh"), str(tmp_path / "ab.json"),
                          "bench:0"], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    [call] = [json.loads(line) for line in log.read_text().splitlines()]
    args = driver_arguments(call)
    assert args.workload == "trimul" and args.timer == "all" and args.cases == ["bench:0"]
    for variant in args.variant:
        name, target = variant.split("=", 1)
        port, copy = target.split(":", 1)
        original = Counter((ROOT / f"{port}_kernels" / "trimul.py").read_text().splitlines())
        dropped = list((original - Counter(Path(copy).read_text().splitlines())).elements())
        assert name == f"unchecked_{port}" and len(dropped) == 1 and "refuse_" in dropped[0]
    assert len(args.variant) == 4


def test_ab_runs_the_tree_before_and_after_a_change_and_the_driver_reads_both_commands(tmp_path):
    tree, out = tmp_path / "tree", tmp_path / "out"
    tree.mkdir()
    out.mkdir()
    (tree / "module.py").write_text("TILE = 64\n")
    change = tmp_path / "change.diff"
    change.write_text("--- a/module.py\n+++ b/module.py\n@@ -1 +1 @@\n-TILE = 64\n+TILE = 128\n")
    folder, log = recording_python(tmp_path)
    environment = {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}
    run = subprocess.run(["bash", str(EXPERIMENTS / "cached-launch" / "ab.sh"), "--prepared", str(change), str(out),
                          "matmul", "smoke", "triton"], cwd=tree, env=environment, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    before, after = [json.loads(line) for line in log.read_text().splitlines()]
    assert (Path(before["cwd"]) / "module.py").read_text() == "TILE = 64\n"
    assert (Path(after["cwd"]) / "module.py").read_text() == "TILE = 128\n"
    before_args, after_args = driver_arguments(before), driver_arguments(after)
    assert before_args.no_properties and after_args.against == out.resolve() / "matmul-before.json"
    assert before_args.workload == after_args.workload == "matmul"
    assert before_args.impl == after_args.impl == ["triton"]
