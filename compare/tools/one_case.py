"""The one-case tools' shared command line (kernel_times, hopper_compile, one_call, hunt, call_cost): WORKLOAD,
--case SET:INDEX, --impl and --variant, parsed into the workload, the case and the implementations."""
from __future__ import annotations

import os
import sys
from typing import Sequence

from compare.driver import select_cases, with_unnamed_variants, with_variants
from ports import get_workload


def one_case_arguments(prog: str, description: str, case_default: str, impl_default: str, impl_help: str,
                       case_help: str = "SET:INDEX, e.g. bench:6"):
    """The argument parser of the one-case tools (kernel_times, hopper_compile, one_call, hunt): WORKLOAD, --case,
    --impl, --variant."""
    import argparse

    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload")
    parser.add_argument("--case", default=case_default, help=f"{case_help} (default {case_default})")
    parser.add_argument("--impl", default=impl_default, help=f"{impl_help} (default {impl_default})")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=IMPL:FILE",
                        help="also offer FILE's copy of implementation IMPL's module as NAME, as `python -m "
                             "compare --variant` does; repeatable")
    return parser


def one_case(workload_name: str, spec: str, variants: Sequence[str] = ()):
    """(workload, case) for a one-case tool's WORKLOAD, --case SET:INDEX and --variant specs (`with_variants`);
    KeyError or ValueError if one is unknown or malformed."""
    workload = with_variants(get_workload(workload_name), list(variants))
    if ":" not in spec:
        raise ValueError(f"--case is one case, SET:INDEX (e.g. bench:0); got {spec!r}")
    [(_, case)] = select_cases(workload, spec)
    return workload, case


def named_cases(workload, specs: str) -> list[tuple[str, dict]]:
    """("SET:INDEX", case) for comma-separated SET (each of its cases) or SET:INDEX specs; ValueError if one is
    unknown."""
    named = []
    for spec in specs.split(","):
        chosen = select_cases(workload, spec)
        set_name, _, index = spec.partition(":")
        indices = [int(index)] if index else range(len(chosen))
        named += [(f"{set_name}:{i}", case) for i, (_, case) in zip(indices, chosen)]
    return named


def one_case_setup(parser, argv, many: bool = False):
    """A one-case tool's arguments parsed, and its workload, case and implementations (--impl, comma-separated,
    with --variant's): (args, workload, case, implementations), or None once a bad argument is printed (the tool
    exits with status 2). many: --case may name sets and several cases (`named_cases`), and the case returned is
    their list. JAX is told not to take the GPU's memory up front: torch shares it."""
    args = parser.parse_args(argv)
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    try:
        if many:
            workload = with_variants(get_workload(args.workload), list(args.variant))
            case = named_cases(workload, args.case)
        else:
            workload, case = one_case(args.workload, args.case, args.variant)
        names = with_unnamed_variants(args.impl.split(","), workload, get_workload(args.workload))
        return args, workload, case, [workload.implementation(name) for name in names]
    except (KeyError, ValueError) as error:
        print(f"bad argument: {error}", file=sys.stderr)
        return None
