"""One implementation on one case: the record the driver writes, and the report and the regression runs read.

In a results JSON each result is a flat object (`Result.to_json`); `Result.from_json` reads it back, records of
older runs included: a field this version does not name is kept in `extra` and written back as it was, and the
backend of a record made before backends had their names (`language`, the Pallas-Triton backend `pallas`) is read
into `backend`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

STATUSES = ("pass", "fail", "error", "skipped")
OLD_BACKEND_NAMES = {"pallas": "pallas-triton"}


@dataclass
class Result:
    impl: str
    framework: str | None = None
    backend: str | None = None
    status: str = "error"  # one of STATUSES
    reason: str | None = None  # why it failed, errored or was skipped (a pass: None)
    errors: dict[str, float] | None = None  # the workload check's error figures on the first call
    output_sha256: str | None = None  # the first call's output, on the seeded first input (compared by --against)
    first_call_s: float | None = None  # the first call, compile included
    checked: str | None = None  # "N/N outputs passed": every call's output, timed or not
    times_ms: list[float] | None = None  # the headline timer's calls (host clock, or kernels under --timer kernels)
    median_ms: float | None = None
    iqr_ms: float | None = None
    runs: int | None = None
    kernel_times_ms: list[float] | None = None  # --timer all: the profiler's sum of the call's kernels
    kernel_ms: float | None = None
    from_torch_times_ms: list[float] | None = None  # --timer all: the torch caller's host clock
    from_torch_ms: float | None = None
    overhead_ms: float | None = None  # median_ms - kernel_ms
    bridge_ms: float | None = None  # from_torch_ms - median_ms
    bridge_arrays: int | None = None  # --timer all, another framework's port: torch tensors crossing a call, both ways
    traceback: str | None = None  # an error's, paths relative to the project
    case_set: str = ""
    case: str = ""
    params: dict[str, Any] | None = None  # the case's definition
    flops: float | None = None
    min_bytes: float | None = None
    tflops: float | None = None
    tbps: float | None = None
    floor_ms: float | None = None  # at the run's ceilings (the report recomputes it at the datasheet's)
    roofline_pct: float | None = None
    speedup: float | None = None  # over the workload's baseline on the same case
    extra: dict[str, Any] = field(default_factory=dict)  # fields of other versions' records, kept as they were

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    @property
    def key(self) -> tuple[str, str, str]:
        return self.case_set, self.case, self.impl

    @classmethod
    def from_json(cls, entry: dict) -> Result:
        named = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {name: value for name, value in entry.items() if name in named}
        if not known.get("backend") and entry.get("language"):
            known["backend"] = OLD_BACKEND_NAMES.get(entry["language"], entry["language"])
        return cls(**known, extra={name: value for name, value in entry.items() if name not in named})

    def to_json(self) -> dict:
        """The result as its JSON object: every field that is set (the reason always), then `extra`."""
        entry = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                 if f.name != "extra" and (getattr(self, f.name) is not None or f.name == "reason")}
        return {**entry, **self.extra}


def results_of(record: dict) -> list[Result]:
    """A run's results (its JSON object's `results`) as records."""
    return [Result.from_json(entry) for entry in record["results"]]
