"""python -m compare WORKLOAD: check every implementation against the float64 reference and time it.

With a GPU: the `test` cases for correctness, then the workload's benchmark sets timed (`bench`;
matmul's `shapes` too). Without one: the `smoke` cases through the Triton interpreter and Pallas
interpret mode, each port for at most 15 s unless --cases names the cases (what is left out is
said, and how to run it). Workloads with properties (matmul: batch invariance, determinism) check
them for every implementation. Exit code: 1 when a check fails or a ported kernel misses a
property (a library baseline missing one is a finding, not an error), 2 for unknown names.
`--against SAVED.json` compares the run with a saved one: exit 1 on a regression, 2 when the two
share no case.
"""
from __future__ import annotations

import argparse
import os
import sys
import textwrap
from pathlib import Path

from compare import HELP_COLUMNS, help_text
from compare.result import results_of


def workloads_help() -> str:
    """Each workload with the first line of its module's docstring, read without importing it."""
    import ast
    import importlib.util

    from ports import WORKLOAD_MODULES

    lines = ["workloads:"]
    for name, module in WORKLOAD_MODULES.items():
        source = Path(importlib.util.find_spec(module).origin).read_text()
        summary = (ast.get_docstring(ast.parse(source)) or "").strip().splitlines()
        lines.extend(textwrap.wrap(f"  {name:8} {summary[0] if summary else ''}", HELP_COLUMNS,
                                   subsequent_indent=" " * 11))
    for line in ("`python -m compare --list` lists every workload's implementations and cases.",
                 "`python -m compare report` writes results/h200/REPORT.md and README.md's tables from the runs "
                 "of record.",
                 "`python -m compare invariance` runs a small decoder in torch and JAX with the batch-invariant "
                 "modes off and on."):
        lines.extend(textwrap.wrap(line, HELP_COLUMNS))
    return "\n".join(lines)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m compare", description=help_text(__doc__),
                                     epilog=workloads_help(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload", nargs="?", help="workload name, e.g. trimul (listed below)")
    parser.add_argument("--impl", action="append", default=None,
                        help="implementation(s) to run, comma-separated or repeated (default: all)")
    parser.add_argument("--cases", action="append", default=None,
                        help="case set(s): smoke, test, bench; or one case by SET:INDEX (bench:3) or by its "
                             "name as the table prints it; `--list WORKLOAD` names them (default: test,bench on a "
                             "GPU, smoke on a CPU)")
    parser.add_argument("--json", type=Path,
                        help="write every figure to this JSON file as it is measured (default: none)")
    parser.add_argument("--plot", type=Path,
                        help="write a PNG chart of time per case per implementation (default: none)")
    parser.add_argument("--pool", type=int, default=3, help="distinct input sets per timed case (default 3)")
    parser.add_argument("--iters", type=int, default=10,
                        help="calls per case after the first and the warm-up, each on a never-seen input and "
                             "checked, and timed where the case set is; 1 to ITERS/2 more calls are drawn afresh "
                             "for each case (default 10)")
    parser.add_argument("--max-seconds", type=float, default=60.0,
                        help="stop timing a case after this long once 3 runs are done, even short of --iters: "
                             "multi-second calls (eigh at n = 512 and up) stay affordable; the remaining checked "
                             "calls run untimed (default 60)")
    parser.add_argument("--time", action="store_true",
                        help="time every case set, not only the workload's benchmark sets; on CPU this times the "
                             "interpreters (meaningless as speed, but it exercises the timed path; default: off)")
    parser.add_argument("--timer", choices=("host", "kernels", "all", "graph"), default="host",
                        help="host: wall clock between device synchronisations, launch overhead included "
                             "(default); kernels: sum of the call's kernel times from the profiler (GPU only); all: "
                             "both, and the torch caller's view through DLPack (custom_kernel), each on every timed "
                             "input, with the overhead above kernel time (GPU only); graph: a torch port's call "
                             "captured into a CUDA graph and replayed, CUDA events around the replay, the cost left "
                             "without host overhead (GPU only; JAX ports are skipped)")
    parser.add_argument("--detail", action="store_true",
                        help="the full table: error figures, IQR, runs, TFLOP/s, TB/s, first-call time, difference "
                             "from the reference port (about 220 columns; default: off, a table of 100 columns)")
    parser.add_argument("--no-properties", action="store_true",
                        help="skip the workload's property sweeps (e.g. matmul batch invariance) (default: off)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=IMPL:FILE",
                        help="also run FILE's copy of implementation IMPL's module as NAME, e.g. "
                             "fast=triton:trimul_fast.py (IMPL's function, from FILE), or, for a port that is a "
                             "package (eigh), a copy of its package directory: an A/B of a kernel change in the "
                             "same run, by the same method; repeatable (default: none)")
    parser.add_argument("--against", type=Path, metavar="SAVED.json",
                        help="compare the run with a saved one of the same workload (e.g. results/h200/matmul.json):"
                             " newly failing, output bits changed (same GPU and versions only), slower beyond noise "
                             "(more than 10%% and 3 of the saved run's IQRs), faster, and what could not be compared;"
                             " exit 1 on a regression, 2 when the runs share no case (default: none)")
    parser.add_argument("--gpus", type=int, metavar="N",
                        help="trimul only: the ports that shard by rows (ports.trimul.SHARDED_BY_ROWS: torch's over "
                             "torch.distributed, JAX's by jax.shard_map) on N devices and on one: the same bits, the "
                             "float64 check, and the scaling (time on 1 / time on N), --iters calls timed; without "
                             "GPUs, N CPU processes and JAX CPU devices through the interpreters (default: off)")
    parser.add_argument("--list", action="store_true",
                        help="list the workload's implementations and cases, by set, index and name (every "
                             "workload's without one), then exit (default: off)")
    return parser.parse_args(argv)


# Without a GPU and without --cases, the seconds each port may spend in its interpreter before the rest of its cases
# are left out (and said so): a first run takes about a minute, not many.
INTERPRETER_SECONDS = 15.0


def _split(values):
    return [v for value in values for v in value.split(",") if v] if values else None


def report_main() -> int:
    """`python -m compare report`: results/h200/REPORT.md and README.md's tables from the runs of record."""
    from compare.report import write_report

    for path in write_report(Path(__file__).resolve().parents[1]):
        print(f"written: {path.name}", file=sys.stderr)
    return 0


REPORT_HELP = """usage: python -m compare report

Writes results/h200/REPORT.md (with its charts) and README.md's generated tables from the runs of
record (compare.report.RUNS_OF_RECORD) and the last GPU run of the test suite
(the newest results/<card>/tests.json)."""


def across_devices(args, impls, case_sets, on_gpu) -> int:
    """`--gpus N`: compare.across_devices for the ports that shard (all of them unless --impl names some)."""
    from compare import across_devices
    from compare.driver import select_cases
    from ports import get_workload

    if args.workload != "trimul" or args.gpus < 1:
        print("--gpus N takes trimul and N >= 1", file=sys.stderr)
        return 2
    sharded = across_devices.sharded_ports()
    impls = impls or list(sharded)
    unsharded = [name for name in impls if name not in sharded]
    if unsharded:
        print(f"--gpus: {', '.join(unsharded)} cannot shard; ports that do: " + ", ".join(
            f"{name} ({across_devices.HOW[impl.framework]})" for name, impl in sharded.items()), file=sys.stderr)
        return 2
    cases = [pair for spec in case_sets for pair in select_cases(get_workload("trimul"), spec)]
    if not on_gpu:
        across_devices.jax_cpu_devices(args.gpus)
    return across_devices.run(impls, cases, args.gpus, args.iters, on_gpu, args.json)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["invariance"]:
        from compare.invariance.command import main as invariance_main

        return invariance_main(argv[1:])
    if argv[:1] == ["report"]:
        if argv[1:] in (["-h"], ["--help"]):
            print(REPORT_HELP)
            return 0
        if argv[1:]:
            print("`python -m compare report` takes no arguments (--help says what it writes)", file=sys.stderr)
            return 2
        return report_main()
    args = parse_args(argv)
    from compare import gpu_or_interpreters

    on_gpu = gpu_or_interpreters()
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch and JAX share the GPU

    from ports import WORKLOAD_MODULES, get_workload

    if args.workload is None and args.list:
        for name in WORKLOAD_MODULES:
            print(f"{name}:")
            list_workload(get_workload(name), indent="  ")
        return 0
    if args.workload not in WORKLOAD_MODULES:
        what = "name a workload" if args.workload is None else f"unknown workload {args.workload!r}"
        print(f"{what}; valid: {', '.join(WORKLOAD_MODULES)}", file=sys.stderr)
        return 2
    from compare.driver import Settings, run, select_cases, with_unnamed_variants, with_variants

    registered = get_workload(args.workload)
    try:
        workload = with_variants(registered, args.variant)
    except (KeyError, ValueError) as error:
        print(str(error).strip("'\""), file=sys.stderr)
        return 2
    valid_impls = [impl.name for impl in workload.implementations]
    if args.list:
        list_workload(workload)
        return 0
    if args.impl is not None and not _split(args.impl):
        print(f"--impl names no implementation; valid: {', '.join(valid_impls)}", file=sys.stderr)
        return 2
    if args.cases is not None and not _split(args.cases):
        print(f"--cases names no case set; valid: {', '.join(workload.cases)}", file=sys.stderr)
        return 2
    impls = with_unnamed_variants(_split(args.impl) or valid_impls, workload, registered)
    unknown = [name for name in impls if name not in valid_impls]
    if unknown:
        print(f"unknown implementation(s) {', '.join(unknown)}; valid: {', '.join(valid_impls)}", file=sys.stderr)
        return 2
    case_sets = _split(args.cases) or (["test", "bench"] if on_gpu else ["smoke"])

    try:
        for spec in case_sets:
            select_cases(workload, spec)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    if args.timer in ("kernels", "all", "graph") and not on_gpu:
        print(f"--timer {args.timer} needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.pool < 2 or args.iters < 1 or args.max_seconds <= 0:
        print("--pool must be at least 2, --iters at least 1 and --max-seconds positive", file=sys.stderr)
        return 2
    if args.gpus is not None:
        return across_devices(args, impls if args.impl else None, case_sets, on_gpu)

    saved = None
    if args.against:
        from compare.regression import load_saved

        try:
            saved = load_saved(args.against, workload.name)
        except ValueError as error:
            print(error, file=sys.stderr)
            return 2
        from compare.regression import common_results

        planned = {(case_set, workload.case_name(case), name) for spec in case_sets
                   for case_set, case in select_cases(workload, spec) for name in impls}
        if not common_results(saved, planned):
            saved_sets = sorted({r.case_set for r in results_of(saved)})
            print(f"--against {args.against}: no case and implementation of this run is in the saved run (it ran "
                  f"case sets {', '.join(saved_sets) or 'none'}; this run: {', '.join(case_sets)}): nothing could "
                  "be compared", file=sys.stderr)
            return 2
    from compare.report import plot, print_table

    if not on_gpu:
        print("no CUDA GPU: running the kernels through the Triton interpreter and Pallas interpret mode;\n"
              "any times shown are interpreter times, not GPU timings", file=sys.stderr)
    settings = Settings(pool=args.pool, min_iters=args.iters, max_iters=max(args.iters, 50),
                        max_seconds=args.max_seconds, timed=on_gpu or args.time, timer=args.timer,
                        timed_sets=workload.benchmark_sets if on_gpu and not args.time else None,
                        interpreter_seconds=INTERPRETER_SECONDS if args.cases is None else None)
    record = run(workload, impls, case_sets, args.json, settings, check_properties=not args.no_properties)
    print_table(record, detail=args.detail)
    if args.plot:
        plot(record, args.plot)
        print(f"chart written to {args.plot}", file=sys.stderr)
    if args.json:
        print(f"results written to {args.json}", file=sys.stderr)
    if record.get("stopped"):
        print(f"stopped early: {record['stopped']}", file=sys.stderr)
    from ports import ported_backend

    ports_hold = all(p["passed"] is not False for p in record.get("properties", []) if ported_backend(p["backend"]))
    status = 0 if ports_hold and all(r.status in ("pass", "skipped") for r in results_of(record)) else 1
    if saved is not None:
        from compare.records import Recorder
        from compare.regression import compare_runs, report

        changes = compare_runs(saved, record, {impl.name for impl in workload.implementations if not impl.ported})
        print(report(changes, saved, record, args.against))
        if args.json:  # the comparison joins the run's record
            record["against"] = {"saved": str(args.against), "changes": changes}
            Recorder(args.json, record).save()
        if any(change["regression"] for change in changes):
            status = 1
    return status


def list_workload(workload, indent=""):
    """A line per implementation (its label wrapped within 100 columns), then the case sets."""
    import textwrap

    for impl in workload.implementations:
        head = f"{indent}{impl.name:15} {impl.framework:6} {impl.backend:18} "
        print(textwrap.fill(impl.label, 100, initial_indent=head, subsequent_indent=" " * len(head)))
    for name, cases in workload.cases.items():
        print(f"{indent}cases {name}: {len(cases)} (--cases {name}, {name}:INDEX, or a case's name)")
        for index, case in enumerate(cases):
            print(f"{indent}  {name}:{index:<4} {workload.case_name(case)}")


if __name__ == "__main__":
    sys.exit(main())
