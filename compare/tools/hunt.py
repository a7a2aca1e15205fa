"""Fresh inputs until the time runs out, every output checked: a failure hunt whose failures can be checked again.

    python -m compare.tools.hunt eigh --case bench:7 --impl triton,pallas --seconds 300 --json hunt.json
    python -m compare.tools.hunt eigh --case bench,test --impl triton,pallas --seconds 600 --json hunt.json

The driver's timed runs vary a few seeded inputs by the workload's symmetries (for eigh, s P A P^T), so an input
that an implementation rarely gets wrong can hide from it: the eigh Triton port's rare failures at 60x1024 mixed
(with its earlier shift groups) showed only on fresh spectra (docs/findings.md). This draws a new input from each
seed in turn (one case: its own seed first, then 1, 2, ...; several cases, as --case bench,test or bench:3,test:7:
each case in turn for seeds 1, 2, ...; with --first-seed S: S, S + 1, ..., so that hunts over different ranges
share no input), runs every implementation on it and checks the output with the workload's check, the driver's;
nothing is timed. Where the workload has a bounded check (eigh: the eigenvalue gate settled by a bound from the
output's own figures), the float64 reference is computed only for the outputs it leaves open. A failing seed is
printed when it is found, and the end says how to check those inputs again (--seeds). A progress line every 30 s;
the tally counts inputs and their items (eigh: matrices). A kernel's fault that leaves the CUDA context unusable
stops the hunt at that input, said so in the tally (every later call would fail with it): the failures before it
stand. The record names the code that ran (each implementation's source digest) and the last seed drawn, so that
hunts over disjoint --first-seed ranges add up across sessions (`python -m compare.tools.hunt_ledger`). Exit status
1 if any implementation failed to load, or failed or raised on any input; 2 for a bad argument.
"""
from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json
import math
import os
import sys
import time
from pathlib import Path

from compare.driver import context_lost
from compare.records import PROJECT_ROOT, device_info, error_text, provenance, source_digest, versions
from ports import WORKLOAD_MODULES, to_framework, to_torch

PROGRESS_SECONDS = 30


class ContextLost(RuntimeError):
    """An implementation's error left the CUDA context unusable: the message names the input and the error."""


def code_digests(workload, impls) -> dict[str, str | None]:
    """Per implementation, a SHA-256 of the code its hunt's verdicts rest on: the port's source (its file or package),
    the workload's module (how a seed makes an input, and the check) and kernel_support (what the ports share: tunables,
    launches); None where the port's source is not found (a hunt of it counts toward no ledger)."""
    shared = [source_digest(Path(importlib.util.find_spec(WORKLOAD_MODULES[workload.name]).origin)),
              source_digest(Path(PROJECT_ROOT) / "kernel_support")]
    digests = {}
    for impl in impls:
        path = impl.source_path()
        digests[impl.name] = (hashlib.sha256("\0".join([source_digest(Path(path)), *shared]).encode()).hexdigest()
                              if path and os.path.exists(path) else None)
    return digests


def seed_order(case: dict | None, first_seed: int | None, seeds: list[int] | None):
    """The seeds to draw inputs from: `seeds` as given; from first_seed upwards if given; else the case's own seed
    (the driver's first pool input), then 1 upwards; with several cases (case None), 1 upwards."""
    if seeds:
        return iter(seeds)
    if first_seed is not None:
        return itertools.count(first_seed)
    if case is None:
        return itertools.count(1)
    return itertools.chain([case["seed"]], (s for s in itertools.count(1) if s != case["seed"]))


def hunt(workload, cases, impls, seeds, seconds: float, device: str, report=print, save=None) -> dict:
    """Each implementation on the input of each seed in turn, each of `cases` ([(name, case)]) for each seed, until
    `seconds` have passed (the first input always runs, and every seed of a finite `seeds`): {name: {"inputs",
    "items" (the inputs' batch entries), "settled_by_bound" (outputs judged without the reference), "failures":
    [{"seed", "case", "reason"}], "worst": {figure: largest value the check gave}, "load_error", "stopped",
    "last_seed" (the seed of the last input it was checked on)}}. An
    implementation that fails to load is recorded (load_error) and left out. Where an error leaves the CUDA context
    unusable, the hunt stops after that input, its reason in every entry's "stopped" (None otherwise).
    save(tally), if given, runs after an input with a failure, with each progress line and at the end, also when the
    hunt is interrupted or stopped, so a hunt cut short keeps what it found."""
    tally = {impl.name: {"inputs": 0, "items": 0, "settled_by_bound": 0, "failures": [], "worst": {},
                         "load_error": None, "stopped": None, "last_seed": None} for impl in impls}
    functions = {}
    for impl in impls:
        try:
            functions[impl.name] = (impl, impl.load())
        except Exception as error:  # noqa: BLE001 - recorded; the others hunt on
            tally[impl.name]["load_error"] = error_text(error)
            report(f"{impl.name} failed to load: {tally[impl.name]['load_error']}")
    start = last_report = time.perf_counter()
    count = 0
    try:
        for seed in seeds:
            for case_name, case in cases:
                if count and time.perf_counter() - start >= seconds:
                    return tally
                count += 1
                found = _check_input(workload, case_name, case, seed, device, functions, tally, report)
                now = time.perf_counter()
                progress = now - last_report >= PROGRESS_SECONDS
                if progress:
                    last_report = now
                    report(f"{count} inputs in {now - start:.0f} s (seed {seed}, {case_name}); failed: "
                           + ", ".join(f"{name} {len(entry['failures'])}" for name, entry in tally.items()))
                if save and (found or progress):
                    save(tally)
    except ContextLost as lost:
        report(str(lost))
        for entry in tally.values():
            entry["stopped"] = str(lost)
    finally:
        if save:
            save(tally)
    return tally


