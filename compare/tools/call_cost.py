"""What a call costs besides its kernels: each piece of the driver's timed call, measured alone on a trivial kernel.

    python -m compare.tools.call_cost [--calls 200] [--json FILE]
    python -m compare.tools.call_cost --port trimul:pallas --case bench:0 [--calls 20] [--profile] [--json FILE]

The driver's host clock starts after an L2 flush and a device-wide synchronisation and stops at the next
synchronisation, so a port's "overhead" (host clock minus its kernels) holds the port's own host work and also the
clock's: a launch onto an idle GPU and a synchronisation round trip. A JAX call adds its dispatch, and a call from
torch the DLPack conversions both ways. Each is measured here alone, on a one-element add, so that a port's overhead
can be read against them: a launch of each language's kernel (Triton's launcher; Gluon's, bare and with one TMA
descriptor made for the call or made once, on a GPU only), a JAX dispatch, DLPack each way, and a scalar read back
in each framework (what a port's own check of its output or input costs, where it reads a value on the host). Each
figure is the median of --calls, in microseconds:
- "back-to-back": --calls calls, then one synchronisation, divided by the calls: the host's cost of a call when
  the device keeps up (what a caller in a loop pays);
- "between synchronisations": one call from an idle, synchronised device to the end of its work, as the driver
  clocks every timed call.

With --port WORKLOAD:IMPL, one real port's call from torch is taken apart instead, on the case --case SET:INDEX
(default bench:0, smoke:0 without a GPU), its inputs made once. Each piece is clocked as the driver clocks a call
(L2 flush, synchronise, clock, the piece, wait for its outputs and synchronise, clock), the median of --calls:
- "to_framework": the torch inputs converted to the port's framework (the identity for a torch port);
- "call, converted once": the port's function on arrays converted once beforehand;
- "host clock": the driver's own host clock (its timed_call), the inputs converted just before, outside the
  clock; "host clock, fresh tensors": the same on clones of the torch inputs, fresh memory each call, as the
  driver's timed inputs are (its `vary` makes new tensors for every timed call);
- "host clock, AWAY_MS ms away": the driver's host clock after AWAY_MS of other host work (a busy loop): its checks and
  input gathers put about that much between two timed calls, and a port's host path (Python, torch, the
  launcher) runs slower after it, cold, than right after its own last call; "..., one call before": the same
  with an untimed call of the port just before the timed one, which warms that path again;
- "to_torch": the port's output converted back to torch;
- "from torch": the driver's "from torch" clock, custom_kernel's call (convert, call, convert back) inside it;
  "from torch, fresh tensors": the same on clones.
The driver's "bridge" is "from torch" less "host clock"; the pieces say what of it is the conversions and what the
call itself (a slower call on freshly converted arrays shows as "host clock" above "call, converted once"). On a
GPU, "kernels" (the driver's kernel timer) comes first, so the driver's "overhead" (host clock less kernels) is
read in one process on one input, and the cudaMalloc column counts torch's caching allocator's trips to the device
during each piece's calls (its warm-up included): a call whose buffers find no cached block pays for them inside
the host clock, which no kernel time shows. With --profile, the port's call is then profiled back to back (--calls
calls, cProfile): the functions with the most time of their own, in microseconds a call, where its host path goes.
Runs on a CPU too (no flush; the Pallas kernels in their interpreters), where the figures are the CPU's own and say
nothing of a GPU's.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

INPUT_ARRAYS = 13  # a TriMul call's arrays: x, mask and 11 weights
AWAY_MS = 20  # about what the driver's output check and input gather take between two timed TriMul calls
PROFILE_ROWS = 15


def _median_us(samples) -> float:
    return statistics.median(samples) * 1e6


def _device_allocations(on_gpu: bool) -> int | None:
    """How many times torch's caching allocator has gone to the device for memory (cudaMalloc) so far: a call that
    finds no cached block pays for one inside the driver's host clock, and not in its kernel times."""
    if not on_gpu:
        return None
    import torch

    return torch.cuda.memory_stats().get("num_device_alloc")


