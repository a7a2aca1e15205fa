"""Without a CUDA GPU the kernels run through the Triton interpreter; it must be chosen before
anything imports triton. Torch and JAX share a GPU when there is one."""
import os
import pathlib
import subprocess
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


@pytest.fixture
def compile_for_hopper():
    """Runs `python -m compare.hopper_compile WORKLOAD --case CASE [OPTIONS]` with the interpreter off (it compiles
    the Triton port's kernels for sm_90 instead of running them); returns (exit status, output)."""
    def run(workload: str, case: str, *options: str):
        env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
        done = subprocess.run([sys.executable, "-m", "compare.hopper_compile", workload, "--case", case, *options],
                              env=env,
                              cwd=pathlib.Path(__file__).resolve().parents[1], capture_output=True, text=True)
        return done.returncode, done.stdout + done.stderr
    return run
