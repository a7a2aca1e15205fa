"""The batch-invariant torch mode's kernels: which matmul port runs its products, the batched product, the row
kernels, and the checks of what they take (`batch_invariant.torch_mode`, `batch_invariant.attention`)."""
from __future__ import annotations

import functools
import os
from typing import Callable

import torch

from batch_invariant import NotCovered

PORT_ORDER = ("gluon", "triton")  # fastest first among the torch ports that give the same bits
DTYPES = (torch.bfloat16, torch.float16)
REDUCTION_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


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


@functools.cache
def _has_gpu() -> bool:
    """Whether this machine has a CUDA GPU: metadata, asked once rather than on every op."""
    return torch.cuda.is_available()


def _check(op: str, *tensors: torch.Tensor, dtypes_taken=DTYPES) -> None:
    """NotCovered for what the kernels do not take: another dtype than bfloat16 or float16 (`dtypes_taken`), mixed
    dtypes, CPU tensors where the mode runs on a GPU, bfloat16 on a CPU."""
    dtypes = {tensor.dtype for tensor in tensors}
    if len(dtypes) != 1 or not dtypes <= set(dtypes_taken):
        raise NotCovered(f"batch-invariant mode: aten::{op} on {', '.join(sorted(map(str, dtypes)))} is not covered "
                         f"(the kernels take {', '.join(map(str, dtypes_taken))}, operands alike); cast, or leave the "
                         "mode")
    if tensors[0].device.type == "cpu" and _has_gpu():
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


@functools.cache
def _batched_port() -> Callable:
    """The Triton port's batched product, which bmm runs on every machine: Gluon's port has none, and the ports give
    the same bits as each other."""
    from ports import matmul as spec

    return spec.WORKLOAD.implementation("triton").load("batched_matmul")


def _batched_product(a: torch.Tensor, b: torch.Tensor, out: str) -> torch.Tensor:
    """a [B, M, K] @ b [B, K, N], every product in one launch, each one's bits those of the product alone, in a's
    dtype (out "same") or float32; empty sizes without a launch."""
    dtype = a.dtype if out == "same" else torch.float32
    if min(a.shape[0], a.shape[1], a.shape[2], b.shape[2]) == 0:
        return torch.zeros((a.shape[0], a.shape[1], b.shape[2]), device=a.device, dtype=dtype)
    _interpreter_ready(a.device)
    return _batched_port()(a, b, out)


def _row_reductions(device: torch.device):
    _interpreter_ready(device)
    from triton_kernels import row_reductions

    return row_reductions
