"""A run against a saved one (`python -m compare WORKLOAD --against SAVED.json`): what moved.

Per case and implementation found in both runs:
- newly failing: passed in the saved run, not now (a regression);
- bits changed: the output on the case's seeded first input has other bits than the saved run's. Compared only
  between runs on the same GPU with the same library versions (a regression for a port; for a library baseline it
  is reported and is not one: cuBLAS and XLA promise no bits across versions); where the GPU or a version differs,
  changed bits are listed apart and are no regression, and so is a result either run holds no digest of (runs
  written before digests were), "bits not compared";
- slower: median time above the saved one by more than 10% and by more than 3 of the saved run's interquartile
  ranges (its spread: the baseline's noise), a regression; faster by the same rule, reported;
- newly passing, reported.
Times are compared only when both runs used the same timer on the same device, and a line warns where a library
baseline's time moved too: the same GPU on another host can move every host clock. A result skipped in either run, one
only the saved run has and one only this run has each get a line, and none is a regression. Two runs with no case
and implementation in common cannot be compared (`common_results` says so before the run).
"""
from __future__ import annotations

import json
from pathlib import Path

from compare.result import Result, results_of

SLOWER_FRACTION = 0.10
SLOWER_IQRS = 3.0
NOISE_RULE = (f"slower or faster: the median moved by more than {SLOWER_FRACTION:.0%} and by more than "
              f"{SLOWER_IQRS:g} x the saved run's interquartile range")
BITS_IGNORE = ("python", "numpy")  # versions that do not touch a GPU's output bits
RESULT_KEYS = ("case_set", "case", "impl", "status")  # what every result of a saved run must name


def load_saved(path: Path, workload: str) -> dict:
    """The saved run, or ValueError (one line, naming the file) saying why it cannot be compared with a run of
    `workload`: a file that cannot be read, is not JSON, or is JSON of another shape than the driver writes."""
    try:
        saved = json.loads(Path(path).read_bytes())
    except (OSError, ValueError) as error:  # UnicodeDecodeError (a PNG, say) and JSONDecodeError are ValueErrors
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(f"--against {path}: cannot read a results JSON ({reason})") from error
    if not isinstance(saved, dict) or not isinstance(saved.get("results"), list):
        raise ValueError(f"--against {path}: not a results JSON of the driver (no list of 'results')")
    for index, entry in enumerate(saved["results"]):
        if not isinstance(entry, dict) or not all(isinstance(entry.get(key), str) for key in RESULT_KEYS):
            raise ValueError(f"--against {path}: not a results JSON of the driver (results[{index}] is not a "
                             f"result with {', '.join(RESULT_KEYS)})")
    if saved.get("workload") != workload:
        raise ValueError(f"--against {path}: a run of {saved.get('workload')!r}, not of {workload!r}")
    return saved


def beyond_noise(saved: Result, new: Result) -> str | None:
    """'slower' or 'faster' when the medians differ by more than the rule allows (NOISE_RULE), else None."""
    if saved.median_ms is None or new.median_ms is None:
        return None
    before, after = saved.median_ms, new.median_ms
    noise = SLOWER_IQRS * (saved.iqr_ms or 0.0)
    if after > before * (1 + SLOWER_FRACTION) and after - before > noise:
        return "slower"
    if after < before * (1 - SLOWER_FRACTION) and before - after > noise:
        return "faster"
    return None


def times_comparable(saved: dict, new: dict) -> bool:
    """Whether the two runs' times can be compared: the same timer on the same device."""
    return (saved.get("settings", {}).get("timer"), saved.get("device")) == (
        new.get("settings", {}).get("timer"), new.get("device"))


def bits_differ_because(saved: dict, new: dict) -> str | None:
    """None when output bits can be compared (the same device and library versions), else what differs."""
    if saved.get("device") != new.get("device"):
        return f"device {saved.get('device')} -> {new.get('device')}"
    before, after = saved.get("versions") or {}, new.get("versions") or {}
    moved = [f"{name} {before.get(name)} -> {after.get(name)}" for name in sorted(before.keys() | after.keys())
             if name not in BITS_IGNORE and before.get(name) != after.get(name)]
    return ", ".join(moved) or None


def common_results(saved: dict, planned: set[tuple[str, str, str]]) -> set[tuple[str, str, str]]:
    """The (case set, case, implementation)s of a planned run that the saved run has too."""
    return planned & {r.key for r in results_of(saved)}


