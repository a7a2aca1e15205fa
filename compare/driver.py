"""Run every selected implementation of a workload over its cases: check, time, record.

Honest timing, the same for torch and JAX implementations:
- a pool of distinct seeded input sets per case, each with its float64 reference; the first
  call (compile included, reported apart) and a warm-up call use sets 0 and 1; every timed call
  gets a never-seen input made from a pool set by the workload's `vary` (a random symmetry of
  the problem, e.g. a permutation, whose answer follows from the reference), so an
  implementation that returns an earlier call's answer, by any key, fails its checks;
- every output is checked against its own reference, outside the timing: the first call's, the warm-up's and each
  later call's, on case sets that are not timed too (as many calls as a timed run makes);
- before each timed call the L2 is flushed (a 256 MiB write) and the device synchronised;
  the time is the host clock from there to a device-wide synchronisation after the call
  (CUDA events would miss work on XLA's own streams);
- medians with the interquartile range and the number of runs.
With timer="kernels" (GPU only) the time of a call is instead the sum of the device times of the
kernels it launched, read from torch.profiler (which sees Triton, Pallas and XLA kernels alike):
launch overhead and synchronisation are left out, which matters for calls of a few microseconds.
With timer="graph" (GPU only, torch ports) each timed call is replayed from a CUDA graph captured once
(`compare.timing.GraphCall`), its inputs copied into the graph's buffers first: what a caller that
captures graphs pays.
Every result is appended to the JSON file as soon as it is measured, and an implementation
that raises, returns NaN or the wrong shape is recorded as failed while the run goes on.
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import os
import random
import statistics
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

from compare.records import (Recorder, device_info, error_text, floor_seconds, property_verdict, provenance,
                             summarise, traceback_text, versions)
from compare.result import Result
from compare.timing import TIMERS, GraphCall, Synchroniser, timed_call
from ports import Implementation, Workload, bit_view, first_difference, output_digest, to_framework, to_torch

POOL_SEED_STRIDE = 7919  # pool member p of a case uses seed + p * stride


BUDGET_RUNS = 3  # timed runs made whatever max_seconds says
PROGRESS_COLUMNS = 100  # the width of the printed table, and of the progress lines wrapped to it


@dataclass
class Settings:
    pool: int = 3  # distinct input sets per timed case
    min_iters: int = 10  # calls per case after the first and the warm-up, each on a never-seen input and checked
    max_iters: int = 50
    min_seconds: float = 1.0  # keep timing until both min_iters and this much time are done
    max_seconds: float = 60.0  # but stop after this long (checks included) once BUDGET_RUNS are done
    timed: bool = True
    timer: str = "host"  # "host": host clock between device synchronisations; "kernels": profiler; "all": see TIMERS;
    # "graph": a torch port's call replayed from a CUDA graph (compare.timing.GraphCall)
    timed_sets: tuple | None = None  # case sets to time when timed (None: all)
    # on a machine without a GPU, the seconds each port (in an interpreter there) may spend before its remaining
    # cases are left out, said so (None: every case runs); the command line's default run sets it
    interpreter_seconds: float | None = None


def context_lost(device: str) -> str | None:
    """The error a device-wide synchronisation raises where a kernel's fault (an illegal address, say) has left the
    CUDA context unusable, else None (always on a CPU)."""
    if device != "cuda":
        return None
    import torch

    try:
        torch.cuda.synchronize()
    except Exception as error:  # torch.AcceleratorError (a RuntimeError)
        return f"{type(error).__name__}: {str(error).splitlines()[0]}"
    return None


def extra_calls(iters: int) -> int:
    """How many checked calls a case gets beyond `iters`, drawn afresh for each case from the operating system's
    randomness (never seeded, never printed before the calls): from 1 to half of `iters`, so that no port can count
    to the call after which the driver stops looking."""
    return 1 + random.SystemRandom().randrange(max(1, iters // 2))


def kept_copy(value):
    """The inputs with every tensor cloned and every dict, tuple and list rebuilt: what the caller passed, kept
    apart from anything a port writes into."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {key: kept_copy(item) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(kept_copy(item) for item in value)
    return copy.copy(value)


