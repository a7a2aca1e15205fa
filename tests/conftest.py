"""Without a CUDA GPU the kernels run through the Triton interpreter (`compare.gpu_or_interpreters`); it must be
chosen before anything imports triton. Torch and JAX share a GPU when there is one."""
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from compare import gpu_or_interpreters

gpu_or_interpreters()
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


# Variables a library's import sets and later reads, kept after the test that imported it: jax's Mosaic GPU loads its
# runtime from this one at each compile (results/h200/experiments/gpu-suite/README.md, four workers at 6b246fe)
SET_BY_IMPORTS = ("MOSAIC_GPU_RUNTIME_LIB_PATH",)


def restore_environment(before: dict) -> None:
    """os.environ as it was (`before`), but for SET_BY_IMPORTS's variables, which stay as they are now."""
    now = {**before, **{name: os.environ[name] for name in SET_BY_IMPORTS if name in os.environ}}
    if os.environ != now:
        os.environ.clear()
        os.environ.update(now)


@pytest.fixture(autouse=True)
def environment_restored():
    """Every test leaves the environment as it found it (but for SET_BY_IMPORTS). A test that stands in a CPU for
    the GPU runs the driver, which chooses the Triton interpreter by setting TRITON_INTERPRET
    (`gpu_or_interpreters`): left set, every Triton kernel module imported after it in the same process ran
    interpreted on a GPU's tensors, and failed."""
    before = dict(os.environ)
    yield
    restore_environment(before)


# Variant files of the Triton TriMul port (`--variant NAME=triton:FILE`), for the driver's and the tools' tests.
TRIMUL_VARIANTS = {
    "counted": '''"""The Triton port as a variant file: the port itself, its calls counted."""
from triton_kernels.trimul import trimul as port

CALLS = []


def trimul(data):
    CALLS.append(1)
    return port(data)
''',
    "zero": '''"""A variant file whose answer is wrong: zeros."""
import torch


def trimul(data):
    return torch.zeros_like(data[0])
''',
    "sign": '''"""A variant file wrong on some inputs only: zeros where the input's first element is positive."""
import torch

from triton_kernels.trimul import trimul as port


def trimul(data):
    return torch.zeros_like(port(data)) if float(data[0].flatten()[0]) > 0 else port(data)
''',
}


@pytest.fixture
def trimul_variant(tmp_path):
    """Writes the variant file of TRIMUL_VARIANTS[kind] as tmp_path / trimul_KIND.py; returns its path."""
    def write(kind: str) -> pathlib.Path:
        path = tmp_path / f"trimul_{kind}.py"
        path.write_text(TRIMUL_VARIANTS[kind])
        return path
    return write


@pytest.fixture
def compile_for_hopper():
    """Runs `python -m compare.tools.hopper_compile WORKLOAD --case CASE [OPTIONS]` with the interpreter off (it
    compiles the Triton port's kernels for sm_90 instead of running them); returns (exit status, output)."""
    def run(workload: str, case: str, *options: str):
        env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
        done = subprocess.run([sys.executable, "-m", "compare.tools.hopper_compile", workload, "--case", case,
                               *options], env=env,
                              cwd=pathlib.Path(__file__).resolve().parents[1], capture_output=True, text=True)
        return done.returncode, done.stdout + done.stderr
    return run


GPU_WORKERS = 4  # processes sharing the GPU: most of a GPU run is compiling, on the host's cores


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pyproject's addopts): a worker a core through the interpreters; GPU_WORKERS on a GPU, where the
    tests share the device (pytest-xdist's hook). Several workers on a GPU failed the Mosaic GPU tests until the
    restore after each test kept SET_BY_IMPORTS."""
    return min(GPU_WORKERS, os.cpu_count() or 1) if torch.cuda.is_available() else os.cpu_count() or 1


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true",
                     help="also run the tests marked slow through the interpreters (minutes each on a CPU)")


def pytest_collection_modifyitems(config, items):
    """Tests marked slow take minutes each in the Triton interpreter; on a CPU they run only with --run-slow. On a
    GPU they always run (seconds there)."""
    if torch.cuda.is_available() or config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow through the interpreters: run with --run-slow (always run on a GPU)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