def between_synchronisations(call, on_gpu: bool, before=lambda: None):
    """A measure (calls -> microseconds) of `call` clocked as the driver clocks a call: after a warm-up call, each
    time `before()` (an L2 flush, say), a device-wide synchronisation, then the clock to the end of the call's work
    (its JAX arrays ready, the device synchronised); the median."""
    from compare.timing import wait_for

    def measure(calls):
        wait_for(call(), on_gpu)
        samples = []
        for _ in range(calls):
            before()
            wait_for(None, on_gpu)  # synchronise
            start = time.perf_counter()
            wait_for(call(), on_gpu)
            samples.append(time.perf_counter() - start)
        return _median_us(samples)
    return measure


def pieces(on_gpu: bool):
    """[(name, what it is, function of calls -> microseconds)], in the order printed."""
    import jax
    import jax.numpy as jnp
    import torch

    from compare.timing import L2_FLUSH_BYTES, median_after_warm_up, wait_for
    from mosaic_gpu_kernels.launch_cost import add_one as mosaic_gpu_add_one
    from pallas_kernels.launch_cost import add_one as pallas_add_one
    from ports import to_framework, to_torch
    from triton_kernels.launch_cost import add_one as triton_add_one

    device = "cuda" if on_gpu else "cpu"
    tensor = torch.zeros(1, device=device)
    scalar = torch.zeros((), device=device)
    many = [torch.zeros(1, device=device) for _ in range(INPUT_ARRAYS)]
    flush = torch.empty(L2_FLUSH_BYTES if on_gpu else 1, dtype=torch.int8, device=device)

    def synchronise():
        if on_gpu:
            torch.cuda.synchronize()

    def back_to_back(call):
        def measure(calls):
            call()
            synchronise()
            start = time.perf_counter()
            for _ in range(calls):
                out = call()
            wait_for(out, on_gpu)
            return (time.perf_counter() - start) / calls * 1e6
        return measure

    def alone(call):
        def measure(calls):
            return median_after_warm_up(call, calls) * 1e6
        return measure

    add_one = jax.jit(lambda v: v + 1)
    first_plus_one = jax.jit(lambda arrays: arrays[0] + 1)  # the other arrays are passed, not read
    native = to_framework("jax", tensor)
    native_scalar = to_framework("jax", scalar)
    natives = to_framework("jax", many)
    pallas_triton, mosaic_gpu = pallas_add_one(on_gpu), mosaic_gpu_add_one(on_gpu)
    try:  # the stream JAX hands a DLPack producer, as jax.dlpack.from_dlpack asks for it
        jax_stream = native.devices().pop().get_stream_for_external_ready_events() if on_gpu else None
    except Exception:  # noqa: BLE001 - a backend without external streams
        jax_stream = None
    return [
        ("synchronise", "torch.cuda.synchronize() on an idle device", alone(synchronise)),
        ("L2 flush", "the driver's 256 MiB flush, then synchronise", alone(lambda: (flush.zero_(), synchronise()))),
        ("torch, back-to-back", "one-element add_ (a launch)", back_to_back(lambda: tensor.add_(1))),
        ("torch, between synchronisations", "the same, clocked as the driver clocks a call",
         between_synchronisations(lambda: tensor.add_(1), on_gpu)),
        ("torch, after a flush", "the same, after the L2 flush",
         between_synchronisations(lambda: tensor.add_(1), on_gpu, before=lambda: flush.zero_())),
        ("torch, a scalar read back", "float() of a 0-d add_: a launch, then its value on the host (as the "
         "JAX TriMul ports' range check reads its sum)", alone(lambda: float(scalar.add_(1)))),
        ("jax, back-to-back", "jax.jit(v + 1): dispatch of one XLA kernel", back_to_back(lambda: add_one(native))),
        ("jax, between synchronisations", "the same, clocked as the driver clocks a call",
         between_synchronisations(lambda: add_one(native), on_gpu)),
        ("jax, a scalar read back", "float() of jax.jit(v + 1) on a 0-d array: its value on the host (as the JAX "
         "TriMul ports' range check and the Pallas eigh's input checks read theirs)",
         alone(lambda: float(add_one(native_scalar)))),
        ("jax, a scalar read back through torch", "the same, its value read by torch: torch.from_dlpack, then float()",
         alone(lambda: float(torch.from_dlpack(add_one(native_scalar))))),
        (f"jax, {INPUT_ARRAYS} arrays, back-to-back", f"jax.jit taking {INPUT_ARRAYS} arrays (a TriMul call's)",
         back_to_back(lambda: first_plus_one(natives))),
        ("pallas-triton, back-to-back", "a Pallas kernel (Triton lowering) adding one",
         back_to_back(lambda: pallas_triton(native))),
        ("pallas-triton, between synchronisations", "the same, clocked as the driver clocks a call",
         between_synchronisations(lambda: pallas_triton(native), on_gpu)),
        ("triton, back-to-back", "a Triton kernel adding one (a pointer and a size): Triton's launcher",
         back_to_back(lambda: triton_add_one(tensor))),
        ("triton, between synchronisations", "the same, clocked as the driver clocks a call",
         between_synchronisations(lambda: triton_add_one(tensor), on_gpu)),
        *(_gluon_pieces(back_to_back, alone) if on_gpu else []),
        ("mosaic-gpu, back-to-back", "a Pallas kernel on Mosaic GPU adding one",
         back_to_back(lambda: mosaic_gpu(native))),
        ("dlpack torch to jax, 1 array", "jax.dlpack.from_dlpack of a torch tensor",
         alone(lambda: to_framework("jax", tensor))),
        (f"dlpack torch to jax, {INPUT_ARRAYS} arrays", "the same for a TriMul call's arrays",
         alone(lambda: to_framework("jax", many))),
        ("  of which torch's __dlpack__", "the producer's part: the capsule, and the wait for torch's stream",
         alone(lambda: tensor.__dlpack__(stream=jax_stream))),
        *_dlpack_import_pieces(tensor, native, alone),
        ("dlpack jax to torch, 1 array", "torch.from_dlpack of a JAX array", alone(lambda: to_torch(native))),
        ("from torch, between synchronisations", "convert, jax.jit(v + 1), convert back, as the driver's "
         "'from torch' clock",
         between_synchronisations(lambda: to_torch(add_one(to_framework("jax", tensor))), on_gpu)),
    ] + ([("jnp zeros", "for scale: jnp.zeros(1) on the host", alone(lambda: jnp.zeros(1)))] if not on_gpu else [])