def named_arguments(names: tuple[str, ...], data) -> list[tuple[str, object]]:
    """(name, argument) for each argument of a call: the members of a tuple input named by the workload's
    `argument_names`, or the one input itself."""
    if isinstance(data, (tuple, list)) and len(names) == len(data):
        return list(zip(names, data))
    return [(names[0] if names else "input", data)]


def written_arguments(names: tuple[str, ...], kept, data) -> list[str]:
    """The arguments (x, weights['norm.weight'], ...) whose value after a call differs from the copy kept before
    it: bitwise for tensors, by equality for the rest (a dict's keys included)."""
    import torch

    def differing(path, before, after):
        if isinstance(before, torch.Tensor):
            same = (isinstance(after, torch.Tensor) and before.shape == after.shape and before.dtype == after.dtype
                    and torch.equal(bit_view(before), bit_view(after)))
            return [] if same else [path]
        if isinstance(before, dict):
            if not isinstance(after, dict) or before.keys() != after.keys():
                return [path]
            return [name for key in before for name in differing(f"{path}[{key!r}]", before[key], after[key])]
        if isinstance(before, (tuple, list)):
            if type(after) is not type(before) or len(after) != len(before):
                return [path]
            return [name for index, (b, a) in enumerate(zip(before, after))
                    for name in differing(f"{path}[{index}]", b, a)]
        return [] if before == after else [path]

    return [written for (name, before), (_, after) in zip(named_arguments(names, kept), named_arguments(names, data))
            for written in differing(name, before, after)]


def restore(data, kept) -> None:
    """Write the kept values back into the tensors (and dicts and lists) a port wrote into, so that the inputs
    shared with later implementations are the ones their references were computed from."""
    import torch

    if isinstance(data, torch.Tensor):
        data.copy_(kept)
    elif isinstance(data, dict):
        data.clear()
        data.update(kept)
    elif isinstance(data, list):
        data[:] = kept
    elif isinstance(data, tuple):
        for item, kept_item in zip(data, kept):
            restore(item, kept_item)


