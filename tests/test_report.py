"""The generated report and README.md's tables (compare/report.py), from the committed runs of record."""
import pathlib

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
    assert "| torch | 18/18 | 0.0587 | 1.00x |" in report  # matmul's baseline, per implementation
    assert "| batch invariance | pass | pass | pass | pass | FAIL (at M = 1) | FAIL (at M = 1) |" in report


def test_report_command_takes_no_arguments(capsys):
    assert compare_main(["report", "--extra"]) == 2
    assert "takes no arguments" in capsys.readouterr().err