def _dlpack_import_pieces(tensor, native, alone) -> list:
    """The rest of `jax.dlpack.from_dlpack`, piece by piece, as jax 0.10-0.11 write it (jax/_src/dlpack.py): the
    backend, device and stream lookups, the buffer import of the producer's capsule (torch's `__dlpack__` again
    included: a capsule is consumed by its import), and the dtype canonicalisation. Private JAX API: where this
    JAX lacks it, no pieces (the whole import above stands)."""
    import jax.numpy as jnp
    from jax._src import xla_bridge

    try:
        from jax._src.lib import _jax, jaxlib_extension_version
    except ImportError:
        return []
    device_type, device_id = tensor.__dlpack_device__()
    platform = "cuda" if tensor.is_cuda else "cpu"

    def lookups():
        device = xla_bridge.get_backend(platform).device_from_local_hardware_id(device_id)
        try:
            return device, device.get_stream_for_external_ready_events()
        except Exception:  # noqa: BLE001 - UNIMPLEMENTED on a CPU, as from_dlpack treats it
            return device, None

    device, stream = lookups()
    extra = (int(device_type),) if jaxlib_extension_version >= 467 else ()

    def buffer_import():
        return _jax.dlpack_managed_tensor_to_buffer(tensor.__dlpack__(stream=stream), device, stream, None, *extra)

    return [
        ("  of which the lookups", "backend, device and the stream for the producer's events", alone(lookups)),
        ("  of which __dlpack__ and the import", "the capsule made and turned into a JAX buffer",
         alone(buffer_import)),
        ("  of which jnp.asarray", "the dtype canonicalisation of the imported array",
         alone(lambda: jnp.asarray(native, dtype=native.dtype))),
    ]


def _port_call(workload, case: dict, impl, on_gpu: bool):
    """(function, framework, torch inputs, inputs converted, output, synchroniser) of one port on one case, its
    function called once (the compile)."""
    from compare.timing import Synchroniser
    from ports import to_framework

    sync = Synchroniser(on_gpu)
    function, framework = impl.load(), impl.framework
    data = workload.make_inputs(case, case["seed"], "cuda" if on_gpu else "cpu")
    converted = to_framework(framework, data)
    output = function(converted)
    sync.wait(output)
    return function, framework, data, converted, output, sync


