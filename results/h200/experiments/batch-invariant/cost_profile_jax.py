"""Where the JAX transformation's time goes in the invariance record's decoder (issue 54: the training step 1.45x at
batch 64 with `batch_invariant`, the forward pass 1.15x): jax.profiler's trace of a few training steps and forward
passes, the transformation off and on, its device events summed by name. Prints, per pass and setting, the events a
pass and their time, then the largest names by time a pass, so that what the transformation adds (the ports' and
row kernels' launches, and the copies and fusions around them) is read against what XLA runs without it.

    python results/h200/experiments/batch-invariant/cost_profile_jax.py [--batch 64] [--passes 5]   (on a GPU)

On a CPU (`--small`, the decoder at the tests' sizes) it runs the same steps and sums the host's events instead: a
check of the script, not a measurement.
"""
import argparse
import collections
import glob
import gzip
import json
import os
import tempfile

import jax
import numpy as np

from compare.invariance.decoder import Decoder, JaxRunner

RECORD_MODEL = dict(vocab=32768, dim=1024, heads=8, hidden=4096, layers=2, length=128)
SMALL_MODEL = dict(vocab=64, dim=32, heads=4, hidden=64, layers=2, length=8)


def device_events(trace_dir: str, device: str) -> list[tuple[str, float]]:
    """(name, microseconds) of every complete event on a process whose name holds `device`, from the Perfetto trace
    jax.profiler wrote under trace_dir: on its stream threads only where it has some (a GPU's kernels; its other
    threads, XLA's ops and modules, span the same kernels again)."""
    [path] = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
    with gzip.open(path) as file:
        events = json.load(file)["traceEvents"]

    def named(kind: str, holding: str) -> set:
        return {(event["pid"], event.get("tid")) if kind == "thread_name" else event["pid"] for event in events
                if event.get("ph") == "M" and event.get("name") == kind
                and holding in event.get("args", {}).get("name", "")}

    processes = named("process_name", device)
    streams = {(pid, tid) for pid, tid in named("thread_name", "Stream") if pid in processes}
    return [(event["name"], float(event.get("dur", 0.0))) for event in events
            if event.get("ph") == "X" and event.get("pid") in processes
            and (not streams or (event["pid"], event.get("tid")) in streams)]


def profile(run, passes: int, device: str) -> list[tuple[str, float]]:
    run()  # compiled and warm
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
            for _ in range(passes):
                run()
        return device_events(trace_dir, device)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--rows", type=int, default=12, help="names printed a setting")
    parser.add_argument("--small", action="store_true", help="the tests' decoder sizes (a CPU check)")
    args = parser.parse_args(argv)
    on_gpu = jax.default_backend() == "gpu"
    model = Decoder(**(SMALL_MODEL if args.small else RECORD_MODEL))
    runner = JaxRunner(model, model.weights(0), on_gpu=on_gpu)
    tokens = model.tokens(args.batch, 0)
    device = "GPU" if on_gpu else "CPU"
    for what, call in (("training step", runner.train_step), ("forward pass", runner.forward)):
        for invariant in (False, True):
            events = profile(lambda: call(tokens, invariant), args.passes, device)
            by_name = collections.defaultdict(lambda: [0, 0.0])
            for name, micros in events:
                by_name[name][0] += 1
                by_name[name][1] += micros
            total = sum(micros for _, micros in events) / args.passes
            print(f"\n=== {what}, batch {args.batch}, transformation {'on' if invariant else 'off'}: "
                  f"{len(events) / args.passes:.0f} {device} events a pass, {total / 1e3:.3f} ms of them")
            for name, (count, micros) in sorted(by_name.items(), key=lambda item: -item[1][1])[:args.rows]:
                print(f"{micros / args.passes / 1e3:9.3f} ms {count / args.passes:6.1f}x  {name[:90]}")


if __name__ == "__main__":
    np.set_printoptions(linewidth=120)
    main()