def measure(workload: Workload, impl: Implementation, case: dict, pool, references, sync: Synchroniser,
            settings: Settings):
    """One implementation on one case. Returns (its Result, first output as torch or None).

    Every output is checked, timed or not: the first call's (compile included) on input set 0, the warm-up's on set
    1, then as many never-seen inputs (`vary`) as a timed run takes and a few more (`extra_calls`), so that a port
    wrong on one call in ten, only on its first or second call, or from some call on, fails on every case set. The
    time budget (`max_seconds`) ends the timing, never the checks: past it the calls go on untimed. Every argument
    is copied before each call and compared after it: a port that writes into its input fails, named, and its
    output is checked against the input as the caller passed it."""
    import torch

    result = Result(impl.name, impl.framework, impl.backend)
    missing = impl.needs.missing()
    if not missing and settings.timer == "graph" and settings.timed and impl.framework != "torch":
        missing = "--timer graph replays torch's CUDA graphs, which do not capture a JAX call (XLA's own streams)"
    if missing:
        result.status, result.reason = "skipped", missing
        return result, None
    names = workload.argument_names

    def inputs_kept(what: str, data, kept) -> str | None:
        """None when the call left every argument as it was; else what it wrote, the arguments restored."""
        written = written_arguments(names, kept, data)
        if not written:
            return None
        restore(data, kept)
        return f"{what}: the port wrote into its input ({', '.join(written)})"

    try:
        function = impl.load()
        sync.wait()
        kept = kept_copy(pool[0])
        start = time.perf_counter()
        first = function(to_framework(impl.framework, pool[0]))
        sync.wait(first)
        result.first_call_s = time.perf_counter() - start
        first = to_torch(first)
        verdict = workload.check(kept, first, references[0])
        result.status = "pass" if verdict.passed else "fail"
        result.reason, result.errors = verdict.reason, verdict.errors
        result.output_sha256 = output_digest(first)  # the first input set is seeded: compared by --against
        written = inputs_kept("call 1, the first (input set 0)", pool[0], kept)
        if written:
            result.status, result.reason = "fail", written
        if result.status != "pass":
            return result, first
        failures = []

        def check(what: str, data, kept, output, expected) -> None:
            checked, written = workload.check(kept, output, expected), inputs_kept(what, data, kept)
            if written:
                failures.append(written)
            elif not checked.passed:
                failures.append(f"{what}: {checked.reason}")

        warm_up = 1 % len(pool)
        kept = kept_copy(pool[warm_up])
        output = function(to_framework(impl.framework, pool[warm_up]))
        sync.wait(output)
        check(f"call 2, the warm-up (input set {warm_up})", pool[warm_up], kept, to_torch(output), references[warm_up])
        del output, kept
        timers = (TIMERS if settings.timer == "all" else (settings.timer,)) if settings.timed else ("untimed",)
        series = {how: [] for how in timers}
        calls = series[timers[0]]  # the headline series: host clock, or the kernels under --timer kernels
        generator = torch.Generator().manual_seed(len(pool))
        graph = None  # --timer graph: the call captured, once
        planned = settings.min_iters + extra_calls(settings.min_iters)  # checked calls after the first two
        made = 0
        begun = time.perf_counter()
        while True:
            runs, elapsed = len(calls), time.perf_counter() - begun
            enough = runs >= settings.min_iters and (elapsed >= settings.min_seconds or not settings.timed)
            over_budget = runs >= BUDGET_RUNS and elapsed >= settings.max_seconds
            timing = timers[0] != "untimed" and runs < settings.max_iters and not enough and not over_budget
            if not timing and made >= planned:
                break
            member = (made + 2) % len(pool)
            data, expected = workload.vary(pool[member], references[member], generator)
            for how in timers if timing else ("untimed",):
                kept = kept_copy(data)
                if how == "untimed":
                    output = to_torch(function(to_framework(impl.framework, data)))
                    sync.wait(output)
                elif how == "graph":
                    graph = graph or GraphCall(function, kept_copy(data))
                    output, seconds = graph(data, sync)
                    series[how].append(seconds)
                else:
                    output, seconds = timed_call(how, function, impl.framework, data, sync)
                    if seconds is None:
                        failures.append(f"call {made + 3}: the call launched no GPU kernel")
                    series[how].append(seconds or 0.0)
                check(f"call {made + 3} ({how}, from input set {member})", data, kept, output, expected)
                del output, kept
            made += 1
            del data, expected
        checked = 2 + made + len(calls) * (len(timers) - 1)  # a timed input is called once a timer
        result.checked = f"{checked - len(failures)}/{checked} outputs passed"
        if settings.timed:
            quartiles = statistics.quantiles(calls, n=4, method="inclusive") if len(calls) > 1 else [calls[0]] * 3
            result.times_ms, result.median_ms = [t * 1e3 for t in calls], statistics.median(calls) * 1e3
            result.iqr_ms, result.runs = (quartiles[2] - quartiles[0]) * 1e3, len(calls)
        if settings.timer == "all" and settings.timed:
            result.kernel_times_ms = [t * 1e3 for t in series["kernels"]]
            result.kernel_ms = statistics.median(series["kernels"]) * 1e3
            result.from_torch_times_ms = [t * 1e3 for t in series["from torch"]]
            result.from_torch_ms = statistics.median(series["from torch"]) * 1e3
            result.overhead_ms = result.median_ms - result.kernel_ms
            result.bridge_ms = result.from_torch_ms - result.median_ms
            if impl.framework != "torch":
                result.bridge_arrays = tensor_count(pool[0]) + tensor_count(first)
        if failures:
            result.status, result.reason = "fail", f"{len(failures)} of {checked} outputs wrong; first: {failures[0]}"
        return result, first
    except Exception as error:  # noqa: BLE001 - one implementation's failure must not stop the run
        result.status, result.reason, result.traceback = "error", error_text(error), traceback_text()
        return result, None


def tensor_count(value) -> int:
    """The torch tensors in inputs or outputs (tensors, and dicts, tuples and lists of them): what a call from torch
    hands to another framework, or takes back, one DLPack conversion each (small inputs share one:
    `ports.to_framework`)."""
    import torch

    if isinstance(value, dict):
        return sum(tensor_count(item) for item in value.values())
    if isinstance(value, (tuple, list)):
        return sum(tensor_count(item) for item in value)
    return int(isinstance(value, torch.Tensor))


