"""Batch-invariant mode for torch: aten's matrix products routed to the project's batch-invariant matmul ports.

    import ports.batch_invariant as bi

    with bi.batch_invariant():  # or bi.enable() ... bi.disable()
        logits = model(tokens)  # each row's bits whatever the batch it runs in

Inside the mode, `aten::mm`, `aten::addmm` and `aten::bmm` run on a matmul port, which sums every output element over
K in one fixed order whatever M is (no split-K): `torch.matmul`, `@`, `F.linear` and their backward passes decompose
into those three, so a row of a product has the same bits alone or in any batch, in the forward pass and in the
gradient of the activations. The port is the fastest that this machine runs among those registered for torch
(`PORT_ORDER`: Gluon on Hopper, Triton on other GPUs and, through its interpreter, on a CPU); the ports give the same
bits as each other, so the choice never changes a result.

What the mode does not cover, it refuses: a product in another dtype than bfloat16 or float16 (or of two dtypes)
raises `NotCovered` naming the op, and so does one on a CPU tensor on a machine with a GPU, or in bfloat16 on a CPU
(Triton's interpreter misreads bfloat16 and returns garbage; float16 runs); it never falls back to a
library kernel, which would be batch-variant without saying so. `bmm` runs every matrix of its batch in one launch of
the Triton port's batched kernel (the same tiles as a product alone, on a second grid axis).

The reductions a decoder runs over its rows are covered too, by row kernels whose order depends on a row's length
alone (triton_kernels.row_reductions): `softmax` and `log_softmax` (and so cross-entropy) with their backward
passes, and `mean` (RMSNorm's), over the last dimension, in float32, bfloat16 or float16 (a mean over every
dimension, a loss's, reduces the whole tensor as one row); over another dimension they are refused. Not covered
yet (torch's own kernels run): `NOT_COVERED`. Leaving the mode restores torch's kernels exactly (the overrides are
one torch.library registration, destroyed on exit).
"""
from __future__ import annotations

import contextlib
import functools
import os
import warnings
from typing import Callable

import torch

COVERED = ("aten::mm", "aten::addmm", "aten::bmm",  # torch.matmul, @ and F.linear decompose into these
           "aten::_softmax", "aten::_log_softmax", "aten::_softmax_backward_data",
           "aten::_log_softmax_backward_data", "aten::mean.dim")  # over the last dimension only
NOT_COVERED = ("layer_norm", "sum", "scaled_dot_product_attention")  # torch's kernels run inside the mode
PORT_ORDER = ("gluon", "triton")  # fastest first among the torch ports that give the same bits
DTYPES = (torch.bfloat16, torch.float16)


class NotCovered(RuntimeError):
    """A product the mode does not cover. A RuntimeError, not a TypeError: torch turns a TypeError raised under `@`
    into Python's own "unsupported operand" error, which would hide the reason."""


_library: torch.library.Library | None = None
_depth = 0
_ports: dict[str, tuple[str, Callable]] = {}  # device type -> (port name, its matmul): metadata, chosen once


def _interpreter_ready(device: torch.device) -> None:
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("batch-invariant mode on a CPU runs the Triton kernels through Triton's interpreter: set "
                           "TRITON_INTERPRET=1 before triton is imported")


def port_for(device: torch.device) -> tuple[str, Callable]:
    """(name, matmul function) of the port the mode runs for tensors on `device`: the first of PORT_ORDER this
    machine runs. RuntimeError where none runs (on a CPU: without the Triton interpreter)."""
    if device.type not in _ports:
        from ports import matmul as spec

        _interpreter_ready(device)
        usable = [name for name in PORT_ORDER
                  if device.type == "cuda" or not spec.WORKLOAD.implementation(name).needs.gpu]
        name = next((name for name in usable if spec.WORKLOAD.implementation(name).needs.missing() is None), None)
        if name is None:
            raise RuntimeError(f"batch-invariant mode: none of the matmul ports {PORT_ORDER} runs on this machine")
        _ports[device.type] = (name, spec.WORKLOAD.implementation(name).load())
    return _ports[device.type]


def _check(op: str, *tensors: torch.Tensor, dtypes_taken=DTYPES) -> None:
    """NotCovered for what the kernels do not take: another dtype than bfloat16 or float16 (`dtypes_taken`), mixed
    dtypes, CPU tensors where the mode runs on a GPU, bfloat16 on a CPU."""
    dtypes = {tensor.dtype for tensor in tensors}
    if len(dtypes) != 1 or not dtypes <= set(dtypes_taken):
        raise NotCovered(f"batch-invariant mode: aten::{op} on {', '.join(sorted(map(str, dtypes)))} is not covered "
                         f"(the kernels take {', '.join(map(str, dtypes_taken))}, operands alike); cast, or leave the "
                         "mode")
    if tensors[0].device.type == "cpu" and torch.cuda.is_available():
        raise NotCovered(f"batch-invariant mode: aten::{op} on CPU tensors is not covered on a machine with a GPU")
    if tensors[0].device.type == "cpu" and torch.bfloat16 in dtypes:
        raise NotCovered(f"batch-invariant mode: aten::{op} on bfloat16 CPU tensors is not covered: Triton's "
                         "interpreter, which runs the port on a CPU, misreads bfloat16 (float16 runs)")