def port_pieces(workload, case: dict, impl, on_gpu: bool):
    """[(name, what it is, function of calls -> microseconds)] of one port's call from torch on one case, taken
    apart (see the module's help); the case's inputs are made, converted and called once here (the compile)."""
    import torch
    from torch.utils._pytree import tree_leaves, tree_map

    from compare.timing import timed_call
    from ports import to_framework, to_torch

    function, framework, data, converted, output, sync = _port_call(workload, case, impl, on_gpu)

    def fresh():  # the torch inputs cloned: new memory, as the driver's timed inputs are
        return tree_map(lambda value: value.clone() if isinstance(value, torch.Tensor) else value, data)

    def driver_clock(how, inputs=lambda: data, before=lambda: None):
        """The driver's own timed_call, inputs made outside the clock, `before()` ahead of each call."""
        def measure(calls):
            samples = []
            for _ in range(calls):
                before()
                samples.append(timed_call(how, function, framework, inputs(), sync)[1])
            return _median_us(samples)
        return measure

    kernels = [("kernels", "the port's kernels alone, the profiler's sum (the driver's kernel timer): the driver's "
                "overhead is host clock less this", driver_clock("kernels"))] if on_gpu else []
    return kernels + [
        ("to_framework", "the torch inputs to the port's framework, its arrays waited for",
         between_synchronisations(lambda: tree_leaves(to_framework(framework, data)), on_gpu, sync.flush)),
        ("call, converted once", "the port's function on arrays converted once beforehand",
         between_synchronisations(lambda: function(converted), on_gpu, sync.flush)),
        ("host clock", "the same on arrays converted just before, outside the clock: the driver's host clock",
         driver_clock("host")),
        ("host clock, fresh tensors", "the same, the torch inputs cloned first (fresh memory, as the driver's)",
         driver_clock("host", fresh)),
        (f"host clock, {AWAY_MS} ms away", f"the same after {AWAY_MS} ms of other host work (a busy loop), as "
         "the driver's checks and input gathers come between its timed calls",
         driver_clock("host", before=lambda: _busy(AWAY_MS / 1e3))),
        (f"host clock, {AWAY_MS} ms away, one call before", "the same with an untimed call of the port just "
         "before the timed one", driver_clock("host", before=lambda: (_busy(AWAY_MS / 1e3),
                                                                      sync.wait(function(converted))))),
        ("to_torch", "the port's output back to torch",
         between_synchronisations(lambda: to_torch(output), on_gpu, sync.flush)),
        ("from torch", "convert, call, convert back (custom_kernel): the driver's 'from torch' clock",
         driver_clock("from torch")),
        ("from torch, fresh tensors", "the same, the torch inputs cloned first", driver_clock("from torch", fresh)),
    ]


