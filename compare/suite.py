"""python -m compare.suite: the whole test suite run, and recorded (results/<card>/tests.json by default).

CI runs the suite on a CPU; this runs it where the kernels are compiled (a GPU), and keeps what the run was:
the commit and whether the tree differed from it, the versions and the device, the counts of passed, failed and
skipped tests, each failure's first lines and the slowest tests. Arguments after `--` go to pytest (e.g.
`-- tests/test_trimul.py`); a record made of part of the suite says so. The exit status is pytest's.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from compare import help_text
from compare.records import PROJECT_ROOT, Recorder, card, device_info, provenance, versions

SLOWEST = 20
FAILURE_LINES = 6


def _test_id(case: ElementTree.Element) -> str:
    """pytest's node id of a JUnit test case ("tests.test_x" + "test_y[p]" -> "tests/test_x.py::test_y[p]")."""
    module, _, cls = case.get("classname", "").partition(".Test")
    path = module.replace(".", "/") + ".py"
    return f"{path}::{'Test' + cls + '::' if cls else ''}{case.get('name')}"


def summarise_junit(path: Path) -> dict:
    """Counts, failures (their first lines) and the slowest tests from pytest's JUnit XML."""
    cases = list(ElementTree.parse(path).getroot().iter("testcase"))
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failures = []
    for case in cases:
        outcome = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        if outcome is None:
            counts["passed"] += 1
            continue
        counts[{"failure": "failed", "error": "errors", "skipped": "skipped"}[outcome.tag]] += 1
        if outcome.tag != "skipped":
            text = (outcome.get("message") or "") + "\n" + (outcome.text or "")
            lines = [line for line in text.replace(PROJECT_ROOT, "").splitlines() if line.strip()]
            failures.append({"test": _test_id(case), "kind": outcome.tag, "first_lines": lines[:FAILURE_LINES]})
    slowest = sorted(cases, key=lambda case: -float(case.get("time") or 0))[:SLOWEST]
    return {"tests": len(cases), **counts, "failures": failures,
            "slowest": [{"test": _test_id(case), "seconds": round(float(case.get("time") or 0), 2)}
                        for case in slowest]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m compare.suite", description=help_text(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path,
                        help="where the record goes (default results/<card>/tests.json, the card it runs on: h100, "
                             "h200)")
    parser.add_argument("--workers", default=None,
                        help="pytest-xdist workers (default: the project's, one a core on a CPU, four on a GPU)")
    parser.add_argument("pytest_args", nargs="*", help="after --: arguments for pytest (default: the whole suite)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        junit = Path(folder) / "junit.xml"
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={junit}",
                   *(("-n", args.workers) if args.workers else ()), *args.pytest_args]
        started, begun = time.strftime("%Y-%m-%dT%H:%M:%S"), time.perf_counter()
        status = subprocess.run(command, cwd=PROJECT_ROOT).returncode
        seconds = time.perf_counter() - begun
        if not junit.exists():
            print(f"pytest wrote no report (exit status {status}): nothing recorded", file=sys.stderr)
            return status or 1
        summary = summarise_junit(junit)
    made = provenance([])
    made.pop("sources")
    shown = ["python -m pytest", *(("-n", args.workers) if args.workers else ()), *args.pytest_args]
    device = device_info()
    args.json = args.json or Path("results") / card(device["device"]) / "tests.json"
    record = {"command": " ".join(shown), "whole_suite": not args.pytest_args, **made, "device": device["device"],
              "mode": device["mode"],
              "versions": versions(), "started": started, "seconds": round(seconds, 1), "exit_status": status,
              **summary}
    Recorder(args.json, record).save()
    print(f"{summary['passed']} passed, {summary['failed']} failed, {summary['errors']} errors, "
          f"{summary['skipped']} skipped in {seconds:.0f} s on {record['device']}; recorded in {args.json}")
    for failure in summary["failures"]:
        print(f"  {failure['kind']}: {failure['test']}: {(failure['first_lines'] or [''])[0][:200]}")
    return status


if __name__ == "__main__":
    sys.exit(main())
