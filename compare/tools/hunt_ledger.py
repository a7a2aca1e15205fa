"""The hunts' ledger: how many fresh inputs, and items (eigh: matrices), each implementation has been checked on with
its code as it stands, added up over hunt records whose seeds do not meet.

    python -m compare.tools.hunt_ledger results/h100/eigh-hunt/*.json

A goal such as "10^6 fresh matrices a port with no failure" takes more device time than one session has, so it is
reached in hunts over disjoint seed ranges (`python -m compare.tools.hunt WORKLOAD --case ... --first-seed S --json
FILE`; each record covers seeds S to its last seed on its cases). An implementation's hunt counts where the code its
verdicts rest on is the working tree's (by SHA-256: the port's source, the workload's module and kernel_support,
`compare.tools.hunt.code_digests`); the rest are listed as left out, with why: other code, no code digest (a record
older than the ledger), a re-check of chosen seeds (--seeds), no --first-seed (its seeds begin at the cases' own,
which the driver's runs use). Two counted records whose seed ranges meet on a case would count an input twice: that
is refused, naming both. The end says the --first-seed that the next hunt takes. Exit status 1 where a counted
record holds a failure, 2 for a bad argument (a record unreadable, not a hunt's or of another workload, or counted
seed ranges that meet).
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys

from compare import help_text
from compare.tools.hunt import code_digests
from ports import get_workload

ENTRY_KEYS = ("inputs", "failures")  # what every hunt record's entry for a port holds (and, in one the ledger counts,
COUNTED_KEYS = ("items", "last_seed")  # these; the record its "cases", "code" and "first_seed")


def _load(paths: list[str]) -> list[tuple[str, dict]]:
    """(path, record) of each hunt record; ValueError naming a file that is not one, or mixed workloads."""
    records = []
    for path in paths:
        try:
            with open(path) as handle:
                record = json.load(handle)
        except (OSError, ValueError) as error:
            raise ValueError(f"{path}: not a readable hunt record ({error})") from error
        results = record.get("results") if isinstance(record, dict) else None
        whole = isinstance(results, dict) and all(isinstance(entry, dict) and all(key in entry for key in ENTRY_KEYS)
                                                  for entry in results.values())
        if not whole:
            raise ValueError(f"{path}: not a hunt record (compare.tools.hunt --json writes one)")
        records.append((path, record))
    workloads = {record.get("workload") for _, record in records}
    if len(workloads) > 1:
        raise ValueError(f"records of several workloads: {', '.join(sorted(map(str, workloads)))}; give one's")
    return records


def _left_out(record: dict, name: str, entry: dict, digest: str | None) -> str | None:
    """Why a record's hunt of implementation `name` does not count toward the ledger, or None where it does."""
    code = record.get("code")
    if entry.get("load_error"):
        return "it failed to load"
    if code is None:
        return "no code digest (a record older than the ledger)"
    if record.get("seeds"):
        return "a re-check of chosen seeds (--seeds)"
    if record.get("first_seed") is None:
        return "no --first-seed (its seeds begin at the cases' own)"
    if entry.get("last_seed") is None:
        return "no input checked"
    if digest is None:
        return "not a registered implementation (a variant), or its source is not found"
    if code.get(name) != digest:
        return f"other code (commit {(record.get('provenance') or {}).get('commit')})"
    return None


def ledger(records: list[tuple[str, dict]], digests: dict[str, str | None]) -> dict:
    """Per implementation: {"inputs", "items", "failures": [(path, failure)], "counted": [path], "left_out": [(path,
    why)], "ranges": [(path, cases, first, last)]}; ValueError where two counted ranges meet on a case."""
    found = {}
    for path, record in records:
        for name, entry in record["results"].items():
            row = found.setdefault(name, {"inputs": 0, "items": 0, "failures": [], "counted": [], "left_out": [],
                                          "ranges": []})
            why = _left_out(record, name, entry, digests.get(name))
            if why:
                row["left_out"].append((path, why))
                continue
            if any(key not in entry for key in COUNTED_KEYS) or not isinstance(record.get("cases"), dict):
                raise ValueError(f"{path}: not a whole hunt record (the cases, or {name}'s items, missing)")
            row["inputs"] += entry["inputs"]
            row["items"] += entry["items"]
            row["failures"].extend((path, failure) for failure in entry["failures"])
            row["counted"].append(path)
            row["ranges"].append((path, set(record["cases"].values()), record["first_seed"], entry["last_seed"]))
    for name, row in found.items():
        for (a, cases_a, first_a, last_a), (b, cases_b, first_b, last_b) in itertools.combinations(row["ranges"], 2):
            shared = cases_a & cases_b
            if shared and first_a <= last_b and first_b <= last_a:
                raise ValueError(f"{name}: {a} (seeds {first_a}-{last_a}) and {b} (seeds {first_b}-{last_b}) both "
                                 f"checked {sorted(shared)[0]} on seeds {max(first_a, first_b)}-{min(last_a, last_b)}")
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m compare.tools.hunt_ledger", description=help_text(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("records", nargs="+", help="hunt records (compare.tools.hunt --json)")
    args = parser.parse_args(argv)
    try:
        records = _load(args.records)
        try:
            workload = get_workload(records[0][1]["workload"])
        except KeyError as error:
            raise ValueError(f"{records[0][0]}: unknown workload {records[0][1]['workload']!r}") from error
        found = ledger(records, code_digests(workload, workload.implementations))
    except ValueError as error:
        print(f"bad argument: {error}", file=sys.stderr)
        return 2
    print(f"{workload.name}: hunts with the code as it stands, over disjoint seed ranges")
    print(f"{'implementation':16} {'inputs':>9} {'items':>11} {'failures':>8}  records counted / left out")
    for name, row in found.items():
        print(f"{name:16} {row['inputs']:9d} {row['items']:11d} {len(row['failures']):8d}  "
              f"{len(row['counted'])} / {len(row['left_out'])}")
        for path, failure in row["failures"]:
            print(f"    failed: seed {failure['seed']}, {failure['case']} ({path}): {failure['reason']}")
        for path, why in row["left_out"]:
            print(f"    left out: {path}: {why}")
    last = max((range_[3] for row in found.values() for range_ in row["ranges"]), default=None)
    if last is None:
        print("no record counted: nothing is proven with the code as it stands")
    else:
        print(f"the next hunt: --first-seed {last + 1}")
    return 1 if any(row["failures"] for row in found.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
