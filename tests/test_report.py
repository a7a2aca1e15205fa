"""The generated report and README.md's tables (compare/report.py), from the committed runs of record."""
import json
import pathlib

import pytest

from compare.__main__ import main as compare_main
from compare.report import README_BLOCK, RUNS_OF_RECORD, readme_with_tables, report_markdown

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_readme_tables_are_what_the_runs_of_record_give():
    text = (ROOT / "README.md").read_text()
    for path in RUNS_OF_RECORD.values():
        assert README_BLOCK.format(path=path) in text, f"README.md has no generated table from {path}"
    assert readme_with_tables(text, ROOT) == text, "README.md's tables differ from the JSON: python -m compare report"


def test_readme_stays_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def test_report_has_each_workloads_tables_and_chart(tmp_path):
    report = report_markdown(ROOT, charts=tmp_path)
    for workload in RUNS_OF_RECORD:
        assert f"## {workload}" in report and (tmp_path / f"{workload}-report.png").stat().st_size > 0
    assert "| triton and mosaic_gpu | 30 of 30 cases |" in report
    assert "| triton and gluon | 30 of 30 cases |" in report
    assert "| torch | 18/18 | 0.0586 | 1.00x |" in report  # matmul's baseline, per implementation
    assert "| batch invariance | pass | pass | pass | pass | FAIL (at M = 1) | FAIL (at M = 1) |" in report
    # a run that split its calls (--timer all) also shows where a port's call goes: kernels, host path, bridge
    assert "![trimul call](trimul-call.png)" in report and (tmp_path / "trimul-call.png").stat().st_size > 0
    assert "matmul call" not in report  # its run of record timed the kernels alone


def test_report_shows_matmul_at_model_shapes_against_cublas():
    from compare.report import SHAPES_RECORD, shapes_markdown
    from compare.result import Result

    report = report_markdown(ROOT)
    if (ROOT / SHAPES_RECORD).exists():
        assert "## matmul at model shapes" in report and "| **within 1.2x** |" in report
        assert "| m1-n32-k2880-bfloat16-out_same | gpt-oss-20b router |" in report

    def result(case, impl, ms, status="pass"):
        return Result(impl, status=status, case_set="shapes", case=case, params={"model": f"layer {case}"},
                      median_ms=ms, from_torch_ms=ms, speedup=1.0 if impl == "torch" else None).to_json()

    record = {"implementations": [{"name": n} for n in ("triton", "gluon", "torch")], "results": [
        result("a", "torch", 0.1), result("a", "triton", 0.12), result("a", "gluon", 0.121),
        result("b", "torch", 0.2), result("b", "triton", 0.1), result("b", "gluon", 0.3, status="fail")]}
    lines = shapes_markdown(record).splitlines()
    assert lines[0] == "| case | model layer | torch, ms (from torch) | triton | gluon |"
    assert lines[2:] == ["| a | layer a | 0.1 | **1.20x** | 1.21x |", "| b | layer b | 0.2 | **0.50x** | fail |",
                         "| **within 1.2x** | | | **2 of 2** | **0 of 2** |"]