def _busy(seconds: float) -> None:
    """Keep the host busy (not asleep) for `seconds`."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def profile_port(workload, case: dict, impl, on_gpu: bool, calls: int, rows: int = PROFILE_ROWS) -> list[dict]:
    """cProfile of `calls` back-to-back calls of one port on inputs converted once: the `rows` functions with the
    most time of their own, each as microseconds a call (its own and with what it calls) and calls a call."""
    import cProfile
    import pstats

    function, _, _, converted, _, sync = _port_call(workload, case, impl, on_gpu)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        output = function(converted)
    profile.disable()
    sync.wait(output)
    measured = pstats.Stats(profile).stats  # {(file, line, function): (calls, primitive, own s, total s, callers)}
    top = sorted(measured.items(), key=lambda item: -item[1][2])[:rows]
    return [{"function": f"{_short_path(file)}:{line}({name})" if line else name, "own_us": own / calls * 1e6,
             "total_us": total / calls * 1e6, "calls_a_call": count / calls}
            for (file, line, name), (count, _, own, total, _) in top]


def _short_path(file: str) -> str:
    """A source file's path from its package on (an installed package's or this repository's), or the standard
    library's file name: never the machine's paths."""
    root = str(Path(__file__).resolve().parents[2]) + os.sep
    if "site-packages" + os.sep in file:
        return file.split("site-packages" + os.sep)[-1]
    return file.removeprefix(root) if file.startswith(root) else Path(file).name


def _gluon_pieces(back_to_back, alone) -> list:
    """Gluon launches (GPU only: no interpreter runs Gluon): an empty kernel taking a pointer, and one taking a TMA
    descriptor made for each call as the Gluon ports make theirs (the layout kept, the descriptor new), so the
    difference is what one descriptor adds to a call: its construction and the launcher's encoding of it; then the
    same with the descriptor made once, the launcher's part alone."""
    import torch

    from gluon_kernels.launch_cost import takes_a_descriptor, takes_a_pointer
    from gluon_kernels.matmul import descriptor

    tile = torch.zeros(64, 64, dtype=torch.float16, device="cuda")
    made_once = descriptor(tile, [64, 64])
    return [
        ("gluon, back-to-back", "an empty Gluon kernel taking a pointer", back_to_back(
            lambda: takes_a_pointer[(1,)](tile))),
        ("gluon with a TMA descriptor, back-to-back", "an empty Gluon kernel taking a [64, 64] fp16 TMA descriptor, "
         "made for the call", back_to_back(lambda: takes_a_descriptor[(1,)](descriptor(tile, [64, 64])))),
        ("  of which the descriptor", "gluon_kernels.matmul.descriptor alone (host work)",
         alone(lambda: descriptor(tile, [64, 64]))),
        ("gluon with a TMA descriptor made once, back-to-back", "the same, the descriptor made beforehand: the "
         "launcher's part", back_to_back(lambda: takes_a_descriptor[(1,)](made_once))),
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m compare.tools.call_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, help="calls a figure is the median of (default 200; 20 with --port)")
    parser.add_argument("--json", type=Path, help="write the figures to this JSON file")
    parser.add_argument("--port", metavar="WORKLOAD:IMPL", help="take this port's call from torch apart instead, "
                        "on --case (e.g. trimul:pallas; `python -m compare --list` lists them)")
    parser.add_argument("--case", metavar="SET:INDEX", help="with --port: the case (default bench:0; smoke:0 without "
                        "a GPU)")
    parser.add_argument("--profile", action="store_true", help="with --port: then profile --calls back-to-back "
                        "calls (cProfile) and list the functions with the most time of their own")
    args = parser.parse_args(argv)
    calls = args.calls if args.calls is not None else 20 if args.port else 200
    if calls < 1:
        parser.error("--calls must be at least 1")
    if (args.case or args.profile) and not args.port:
        parser.error("--case and --profile go with --port")
    if args.port:  # JAX is told not to take the GPU's memory up front: torch holds the case's inputs
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    from compare import gpu_or_interpreters
    from compare.records import device_info, error_text, versions
    from compare.tools.one_case import one_case

    on_gpu = gpu_or_interpreters()
    about = {}
    if args.port:
        workload_name, _, impl_name = args.port.partition(":")
        try:
            workload, case = one_case(workload_name, args.case or ("bench:0" if on_gpu else "smoke:0"))
            impl = workload.implementation(impl_name)
        except (KeyError, ValueError) as error:
            parser.error(error.args[0] if error.args else str(error))
        missing = impl.needs.missing()
        if missing:
            print(f"{args.port} cannot run here: {missing}", file=sys.stderr)
            return 1
        about = {"port": args.port, "case": workload.case_name(case), "params": case}
        print(f"{args.port} on {about['case']}, from torch, taken apart")
        measured = port_pieces(workload, case, impl, on_gpu)
    else:
        measured = pieces(on_gpu)
    rows = []
    print(f"{'piece':42} {'us a call':>10} {'cudaMalloc':>10}  what it is")
    for name, what, measure in measured:
        before = _device_allocations(on_gpu)
        try:
            figure = measure(calls)
            shown = f"{figure:10.1f}"
        except Exception as error:  # noqa: BLE001 - one piece's failure is reported; the others still run
            figure, shown, what = None, f"{'failed':>10}", f"{what}: {error_text(error)}"
        allocations = None if before is None else _device_allocations(on_gpu) - before
        print(f"{name:42} {shown} {'-' if allocations is None else allocations:>10}  {what}")
        rows.append({"piece": name, "what": what, "us": figure, "device_allocations": allocations})
        sys.stdout.flush()
    if args.profile:
        about["profile"] = profile_port(workload, case, impl, on_gpu, calls)
        print("\nits call back to back, profiled: us a call, the function's own and with what it calls")
        print(f"{'own':>8} {'total':>8} {'calls':>6}  function")
        for row in about["profile"]:
            print(f"{row['own_us']:8.1f} {row['total_us']:8.1f} {row['calls_a_call']:6.1f}  {row['function']}")
    if args.json:
        args.json.write_text(json.dumps({"device": device_info(), "versions": versions(), "calls": calls, **about,
                                         "pieces": rows}, indent=1))
    return 1 if any(row["us"] is None for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