def compare_outputs(a, b) -> dict:
    """Largest difference between two implementations' outputs (tensors, or tuples of tensors
    compared element by element), and whether they agree bitwise."""
    a, b = (a, b) if isinstance(a, (tuple, list)) else ((a,), (b,))
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        return {"max_abs_diff": math.nan, "bitwise_equal": False, "first_difference": None}
    differences = [first_difference(x.detach().cpu(), y.detach().cpu()) for x, y in zip(a, b)]
    first = next((d for d in differences if d), None)
    return {"max_abs_diff": max((d["max_abs_diff"] for d in differences if d), default=0.0),
            "bitwise_equal": first is None, "first_difference": first}


def cross_comparisons(workload: Workload, case_set: str, case: str, outputs: dict) -> list[dict]:
    """Every pair of passing ports on one case (outputs: name -> first output, the reference port first): the
    largest difference and whether they agree bitwise, on the part of the output the workload compares."""
    part = workload.comparable or (lambda output: output)
    entries = []
    for a_name, b_name in itertools.combinations(outputs, 2):
        try:
            comparison = compare_outputs(part(outputs[a_name]), part(outputs[b_name]))
        except Exception as error:  # noqa: BLE001 - recorded; the run goes on
            comparison = {"max_abs_diff": math.nan, "bitwise_equal": False, "error": error_text(error)}
        entries.append({"case_set": case_set, "case": case, "pair": [a_name, b_name], **comparison})
    return entries


def property_results(workload: Workload, impl: Implementation, device: str, sizes: dict) -> list[dict]:
    """The workload's extra properties (e.g. batch invariance) for one implementation."""
    missing = impl.needs.missing()
    if missing:
        return [{"impl": impl.name, "backend": impl.backend, "property": "all", "passed": None, "checked": "-",
                 "error": f"skipped: {missing}", "first_difference": None}]
    try:
        function = impl.load()
        entries = workload.properties(lambda inputs: to_torch(function(inputs)),
                                      lambda *inputs: to_framework(impl.framework, inputs), device, sizes)
    except Exception as error:  # noqa: BLE001 - reported, and the run goes on
        entries = [{"property": "all", "passed": False, "checked": "-", "error": error_text(error),
                    "first_difference": None}]
    return [{"impl": impl.name, "backend": impl.backend, **entry} for entry in entries]


def with_variants(workload: Workload, specs: list[str]) -> Workload:
    """The workload with a variant implementation for each "NAME=IMPL:FILE": FILE's copy of implementation
    IMPL's module (the function IMPL calls, from FILE), or, where IMPL's module is a package (a module per stage),
    FILE a directory holding a copy of that package, run as NAME with IMPL's framework, backend and needs, so
    that a kernel change is measured against the port in the same run and by the same method. ValueError
    (or KeyError, for an unknown IMPL) if a spec is malformed, its name taken or its file missing."""
    variants = []
    for spec in specs:
        name, _, rest = spec.partition("=")
        base_name, _, path = rest.partition(":")
        if not (name and base_name and path):
            raise ValueError(f"a variant is NAME=IMPL:FILE, e.g. fast=triton:trimul_fast.py; got {spec!r}")
        taken = [impl.name for impl in workload.implementations + tuple(variants)]
        if name in taken:
            raise ValueError(f"variant name {name!r} is taken; taken: {', '.join(taken)}")
        base = workload.implementation(base_name)
        if not (path.endswith(".py") and os.path.isfile(path) or os.path.isfile(os.path.join(path, "__init__.py"))):
            raise ValueError(f"variant {name!r}: {path!r} is not a Python file or package")
        function = base.target.rsplit(":", 1)[1]
        variants.append(dataclasses.replace(base, name=name, label=f"{base.label}, variant from {path}",
                                            target=f"{os.path.abspath(path)}:{function}"))
    return dataclasses.replace(workload, implementations=workload.implementations + tuple(variants))


def with_unnamed_variants(names: list[str], workload: Workload, registered: Workload) -> list[str]:
    """The implementation names, then those of the variants `with_variants` added to `registered` that the names
    leave out: a variant always runs beside what it is compared with."""
    added = [impl.name for impl in workload.implementations[len(registered.implementations):]]
    return names + [name for name in added if name not in names]


