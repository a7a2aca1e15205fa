"""The driver's table (rich) and chart (matplotlib) from a run's record."""
from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table

from compare.invariance.decoder import cross_verdict, per_batch
from compare.records import datasheet_peaks, floor_seconds, geometric_mean, property_verdict
from compare.result import Result, results_of
from ports import ported_backend

VERDICTS = {"pass": "[green]pass[/]", "fail": "[red]FAIL[/]", "error": "[red]ERROR[/]", "skipped": "[yellow]skipped[/]"}


def passed_text(entry: dict) -> str:
    """"3/4" of a summary entry, or "skipped" where the machine could run none of its cases."""
    if entry.get("skipped") == entry["cases"]:
        return "skipped"
    return f"{entry['passed']}/{entry['cases']}"


def _number(value, digits=3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if abs(value) >= 1000 or (value != 0 and abs(value) < 10 ** -digits):
        return f"{value:.2e}"
    return f"{value:.{digits}f}"


# the compact table's shorter headers, and the detail table's column each shows
COMPACT_HEADERS = {"ms": "median ms", "roofline %": "% roofline", "bits": "bitwise", "overhead": "overhead ms",
                   "from torch": "from torch ms"}


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
    results = results_of(record)
    costs = any(r.kernel_ms is not None for r in results)  # timed with --timer all
    if detail:
        columns = ("set", "case", "impl", "verdict", "error figures", "median ms", "IQR ms", "runs",
                   *(("kernel ms", "overhead ms", "from torch ms", "bridge us an array") if costs else ()), "TFLOP/s",
                   "TB/s", "% roofline", "speed-up", "first call s", "|vs ref port|", "bitwise")
    elif costs:
        columns = ("case", "impl", "verdict", "ms", "kernel ms", "overhead", "from torch", "bits")
    else:
        columns = ("case", "impl", "verdict", "ms", "speed-up", "roofline %", "bits")
    tables = {}
    for r in results:
        table_key = "all" if detail else r.case_set
        if table_key not in tables:
            tables[table_key] = Table(title=title if detail else f"{title}: {r.case_set}", header_style="bold",
                                      box=None if not detail else box.HEAVY_HEAD, pad_edge=False)
            for column in columns:
                tables[table_key].add_column(column, justify="left" if column in (
                    "set", "case", "impl", "verdict", "error figures") else "right",
                    overflow="fold")  # a long case name breaks a line rather than losing its end
        pair = against_reference.get(r.key, {})
        bitwise = ("ref" if reference_port.get((r.case_set, r.case)) == r.impl
                   else {True: "equal", False: "differ"}.get(pair.get("bitwise_equal"), "-"))
        passed = r.passed  # a failing result's time is in the JSON, not shown as a speed
        cells = {"set": r.case_set, "case": r.case, "impl": r.impl, "verdict": VERDICTS[r.status],
                 "error figures": " ".join(f"{name}={_number(value)}" for name, value in (r.errors or {}).items())
                 or "-",
                 "median ms": _number(r.median_ms if passed else None),
                 "IQR ms": _number(r.iqr_ms if passed else None), "runs": str("-" if r.runs is None else r.runs),
                 "TFLOP/s": _number(r.tflops, 1), "TB/s": _number(r.tbps, 2),
                 "% roofline": _number(r.roofline_pct, 1),
                 "speed-up": _number(r.speedup, 2),
                 "first call s": _number(r.first_call_s, 2), "|vs ref port|": _number(pair.get("max_abs_diff")),
                 "bitwise": bitwise,
                 "kernel ms": _number(r.kernel_ms if passed else None),
                 "overhead ms": _number(r.overhead_ms if passed else None),
                 "from torch ms": _number(r.from_torch_ms if passed else None),
                 "bridge us an array": _number(_bridge_per_array_us([r]), 1)}
        tables[table_key].add_row(*(cells[COMPACT_HEADERS.get(column, column)] for column in columns))
    for table in tables.values():
        console.print(table)
    if not detail:
        console.print("ms: median time per call (host clock); " + (
            "kernel ms: the profiler's sum of its kernels; overhead: ms minus kernel ms; from torch: the torch "
            "caller's view (DLPack both ways for JAX); " if costs else "speed-up: against the workload's baseline; ")
            + "bits: against the reference port (ref)" + (
                "; the interpreters round as NumPy and the CPU's XLA do, so ports that differ here promise "
                "nothing of the GPU's bits" if interpreted else "") + ". Other figures: --detail, or --json.")
    failures = [r for r in results if r.status not in ("pass", "skipped")]
    for r in failures:
        console.print(f"[red]{r.status}[/] {r.case_set} {r.case} {r.impl}: {r.reason}")
    skipped = {r.impl: r.reason for r in results if r.status == "skipped"}
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
            if p["passed"] is False and not ported_backend(p["backend"]):
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
    for column in ("set", "impl", "passed", "geomean ms",
                   *(("kernel ms", "from torch ms", "bridge us/array") if costs else ()), "geomean first call s"):
        summary.add_column(column)
    for case_set, impls in record.get("summary", {}).items():
        for impl, entry in impls.items():
            bridged = [r for r in results if r.case_set == case_set and r.impl == impl]
            summary.add_row(case_set, impl, passed_text(entry), _number(entry.get("geomean_ms")),
                            *((_number(entry.get("geomean_kernel_ms")), _number(entry.get("geomean_from_torch_ms")),
                               _number(_bridge_per_array_us(bridged), 1)) if costs else ()),
                            _number(entry.get("geomean_first_call_s"), 2))
    console.print(summary)
    if costs:
        console.print("bridge us/array: the median over the cases of (from torch - ms), in us, over the torch tensors "
                      "a call hands over and takes back (another framework's ports only).")


def _bridge_per_array_us(results) -> float | None:
    """The median over passing `results` of their bridge in us over the tensors each call takes across; None where
    none crossed (a torch port, or no --timer all)."""
    per_array = [1e3 * r.bridge_ms / r.bridge_arrays for r in results
                 if r.passed and r.bridge_arrays and r.bridge_ms is not None]
    return statistics.median(per_array) if per_array else None


def plot(record: dict, path) -> None:
    """Grouped bars: median time per case per implementation (passing results only), log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [r for r in results_of(record) if r.median_ms and r.passed]
    cases = list(dict.fromkeys(f"{r.case_set}:{r.case}" for r in timed))
    impls = list(dict.fromkeys(r.impl for r in timed))
    width = 0.8 / max(len(impls), 1)
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(cases) + 2), 4.5))
    for n, impl in enumerate(impls):
        xs, ys = [], []
        for r in timed:
            if r.impl == impl:
                xs.append(cases.index(f"{r.case_set}:{r.case}") + n * width)
                ys.append(r.median_ms)
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


CALL_PARTS = (("kernel_ms", "kernels"), ("overhead_ms", "host path (own framework)"),
              ("bridge_ms", "from torch: bridge"))


def call_parts(record: dict) -> list[Result]:
    """The ports' passing bench results whose calls the run split into kernel time and host path (`--timer all`)."""
    return [r for r in results_of(record) if r.passed and r.case_set == "bench" and r.kernel_ms is not None
            and r.overhead_ms is not None and ported_backend(r.backend)]


def plot_call_parts(record: dict, path) -> None:
    """Where a call's time goes: per bench case, each port's call from torch as stacked bars of its kernels'
    time, its host path in its own framework and the bridge from torch, with the datasheet floor marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    split = call_parts(record)
    cases = list(dict.fromkeys(r.case for r in split))
    impls = _implementations(record)
    impls = [n for n in impls if any(r.impl == n for r in split)]
    columns = 2
    rows = -(-len(cases) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(11, 1.0 + 0.32 * len(impls) * rows), squeeze=False)
    colours = ("#1f4e79", "#6fa8dc", "#cfe2f3")
    for ax, case in zip(axes.flat, cases):
        by_impl = {r.impl: r for r in split if r.case == case}
        names = [n for n in impls if n in by_impl]
        left = [0.0] * len(names)
        for (field, label), colour in zip(CALL_PARTS, colours):
            widths = [max(getattr(by_impl[n], field) or 0.0, 0.0) for n in names]
            ax.barh(names, widths, left=left, color=colour, label=label)
            left = [x + w for x, w in zip(left, widths)]
        floor = floor_ms(record, by_impl[names[0]])
        if floor is not None:
            ax.axvline(floor, color="black", linestyle="--", linewidth=1, label="datasheet floor")
        ax.set_title(case, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("ms per call", fontsize=7)
    for ax in list(axes.flat)[len(cases):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8)
    fig.suptitle(f"{record['workload']} on {record['device']}: where a call's time goes (median parts)", fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)


# The runs each workload's headline table in README.md and REPORT.md comes from (paths relative to the project).
RUNS_OF_RECORD = {
    "trimul": "results/h200/trimul.json",
    "matmul": "results/h200/matmul-kernel-times.json",
    "eigh": "results/h200/eigh.json",
}
README_BLOCK = "<!-- generated by `python -m compare report` from {path}: edit the JSON's run, not this text -->"
README_BLOCK_END = "<!-- end of generated table -->"


def _ms(value) -> str:
    return "-" if value is None else f"{value:.3g}"


def _implementations(record: dict) -> list[str]:
    """The run's implementation names, ports first, in the order the run listed them."""
    results = results_of(record)
    listed = record.get("implementations") or [{"name": r.impl} for r in results]
    names = list(dict.fromkeys(entry["name"] for entry in listed))
    backends = {r.impl: r.backend for r in results}
    return [n for n in names if ported_backend(backends.get(n))] + [
        n for n in names if not ported_backend(backends.get(n))]


def floor_ms(record: dict, result: Result) -> float | None:
    """A result's roofline floor at its GPU's datasheet peaks (computed here, so that a run recorded with other
    ceilings shows the floor nothing can beat), or None off the GPUs with a datasheet entry."""
    peaks = datasheet_peaks(record.get("device"))
    if not peaks or result.flops is None or result.min_bytes is None:
        return None
    return floor_seconds(result.flops, result.min_bytes, peaks) * 1e3


def floor_note(record: dict) -> str:
    """Where the datasheet floor comes from, for the line under a table."""
    peaks = datasheet_peaks(record.get("device"))
    return (f"Floor: the case's flops or bytes at the {peaks['source']}." if peaks
            else "No datasheet floor for this device.")


def markdown_table(record: dict, case_set: str = "bench") -> str:
    """Median ms per case and implementation (failures named), the datasheet floor, and the geometric means."""
    names = _implementations(record)
    results = [r for r in results_of(record) if r.case_set == case_set]
    cases = list(dict.fromkeys(r.case for r in results))
    by_key = {(r.case, r.impl): r for r in results}
    lines = ["| case | datasheet floor | " + " | ".join(names) + " |", "|---" * (len(names) + 2) + "|"]
    for case in cases:
        cells = []
        for name in names:
            r = by_key.get((case, name))
            cells.append("-" if r is None else _ms(r.median_ms) if r.passed else r.status)
        floor = next((floor_ms(record, by_key[(case, n)]) for n in names if (case, n) in by_key), None)
        lines.append(f"| {case} | {_ms(floor)} | " + " | ".join(cells) + " |")
    summary = record.get("summary", {}).get(case_set, {})
    lines.append("| **geometric mean** | | " + " | ".join(f"**{_ms(summary.get(n, {}).get('geomean_ms'))}**"
                                                      for n in names) + " |")
    lines.append("| passed | | " + " | ".join(passed_text(summary[n]) if n in summary else "-" for n in names) + " |")
    return "\n".join(lines)


def bitwise_markdown(record: dict) -> str:
    """For each pair of ports, on how many cases their outputs were bitwise equal."""
    pairs = {}
    for c in record.get("cross", []):
        equal, total = pairs.get(tuple(c["pair"]), (0, 0))
        pairs[tuple(c["pair"])] = (equal + bool(c["bitwise_equal"]), total + 1)
    if not pairs:
        return "No two ports passed a case in this run."
    lines = ["| ports | bitwise equal |", "|---|---|"]
    lines += [f"| {a} and {b} | {equal} of {total} cases |" for (a, b), (equal, total) in pairs.items()]
    return "\n".join(lines)


def properties_markdown(record: dict) -> str:
    names = list(dict.fromkeys(p["impl"] for p in record.get("properties", [])))
    props = list(dict.fromkeys(p["property"].split(":")[0] for p in record.get("properties", [])))
    verdict = {(p["impl"], p["property"].split(":")[0]): p for p in record.get("properties", [])}
    lines = ["| property | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for prop in props:
        cells = []
        for name in names:
            p = verdict.get((name, prop))
            text = "-" if p is None else property_verdict(p["passed"])
            if p and p["passed"] is False and p.get("first_difference"):
                where = p["first_difference"]
                text += f" (at M = {where['m']})" if "m" in where else ""
            cells.append(text)
        lines.append(f"| {prop} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def per_implementation_markdown(record: dict, case_set: str = "bench") -> str:
    """Per implementation over the case set: cases passed, the geometric means of its time and of its speed-up over
    the workload's baseline, the median % of the roofline floor, and where the run timed them, the kernel time, the
    overhead above it and the torch caller's time (`--timer all`)."""
    names = _implementations(record)
    results = results_of(record)
    rows = {name: [r for r in results if r.case_set == case_set and r.impl == name] for name in names}
    costs = any(r.kernel_ms is not None for results in rows.values() for r in results)
    header = ["implementation", "passed", "geomean ms", "geomean speed-up", "median % of datasheet floor"]
    header += ["geomean kernel ms", "median overhead ms", "geomean from torch ms"] if costs else []
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]

    for name, results in rows.items():
        passing = [r for r in results if r.passed]
        complete = len(passing) == len(results) and results
        speedups = [r.speedup for r in passing]
        roofline = [100 * floor_ms(record, r) / r.median_ms for r in passing
                    if floor_ms(record, r) is not None and r.median_ms]
        cells = [name, f"{len(passing)}/{len(results)}",
                 _ms(geometric_mean([r.median_ms for r in passing]) if complete else None),
                 f"{geometric_mean(speedups):.2f}x" if complete and all(speedups) else "-",
                 f"{statistics.median(roofline):.1f}" if roofline else "-"]
        if costs:
            cells += [_ms(geometric_mean([r.kernel_ms for r in passing]) if complete else None),
                      _ms(statistics.median([r.overhead_ms for r in passing]) if complete else None),
                      _ms(geometric_mean([r.from_torch_ms for r in passing]) if complete else None)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _commit(made: dict) -> str:
    """A record's commit, short, and whether the tree differed from it."""
    return ((made.get("commit") or "")[:7] or "not recorded") + (" (with uncommitted changes)" if made.get("dirty")
                                                                 else "")


def _provenance_line(record: dict, path: str) -> str:
    versions = record.get("versions", {})
    return (f"`{path}`: {record.get('device')}, {record.get('started', '?')[:10]}, timer "
            f"{record.get('settings', {}).get('timer', 'host')}; torch {versions.get('torch')}, triton "
            f"{versions.get('triton')}, jax {versions.get('jax')}; commit {_commit(record.get('provenance') or {})}")


def _generated(path: str, body: str) -> str:
    """README.md's block generated from the JSON at `path`: its markers around `body`."""
    return README_BLOCK.format(path=path) + "\n\n" + body + "\n\n" + README_BLOCK_END


def headline(workload: str, root: Path) -> str:
    """A workload's README table: the bench medians of its run of record, with where they came from."""
    path = RUNS_OF_RECORD[workload]
    record = json.loads((root / path).read_text())
    return _generated(path, _provenance_line(record, path) + ". Median ms per call.\n\n" + markdown_table(record)
                      + "\n\n" + floor_note(record))


TESTS_RECORDS = "results/*/tests.json"  # the whole suite's GPU runs, one a card (`python -m compare.suite`)


def tests_record(root: Path) -> str | None:
    """The newest of the cards' records of the whole suite (relative to root), or None."""
    found = sorted(root.glob(TESTS_RECORDS), key=lambda path: json.loads(path.read_text()).get("started", ""))
    return str(found[-1].relative_to(root)) if found else None


def tests_line(root: Path) -> str:
    """README.md's line on the last GPU run of the whole test suite (or that none is recorded)."""
    path = tests_record(root)
    if path is None:
        return _generated(TESTS_RECORDS, "No GPU run of the whole test suite is recorded yet: `python -m "
                          "compare.suite` on a GPU records one in `results/<card>/tests.json`.")
    record = json.loads((root / path).read_text())
    return _generated(path, f"The whole test suite last passed on an {record['device']} on "
                      f"{record['started'][:10]} at commit {_commit(record)}: {record['passed']} passed, "
                      f"{record['failed'] + record['errors']} failed, {record['skipped']} skipped "
                      f"(`python -m compare.suite`, recorded in `{path}`).")


INVARIANCE_RECORD = "results/h200/invariance.json"  # `python -m compare invariance`'s run of record


def _batch_verdicts(runs: dict) -> str:
    """"the same bits" when every batch kept each sequence's logits and input gradient, else the first batch where
    they moved (and the decoder's op where the logits first did, where the run named it)."""
    moved = sorted((int(batch), verdict) for batch, verdict in runs.items()
                   if not (verdict["logits"] and verdict["gradient"]))
    if not moved:
        return "the same bits"
    batch, verdict = moved[0]
    op = verdict.get("first_differing_op")
    return f"variant from B = {batch}" + (f" (first at `{op}`)" if op else "")


def invariance_lines(record: dict) -> str:
    """The batch-invariant modes' verdicts and cost from the invariance run of record (README.md and REPORT.md)."""
    model, cost = record["model"], record.get("cost", {})
    versions = record.get("versions", {})
    batches = sorted(int(batch) for batch in record["batches"])
    started = (record.get("started") or "")[:10] or "date not recorded"
    lines = [f"`{INVARIANCE_RECORD}`: {record.get('device')}, {started}; "
             f"torch {versions.get('torch')}, triton {versions.get('triton')}, jax {versions.get('jax')}; commit "
             f"{_commit(record)}. A {record['dtype']} decoder ({model['layers']} "
             f"layers, width {model['dim']}, {model['heads']} heads, {model['length']} tokens): each sequence's "
             f"logits and input gradient alone and in batches of {batches[1]} to {batches[-1]}; the cost is the mode's "
             "median host time over torch's or XLA's own" + "".join(
                 f" (the mode held; entering and leaving {framework}'s: {entries['switch_ms']:.3g} ms)"
                 for framework, entries in cost.items() if "switch_ms" in entries)
             + ". " + cross_verdict(record["cross"]), "",
             "| framework | mode off | mode on | forward, mode on / off | training step, mode on / off |",
             "|---|---|---|---|---|"]
    for framework, modes in record["frameworks"].items():
        ratios = {kind: " · ".join(f"B = {batch}: {times[kind]['on'] / times[kind]['off']:.2f}x"
                                   for batch, times in per_batch(cost.get(framework, {})).items())
                  for kind in ("forward_ms", "step_ms")}
        lines.append(f"| {framework} | {_batch_verdicts(modes['off'])} | {_batch_verdicts(modes['on'])} | "
                     f"{ratios['forward_ms'] or '-'} | {ratios['step_ms'] or '-'} |")
    return "\n".join(lines)


def readme_with_tables(text: str, root: Path) -> str:
    """README.md's text with every generated block replaced by the table (or line) its JSON gives now."""
    blocks = {path: lambda workload=workload: headline(workload, root) for workload, path in RUNS_OF_RECORD.items()}
    tests = tests_record(root) or TESTS_RECORDS  # the block names the record it came from: the newest card's
    text = re.sub(re.escape(README_BLOCK.format(path="@")).replace("@", r"results/(\*|[\w-]+)/tests\.json"),
                  README_BLOCK.format(path=tests).replace("\\", "\\\\"), text)
    blocks[tests] = lambda: tests_line(root)
    blocks[INVARIANCE_RECORD] = lambda: _generated(
        INVARIANCE_RECORD, invariance_lines(json.loads((root / INVARIANCE_RECORD).read_text())))
    for path, generate in blocks.items():
        start = text.find(README_BLOCK.format(path=path))
        if start < 0:
            continue
        end = text.index(README_BLOCK_END, start) + len(README_BLOCK_END)
        text = text[:start] + generate() + text[end:]
    return text


def _baseline(record: dict) -> str:
    """The implementation whose speed-up is 1 on every case it passed (the workload's baseline in that run)."""
    for r in results_of(record):
        if r.speedup == 1.0:
            return r.impl
    return "the baseline"


SHAPES_RECORD = "results/h200/matmul-shapes.json"  # matmul at the shapes of real models (`--cases shapes`)
WITHIN = 1.2  # issue 56's goal: a port's call from torch within this factor of cuBLAS's


def shapes_markdown(record: dict) -> str:
    """Matmul at model shapes: each implementation's call over the baseline's (cuBLAS through torch.matmul), per
    case, from torch where the run measured it (`--timer all`), else by the host clock; ratios within WITHIN bold,
    and how many cases each port has within it."""
    results = [r for r in results_of(record) if r.case_set == "shapes"]
    baseline = _baseline(record)
    names = [n for n in _implementations(record) if n != baseline]
    by_key = {(r.case, r.impl): r for r in results}
    models = {r.case: (r.params or {}).get("model", "-") for r in results}

    def call_ms(r):
        return r.from_torch_ms if r.from_torch_ms is not None else r.median_ms

    clock = "from torch" if all(r.from_torch_ms is not None for r in results if r.passed) else "host clock"
    lines = [f"| case | model layer | {baseline}, ms ({clock}) | " + " | ".join(names) + " |",
             "|---" * (len(names) + 3) + "|"]
    within = dict.fromkeys(names, 0)
    cases = list(dict.fromkeys(r.case for r in results))
    for case in cases:
        base = by_key.get((case, baseline))
        base_ms = call_ms(base) if base is not None and base.passed else None
        cells = []
        for name in names:
            r = by_key.get((case, name))
            if r is None or not r.passed or base_ms is None:
                cells.append("-" if r is None else r.status if not r.passed else "no baseline")
                continue
            ratio = call_ms(r) / base_ms
            within[name] += ratio <= WITHIN
            cells.append(f"**{ratio:.2f}x**" if ratio <= WITHIN else f"{ratio:.2f}x")
        lines.append(f"| {case} | {models[case]} | {_ms(base_ms)} | " + " | ".join(cells) + " |")
    lines.append(f"| **within {WITHIN}x** | | | " + " | ".join(f"**{within[n]} of {len(cases)}**" for n in names)
                 + " |")
    return "\n".join(lines)


def report_markdown(root: Path, charts: Path | None = None) -> str:
    """REPORT.md: per workload, its run of record's tables (time per case, pass counts, bitwise agreement between
    ports, properties) and chart; `charts` is the folder the charts are written to (None: no charts)."""
    parts = ["# Report: the runs of record on the H200", "",
             "Written by `python -m compare report` from the JSON files named below; every figure is the driver's.",
             ""]
    for workload, path in RUNS_OF_RECORD.items():
        record = json.loads((root / path).read_text())
        parts += [f"## {workload}", "", _provenance_line(record, path) + ".", "", "Median ms per call, bench cases:",
                  "", markdown_table(record), "", floor_note(record), "",
                  f"Per implementation (speed-up over `{_baseline(record)}`):", "",
                  per_implementation_markdown(record), "", "Bitwise agreement between the ports:", "",
                  bitwise_markdown(record), ""]
        if record.get("properties"):
            parts += ["Properties (a library baseline's FAIL is a finding about it). Batch invariance compares the "
                      "rows of `a[:M] @ b` with those of `(a @ b)[:M]`, M = 1 first:", "",
                      properties_markdown(record), ""]
        if charts is not None:
            chart = charts / f"{workload}-report.png"
            plot(record, chart)
            parts += [f"![{workload}]({chart.name})", ""]
            if call_parts(record):
                chart = charts / f"{workload}-call.png"
                plot_call_parts(record, chart)
                parts += ["Where a port's call goes, bench cases: each bar is the call from torch, its kernels' time, "
                          "the rest of its call in its own framework (host path) and the bridge from torch "
                          "(`ports.custom_kernel`); each part a median, so the parts need not sum to a measured "
                          "total.", "", f"![{workload} call]({chart.name})", ""]
    if (root / SHAPES_RECORD).exists():
        record = json.loads((root / SHAPES_RECORD).read_text())
        parts += ["## matmul at model shapes", "", _provenance_line(record, SHAPES_RECORD) + ".", "",
                  f"Each implementation's call over `{_baseline(record)}`'s, the `shapes` cases (the products of "
                  f"real models' layers at decode and prefill sizes); bold: within the goal of {WITHIN}x.", "",
                  shapes_markdown(record), ""]
    if (root / INVARIANCE_RECORD).exists():
        record = json.loads((root / INVARIANCE_RECORD).read_text())
        parts += ["## batch-invariant modes", "", invariance_lines(record), "", ops_markdown(record), ""]
    return "\n".join(parts)


def ops_markdown(record: dict) -> str:
    """The invariance run's op-by-op verdicts: each op alone, a sequence alone against in a batch, modes off and on."""
    ops = record.get("ops")
    if not ops:
        return "No op-by-op probe in this run (`--ops`)."
    sizes = ", ".join(f"{name} {value}" for name, value in ops["sizes"].items())
    columns = [(framework, mode) for framework in ops["verdicts"] for mode in ("off", "on")]
    rows = [f"Each op alone ({sizes}), a sequence alone against in a batch of up to {max(ops['batches'])}:", "",
            "| op | " + " | ".join(f"{framework} {mode}" for framework, mode in columns) + " |",
            "|---|" + "---|" * len(columns)]
    for op in next(iter(ops["verdicts"].values())):
        rows.append(f"| {op} | " + " | ".join(ops["verdicts"][framework].get(op, {}).get(mode, "-")
                                              for framework, mode in columns) + " |")
    return "\n".join(rows)


def write_report(root: Path) -> list[Path]:
    """results/h200/REPORT.md (with its charts) and README.md's generated tables, from the runs of record."""
    out = root / "results" / "h200"
    report = out / "REPORT.md"
    report.write_text(report_markdown(root, charts=out))
    readme = root / "README.md"
    readme.write_text(readme_with_tables(readme.read_text(), root))
    return [report, readme]
