"""GPU MODE's benchmark clock, run from a port's own framework: eval.py's protocol in this process, each call clocked
from the port's framework and from torch, so that the bridge between them gets its own figure.

    python -m compare.tools.gpu_mode_clock PROBLEM_DIR --workload trimul --impl pallas,mosaic_gpu
                                           [--mode benchmark | leaderboard] [--secret | --seed N] [--json FILE]

GPU MODE's eval.py (`compare.tools.gpu_mode_eval`) calls a submission with torch tensors and clocks it with CUDA
events on torch's stream, so a JAX port's figure there holds the bridge (DLPack both ways and JAX's dispatch from
torch's side). This tool follows eval.py's benchmark protocol and clocks every case twice:
- "own": the port's function on its framework's arrays, converted from the case's torch input outside the clock;
- "from torch": `ports.custom_kernel(WORKLOAD, IMPL)` on the torch input, as eval.py calls a submission;
and "bridge" is the second less the first. For a torch port the two rows are the same call.

The protocol, as eval.py's benchmark mode has it: task.yml's `benchmarks`, each value as eval.py reads it from its
case file (an integer, or else the string Python prints: `nomask: False` stays the string "False"), a case's seed
mixed with the secret seed as eval.py mixes them, the problem's own `generate_input` and `check_implementation`
(its reference.py, imported from a run folder built from task.yml's files), one checked call, a warm-up of the
first case, then up to --max-calls timed calls a case, until the standard error of their mean is below 0.1% of it,
their sum passes --max-seconds or two minutes pass. The same input every call; --mode leaderboard draws a fresh one
for every call (the seed 13 more each time), outside the clock, as eval.py's ranked runs do. The clock is the
host's, from a synchronised device to the call's outputs ready (`jax.block_until_ready`, `torch.cuda.synchronize`):
JAX has no CUDA events, so both rows use the host clock, and eval.py's event figure for the torch call is
gpu_mode_eval's. It prints each port's per-case means and geometric means, in ms; --json keeps them.
"""
from __future__ import annotations

import importlib
import json
import math
import re
import secrets
import sys
import tempfile
import time
from pathlib import Path

from compare.tools.gpu_mode_eval import copy_harness_files, harness_arguments, registered, task

MAX_CALLS = 100  # eval.py's most timed calls a case
MAX_SECONDS = 10.0  # its limit on a case's summed call times
MAX_WALL_SECONDS = 120.0  # and on a case's wall time
RELATIVE_ERROR = 0.001  # it stops once the mean's standard error is below this share of the mean


def as_eval_reads(case: dict) -> dict:
    """A task.yml case as eval.py reads it from its `key: value` line: an integer where the value prints as one,
    else the string Python prints (a boolean becomes "True" or "False", both true)."""
    return {key: int(str(value)) if re.fullmatch(r"[+-]?[0-9]+", str(value)) else str(value)
            for key, value in case.items()}


def mixed_seed(case_seed: int, secret: int) -> int:
    """A case's seed with the secret seed mixed in, as eval.py mixes them (a Cantor pairing added to the case's seed,
    so that a large secret makes a large seed)."""
    return case_seed + (case_seed + secret) * (case_seed + secret + 1) // 2


def stats(durations_ns: list[int]) -> dict:
    runs = len(durations_ns)
    mean = sum(durations_ns) / runs
    std = math.sqrt(sum((d - mean) ** 2 for d in durations_ns) / (runs - 1)) if runs > 1 else 0.0
    return {"runs": runs, "mean_ns": mean, "err_ns": std / math.sqrt(runs), "best_ns": min(durations_ns),
            "worst_ns": max(durations_ns)}


def clock(call, ready, inputs, max_calls: int, max_seconds: float) -> dict:
    """eval.py's stopping rule around `call(inputs(index))`: `ready(value)` waits for a value and the device."""
    durations, started = [], time.perf_counter_ns()
    for index in range(max_calls):
        data = inputs(index)
        ready(data)
        start = time.perf_counter_ns()
        output = call(data)
        ready(output)
        durations.append(time.perf_counter_ns() - start)
        del output
        if index > 1:
            now = stats(durations)
            if (now["err_ns"] < RELATIVE_ERROR * now["mean_ns"] or sum(durations) > max_seconds * 1e9
                    or time.perf_counter_ns() - started > MAX_WALL_SECONDS * 1e9):
                break
    return stats(durations)


def clone(data):
    """A deep copy of a case's input (tensors cloned), for the check: a call may write its input."""
    if isinstance(data, dict):
        return {key: clone(value) for key, value in data.items()}
    if isinstance(data, (tuple, list)):
        return type(data)(clone(value) for value in data)
    return data.clone() if hasattr(data, "clone") else data


