"""How one call is timed, the same for every implementation: the L2 flushed and the device synchronised first, then
the host clock to a device-wide synchronisation after the call (CUDA events would miss work on XLA's own streams),
or the sum of the call's kernel times from torch.profiler (which sees Triton, Pallas and XLA kernels alike)."""
from __future__ import annotations

import functools
import time
from collections import defaultdict

from ports import to_framework, to_torch


def median_after_warm_up(call, calls: int, meet=None) -> float:
    """Seconds: one untimed call of `call` (which waits for its own work), then the median host time of `calls`
    calls. `meet()`, where given, runs before the clock starts and again before it stops (processes that wait for
    each other there, as `compare.across_devices.median_seconds`'s ranks)."""
    import statistics

    call()
    samples = []
    for _ in range(calls):
        if meet:
            meet()
        start = time.perf_counter()
        call()
        if meet:
            meet()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def median_kernel_us(function, data, runs: int = 10) -> float:
    """Microseconds: the median over `runs` calls of `function(data)`'s kernel time (torch inputs), each call after
    an L2 flush, as the driver's kernel timer takes it; one untimed call first (compiling, warming)."""
    import statistics

    function(data)
    sync = _gpu_synchroniser()
    return statistics.median(timed_call("kernels", function, "torch", data, sync)[1] for _ in range(runs)) * 1e6


@functools.cache
def _gpu_synchroniser():
    return Synchroniser(on_gpu=True)  # its L2 flush buffer, made once


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
# tensors in and out (for a JAX implementation, DLPack both ways inside the clock). `--timer graph` (`GraphCall`)
# is a fourth, alone: a torch port's call replayed from a CUDA graph, the cost left once host overhead is gone.
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


class GraphCall:
    """A torch port's call captured into a CUDA graph on input buffers of its own (the `--timer graph` clock): each
    call copies the inputs into the buffers, flushes L2 (both outside the clock), replays the graph between two CUDA
    events, and returns the graph's output, which the next replay overwrites. The graph is captured once, after two
    calls on a side stream (compiling and caching whatever the call keeps), from the first inputs given: a call
    that reads to the host, allocates outside the capture's pool or launches what it has not run before cannot be
    captured, and says so. The replay computes from the buffers' values, so every output is checked as any call's."""

    def __init__(self, function, buffers):
        self.buffers = buffers  # the inputs' structure, tensors of their own (`compare.driver.kept_copy`)
        try:
            self.graph, self.output = captured(lambda: function(self.buffers))
        except Exception as error:
            raise RuntimeError(f"the call cannot be captured into a CUDA graph: {type(error).__name__}: {error}") \
                from error

    def __call__(self, data, sync: Synchroniser):
        _copy_into(self.buffers, data)
        sync.flush()
        return self.output, replay_seconds(self.graph)


def captured(call):
    """(a CUDA graph of `call`, the output its replays write), captured after two warm-up calls on a side stream."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = call()
    return graph, output


def replay_seconds(graph) -> float:
    """Seconds of one replay of a CUDA graph, between two CUDA events."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def _copy_into(buffers, data) -> None:
    """Each tensor of `data` copied into the tensor at its place in `buffers` (dicts, tuples and lists alike)."""
    if isinstance(buffers, dict):
        for key in buffers:
            _copy_into(buffers[key], data[key])
    elif isinstance(buffers, (tuple, list)):
        for buffer, item in zip(buffers, data, strict=True):
            _copy_into(buffer, item)
    elif hasattr(buffers, "copy_"):
        buffers.copy_(data)


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