def select_cases(workload: Workload, spec: str) -> list[tuple[str, dict]]:
    """(set, case) pairs for "SET" (every case of the set), "SET:INDEX" or "SET:NAME" (one case), or a case's NAME
    alone as the table prints it (where one set holds it); ValueError, naming what is valid, if unknown."""
    name, _, index = spec.partition(":")
    if not index and name not in workload.cases:
        holding = [(set_name, case) for set_name, cases in workload.cases.items() for case in cases
                   if workload.case_name(case) == name]
        if len(holding) == 1:
            return holding
        if holding:
            raise ValueError(f"case {name!r} is in sets {', '.join(s for s, _ in holding)}: name one, e.g. "
                             f"{holding[0][0]}:{name}")
        raise ValueError(f"unknown case set or case {name!r}; valid: {', '.join(workload.cases)}, SET:INDEX, or a "
                         "case's name (`--list` names every case)")
    if name not in workload.cases:
        raise ValueError(f"unknown case set {name!r}; valid: {', '.join(workload.cases)}")
    cases = workload.cases[name]
    if not index:
        return [(name, case) for case in cases]
    if not index.isdigit():
        named = [case for case in cases if workload.case_name(case) == index]
        if named:
            return [(name, named[0])]
        raise ValueError(f"case index {index!r} is not a number nor a case of {name}: SET:INDEX or SET:NAME, e.g. "
                         f"{name}:0 (`--list` names every case)")
    if int(index) >= len(cases):
        raise ValueError(f"case index {index!r} out of range for {name} (0..{len(cases) - 1})")
    return [(name, cases[int(index)])]


