"""Every kernel launch of triton_kernels/eigh/divide_conquer.py at each n given (default 512 and 1024) compiled for
sm_90 (no GPU needed; compare.hopper_compile's interception, as the launch specialises): n, name, warps, compile
seconds, shared bytes, registers, spilled bytes, error.

    PYTHONPATH=. python results/h200/experiments/eigh-prototypes/divide_conquer_compiles.py [N ...]
"""
import sys

import torch

from compare.hopper_compile import compile_launches
from triton_kernels.eigh import divide_conquer

for n in [int(size) for size in sys.argv[1:]] or [512, 1024]:
    d, e = torch.randn(2, n), torch.randn(2, n)
    for entry in compile_launches(lambda inputs: divide_conquer.solve(*inputs), (d, e, torch.ones(2)), specialise=True):
        print(n, entry.name, entry.warps, f"{entry.seconds:.1f}s", entry.shared_bytes, entry.registers,
              entry.spilled_bytes, entry.error, flush=True)
