"""One call of each implementation on one case, nothing timed or checked: for a profiler outside the process.

    ncu --clock-control none --kernel-name regex:tridiagonalize --launch-count 1 --section SpeedOfLight \\
        python -m compare.tools.one_call eigh --case bench:3 --impl triton

Nsight Compute (`ncu`) replays each kernel it is asked for and reads the hardware counters (DRAM bytes, issue
rates, stall reasons), which torch.profiler cannot; it profiles a whole process, so this runs nothing but the
calls: the case's input made once, then --calls calls of each implementation (the first compiles), each waited
for. Filter the kernels with ncu's own options (--kernel-name, --launch-skip, --launch-count). Runs on the CPU
too (the interpreters), where it only shows that the call runs. Exit status 1 if an implementation fails; the
others still run.
"""
from __future__ import annotations

import sys


def main(argv=None) -> int:
    from compare import gpu_or_interpreters

    on_gpu = gpu_or_interpreters()
    # imported here: the driver imports the kernel-time helpers this shares
    from compare.records import error_text
    from compare.timing import wait_for
    from compare.tools.one_case import one_case_arguments, one_case_setup

    parser = one_case_arguments("python -m compare.tools.one_call", __doc__, "bench:0", "triton",
                                "comma-separated implementations, called in this order")
    parser.add_argument("--calls", type=int, default=1, help="calls of each implementation (default 1)")
    setup = one_case_setup(parser, argv)
    if setup is None:
        return 2
    args, workload, case, impls = setup
    from ports import to_framework

    inputs = workload.make_inputs(case, case["seed"], "cuda" if on_gpu else "cpu")
    failed = False
    for impl in impls:
        try:
            function = impl.load()
            native = to_framework(impl.framework, inputs)
            for _ in range(args.calls):
                wait_for(function(native), on_gpu)
            print(f"{impl.name}: {args.calls} call(s) on {workload.case_name(case)}")
        except Exception as error:  # noqa: BLE001 - reported; the next implementation runs
            print(f"{impl.name}: failed: {error_text(error)}")
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
