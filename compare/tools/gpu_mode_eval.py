"""GPU MODE's own harness on a port: its eval.py runs the registered implementation as a submission.

    python -m compare.tools.gpu_mode_eval PROBLEM_DIR --workload trimul --impl gluon,triton [--mode benchmark]

PROBLEM_DIR is a problem's folder of a checkout of gpu-mode/reference-kernels (problems/bioml/trimul,
problems/linalg/eigh_py), which this project does not ship: its eval.py, reference.py, task.yml and the files its
task.yml lists. For each implementation the tool copies the problem into a fresh folder, writes a submission.py whose
`custom_kernel` is `ports.custom_kernel(WORKLOAD, IMPL)` (torch tensors in and out, JAX ports through DLPack), writes
task.yml's `tests` (--mode test) or `benchmarks` (benchmark, leaderboard) as eval.py reads them, one `key: value; ...`
line a case, and runs `python eval.py MODE FILE` with the harness's output to a file (POPCORN_FD) and a secret seed
(POPCORN_SEED: --seed, or a fresh random one, printed). It prints each implementation's verdict, failures and, when
timed, the geometric mean of the cases' mean times; --out keeps eval.py's output and log a run.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
SUBMISSION = '''from ports import custom_kernel as _entry

custom_kernel = _entry({workload!r}, {impl!r})
'''


def case_lines(task_yml: Path, mode: str) -> str:
    """task.yml's test cases (mode "test") or benchmark cases, a `key: value; ...` line each, as GPU MODE's runner
    writes them for eval.py (booleans and all as Python prints them)."""
    import yaml  # the harness's own task format; pyyaml comes with transformers and jax's tools, not with this project

    task = yaml.safe_load(task_yml.read_text())
    cases = task["tests" if mode == "test" else "benchmarks"]
    return "".join("; ".join(f"{key}: {value}" for key, value in case.items()) + "\n" for case in cases)


def summary(output: str) -> dict:
    """eval.py's POPCORN output read: {"check": "pass" / "fail" / None, "failures": [lines], "means_ns": [...],
    "geomean_ms": float or None}."""
    check = re.findall(r"^check: (\w+)", output, re.M)
    means = [float(value) for value in re.findall(r"^benchmark\.\d+\.mean: ([0-9.eE+-]+)", output, re.M)]
    failures = [line for line in output.splitlines() if re.match(r"^(test|benchmark)\.\d+\.(status: fail|error:)",
                                                                  line)]
    geomean = math.exp(sum(map(math.log, means)) / len(means)) / 1e6 if means else None
    return {"check": check[-1] if check else None, "failures": failures, "means_ns": means, "geomean_ms": geomean}


def run_eval(problem: Path, workload: str, impl: str, mode: str, seed: int, timeout: float) -> tuple[int, str, str]:
    """(eval.py's exit status, None if it ran past `timeout`; its POPCORN output; its stdout and stderr) for one
    implementation."""
    with tempfile.TemporaryDirectory(prefix=f"gpu-mode-{impl}-") as folder:
        work = Path(folder)
        for item in problem.iterdir():
            (shutil.copytree if item.is_dir() else shutil.copy2)(item, work / item.name)
        (work / "submission.py").write_text(SUBMISSION.format(workload=workload, impl=impl))
        cases = work / f"{mode}-cases.txt"
        cases.write_text(case_lines(problem / "task.yml", mode))
        popcorn = work / "popcorn.txt"
        env = {**os.environ, "POPCORN_SEED": str(seed),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")]))}
        with open(popcorn, "w") as sink:
            env["POPCORN_FD"] = str(sink.fileno())
            try:
                done = subprocess.run([sys.executable, "eval.py", mode, cases.name], cwd=work, env=env,
                                      pass_fds=(sink.fileno(),), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, timeout=timeout)
                status, log = done.returncode, done.stdout
            except subprocess.TimeoutExpired as stopped:
                so_far = stopped.output or b""  # bytes, whatever `text` says
                status, log = None, f"{so_far.decode(errors='replace')}\n(stopped after {timeout:g} s)"
        output = popcorn.read_text()
        return status, output, log


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m compare.tools.gpu_mode_eval", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("problem", type=Path, help="a problem's folder of gpu-mode/reference-kernels")
    parser.add_argument("--workload", required=True, help="the registered workload (trimul, eigh)")
    parser.add_argument("--impl", required=True, help="implementations, comma-separated")
    parser.add_argument("--mode", default="benchmark", choices=("test", "benchmark", "leaderboard"))
    parser.add_argument("--seed", type=int, help="POPCORN_SEED, the secret seed (default: a fresh random one)")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds an implementation (default 1200)")
    parser.add_argument("--out", type=Path, help="a folder to keep eval.py's output and log in, a file each run")
    args = parser.parse_args(argv)
    missing = [name for name in ("eval.py", "task.yml") if not (args.problem / name).is_file()]
    if missing:
        parser.error(f"{args.problem} is not a GPU MODE problem's folder: no {' or '.join(missing)}")
    from ports import get_workload

    try:
        registered = get_workload(args.workload)
        impls = [registered.implementation(name).name for name in args.impl.split(",")]
    except KeyError as error:
        parser.error(str(error).strip("'\""))
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    print(f"{args.problem.name}, eval.py {args.mode}, POPCORN_SEED={seed}", flush=True)
    failed = False
    for impl in impls:
        status, output, log = run_eval(args.problem, args.workload, impl, args.mode, seed, args.timeout)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"{args.problem.name}-{impl}-{args.mode}.txt").write_text(output)
            (args.out / f"{args.problem.name}-{impl}-{args.mode}.log").write_text(log)
        found = summary(output)
        verdict = found["check"] or ("no verdict: stopped at --timeout" if status is None else
                                     f"no verdict (exit status {status})")
        timed = f", geomean {found['geomean_ms']:.4f} ms over {len(found['means_ns'])}" if found["means_ns"] else ""
        print(f"  {impl}: {verdict}, {len(found['failures'])} failure(s){timed}", flush=True)
        for line in found["failures"][:6]:
            print(f"    {line}")
        if found["check"] is None and log.strip():
            print("    " + "\n    ".join(log.strip().splitlines()[-6:]))
        failed |= found["check"] != "pass" or status != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
