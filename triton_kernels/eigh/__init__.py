"""Batched symmetric eigendecomposition in Triton, one module per stage.

n <= 64: the on-chip Jacobi (`jacobi`), one program per matrix with the matrix in registers; the launcher sorts
the eigenvalues (glue).

n > 64: the LAPACK dsytrd + dstebz + dstein route (or, for steps 2 and 3, dstedc's divide and conquer:
`divide_conquer`, chosen by EIGENVECTORS), each stage written for batches of matrices:
1. `tridiagonal`: Householder reflectors T = H^T (A / max|A|) H, in one launch or over launches;
2. `bisection`: T's eigenvalues from Sturm counts, one lane per eigenvalue;
3. `inverse_iteration`: T's eigenvectors, `INVERSE_ITERATION.rounds` rounds, each followed by the clusters' block
   Gram-Schmidt (`gram_schmidt`), then the repair of vectors whose residual is still large;
4. `back_transform`: Q = H Z in LAPACK's compact WY form.

The input's checks (NaN or Inf, max |A - A^T| against max |A|) come from the kernels that read A first
(`common.checked`): they count what they read, zero the entries that are not finite (so that no later kernel sees
them) and leave three bounds, which the call reads after its last kernel, in its one synchronisation, raising if
the input was bad. Fewer than `TRIDIAGONAL.one_launch_batch` matrices replay their path's kernels from a CUDA graph
(`_replayed`). Nothing is kept between calls but compiled kernels and those graphs' buffers. Why the shifts,
clusters and rounds are what they are: kernel_support/eigh_common.py and docs/findings.md, "The eigh ports' tuning
constants".
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ports.eigh import check_shape
from kernel_support.eigh_common import JACOBI, TRIDIAGONAL, check_offsets
from . import back_transform, bisection, divide_conquer, inverse_iteration, jacobi, tridiagonal
from .common import check_bounds

# T's eigenpairs: "inverse_iteration" (bisection, inverse iteration, the clusters' Gram-Schmidt, the repair), or
# "divide_conquer" (`divide_conquer`: the candidate of issue 55, A/B'd on the H200 as a copy of this package with
# this line changed, and not ready: docs/findings.md, "Divide and conquer's leaves and first GPU run")
EIGENVECTORS = "inverse_iteration"


@dataclass(frozen=True)
class TritonEigh:
    """The Triton port's own tunables of the whole call."""

    cuda_graph_shapes: int = 4  # the port replays its path (Jacobi or tridiagonal) for fewer than
    # `TRIDIAGONAL.one_launch_batch` matrices from a CUDA graph, for this many shapes at most (0: launch every kernel
    # from Python): launches dominate there


TRITON_EIGH = TritonEigh()


def _tridiagonal(a: torch.Tensor):
    """(Q, L, the checks' bounds) by tridiagonalisation, T's eigenpairs (`EIGENVECTORS`) and back-transformation
    (n > 64)."""
    w, d, e, tau, scale, bounds = tridiagonal.reduce(a)  # T = H^T (A / scale) H: d, e; H's reflectors in w, tau
    if EIGENVECTORS == "divide_conquer":
        z, _, eigenvalues = divide_conquer.solve(d, e, scale)  # T's eigenvectors as rows, A's eigenvalues
    else:
        values, norm, eigenvalues = bisection.eigenvalues(d, e, scale)  # T's, then times scale: A's
        z = inverse_iteration.vectors(d, e, values, norm)  # T's eigenvectors as rows
    return back_transform.apply(w, tau, z), eigenvalues, bounds.amax(dim=(0, 1))


def _jacobi(a: torch.Tensor):
    """(Q, L, the checks' bounds) by the on-chip Jacobi (n <= 64)."""
    batch, n, _ = a.shape
    size = JACOBI.size(n)
    check_offsets(batch, size)
    vectors, values, _, bounds = jacobi.on_chip(F.pad(a, (0, size - n, 0, size - n)).contiguous())
    vectors, values = vectors[:, :n, :n], values[:, :n]
    values, order = values.sort(dim=-1)
    return vectors.gather(-1, order.unsqueeze(-2).expand(batch, n, n)), values, bounds.amax(dim=0)


# (path, EIGENVECTORS, shape, device) -> (CUDA graph, its input, its outputs), newest last
_GRAPHS: OrderedDict = OrderedDict()


def _replayed(path, a: torch.Tensor):
    """path(a) (`_jacobi` or `_tridiagonal`) from a CUDA graph captured on the shape's first call, replayed on a
    copy of this call's input: every kernel runs on every call, but the graph's launches (over launches two a
    column; four a Gram-Schmidt panel from n = 512; for n <= 64 the pad's, the Jacobi's, the sort's, the gather's and
    the bounds') cost one
    launch from Python. The latest `TRITON_EIGH.cuda_graph_shapes` shapes keep their graphs (and memory)."""
    key = (path, EIGENVECTORS, tuple(a.shape), a.device)
    if key not in _GRAPHS:
        static_input = a.clone()
        path(static_input)  # compiles every kernel before the capture
        torch.cuda.synchronize(a.device)
        graph = torch.cuda.CUDAGraph()
        # thread-local: JAX's runtime threads (the driver runs both ports in one process) may call CUDA meanwhile
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            outputs = path(static_input)
        _GRAPHS[key] = (graph, static_input, outputs)
        while len(_GRAPHS) > TRITON_EIGH.cuda_graph_shapes:
            _GRAPHS.popitem(last=False)
    _GRAPHS.move_to_end(key)
    graph, static_input, outputs = _GRAPHS[key]
    static_input.copy_(a)
    graph.replay()
    return tuple(output.clone() for output in outputs)  # the graph's buffers are overwritten by the next call


def eigh(a: torch.Tensor):
    """(Q, L) for a [batch, n, n] float32 symmetric: A Q = Q diag(L), L ascending. Waits for its kernels: the
    input's checks are read after the last."""
    check_shape(a, "torch")
    batch, n, _ = a.shape
    if batch == 0 or n == 0:
        return torch.empty_like(a), torch.empty((batch, n), device=a.device, dtype=a.dtype)
    a = a.contiguous()
    path = _tridiagonal if n > JACOBI.max_n else _jacobi
    if a.is_cuda and TRITON_EIGH.cuda_graph_shapes and not TRIDIAGONAL.shares_the_sms(batch):
        q, values, bounds = _replayed(path, a)
    else:
        q, values, bounds = path(a)
    check_bounds(bounds)
    return q, values