def test_report_command_takes_no_arguments_but_help(capsys):
    assert compare_main(["report", "--extra"]) == 2
    assert "takes no arguments" in capsys.readouterr().err
    assert compare_main(["report", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: python -m compare report")


def below_floor(records):
    """(file, case, implementation, which time, ms, floor ms) for each passing time of the records ((name, record)
    pairs) under its datasheet floor: medians and every single call."""
    from compare.report import floor_ms
    from compare.result import Result

    found = []
    for name, record in records:
        if not isinstance(record, dict) or not isinstance(record.get("results"), list):
            continue  # not a driver run
        for entry in record["results"]:
            if not (isinstance(entry, dict) and entry.get("status") == "pass"):
                continue
            result = Result.from_json(entry)
            floor = floor_ms(record, result)
            for key in ("median_ms", "kernel_ms", "from_torch_ms", "times_ms", "kernel_times_ms",
                        "from_torch_times_ms"):
                values = getattr(result, key) if floor is not None else None
                for value in values if isinstance(values, list) else [] if values is None else [values]:
                    if value < floor:
                        found.append((name, result.case, result.impl, key, value, floor))
    return found


def test_no_recorded_time_beats_its_datasheet_floor():
    records = [(str(path.relative_to(ROOT)), json.loads(path.read_text()))
               for path in sorted((ROOT / "results").rglob("*.json"))]
    assert sum(isinstance(r, dict) and r.get("device") == "NVIDIA H200" for _, r in records) > 50  # runs are read
    assert below_floor(records) == []


def test_a_time_under_the_datasheet_floor_is_caught():
    from compare.report import floor_ms, floor_note
    from compare.result import Result

    record = {"device": "NVIDIA H200", "results": [
        {"case": "c", "impl": "fast", "status": "pass", "flops": 989e12, "min_bytes": 1.0, "median_ms": 1001.0,
         "times_ms": [1002.0, 999.0]}]}  # a second of flops at the datasheet's bf16 peak: one call took less
    assert floor_ms(record, Result.from_json(record["results"][0])) == pytest.approx(1e3)
    assert "989 TFLOP/s" in floor_note(record)
    assert [(key, value) for *_, key, value, _ in below_floor([("planted", record)])] == [("times_ms", 999.0)]
    assert below_floor([("elsewhere", dict(record, device="x86_64"))]) == []  # no datasheet: no floor


def test_the_last_gpu_run_of_the_whole_suite_is_recorded_and_green():
    from compare.records import card
    from compare.report import tests_record

    path = tests_record(ROOT)
    if path is None:  # README.md says so (test_readme_tables_are_what_the_runs_of_record_give)
        pytest.skip("no GPU run of the whole suite recorded yet in results/<card>/tests.json")
    record = json.loads((ROOT / path).read_text())
    assert path == f"results/{card(record['device'])}/tests.json"  # filed under the card that ran it
    assert record["whole_suite"] and record["mode"] == "gpu" and record["commit"], record["command"]
    assert (record["failed"], record["errors"], record["failures"], record["exit_status"]) == (0, 0, [], 0)
    assert record["passed"] > 500 and len(record["slowest"]) == 20


def test_the_suite_record_counts_outcomes_and_keeps_each_failures_first_lines(tmp_path):
    from compare.suite import summarise_junit

    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_x" name="test_ok[a]" time="2.5"/>'
        '<testcase classname="tests.test_x" name="test_bad" time="0.1"><failure message="AssertionError: 1 != 2">'
        'def test_bad():\n&gt;  assert 1 == 2\nE  AssertionError</failure></testcase>'
        '<testcase classname="tests.test_x" name="test_gpu" time="0"><skipped message="needs a GPU"/></testcase>'
        '<testcase classname="tests.test_y" name="test_setup" time="0.3"><error message="fixture broke"/></testcase>'
        '</testsuite></testsuites>')
    summary = summarise_junit(junit)
    assert {key: summary[key] for key in ("tests", "passed", "failed", "errors", "skipped")} == {
        "tests": 4, "passed": 1, "failed": 1, "errors": 1, "skipped": 1}
    assert summary["failures"][0] == {"test": "tests/test_x.py::test_bad", "kind": "failure", "first_lines": [
        "AssertionError: 1 != 2", "def test_bad():", ">  assert 1 == 2", "E  AssertionError"]}
    assert summary["slowest"][0] == {"test": "tests/test_x.py::test_ok[a]", "seconds": 2.5}


def test_every_file_the_findings_cite_exists():
    """docs/findings.md names the file that holds each figure: each path it cites (globs too) and each results file
    it names alone must be in the repository; a path at a commit (`git show HASH:PATH`, a file removed) is git's."""
    import re

    text = (ROOT / "docs" / "findings.md").read_text()
    folders = r"(?:results|tests|compare|ports|docs|batch_invariant|kernel_support|\w+_kernels)"
    paths = set(re.findall(rf"(?<![\w/.:])({folders}/[\w./*-]*[\w/*])", text))
    names = set(re.findall(r"`([\w.-]+\.(?:json|txt|pt|png))`", text)) - {path.rsplit("/", 1)[-1] for path in paths}
    assert len(paths) > 20 and len(names) > 20  # the citations are read
    missing = [path for path in sorted(paths) if not list(ROOT.glob(path.rstrip("/")))]
    missing += [name for name in sorted(names) if not list((ROOT / "results").rglob(name))]
    assert missing == [], missing


def test_a_result_reads_back_what_any_run_wrote():
    # every result the runs in results/ hold reads into a Result and writes back as it was (fields of older versions
    # kept in `extra`); a record made before backends had names gets its backend from `language`
    from compare.result import Result

    read = 0
    for path in sorted((ROOT / "results").rglob("*.json")):
        record = json.loads(path.read_text())
        for entry in record.get("results", []) if isinstance(record, dict) else []:
            if isinstance(entry, dict) and "impl" in entry:
                back = Result.from_json(entry).to_json()
                if "backend" not in entry:
                    back.pop("backend", None)
                assert back == {key: value for key, value in entry.items() if value is not None or key == "reason"}
                read += 1
    assert read > 3000
    old = Result.from_json({"impl": "p", "language": "pallas", "status": "pass", "timed_checks": "4/4 passed"})
    assert old.backend == "pallas-triton" and old.passed and old.extra == {"language": "pallas",
                                                                             "timed_checks": "4/4 passed"}
