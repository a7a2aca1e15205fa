"""GPU MODE's own harness on a port: its eval.py runs the registered implementation as a submission.

    python -m compare.tools.gpu_mode_eval PROBLEM_DIR --workload trimul --impl gluon,triton [--mode benchmark]
                                          [--secret | --seed N]

PROBLEM_DIR is a problem's folder in a checkout of gpu-mode/reference-kernels (problems/bioml/trimul,
problems/linalg/eigh_py), which this project does not ship. For each implementation the tool builds a run folder
as GPU MODE's runner does, from the files task.yml lists (paths relative to PROBLEM_DIR, so the checkout's layout
must stay whole: eigh_py's utils.py comes from ../../pmpp_v2), with a submission.py whose `custom_kernel` is
`ports.custom_kernel(WORKLOAD, IMPL)` (torch tensors in and out, JAX ports through DLPack). It writes task.yml's
`tests` (--mode test) or `benchmarks` (benchmark, leaderboard) as eval.py reads them, one `key: value; ...` line a
case, and runs `python eval.py MODE FILE` with the harness's output to a file (POPCORN_FD). With no seed the cases
are the public ones, as the runner's own test, benchmark and leaderboard runs are; --secret draws a fresh secret
seed (POPCORN_SEED, printed: eval.py mixes it into every case's seed), --seed N sets one. A mode runs alone (the
runner runs test, then benchmark, then leaderboard, each once the one before passed). Each run is stopped, with the
harness's worker processes, after task.yml's timeout for the mode (or --timeout). It prints each implementation's
verdict, failing cases and, when timed, the geometric mean of the cases' mean times; --out keeps eval.py's output
and log a run.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import secrets
import shutil
import signal
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
    cases = task(task_yml.parent)["tests" if mode == "test" else "benchmarks"]
    return "".join("; ".join(f"{key}: {value}" for key, value in case.items()) + "\n" for case in cases)


def summary(output: str) -> dict:
    """eval.py's POPCORN output read: {"check": "pass" / "fail" / None, "failures": [a failing case's status line],
    "errors": [their error lines], "means_ns": [...], "geomean_ms": float or None}."""
    check = re.findall(r"^check: (\w+)", output, re.M)
    means = [float(value) for value in re.findall(r"^benchmark\.\d+\.mean: ([0-9.eE+-]+)", output, re.M)]
    failures = re.findall(r"^(?:test|benchmark)\.\d+\.status: fail$", output, re.M)
    errors = re.findall(r"^(?:test|benchmark)\.\d+\.error: .*$", output, re.M)
    geomean = math.exp(sum(map(math.log, means)) / len(means)) / 1e6 if means else None
    return {"check": check[-1] if check else None, "failures": failures, "errors": errors, "means_ns": means,
            "geomean_ms": geomean}


def task(problem: Path) -> dict:
    import yaml  # the harness's own task format; pyyaml comes with transformers (the models extra), not this project

    return yaml.safe_load((problem / "task.yml").read_text())


def timeout_for(spec: dict, mode: str) -> float:
    """task.yml's time limit for the mode, in seconds (1200 where it names none)."""
    return float(spec.get({"test": "test_timeout", "benchmark": "benchmark_timeout",
                           "leaderboard": "ranked_timeout"}[mode], 1200))


def copy_harness_files(problem: Path, work: Path) -> None:
    """task.yml's files but the submission, copied into the run folder `work` under their names, as GPU MODE's runner
    lays them out (sources relative to the problem's folder)."""
    for entry in task(problem)["files"]:
        if entry["source"] != "@SUBMISSION@":
            shutil.copy2(problem / entry["source"], work / entry["name"])


