"""Where the time goes: per-kernel GPU time of implementations on one case, from torch.profiler.

    python -m compare.tools.kernel_times trimul --case bench:6 --impl triton,pallas
    python -m compare.tools.kernel_times eigh --case bench:3 --impl triton --variant capped=triton:eigh_capped

The profiler records Triton, Pallas and XLA kernels in one trace, so the breakdown is the
same for both frameworks. Each implementation runs a warm-up call, then `--runs` profiled calls
on one input set; the table gives each kernel's mean time per call and what its launches ran with,
as the profiler's trace records it for every kernel, XLA's compiles of the Pallas kernels included:
registers a thread, threads a block and shared memory a block (each distinct set, where a name has
several specialisations). For a Triton implementation it then lists what the GPU's Triton compiled
each of its module's kernels to: warps, registers a thread and bytes of local memory (spills), one
line per specialisation (XLA's spills are out of reach). A --variant runs with the implementations
named in --impl. An implementation that fails is reported on one line and the others still run
(exit status 1).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from collections import defaultdict

from compare.timing import device_ms, profiled, wait_for


def _profiled_after_warm_up(function, native_inputs, runs: int):
    """The profiler of `runs` calls after a warm-up call, waited for (otherwise a JAX call's kernels would still
    run, and be counted, while the profiled calls start)."""
    wait_for(function(native_inputs))
    return profiled(function, native_inputs, runs)[1]


def _mean_ms(prof, runs: int) -> dict[str, float]:
    return dict(sorted(((name, ms / runs) for name, ms in device_ms(prof).items()), key=lambda item: -item[1]))


def kernel_times(function, native_inputs, runs: int) -> dict[str, float]:
    """Mean device time per call (ms) of each kernel the function launches, after a warm-up call."""
    return _mean_ms(_profiled_after_warm_up(function, native_inputs, runs), runs)


def launch_resources(trace_events) -> dict[str, list[tuple[int, int, int]]]:
    """{kernel: sorted distinct (registers a thread, threads a block, shared memory bytes a block)} of the
    kernel launches in a profiler trace's events (Chrome trace format; CUPTI records them for every kernel)."""
    found = defaultdict(set)
    for event in trace_events:
        args = event.get("args", {})
        if event.get("cat") == "kernel" and "registers per thread" in args:
            threads = 1
            for extent in args.get("block", [1]):
                threads *= extent
            found[event["name"]].add((args["registers per thread"], threads, args.get("shared memory", 0)))
    return {name: sorted(launches) for name, launches in found.items()}


def _traced_resources(prof) -> dict[str, list[tuple[int, int, int]]]:
    with tempfile.TemporaryDirectory() as folder:
        trace = os.path.join(folder, "trace.json")
        prof.export_chrome_trace(trace)
        with open(trace) as file:
            return launch_resources(json.load(file).get("traceEvents", []))


def resources_text(launches: list[tuple[int, int, int]]) -> str:
    """'168 regs 64 thr 0 B' for each distinct launch resource set, '; '-joined; '-' if none was recorded."""
    return "; ".join(f"{regs} regs {threads} thr {shared} B" for regs, threads, shared in launches) or "-"


def compiled_kernels(function) -> list[tuple[str, int, int, int]]:
    """(kernel, warps, registers a thread, bytes of local memory a thread: spills) of each compiled
    specialisation of the Triton kernels in the module that defines `function`, as its launches left them in
    Triton's per-device caches (whose n_spills counts 4-byte words)."""
    from triton.runtime.jit import JITFunction

    module = sys.modules.get(getattr(function, "__module__", None))
    rows = []
    for name, value in sorted(vars(module).items()) if module else ():
        if isinstance(value, JITFunction):
            for kernel_cache, *_ in value.device_caches.values():
                rows += [(name, kernel.metadata.num_warps, kernel.n_regs, 4 * kernel.n_spills)
                         for kernel in kernel_cache.values() if getattr(kernel, "n_regs", None) is not None]
    return rows


def main(argv=None) -> int:
    # imported here: the driver imports this module
    from compare.tools.one_case import one_case_arguments, one_case_setup

    parser = one_case_arguments("python -m compare.tools.kernel_times", __doc__, "bench:0", "triton,pallas",
                                "comma-separated implementations")
    parser.add_argument("--runs", type=int, default=5)
    setup = one_case_setup(parser, argv)
    if setup is None:
        return 2
    args, workload, case, impls = setup
    import torch

    if not torch.cuda.is_available():
        print("kernel_times needs a CUDA GPU", file=sys.stderr)
        return 2
    inputs = workload.make_inputs(case, case["seed"], "cuda")
    print(f"{args.workload} {workload.case_name(case)}: mean GPU time per call, {args.runs} calls")
    reported = [report(impl, inputs, args.runs) for impl in impls]
    return 0 if all(reported) else 1


def report(impl, inputs, runs: int) -> bool:
    """Print one implementation's kernel times (and a Triton one's compiled kernels); False, with the error on
    one line, if it fails, so that the other implementations are still reported."""
    from compare.records import error_text
    from ports import to_framework

    try:
        function = impl.load()
        prof = _profiled_after_warm_up(function, to_framework(impl.framework, inputs), runs)
        times = _mean_ms(prof, runs)
    except Exception as error:  # noqa: BLE001 - reported; the next implementation runs
        print(f"{impl.name}: failed: {error_text(error)}")
        return False
    try:
        resources = _traced_resources(prof)
    except Exception as error:  # noqa: BLE001 - the times stand without the trace's launch records
        print(f"{impl.name}: launch resources unavailable: {error_text(error)}")
        resources = {}
    print(f"{impl.name}: {sum(times.values()):.3f} ms in kernels")
    for kernel, ms in times.items():
        print(f"  {ms:9.3f} ms  {resources_text(resources.get(kernel, [])):30s}  {kernel[:100]}")
    if impl.backend == "triton":
        for kernel, warps, registers, spilled in compiled_kernels(function):
            print(f"  {kernel:40s} {warps:2d} warps {registers:4d} registers {spilled:6d} bytes spilled")
    return True


if __name__ == "__main__":
    sys.exit(main())