def compare_runs(saved: dict, new: dict, library: set[str]) -> list[dict]:
    """Every change between the runs: {"case_set", "case", "impl", "change", "detail", "regression", "library"}.
    `library`: the names of library baselines (their bit changes are not regressions; "library" marks their
    changes). ValueError when the runs have no result in common."""
    before = {r.key: r for r in results_of(saved)}
    after = {r.key: r for r in results_of(new)}
    if not before.keys() & after.keys():
        raise ValueError("the runs have no case and implementation in common: nothing can be compared")
    changes = []
    bits_apart = bits_differ_because(saved, new)

    def add(where, change, detail, regression):
        changes.append({"case_set": where[0], "case": where[1], "impl": where[2], "change": change, "detail": detail,
                        "regression": regression, "library": where[2] in library})

    for where, now in after.items():
        then = before.get(where)
        if then is None:
            add(where, "new", "not in the saved run", False)
            continue
        if then.status == "skipped" or now.status == "skipped":
            which = ("skipped in both" if then.status == now.status else
                     "skipped now" if now.status == "skipped" else "was skipped")
            reason = now.reason if now.status == "skipped" else then.reason
            add(where, which, reason or "", False)
            continue
        if then.passed and not now.passed:
            add(where, "newly failing", now.reason or "", True)
        elif not then.passed and now.passed:
            add(where, "newly passing", f"was {then.status}: {then.reason or ''}", False)
        if then.passed and now.passed and not (then.output_sha256 and now.output_sha256):
            which = "either run" if not (then.output_sha256 or now.output_sha256) else (
                "the saved run" if not then.output_sha256 else "this run")
            add(where, "bits not compared", f"no output digest in {which}", False)
        elif then.output_sha256 and now.output_sha256 and then.output_sha256 != now.output_sha256:
            if bits_apart:
                add(where, "bits differ", f"other GPU or versions ({bits_apart}): not compared", False)
            else:
                add(where, "bits changed", "the output on the seeded first input differs from the saved run's",
                    where[2] not in library)
        moved = beyond_noise(then, now) if times_comparable(saved, new) else None
        if moved:
            add(where, moved, f"{then.median_ms:.4g} -> {now.median_ms:.4g} ms (saved IQR {then.iqr_ms or 0:.2g})",
                moved == "slower")
    for where in before.keys() - after.keys():
        add(where, "not rerun", "in the saved run only", False)
    return changes


def library_moves(changes: list[dict]) -> list[dict]:
    """The library baselines' times that moved beyond noise. Their code is the saved run's where the versions are,
    so their move is the machine's (another host of the same GPU: a slower host path moves every host clock)."""
    return [c for c in changes if c["library"] and c["change"] in ("slower", "faster")]


def report(changes: list[dict], saved: dict, new: dict, path) -> str:
    """The changes as text, a line each: regressions first, then the other changes, then what was not compared;
    a warning where library baselines moved too."""
    compared = len({r.key for r in results_of(saved)} & {r.key for r in results_of(new)})
    lines = [f"against {path} (saved {saved.get('started', '?')}, commit "
             f"{(saved.get('provenance') or {}).get('commit') or 'not recorded'}): {compared} result(s) in both runs"]
    if times_comparable(saved, new):
        lines.append(f"  times: {NOISE_RULE}")
    else:
        lines.append("  times not compared: the saved run used another timer or device "
                     f"({saved.get('settings', {}).get('timer')} on {saved.get('device')})")
    bits_apart = bits_differ_because(saved, new)
    undigested = sum(change["change"] == "bits not compared" for change in changes)
    lines.append(f"  bits: not compared, {bits_apart}" if bits_apart else
                 "  bits: compared (the same device and library versions)" + (
                     f", but not for {undigested} result(s) without an output digest" if undigested else ""))
    moved_libraries = library_moves(changes)
    if moved_libraries:
        first = moved_libraries[0]
        lines.append(f"  machine: {len(moved_libraries)} library baseline time(s) moved too (first: {first['impl']} "
                     f"{first['case_set']}:{first['case']} {first['change']}, {first['detail']}): a port's move of "
                     "that size may be the machine's, not the port's; an A/B in one run (--variant) settles it")
    if not changes:
        lines.append("  nothing moved")
    apart = ("bits differ", "bits not compared", "skipped in both", "skipped now", "was skipped", "new", "not rerun")
    for change in sorted(changes, key=lambda c: (not c["regression"], c["change"] in apart, c["case_set"], c["case"],
                                                 c["impl"])):
        mark = "REGRESSION" if change["regression"] else "moved" if change["change"] not in apart else "apart"
        lines.append(f"  {mark:10} {change['change']:17} {change['impl']:12} {change['case_set']}:{change['case']}"
                     f"  {change['detail']}")
    regressions = sum(c["regression"] for c in changes)
    lines.append(f"  {regressions} regression(s), {len(changes) - regressions} other change(s)")
    return "\n".join(lines)
