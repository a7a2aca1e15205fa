"""Where the time goes: per-kernel GPU time of implementations on one case, from torch.profiler.

    python -m compare.kernel_times trimul --case bench:6 --impl triton,pallas

The profiler records Triton, Pallas and XLA kernels in one trace, so the breakdown is the
same for both frameworks. Each implementation runs a warm-up call, then `--runs` profiled calls
on one input set; the table gives each kernel's mean time per call.
"""
from __future__ import annotations

import os
import sys
from collections import defaultdict


def profiled_calls(function, native_inputs, runs: int = 1):
    """Call `function` `runs` times under torch.profiler; returns (last output, {kernel: total ms})."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            out = function(native_inputs)
            if hasattr(out, "block_until_ready"):
                out.block_until_ready()
            torch.cuda.synchronize()
    totals = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] += event.device_time / 1e3
    return out, totals


def kernel_times(function, native_inputs, runs: int) -> dict[str, float]:
    """Mean device time per call (ms) of each kernel the function launches, after a warm-up call."""
    function(native_inputs)
    _, totals = profiled_calls(function, native_inputs, runs)
    return dict(sorted(((name, ms / runs) for name, ms in totals.items()), key=lambda item: -item[1]))


def main(argv=None) -> int:
    from compare.driver import one_case, one_case_arguments  # here: the driver imports this module

    parser = one_case_arguments("python -m compare.kernel_times", __doc__, "bench:0", "triton,pallas",
                                "comma-separated implementations")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import torch

    from ports import to_framework

    if not torch.cuda.is_available():
        print("kernel_times needs a CUDA GPU", file=sys.stderr)
        return 2
    try:
        workload, case = one_case(args.workload, args.case)
        impls = [workload.implementation(name) for name in args.impl.split(",")]
    except (KeyError, ValueError) as error:
        print(f"bad argument: {error}; --case is SET:INDEX, e.g. bench:0", file=sys.stderr)
        return 2
    inputs = workload.make_inputs(case, case["seed"], "cuda")
    print(f"{args.workload} {workload.case_name(case)}: mean GPU time per call, {args.runs} calls")
    for impl in impls:
        times = kernel_times(impl.load(), to_framework(impl.framework, inputs), args.runs)
        print(f"{impl.name}: {sum(times.values()):.3f} ms in kernels")
        for kernel, ms in times.items():
            print(f"  {ms:9.3f} ms  {kernel[:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
