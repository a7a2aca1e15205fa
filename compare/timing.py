"""How one call is timed, the same for every implementation: the L2 flushed and the device synchronised first, then
the host clock to a device-wide synchronisation after the call (CUDA events would miss work on XLA's own streams),
or the sum of the call's kernel times from torch.profiler (which sees Triton, Pallas and XLA kernels alike)."""
from __future__ import annotations

import time
from collections import defaultdict

from ports import to_framework, to_torch


def median_after_warm_up(call, calls: int) -> float:
    """Seconds: one untimed call of `call` (which waits for its own work), then the median host time of `calls`
    calls."""
    import statistics

    call()
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def wait_for(output, on_gpu: bool = True) -> None:
    """Return once a call's work is done: each JAX array of its output (a JAX call returns before its kernels
    have run, and they run on JAX's own stream), then, on a GPU, all device work."""
    import torch

    for value in output if isinstance(output, (tuple, list)) else (output,):
        if hasattr(value, "block_until_ready"):
            value.block_until_ready()
    if on_gpu:
        torch.cuda.synchronize()


def profiled(function, native_inputs, runs: int):
    """Call `function` `runs` times under torch.profiler; returns (last output, the profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            out = function(native_inputs)
            wait_for(out)
    return out, prof


def device_ms(prof) -> dict[str, float]:
    """{kernel: total device ms} of a profiler's CUDA events."""
    import torch

    totals = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] += event.device_time / 1e3
    return totals


def profiled_calls(function, native_inputs, runs: int = 1):
    """The driver's kernel timer: (last output of `runs` profiled calls, {kernel: total device ms}), no warm-up."""
    out, prof = profiled(function, native_inputs, runs)
    return out, device_ms(prof)


L2_FLUSH_BYTES = 256 * 2**20


# What a call costs, timed three ways (Settings.timer "all" takes each in turn on every timed input):
# "host": from the port's own framework, inputs already converted, host clock between device-wide synchronisations;
# "kernels": the sum of the call's kernel times from the profiler; "from torch": the GPU MODE caller's view, torch
# tensors in and out (for a JAX implementation, DLPack both ways inside the clock).
TIMERS = ("host", "kernels", "from torch")


class Synchroniser:
    """Flushes L2 and waits for all device work, for torch and JAX outputs alike."""

    def __init__(self, on_gpu: bool):
        import torch

        self.on_gpu = on_gpu
        self.flush_buffer = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda") if on_gpu else None

    def wait(self, output=None):
        wait_for(output, self.on_gpu)

    def flush(self):
        if self.on_gpu:
            self.flush_buffer.zero_()
        self.wait()


def timed_call(how: str, function, framework: str, data, sync: Synchroniser):
    """One call of `function` on torch inputs `data`, timed `how` (one of TIMERS), L2 flushed first.
    Returns (the output as torch, seconds; None when the profiler saw no GPU kernel)."""
    bridged = how == "from torch"  # the conversions both ways inside the clock
    inputs = None if bridged else to_framework(framework, data)
    sync.flush()
    if how == "kernels":
        native, kernels = profiled_calls(function, inputs)
        return to_torch(native), (sum(kernels.values()) / 1e3 if kernels else None)
    start = time.perf_counter()
    native = function(to_framework(framework, data) if bridged else inputs)
    output = to_torch(native) if bridged else None
    sync.wait(native)
    seconds = time.perf_counter() - start
    return (output if bridged else to_torch(native)), seconds
