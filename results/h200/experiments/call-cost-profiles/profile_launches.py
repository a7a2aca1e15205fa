"""Where a launch's host time goes: cProfile of back-to-back launches of three empty-bodied kernels (GPU only).

    python results/h200/experiments/call-cost-profiles/profile_launches.py [--launches 5000]

The kernels are compare.tools.call_cost's (triton_kernels.launch_cost, gluon_kernels.launch_cost): a Triton kernel
adding one (a pointer and a size), an empty Gluon kernel taking a pointer, and the same taking a [64, 64] fp16 TMA
descriptor made once beforehand. Each is timed back to back
without the profiler, then profiled; the functions with the most time of their own are printed.
"""
import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from gluon_kernels.launch_cost import takes_a_descriptor, takes_a_pointer  # noqa: E402
from gluon_kernels.matmul import descriptor  # noqa: E402
from triton_kernels.launch_cost import add_one  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--launches", type=int, default=5000)
    launches = parser.parse_args().launches
    tile = torch.zeros(64, 64, dtype=torch.float16, device="cuda")
    made_once = descriptor(tile, [64, 64])
    kernels = {
        "triton add-one": lambda: add_one(tile),
        "gluon, a pointer": lambda: takes_a_pointer[(1,)](tile),
        "gluon, a descriptor made once": lambda: takes_a_descriptor[(1,)](made_once),
    }
    for name, launch in kernels.items():
        launch()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(launches):
            launch()
        torch.cuda.synchronize()
        print(f"== {name}: {(time.perf_counter() - start) / launches * 1e6:.1f} us a launch, back to back")
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(launches):
            launch()
        profile.disable()
        torch.cuda.synchronize()
        pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
