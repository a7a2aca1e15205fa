"""Where the compiler puts CTA barriers in the Gluon matmul kernel at 128 x 256 tiles (3000 x 5120 x 2880), with the
port's `cta_barrier` in `store_tile` and without it (the copies of ragged_fix_ab.py): the PTX's barriers, TMA
copies, wgmma waits and shared stores from the K loop's end to the output tile's store, compiled for sm_90 by the
installed Triton through `compare.tools.hopper_compile.compile_launches` (no GPU needed).

    PYTHONPATH=. python results/h200/experiments/gluon-matmul/barrier_ptx.py   (TRITON_INTERPRET unset)
"""
import re

import torch
import triton

from compare.tools.hopper_compile import compile_launches
from ragged_fix_ab import SOURCE, UNFENCED, load  # this script's folder is on sys.path

SHOWN = re.compile(r"bar\.sync|cp\.async\.bulk\.tensor|wgmma\.wait_group|stmatrix|st\.shared|crit_edge")


def after_the_k_loop(ptx: str) -> list[str]:
    """The shown instructions from the K loop's exit to the output tile's TMA store, runs of one folded."""
    lines = [re.sub(r"\s+", " ", line.strip().split("[")[0])[:70] for line in ptx.splitlines() if SHOWN.search(line)]
    lines = lines[next(i for i, line in enumerate(lines) if "crit_edge" in line):]
    lines = lines[:next(i for i, line in enumerate(lines) if "global.shared" in line) + 1]
    folded = []
    for line in lines:
        if folded and folded[-1][1] == line:
            folded[-1][0] += 1
        else:
            folded.append([1, line])
    return [f"{count} x {line}" for count, line in folded]


def main():
    m, n, k = 3000, 5120, 2880
    inputs = (torch.zeros((m, k), dtype=torch.bfloat16), torch.zeros((k, n), dtype=torch.bfloat16), "same")
    print(f"triton {triton.__version__}")
    for name, text in (("with cta_barrier", SOURCE), ("without it", UNFENCED)):
        (kernel,) = compile_launches(load(name, text).matmul, inputs)
        print(f"\n{name}: after the K loop")
        print("\n".join(f"  {line}" for line in after_the_k_loop(kernel.ptx)))


if __name__ == "__main__":
    main()
