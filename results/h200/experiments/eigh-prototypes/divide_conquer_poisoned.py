"""The Triton divide and conquer on the tridiagonals of random dense symmetric matrices, in the Triton interpreter,
with every scratch buffer of `solve` poisoned (floats NaN, integers far negative): an entry read before it is
written shows as a NaN or an out-of-range index. Prints each T's residual and orthogonality in the eigh gates' units.

    TRITON_INTERPRET=1 PYTHONPATH=. python results/h200/experiments/eigh-prototypes/divide_conquer_poisoned.py \
        N COUNT SEED

T comes from LAPACK's float64 reduction (scipy's `hessenberg` of a symmetric matrix), rounded to float32: not the
port's own reduction, so these are not the GPU bench's T's.
"""
import sys
import time

import numpy as np
import scipy.linalg
import torch

from triton_kernels.eigh import divide_conquer

EMPTY = torch.empty


def poisoned_empty(*args, **kwargs):
    buffer = EMPTY(*args, **kwargs)
    return buffer.fill_(float("nan") if buffer.dtype.is_floating_point else -(2 ** 30))


def main(n: int, count: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    diagonals, offdiagonals = [], []
    for _ in range(count):
        a = rng.standard_normal((n, n))
        h = scipy.linalg.hessenberg((a + a.T) / 2)
        diagonals.append(np.diag(h))
        offdiagonals.append(np.append(np.diag(h, 1), 0.0))
    d = torch.tensor(np.array(diagonals), dtype=torch.float32)
    e = torch.tensor(np.array(offdiagonals), dtype=torch.float32)
    divide_conquer.torch.empty = poisoned_empty
    start = time.time()
    z, values, _ = divide_conquer.solve(d, e, torch.ones(count))
    divide_conquer.torch.empty = EMPTY
    off = e[:, :-1].double()
    t = torch.diag_embed(d.double()) + torch.diag_embed(off, 1) + torch.diag_embed(off, -1)
    z, values = z.double(), values.double()
    unit = n * torch.finfo(torch.float32).eps
    residual = (z @ t - values[:, :, None] * z).abs().sum(2).amax(1) / (unit * t.abs().sum(1).amax(1))
    orthogonality = (z @ z.transpose(1, 2) - torch.eye(n)).abs().sum(1).amax(1) / unit
    print(f"{count} T's of n = {n} in {time.time() - start:.0f} s; NaN in z: {torch.isnan(z).any().item()}; "
          f"residual at most {residual.max():.3g} (gate 200), "
          f"orthogonality at most {orthogonality.max():.3g} (gate 100)")
    print("residuals", [round(x, 2) for x in residual.tolist()])


if __name__ == "__main__":
    main(*map(int, sys.argv[1:4]))
