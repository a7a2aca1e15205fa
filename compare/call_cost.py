"""What a call costs besides its kernels: each piece of the driver's timed call, measured alone on a trivial kernel.

    python -m compare.call_cost [--calls 200] [--json FILE]

The driver's host clock starts after an L2 flush and a device-wide synchronisation and stops at the next
synchronisation, so a port's "overhead" (host clock minus its kernels) holds the port's own host work and also the
clock's: a launch onto an idle GPU and a synchronisation round trip. A JAX call adds its dispatch, and a call from
torch the DLPack conversions both ways. Each is measured here alone, on a one-element add, so that a port's overhead
can be read against them. Each figure is the median of --calls, in microseconds:
- "back-to-back": --calls calls, then one synchronisation, divided by the calls: the host's cost of a call when
  the device keeps up (what a caller in a loop pays);
- "between synchronisations": one call from an idle, synchronised device to the end of its work, as the driver
  clocks every timed call.
Runs on a CPU too (no flush; the Pallas kernels in their interpreters), where the figures are the CPU's own and say
nothing of a GPU's.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

INPUT_ARRAYS = 13  # a TriMul call's arrays: x, mask and 11 weights


def _median_us(samples) -> float:
    return statistics.median(samples) * 1e6


def pieces(on_gpu: bool):
    """[(name, what it is, function of calls -> microseconds)], in the order printed."""
    import jax
    import jax.numpy as jnp
    import torch

    from compare.driver import L2_FLUSH_BYTES
    from compare.kernel_times import wait_for
    from ports import to_framework, to_torch

    device = "cuda" if on_gpu else "cpu"
    tensor = torch.zeros(1, device=device)
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

    def between_synchronisations(call, before=lambda: None):
        def measure(calls):
            wait_for(call(), on_gpu)
            samples = []
            for _ in range(calls):
                before()
                synchronise()
                start = time.perf_counter()
                wait_for(call(), on_gpu)
                samples.append(time.perf_counter() - start)
            return _median_us(samples)
        return measure

    def alone(call):
        def measure(calls):
            call()
            samples = []
            for _ in range(calls):
                start = time.perf_counter()
                call()
                samples.append(time.perf_counter() - start)
            return _median_us(samples)
        return measure

    add_one = jax.jit(lambda v: v + 1)
    first_plus_one = jax.jit(lambda arrays: arrays[0] + 1)  # the other arrays are passed, not read
    native = to_framework("jax", tensor)
    natives = to_framework("jax", many)
    pallas_triton, mosaic_gpu = _pallas_add_ones(on_gpu)
    try:  # the stream JAX hands a DLPack producer, as jax.dlpack.from_dlpack asks for it
        jax_stream = native.devices().pop().get_stream_for_external_ready_events() if on_gpu else None
    except Exception:  # noqa: BLE001 - a backend without external streams
        jax_stream = None
    return [
        ("synchronise", "torch.cuda.synchronize() on an idle device", alone(synchronise)),
        ("L2 flush", "the driver's 256 MiB flush, then synchronise", alone(lambda: (flush.zero_(), synchronise()))),
        ("torch, back-to-back", "one-element add_ (a launch)", back_to_back(lambda: tensor.add_(1))),
        ("torch, between synchronisations", "the same, clocked as the driver clocks a call",
         between_synchronisations(lambda: tensor.add_(1))),
        ("torch, after a flush", "the same, after the L2 flush",
         between_synchronisations(lambda: tensor.add_(1), before=lambda: flush.zero_())),
        ("jax, back-to-back", "jax.jit(v + 1): dispatch of one XLA kernel", back_to_back(lambda: add_one(native))),
        ("jax, between synchronisations", "the same, clocked as the driver clocks a call",
         between_synchronisations(lambda: add_one(native))),
        (f"jax, {INPUT_ARRAYS} arrays, back-to-back", f"jax.jit taking {INPUT_ARRAYS} arrays (a TriMul call's)",
         back_to_back(lambda: first_plus_one(natives))),
        ("pallas-triton, back-to-back", "a Pallas kernel (Triton lowering) adding one",
         back_to_back(lambda: pallas_triton(native))),
        ("pallas-triton, between synchronisations", "the same, clocked as the driver clocks a call",
         between_synchronisations(lambda: pallas_triton(native))),
        ("mosaic-gpu, back-to-back", "a Pallas kernel on Mosaic GPU adding one",
         back_to_back(lambda: mosaic_gpu(native))),
        ("dlpack torch to jax, 1 array", "jax.dlpack.from_dlpack of a torch tensor",
         alone(lambda: to_framework("jax", tensor))),
        (f"dlpack torch to jax, {INPUT_ARRAYS} arrays", "the same for a TriMul call's arrays",
         alone(lambda: to_framework("jax", many))),
        ("  of which torch's __dlpack__", "the producer's part: the capsule, and the wait for torch's stream",
         alone(lambda: tensor.__dlpack__(stream=jax_stream))),
        ("dlpack jax to torch, 1 array", "torch.from_dlpack of a JAX array", alone(lambda: to_torch(native))),
        ("from torch, between synchronisations", "convert, jax.jit(v + 1), convert back, as the driver's "
         "'from torch' clock", between_synchronisations(lambda: to_torch(add_one(to_framework("jax", tensor))))),
    ] + ([("jnp zeros", "for scale: jnp.zeros(1) on the host", alone(lambda: jnp.zeros(1)))] if not on_gpu else [])


def _pallas_add_ones(on_gpu: bool):
    """Two jitted one-element kernels adding one: Pallas on its Triton lowering, and on Mosaic GPU."""
    import jax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from mosaic_gpu_kernels.matmul import _interpret_params

    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1

    def triton_add(x):
        return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=not on_gpu)(x)

    def mosaic_add(x):
        wide = jax.numpy.broadcast_to(x, (128,))  # Mosaic GPU's plain loads take 128 elements at least
        return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((128,), x.dtype), grid=(1,), grid_names=("one",),
                            interpret=None if on_gpu else _interpret_params())(wide)[:1]

    return jax.jit(triton_add), jax.jit(mosaic_add)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m compare.call_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200, help="calls a figure is the median of (default 200)")
    parser.add_argument("--json", type=Path, help="write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.calls < 1:
        parser.error("--calls must be at least 1")
    from compare import gpu_or_interpreters
    from compare.driver import device_info, error_text, versions

    on_gpu = gpu_or_interpreters()
    rows = []
    print(f"{'piece':42} {'us a call':>10}  what it is")
    for name, what, measure in pieces(on_gpu):
        try:
            figure = measure(args.calls)
            print(f"{name:42} {figure:10.1f}  {what}")
        except Exception as error:  # noqa: BLE001 - one piece's failure is reported; the others still run
            figure = None
            print(f"{name:42} {'failed':>10}  {what}: {error_text(error)}")
        rows.append({"piece": name, "what": what, "us": figure})
        sys.stdout.flush()
    if args.json:
        args.json.write_text(json.dumps({"device": device_info(), "versions": versions(), "calls": args.calls,
                                         "pieces": rows}, indent=1))
    return 1 if any(row["us"] is None for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