def _product(a: torch.Tensor, b: torch.Tensor, out: str) -> torch.Tensor:
    """a [M, K] @ b [K, N] on the port, in a's dtype (out "same") or float32; empty sizes without a launch."""
    m, k, n = a.shape[0], a.shape[1], b.shape[1]
    dtype = a.dtype if out == "same" else torch.float32
    if min(m, n, k) == 0:
        return torch.zeros((m, n), device=a.device, dtype=dtype)
    return port_for(a.device)[1]((a, b, out))


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    _check("mm", a, b)
    return _product(a, b, "same")


def _addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta=1, alpha=1) -> torch.Tensor:
    """beta bias + alpha (a @ b), the product and the sum in float32 and rounded once, as a fused epilogue does."""
    _check("addmm", bias, a, b)
    total = _product(a, b, "float32")
    if alpha != 1:
        total = total * alpha
    if beta != 0:
        total = total + (bias.float() if beta == 1 else beta * bias.float())
    return total.to(a.dtype)


@functools.cache
def _batched_port() -> Callable:
    """The Triton port's batched product, which bmm runs on every machine: Gluon's port has none, and the ports give
    the same bits as each other."""
    from ports import matmul as spec

    return spec.WORKLOAD.implementation("triton").load("batched_matmul")


def _bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [B, M, K] @ b [B, K, N], every product in one launch, each one's bits those of the product alone."""
    _check("bmm", a, b)
    if min(a.shape[0], a.shape[1], a.shape[2], b.shape[2]) == 0:
        return torch.zeros((a.shape[0], a.shape[1], b.shape[2]), device=a.device, dtype=a.dtype)
    _interpreter_ready(a.device)
    return _batched_port()(a, b, "same")


REDUCTION_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _last_dimension(op: str, x: torch.Tensor, dims) -> None:
    """NotCovered unless `dims` (an int or a list of one) is x's last dimension: the rows the kernels reduce."""
    dims = [dims] if isinstance(dims, int) else list(dims or [])
    if len(dims) != 1 or dims[0] % max(x.dim(), 1) != max(x.dim(), 1) - 1:
        raise NotCovered(f"batch-invariant mode: aten::{op} over dimension(s) {dims} of a {x.dim()}-D tensor is not "
                         "covered (the row kernels reduce the last dimension only)")


def _row_reductions(device: torch.device):
    _interpreter_ready(device)
    from triton_kernels import row_reductions

    return row_reductions


def _softmax(x: torch.Tensor, dim: int, half_to_float: bool, log: bool = False) -> torch.Tensor:
    op = "_log_softmax" if log else "_softmax"
    _check(op, x, dtypes_taken=REDUCTION_DTYPES)
    _last_dimension(op, x, dim)
    return _row_reductions(x.device).softmax(x, log, torch.float32 if half_to_float else x.dtype)


def _softmax_backward(g: torch.Tensor, y: torch.Tensor, dim: int, input_dtype: torch.dtype,
                      log: bool = False) -> torch.Tensor:
    op = "_log_softmax_backward_data" if log else "_softmax_backward_data"
    _check(op, g, y, dtypes_taken=REDUCTION_DTYPES)
    _last_dimension(op, g, dim)
    return _row_reductions(g.device).softmax_backward(g, y, log, input_dtype)


def _mean(x: torch.Tensor, dim, keepdim: bool = False, *, dtype=None) -> torch.Tensor:
    """The mean over the last dimension on the row kernel; over every dimension (a loss's `.mean()`), the whole
    tensor as one row, in an order that depends on its size alone."""
    _check("mean.dim", x, dtypes_taken=REDUCTION_DTYPES)
    reductions = _row_reductions(x.device)
    if dim is None or sorted(d % max(x.dim(), 1) for d in ([dim] if isinstance(dim, int) else dim)) in (
            [], list(range(x.dim()))):
        whole = reductions.mean(x.reshape(1, -1), False, dtype or x.dtype)
        return whole.reshape([1] * x.dim() if keepdim else [])
    _last_dimension("mean.dim", x, dim)
    return reductions.mean(x, keepdim, dtype or x.dtype)


def active() -> bool:
    return _library is not None


def enable() -> None:
    """Route aten's matrix products to the ports until `disable` (calls nest: the mode ends at the last disable)."""
    global _library, _depth
    _depth += 1
    if _library is not None:
        return
    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # torch warns that a registered kernel is overridden: that is the mode
        warnings.simplefilter("ignore", UserWarning)
        for key in ("CPU", "CUDA"):
            library.impl("aten::mm", _mm, key)
            library.impl("aten::addmm", _addmm, key)
            library.impl("aten::bmm", _bmm, key)
            library.impl("aten::_softmax", _softmax, key)
            library.impl("aten::_log_softmax", functools.partial(_softmax, log=True), key)
            library.impl("aten::_softmax_backward_data", _softmax_backward, key)
            library.impl("aten::_log_softmax_backward_data", functools.partial(_softmax_backward, log=True), key)
            library.impl("aten::mean.dim", _mean, key)
    _library = library


def disable() -> None:
    """End the mode (the last of nested `enable`s): torch's own kernels again."""
    global _library, _depth
    if _depth == 0:
        return
    _depth -= 1
    if _depth == 0 and _library is not None:
        _library._destroy()
        _library = None


@contextlib.contextmanager
def batch_invariant():
    """The mode for a `with` block."""
    enable()
    try:
        yield
    finally:
        disable()
