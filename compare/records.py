"""What a run records and how it is summed up: the JSON record written as results come in, the machine, versions and
provenance a run keeps, the roofline floor at the GPU's datasheet peaks, one-line errors, and the summary (speed-ups
and geometric means). The driver writes records; the report, the regression runs and the suite record read them."""
from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from compare.result import Result
from ports import Implementation

# The roofline's ceilings: the vendor's datasheet peaks (dense bf16 tensor-core rate, HBM bandwidth), which no
# measurement can beat (a measured ceiling was: cuBLAS later ran faster than the one measured here).
DATASHEET_PEAKS = {
    "H200": {"flops": 989e12, "bytes": 4.8e12, "source": "NVIDIA H200 SXM datasheet: 989 TFLOP/s dense bf16, 4.8 TB/s"},
    "H100": {"flops": 989e12, "bytes": 3.35e12, "source": "NVIDIA H100 SXM datasheet: 989 TFLOP/s dense bf16, "
                                                         "3.35 TB/s"},
}


def datasheet_peaks(device: str) -> dict | None:
    """The datasheet's ceilings for a GPU named `device` ({"flops", "bytes", "source"}), or None for another."""
    return next((peaks for key, peaks in DATASHEET_PEAKS.items() if key in (device or "")), None)


def floor_seconds(flops: float, min_bytes: float, peaks: dict) -> float:
    """The roofline floor: no implementation can take less time than its flops or its bytes at the peaks."""
    return max(flops / peaks["flops"], min_bytes / peaks["bytes"])


PROJECT_ROOT = str(Path(__file__).resolve().parents[1]) + os.sep  # left out of the tracebacks a results file keeps


@dataclass
class Recorder:
    """Holds the run's record and rewrites the JSON file after every addition."""

    path: Path | None
    record: dict = field(default_factory=dict)

    def save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.record, indent=1, default=float))
        os.replace(tmp, self.path)


def device_info():
    import torch

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        return {"device": name, "mode": "gpu", "ceilings": datasheet_peaks(name)}
    return {"device": platform.processor() or platform.machine(), "mode": "interpreter", "ceilings": None}


def card(device: str) -> str:
    """The folder under results/ for a device's records: an NVIDIA card's model (h100, h200) or, failing one, its
    name made a path (a CPU's processor too)."""
    found = re.search(r"\b([A-Z]\d{3})\b", device) if device.startswith("NVIDIA") else None
    return found.group(1).lower() if found else re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "cpu"


def versions():
    """The frameworks' versions, the CUDA builds they carry where there is a GPU, and the NVIDIA driver's. A
    framework not yet imported is read from its installed metadata, not imported: a run of torch ports does not
    load JAX (one installed under another distribution's name, as pytorch-triton, is imported to be read)."""
    import importlib.metadata

    found = {"python": platform.python_version()}
    for module in ("torch", "triton", "jax", "jaxlib", "numpy"):
        try:
            found[module] = (sys.modules[module].__version__ if module in sys.modules
                             else importlib.metadata.version(module))
        except importlib.metadata.PackageNotFoundError:
            try:
                found[module] = __import__(module).__version__
            except Exception:  # noqa: BLE001 - a missing framework is reported, not fatal
                found[module] = None
    for distribution in ("jax-cuda13-plugin", "jax-cuda12-plugin"):
        try:
            found[distribution] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            pass
    import torch

    if torch.cuda.is_available():
        found["torch_cuda"] = torch.version.cuda
        found["nvidia_driver"] = _command_output("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader")
    return found


def _command_output(*command: str, cwd: str | None = None) -> str | None:
    """A command's first line of output, or None when it cannot run or fails."""
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip().splitlines()[0] if done.stdout.strip() else ""


def provenance(impls: Sequence[Implementation]) -> dict:
    """What made the run: the commit the environment's CROSSPORT_COMMIT names, where set (a copy of a tree whose
    git metadata is older than its files, as on a machine that gets the working tree copied, names its real
    commit so; dirty unknown), else the git commit and whether tracked files differed from it, and each
    implementation's source file or package (relative to the project, variants included) with its SHA-256
    (`source_digest`)."""
    commit = _command_output("git", "rev-parse", "HEAD", cwd=PROJECT_ROOT)
    if os.environ.get("CROSSPORT_COMMIT") or not commit:
        record = {"commit": os.environ.get("CROSSPORT_COMMIT"), "dirty": None, "commit_from": "CROSSPORT_COMMIT"}
    else:
        dirty = _command_output("git", "status", "--porcelain", "--untracked-files=no", cwd=PROJECT_ROOT) != ""
        record = {"commit": commit, "dirty": dirty, "commit_from": "git"}
    sources = {}
    for impl in impls:
        path = impl.source_path()
        if path and os.path.exists(path):
            absolute = os.path.abspath(path)
            shown = absolute[len(PROJECT_ROOT):] if absolute.startswith(PROJECT_ROOT) else os.path.basename(path)
            sources[impl.name] = {"file": shown, "sha256": source_digest(Path(path))}
        else:
            sources[impl.name] = {"file": None, "sha256": None}
    record["sources"] = sources
    return record


def source_digest(path: Path) -> str:
    """SHA-256 of a source file, or of a package directory's Python files (each one's path within it and its
    bytes, in order of path)."""
    digest = hashlib.sha256()
    if path.is_file():
        digest.update(path.read_bytes())
    for file in sorted(path.rglob("*.py")) if path.is_dir() else ():
        digest.update(file.relative_to(path).as_posix().encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


def traceback_text() -> str:
    """The exception being handled, as a traceback whose paths inside the project are relative to it (a results
    file names no machine's directories)."""
    return traceback.format_exc(limit=8).replace(PROJECT_ROOT, "")


def error_text(error: BaseException) -> str:
    """An exception on one line: its type and its message's last line (where the libraries put the cause)."""
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[-1] if lines else ''}"[:500]


def property_verdict(passed: bool | None) -> str:
    """A property's verdict in words: None is an implementation that cannot run here (`Needs.missing`)."""
    return {True: "pass", False: "FAIL", None: "skipped"}[passed]


def geometric_mean(values) -> float | None:
    """The geometric mean of positive values; None when there are none or one is missing or zero."""
    values = list(values)
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values and all(values) else None


def summarise(results: Sequence[Result], baseline: str) -> dict:
    """Speed-ups of passing results against the passing baseline per case (set on the results), and per
    implementation the geometric mean of median times over each case set where every case passed and was timed."""
    medians = {result.key: result.median_ms for result in results if result.passed}
    for result in results:
        base = medians.get((result.case_set, result.case, baseline))
        if result.passed and result.median_ms and base:
            result.speedup = base / result.median_ms
    summary = {}
    for (case_set, impl) in dict.fromkeys((r.case_set, r.impl) for r in results):  # in the run's order
        rows = [r for r in results if r.case_set == case_set and r.impl == impl]
        complete = all(r.passed and r.median_ms for r in rows)
        entry = {"cases": len(rows), "passed": sum(r.passed for r in rows),
                 "skipped": sum(r.status == "skipped" for r in rows)}
        if complete:
            entry["geomean_ms"] = geometric_mean(r.median_ms for r in rows)
            for key in ("kernel_ms", "from_torch_ms"):
                if all(getattr(r, key) for r in rows):
                    entry[f"geomean_{key}"] = geometric_mean(getattr(r, key) for r in rows)
            entry["geomean_first_call_s"] = geometric_mean(r.first_call_s for r in rows)
        summary.setdefault(case_set, {})[impl] = entry
    return summary