def run(workload: Workload, impl_names: list[str], case_sets: list[str], json_path: Path | None = None,
        settings: Settings | None = None, progress=None, check_properties: bool = True) -> dict:
    """Check (and, where settings.timed, time) each implementation on each case of the sets
    (each "SET" or "SET:INDEX", see select_cases)."""
    import torch

    settings = settings or Settings()
    progress = progress or (lambda message: print(message, file=sys.stderr, flush=True))
    info = device_info()
    on_gpu = info["mode"] == "gpu"
    device = "cuda" if on_gpu else "cpu"
    impls = [workload.implementation(name) for name in impl_names]
    recorder = Recorder(json_path, {
        "workload": workload.name, **info, "versions": versions(), "provenance": provenance(impls),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "settings": vars(settings),
        "implementations": [{"name": impl.name, "framework": impl.framework, "backend": impl.backend,
                             "label": impl.label} for impl in impls],
        "timing": {"kernels": "sum of kernel device times (torch.profiler), L2 flushed",
                   "graph": "the call replayed from a CUDA graph, CUDA events around the replay, L2 flushed",
                   "host": "host clock between device-wide synchronisations, L2 flushed",
                   "all": "host clock (median_ms), kernel times (kernel_ms) and the torch caller's host clock "
                          "(from_torch_ms), each on every timed input, L2 flushed"}[settings.timer],
        "results": [], "cross": []})
    recorder.save()
    sync = Synchroniser(on_gpu)
    results: list[Result] = []
    jobs = [job for spec in case_sets for job in select_cases(workload, spec)]
    done = 0
    lost = None  # the error of a CUDA context an implementation's fault left unusable: the run stops there
    spent = {impl.name: 0.0 for impl in impls}  # seconds in each implementation's cases (the interpreters' budget)
    capped = settings.interpreter_seconds is not None and not on_gpu
    left_out = {}  # implementation -> cases left out of its budget
    for case_set, case in jobs:
        name = workload.case_name(case)
        timed = settings.timed and (settings.timed_sets is None or case_set in settings.timed_sets)
        case_settings = Settings(**{**vars(settings), "timed": timed})
        pool = [workload.make_inputs(case, case["seed"] + p * POOL_SEED_STRIDE, device) for p in range(settings.pool)]
        references = [workload.reference(inputs) for inputs in pool]
        flops, min_bytes = workload.cost(case)
        ported = {}  # passing ports' first outputs, in registration order: the first is the reference port
        for impl in impls:
            done += 1
            if capped and impl.ported and spent[impl.name] >= settings.interpreter_seconds:
                result, first = Result(impl.name, impl.framework, impl.backend, status="skipped"), None
                result.reason = (f"left out: the interpreter's {settings.interpreter_seconds:g} s of this default "
                                 f"run were spent on earlier cases (--cases {case_set} runs every case)")
                left_out[impl.name] = left_out.get(impl.name, 0) + 1
            else:
                begun = time.perf_counter()
                result, first = measure(workload, impl, case, pool, references, sync, case_settings)
                spent[impl.name] += time.perf_counter() - begun
            result.case_set, result.case, result.params = case_set, name, case
            result.flops, result.min_bytes = flops, min_bytes
            if result.passed and result.median_ms:
                seconds = result.median_ms / 1e3
                result.tflops, result.tbps = flops / seconds / 1e12, min_bytes / seconds / 1e12
                if info["ceilings"]:
                    floor = floor_seconds(flops, min_bytes, info["ceilings"])
                    result.floor_ms, result.roofline_pct = floor * 1e3, 100 * floor / seconds
            results.append(result)
            # the summary so far, with every result: a run stopped before its end (a time limit, say) keeps one;
            # "finished" is written only at the end
            recorder.record["summary"] = summarise(results, workload.baseline)
            recorder.record["results"] = [entry.to_json() for entry in results]
            recorder.save()
            # a kernel's fault may surface in any later call, as any error
            lost = result.status == "error" and context_lost(device)
            if lost:
                recorder.record["stopped"] = (f"the CUDA context was lost at {case_set} {name} {impl.name} ({lost}); "
                                              "every later call would fail with it: the run stops, the results "
                                              "before it stand")
                recorder.save()
                progress(textwrap.fill(recorder.record["stopped"], PROGRESS_COLUMNS, subsequent_indent="    "))
                break
            # kept on the host: on the GPU every port's output of a case would hold its memory until the case ends
            if impl.ported and result.passed:
                ported[impl.name] = (tuple(part.cpu() for part in first) if isinstance(first, (tuple, list))
                                     else first.cpu())
            timing = f" {result.median_ms:.3f} ms" if result.median_ms is not None else ""
            progress(textwrap.fill(f"[{done}/{len(jobs) * len(impls)}] {case_set} {name} {impl.name}: "
                                   f"{result.status}{timing}{' - ' + result.reason if result.reason else ''}",
                                   PROGRESS_COLUMNS, subsequent_indent="    "))
            del first
        if lost:
            break
        recorder.record["cross"].extend(cross_comparisons(workload, case_set, name, ported))
        recorder.save()
        del pool, references, ported
        if on_gpu:
            torch.cuda.empty_cache()
    if left_out:
        recorder.record["left_out"] = left_out
        recorder.save()
        progress(textwrap.fill(
            f"left out, as the interpreters are slow: {', '.join(f'{n} {c} case(s)' for n, c in left_out.items())} "
            f"(each port got {settings.interpreter_seconds:g} s; name the cases, e.g. --cases "
            f"{', '.join(dict.fromkeys(spec.partition(':')[0] for spec in case_sets))}, to run every one)",
            PROGRESS_COLUMNS, subsequent_indent="    "))
    if workload.properties is not None and check_properties and not lost:
        sizes = workload.property_sizes["gpu" if on_gpu else "cpu"]
        recorder.record["properties"] = []
        for impl in impls:
            progress(f"properties of {impl.name} ...")
            for entry in property_results(workload, impl, device, sizes):
                recorder.record["properties"].append(entry)
                line = (f"  {entry['property']}: {property_verdict(entry['passed'])} ({entry['checked']})"
                        + (f" first difference {entry['first_difference']}" if entry.get("first_difference") else "")
                        + (f" {entry['error']}" if entry.get("error") else ""))
                progress(textwrap.fill(line, PROGRESS_COLUMNS, subsequent_indent="    "))
            recorder.save()
    recorder.record["summary"] = summarise(results, workload.baseline)
    recorder.record["results"] = [entry.to_json() for entry in results]
    recorder.record["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    recorder.save()
    return recorder.record