def waiters(framework: str):
    """(wait for torch values and the device, wait for the port's framework's values and the device)."""
    import torch

    def torch_ready(_value):
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    if framework != "jax":
        return torch_ready, torch_ready
    import jax

    def jax_ready(value):
        jax.block_until_ready(value)
        torch_ready(value)

    return torch_ready, jax_ready


def harness(problem: Path, work: Path):
    """The problem's reference module, imported from a run folder built as eval.py's (its `utils` and `task` with
    it); the modules are dropped from sys.modules again, so that two problems never share them."""
    copy_harness_files(problem, work)
    names = ("reference", "utils", "task")
    sys.path.insert(0, str(work))
    try:
        return importlib.import_module("reference")
    finally:
        sys.path.remove(str(work))
        for name in names:
            sys.modules.pop(name, None)


def clock_port(reference, workload: str, impl: str, cases: list[dict], leaderboard: bool, max_calls: int,
               max_seconds: float) -> dict:
    """{"check": "pass" / "fail", "error": str, "cases": [{"spec", "own", "from_torch"} stats]} for one port."""
    from ports import custom_kernel, get_workload, to_framework

    port = get_workload(workload).implementation(impl)
    own, from_torch = port.load(), custom_kernel(workload, impl)
    torch_ready, own_ready = waiters(port.framework)
    rows = []
    for index, case in enumerate([cases[0]] + cases):  # the first case twice: eval.py's warm-up, not kept
        data = reference.generate_input(**case)
        expected_input = clone(data)
        good, message = reference.check_implementation(expected_input, from_torch(data))
        if not good:
            return {"check": "fail", "error": f"{case}: {message}", "cases": rows}

        def inputs(call, case=case, data=data):
            if not leaderboard:
                return data
            return reference.generate_input(**dict(case, seed=case["seed"] + 13 * (call + 1)))

        def own_inputs(call, inputs=inputs):
            return to_framework(port.framework, inputs(call))

        seconds = 0.1 if index == 0 else max_seconds  # eval.py's warm-up: a tenth of a second's calls
        row = {"spec": case, "own": clock(own, own_ready, own_inputs, max_calls, seconds),
               "from_torch": clock(from_torch, torch_ready, inputs, max_calls, seconds)}
        if index:
            rows.append(row)
    return {"check": "pass", "error": "", "cases": rows}


def geomean_ms(rows: list[dict], key: str) -> float:
    return math.exp(sum(math.log(row[key]["mean_ns"]) for row in rows) / len(rows)) / 1e6


def main(argv=None) -> int:
    parser = harness_arguments("python -m compare.tools.gpu_mode_clock", __doc__, ("benchmark", "leaderboard"))
    parser.add_argument("--max-calls", type=int, default=MAX_CALLS, help=f"timed calls a case at most ({MAX_CALLS})")
    parser.add_argument("--max-seconds", type=float, default=MAX_SECONDS,
                        help=f"a case's summed call times at most, in seconds ({MAX_SECONDS:g})")
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    args = parser.parse_args(argv)
    if not (args.problem / "task.yml").is_file():
        parser.error(f"{args.problem} is not a GPU MODE problem's folder: no task.yml")
    if args.max_calls < 3:
        parser.error("--max-calls must be at least 3 (eval.py's least)")
    impls = registered(parser, args.workload, args.impl)
    seed = secrets.randbelow(2**31) if args.secret else args.seed
    cases = [as_eval_reads(case) for case in task(args.problem)["benchmarks"]]
    if seed is not None:
        cases = [dict(case, seed=mixed_seed(case["seed"], seed)) if "seed" in case else case for case in cases]
    print(f"{args.problem.name}, eval.py's {args.mode} clock from each port's framework, " +
          ("the public cases" if seed is None else f"secret seed {seed}"), flush=True)
    results, failed = {}, False
    with tempfile.TemporaryDirectory(prefix="gpu-mode-clock-") as folder:
        reference = harness(args.problem, Path(folder))
        for impl in impls:
            found = results[impl] = clock_port(reference, args.workload, impl, cases, args.mode == "leaderboard",
                                               args.max_calls, args.max_seconds)
            if found["check"] != "pass":
                failed = True
                print(f"  {impl}: fail, {found['error']}", flush=True)
                continue
            own, torch_ms = geomean_ms(found["cases"], "own"), geomean_ms(found["cases"], "from_torch")
            print(f"  {impl}: pass, geomean own {own:.4f} ms, from torch {torch_ms:.4f} ms, the bridge "
                  f"{torch_ms - own:+.4f} ms over {len(found['cases'])}", flush=True)
            for row in found["cases"]:
                spec = "; ".join(f"{key}: {value}" for key, value in row["spec"].items())
                print(f"    {row['own']['mean_ns'] / 1e6:9.4f} {row['from_torch']['mean_ns'] / 1e6:9.4f}  {spec}")
    if args.json:
        args.json.write_text(json.dumps({"problem": args.problem.name, "workload": args.workload, "mode": args.mode,
                                         "secret_seed": seed, "ports": results}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
