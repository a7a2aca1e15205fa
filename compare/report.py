"""The driver's table (rich) and chart (matplotlib) from a run's record."""
from __future__ import annotations

import math

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


def print_table(record: dict, console: Console | None = None) -> None:
    console = console or Console(width=None if Console().is_terminal else 220)
    interpreted = record["mode"] != "gpu"
    # each port against the case's reference port: the first port of the case's first pair (the driver pairs the
    # passing ports in registration order)
    reference_port, against_reference = {}, {}
    for c in record["cross"]:
        key = (c["case_set"], c["case"])
        if reference_port.setdefault(key, c["pair"][0]) == c["pair"][0]:
            against_reference[(*key, c["pair"][1])] = c
    title = f"{record['workload']} on {record['device']}"
    if interpreted:
        title += " - CPU interpreters: times are NOT GPU timings"
    table = Table(title=title, header_style="bold")
    for column in ("set", "case", "impl", "verdict", "error figures", "median ms", "IQR ms", "runs",
                   "TFLOP/s", "TB/s", "% roofline", "speed-up", "first call s", "|vs ref port|", "bitwise"):
        table.add_column(column, justify="left" if column in ("set", "case", "impl", "verdict", "error figures")
                         else "right")
    for r in record["results"]:
        errors = r.get("errors", {})
        verdict = VERDICTS[r["status"]]
        pair = against_reference.get((r["case_set"], r["case"], r["impl"]), {})
        bitwise = ("ref" if reference_port.get((r["case_set"], r["case"])) == r["impl"]
                   else {True: "equal", False: "differ"}.get(pair.get("bitwise_equal"), "-"))
        figures = " ".join(f"{name}={_number(value)}" for name, value in errors.items())
        passed = r["status"] == "pass"  # a failing result's time is in the JSON, not shown as a speed
        table.add_row(r["case_set"], r["case"], r["impl"], verdict, figures or "-",
                      _number(r.get("median_ms") if passed else None), _number(r.get("iqr_ms") if passed else None),
                      str(r.get("runs", "-")), _number(r.get("tflops"), 1), _number(r.get("tbps"), 2),
                      _number(r.get("roofline_pct"), 1), _number(r.get("speedup"), 2),
                      _number(r.get("first_call_s"), 2), _number(pair.get("max_abs_diff")), bitwise)
    console.print(table)
    failures = [r for r in record["results"] if r["status"] not in ("pass", "skipped")]
    for r in failures:
        console.print(f"[red]{r['status']}[/] {r['case_set']} {r['case']} {r['impl']}: {r['reason']}")
    skipped = {r["impl"]: r["reason"] for r in record["results"] if r["status"] == "skipped"}
    for impl, reason in skipped.items():
        console.print(f"[yellow]skipped[/] {impl}: {reason}")
    if record.get("properties"):
        properties = Table(title="properties" + (" (CPU interpreters)" if interpreted else ""), header_style="bold")
        for column in ("impl", "property", "verdict", "checked", "first difference"):
            properties.add_column(column)
        for p in record["properties"]:
            detail = p.get("error") or (str(p["first_difference"]) if p.get("first_difference") else "-")
            properties.add_row(p["impl"], p["property"], VERDICTS[property_verdict(p["passed"]).lower()], p["checked"],
                               detail)
        console.print(properties)
    summary = Table(title="geometric means per case set (over cases that all passed and were timed)")
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
