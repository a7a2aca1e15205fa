"""Both eigh ports with each eigenvector method (inverse iteration, divide and conquer), through the interpreters on
the CPU: the check's figures on one matrix of n = 66 (halves of 33 rows: carried blocks and tiles across the halves)
of four families.

    python results/h200/experiments/eigh-prototypes/divide_conquer_ports.py   (on a CPU; about 10 minutes)
"""
import importlib
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import ports  # noqa: E402  (after the interpreter is chosen)
from ports import eigh as spec  # noqa: E402

for port in ("triton", "pallas"):
    package = importlib.import_module(spec.WORKLOAD.implementation(port).target.rsplit(":", 1)[0])
    for method in ("inverse_iteration", "divide_conquer"):
        package.EIGENVECTORS = method
        for family in ("psd", "clustered", "dense", "repeated"):
            a = spec.make_inputs(spec._case(1, 66, 2, 93, family), 93, "cpu")
            verdict = spec.check(a, ports.custom_kernel("eigh", port)(a), spec.reference(a))
            figures = ", ".join(f"{name.removesuffix('_scaled')} {value:.3f}" for name, value in verdict.errors.items())
            print(f"{port:6s} {method:17s} {family:9s} {'pass' if verdict.passed else 'FAIL'}: {figures}", flush=True)