def _check_input(workload, case_name, case, seed, device, functions, tally, report) -> bool:
    """Every implementation on the input of (case, seed), checked and tallied; whether one failed. The reference
    is computed once, and only where the workload's bounded check leaves an output open. ContextLost where an error
    left the CUDA context unusable (its failure tallied; the implementations after it do not run)."""
    inputs = workload.make_inputs(case, seed, device)
    expected = None
    found = False
    for name, (impl, function) in functions.items():
        entry = tally[name]
        lost = None
        try:
            output = to_torch(function(to_framework(impl.framework, inputs)))
            verdict = workload.bounded_check(inputs, output) if workload.bounded_check else None
            if verdict is None:
                expected = workload.reference(inputs) if expected is None else expected
                verdict = workload.check(inputs, output, expected)
            else:
                entry["settled_by_bound"] += 1
            for figure, value in verdict.errors.items():
                value = math.inf if math.isnan(value) else value
                entry["worst"][figure] = max(entry["worst"].get(figure, value), value)
            reason = "" if verdict.passed else verdict.reason
        except Exception as error:  # noqa: BLE001 - recorded; the hunt goes on unless the context is lost
            reason, lost = error_text(error), context_lost(device)
        entry["inputs"] += 1
        entry["items"] += case.get("batch", 1)
        entry["last_seed"] = seed
        if reason:
            entry["failures"].append({"seed": seed, "case": case_name, "reason": reason})
            report(f"seed {seed}, {case_name}: {name} failed: {reason}")
            found = True
        if lost:
            raise ContextLost(f"the CUDA context was lost at seed {seed}, {case_name}, {name} ({lost}); every later "
                              "call would fail with it: the hunt stops, its failures before it stand")
    return found


def main(argv=None) -> int:
    from compare import gpu_or_interpreters

    on_gpu = gpu_or_interpreters()
    from compare.tools.one_case import one_case_arguments, one_case_setup

    parser = one_case_arguments("python -m compare.tools.hunt", __doc__, "bench:0", "triton,pallas",
                                "comma-separated implementations",
                                case_help="comma-separated SET:INDEX or SET (each of its cases), e.g. bench,test:3")
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="draw new inputs until this long has passed (default 60; the first input always runs)")
    parser.add_argument("--first-seed", type=int, default=None,
                        help="draw from this seed upwards (default: one case's own seed, then 1 upwards; several "
                             "cases: 1 upwards)")
    parser.add_argument("--seeds", default=None,
                        help="comma-separated seeds to check, all of them and nothing else (a failure found before)")
    parser.add_argument("--json", default=None, help="write the tally to this JSON file")
    setup = one_case_setup(parser, argv, many=True)
    if setup is None:
        return 2
    args, workload, cases, impls = setup
    try:
        seeds = [int(s) for s in args.seeds.split(",")] if args.seeds is not None else None
    except ValueError:
        print(f"bad argument: --seeds takes comma-separated integers, got {args.seeds!r}", file=sys.stderr)
        return 2
    if args.seconds <= 0:
        print("bad argument: --seconds must be positive", file=sys.stderr)
        return 2
    if not on_gpu:
        print("no CUDA GPU: the kernels run through the Triton interpreter and Pallas interpret mode",
              file=sys.stderr)
    one = cases[0][1] if len(cases) == 1 else None
    header = {"workload": workload.name, "case": workload.case_name(one) if one else args.case,
              "cases": {name: workload.case_name(case) for name, case in cases}, "params": one, **device_info(),
              "versions": versions(), "provenance": provenance(impls), "code": code_digests(workload, impls),
              "seconds": None if seeds else args.seconds,
              "first_seed": None if seeds else args.first_seed, "seeds": seeds}

    def save(tally):  # whole or not at all: written beside, then moved over
        with open(f"{args.json}.part", "w") as handle:
            json.dump({**header, "results": tally}, handle, indent=1)
        os.replace(f"{args.json}.part", args.json)

    tally = hunt(workload, cases, impls, seed_order(one, args.first_seed, seeds),
                 math.inf if seeds else args.seconds, "cuda" if on_gpu else "cpu",
                 report=lambda line: print(line, flush=True), save=save if args.json else None)
    for impl_name, entry in tally.items():
        if entry["load_error"]:
            print(f"{header['case']} {impl_name}: failed to load: {entry['load_error']}")
            continue
        worst = ", ".join(f"{figure} {value:.3g}" for figure, value in entry["worst"].items())
        print(f"{header['case']} {impl_name}: {entry['inputs']} inputs ({entry['items']} items), "
              f"{len(entry['failures'])} failed" + (f"; worst {worst}" if worst else "")
              + ("; stopped: the CUDA context was lost" if entry["stopped"] else ""))
    failed = {}
    for entry in tally.values():
        for failure in entry["failures"]:
            failed.setdefault(failure["case"], set()).add(failure["seed"])
    variants = "".join(f" --variant {spec}" for spec in args.variant)
    for case_name, failed_seeds in failed.items():
        print(f"check them again: python -m compare.tools.hunt {args.workload} --case {case_name} --impl {args.impl}"
              f"{variants} --seeds {','.join(map(str, sorted(failed_seeds)))}")
    return 1 if failed or any(entry["load_error"] for entry in tally.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