def run_eval(problem: Path, workload: str, impl: str, mode: str, seed: int | None,
             timeout: float) -> tuple[int | None, str, str]:
    """(eval.py's exit status, None if it ran past `timeout`; its POPCORN output; its stdout and stderr) for one
    implementation."""
    with tempfile.TemporaryDirectory(prefix=f"gpu-mode-{impl}-") as folder:
        work = Path(folder)
        copy_harness_files(problem, work)
        (work / "submission.py").write_text(SUBMISSION.format(workload=workload, impl=impl))
        cases = work / f"{mode}-cases.txt"
        cases.write_text(case_lines(problem / "task.yml", mode))
        popcorn = work / "popcorn.txt"
        env = {name: value for name, value in os.environ.items() if name != "POPCORN_SEED"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")]))
        if seed is not None:
            env["POPCORN_SEED"] = str(seed)
        with open(popcorn, "w") as sink:
            env["POPCORN_FD"] = str(sink.fileno())
            # a session of its own: a timeout stops eval.py's pool worker too, which runs the kernels
            process = subprocess.Popen([sys.executable, "eval.py", mode, cases.name], cwd=work, env=env,
                                       pass_fds=(sink.fileno(),), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       text=True, start_new_session=True)
            try:
                log, _ = process.communicate(timeout=timeout)
                status = process.returncode
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                log, _ = process.communicate()
                status, log = None, f"{log}\n(stopped after {timeout:g} s)"
        output = popcorn.read_text()
        return status, output, log


def harness_arguments(prog: str, description: str, modes: tuple[str, ...]) -> argparse.ArgumentParser:
    """The arguments the GPU MODE tools share: the problem's folder, --workload, --impl, --mode and the seed."""
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("problem", type=Path, help="a problem's folder of gpu-mode/reference-kernels")
    parser.add_argument("--workload", required=True, help="the registered workload (trimul, eigh)")
    parser.add_argument("--impl", required=True, help="implementations, comma-separated")
    parser.add_argument("--mode", default="benchmark", choices=modes)
    seeds = parser.add_mutually_exclusive_group()
    seeds.add_argument("--secret", action="store_true", help="a fresh random secret seed (POPCORN_SEED), printed")
    seeds.add_argument("--seed", type=int, help="this secret seed (default: none, the public cases)")
    return parser


def registered(parser: argparse.ArgumentParser, workload: str, impls: str) -> list[str]:
    """The named implementations of the workload, or the parser's error naming the unknown one."""
    from ports import get_workload

    try:
        found = get_workload(workload)
        return [found.implementation(name).name for name in impls.split(",")]
    except KeyError as error:
        parser.error(str(error).strip("'\""))


def main(argv=None) -> int:
    parser = harness_arguments("python -m compare.tools.gpu_mode_eval", __doc__, ("test", "benchmark", "leaderboard"))
    parser.add_argument("--timeout", type=float, help="seconds an implementation (default: task.yml's for the mode)")
    parser.add_argument("--out", type=Path, help="a folder to keep eval.py's output and log in, a file each run")
    args = parser.parse_args(argv)
    missing = [name for name in ("eval.py", "task.yml") if not (args.problem / name).is_file()]
    if missing:
        parser.error(f"{args.problem} is not a GPU MODE problem's folder: no {' or '.join(missing)}")
    absent = [entry["source"] for entry in task(args.problem).get("files", ())
              if entry["source"] != "@SUBMISSION@" and not (args.problem / entry["source"]).is_file()]
    if absent:
        parser.error(f"task.yml lists files not found from {args.problem}: {', '.join(absent)} (keep the "
                     "reference-kernels checkout's layout whole)")
    impls = registered(parser, args.workload, args.impl)
    seed = secrets.randbelow(2**31) if args.secret else args.seed
    timeout = args.timeout or timeout_for(task(args.problem), args.mode)
    print(f"{args.problem.name}, eval.py {args.mode}, " + ("the public cases" if seed is None else
                                                          f"POPCORN_SEED={seed}"), flush=True)
    failed = False
    for impl in impls:
        status, output, log = run_eval(args.problem, args.workload, impl, args.mode, seed, timeout)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"{args.problem.name}-{impl}-{args.mode}.txt").write_text(output)
            (args.out / f"{args.problem.name}-{impl}-{args.mode}.log").write_text(log)
        found = summary(output)
        verdict = found["check"] or ("no verdict: stopped at --timeout" if status is None else
                                     f"no verdict (exit status {status})")
        timed = f", geomean {found['geomean_ms']:.4f} ms over {len(found['means_ns'])}" if found["means_ns"] else ""
        print(f"  {impl}: {verdict}, {len(found['failures'])} failure(s){timed}", flush=True)
        for line in found["errors"][:6]:
            print(f"    {line}")
        if found["check"] is None and log.strip():
            print("    " + "\n    ".join(log.strip().splitlines()[-6:]))
        failed |= found["check"] != "pass" or status != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
