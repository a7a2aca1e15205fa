"""The driver's table (rich) and chart (matplotlib) from a run's record."""
from __future__ import annotations

import math

from rich import box
from rich.console import Console
from rich.table import Table

from compare.driver import property_verdict

VERDICTS = {"pass": "[green]pass[/]", "fail": "[red]FAIL[/]", "error": "[red]ERROR[/]", "skipped": "[yellow]skipped[/]"}


def _number(value, digits=3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if abs(value) >= 1000 or (value != 0 and abs(value) < 10 ** -digits):
        return f"{value:.2e}"
    return f"{value:.{digits}f}"


def _reference_pairs(record: dict):
    """Each port against the case's reference port: the first port of the case's first pair (the driver pairs the
    passing ports in registration order). Returns ({(set, case): reference port}, {(set, case, impl): pair})."""
    reference_port, against_reference = {}, {}
    for c in record["cross"]:
        key = (c["case_set"], c["case"])
        if reference_port.setdefault(key, c["pair"][0]) == c["pair"][0]:
            against_reference[(*key, c["pair"][1])] = c
    return reference_port, against_reference


def print_table(record: dict, console: Console | None = None, detail: bool = False) -> None:
    """The results, the properties and the geometric means. Compact (within 100 columns: one table per case set,
    times, speed-up, roofline and bitwise agreement) unless `detail`, which adds the error figures, IQR, runs,
    TFLOP/s, TB/s, first-call time, the difference from the reference port and where properties first failed."""
    console = console or Console(width=None if Console().is_terminal else (220 if detail else 100))
    interpreted = record["mode"] != "gpu"
    reference_port, against_reference = _reference_pairs(record)
    title = f"{record['workload']} on {record['device']}"
    if interpreted:
        title += " - CPU interpreters: times are NOT GPU timings"
    if detail:
        columns = ("set", "case", "impl", "verdict", "error figures", "median ms", "IQR ms", "runs", "TFLOP/s",
                   "TB/s", "% roofline", "speed-up", "first call s", "|vs ref port|", "bitwise")
    else:
        columns = ("case", "impl", "verdict", "ms", "speed-up", "roofline %", "bits")
    tables = {}
    for r in record["results"]:
        table_key = "all" if detail else r["case_set"]
        if table_key not in tables:
            tables[table_key] = Table(title=title if detail else f"{title}: {r['case_set']}", header_style="bold",
                                      box=None if not detail else box.HEAVY_HEAD, pad_edge=False)
            for column in columns:
                tables[table_key].add_column(column, justify="left" if column in (
                    "set", "case", "impl", "verdict", "error figures") else "right",
                    overflow="fold")  # a long case name breaks a line rather than losing its end
        pair = against_reference.get((r["case_set"], r["case"], r["impl"]), {})
        bitwise = ("ref" if reference_port.get((r["case_set"], r["case"])) == r["impl"]
                   else {True: "equal", False: "differ"}.get(pair.get("bitwise_equal"), "-"))
        passed = r["status"] == "pass"  # a failing result's time is in the JSON, not shown as a speed
        cells = {"set": r["case_set"], "case": r["case"], "impl": r["impl"], "verdict": VERDICTS[r["status"]],
                 "error figures": " ".join(f"{name}={_number(value)}" for name, value in r.get("errors", {}).items())
                 or "-",
                 "median ms": _number(r.get("median_ms") if passed else None),
                 "ms": _number(r.get("median_ms") if passed else None),
                 "IQR ms": _number(r.get("iqr_ms") if passed else None), "runs": str(r.get("runs", "-")),
                 "TFLOP/s": _number(r.get("tflops"), 1), "TB/s": _number(r.get("tbps"), 2),
                 "% roofline": _number(r.get("roofline_pct"), 1), "roofline %": _number(r.get("roofline_pct"), 1),
                 "speed-up": _number(r.get("speedup"), 2),
                 "first call s": _number(r.get("first_call_s"), 2), "|vs ref port|": _number(pair.get("max_abs_diff")),
                 "bitwise": bitwise, "bits": bitwise}
        tables[table_key].add_row(*(cells[column] for column in columns))
    for table in tables.values():
        console.print(table)
    if not detail:
        console.print("ms: median time per call; speed-up: against the workload's baseline; bits: against the reference "
                      "port (ref). Error figures, IQR, runs, TFLOP/s, first-call times: --detail, or --json.")
    failures = [r for r in record["results"] if r["status"] not in ("pass", "skipped")]
    for r in failures:
        console.print(f"[red]{r['status']}[/] {r['case_set']} {r['case']} {r['impl']}: {r['reason']}")
    skipped = {r["impl"]: r["reason"] for r in record["results"] if r["status"] == "skipped"}
    for impl, reason in skipped.items():
        console.print(f"[yellow]skipped[/] {impl}: {reason}")
    if record.get("properties"):
        properties = Table(title="properties" + (" (CPU interpreters)" if interpreted else ""), header_style="bold",
                           box=None if not detail else box.HEAVY_HEAD, pad_edge=False)
        for column in ("impl", "property", "verdict", "checked") + (("first difference",) if detail else ()):
            properties.add_column(column)
        library_failed = False
        for p in record["properties"]:
            verdict = VERDICTS[property_verdict(p["passed"]).lower()]
            if p["passed"] is False and p["backend"] == "library":
                verdict, library_failed = "[yellow]FAIL: finding[/]", True
            detail_cell = p.get("error") or (str(p["first_difference"]) if p.get("first_difference") else "-")
            properties.add_row(p["impl"], p["property"] if detail else p["property"].split(":")[0], verdict,
                               p["checked"], *((detail_cell,) if detail else ()))
        console.print(properties)
        if library_failed:
            console.print("A library baseline that misses a property is a finding about that library, not an error "
                          "of this run: the exit code counts the ports' properties only.")
    summary = Table(title="geometric means per case set (over cases that all passed and were timed)",
                    box=None if not detail else box.HEAVY_HEAD, pad_edge=False)
    for column in ("set", "impl", "passed", "geomean ms", "geomean first call s"):
        summary.add_column(column)
    for case_set, impls in record.get("summary", {}).items():
        for impl, entry in impls.items():
            summary.add_row(case_set, impl, f"{entry['passed']}/{entry['cases']}", _number(entry.get("geomean_ms")),
                            _number(entry.get("geomean_first_call_s"), 2))
    console.print(summary)


def plot(record: dict, path) -> None:
    """Grouped bars: median time per case per implementation (passing results only), log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [r for r in record["results"] if r.get("median_ms") and r["status"] == "pass"]
    cases = list(dict.fromkeys(f"{r['case_set']}:{r['case']}" for r in timed))
    impls = list(dict.fromkeys(r["impl"] for r in timed))
    width = 0.8 / max(len(impls), 1)
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(cases) + 2), 4.5))
    for n, impl in enumerate(impls):
        xs, ys = [], []
        for r in timed:
            if r["impl"] == impl:
                xs.append(cases.index(f"{r['case_set']}:{r['case']}") + n * width)
                ys.append(r["median_ms"])
        ax.bar(xs, ys, width, label=impl)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cases))], [c.split(":", 1)[1] for c in cases],
                  rotation=30, ha="right", fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("median time, ms (log)")
    note = " (CPU interpreters, not GPU timings)" if record["mode"] != "gpu" else ""
    ax.set_title(f"{record['workload']} on {record['device']}{note}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
