"""The matmul ports' host path with their kernel launches stubbed out, on the CPU: the Python each call runs around
its launch, without the launch's own cost (the cached launch's key and Triton's launcher).

    PYTHONPATH=. python results/h200/experiments/cached-launch/host_paths.py matmul:triton   (or matmul:gluon)

Prints us a call (the mean of 5000 calls on a 1 x 4096 by 4096 x 4096 bf16 product), then a cProfile of 2000 calls.
Run from the tree to measure: the before and after trees in turn, on a quiet machine.
"""
import cProfile
import pstats
import sys
import time

import torch


def microseconds_a_call(function, calls=5000):
    for _ in range(100):
        function()
    start = time.perf_counter()
    for _ in range(calls):
        function()
    return (time.perf_counter() - start) / calls * 1e6


def main(which):
    import gluon_kernels.matmul as gluon
    import triton_kernels.matmul as triton_port

    for module in (gluon, triton_port):
        module.launch = lambda *args, **kwargs: None
    port = {"matmul:triton": triton_port.matmul, "matmul:gluon": gluon.matmul}[which]
    data = (torch.zeros(1, 4096, dtype=torch.bfloat16), torch.zeros(4096, 4096, dtype=torch.bfloat16), "same")
    print(f"{which}: {microseconds_a_call(lambda: port(data)):.1f} us a call, launches stubbed")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(2000):
        port(data)
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main(sys.argv[1])
