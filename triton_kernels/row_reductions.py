"""Row reductions whose bits never depend on the number of rows, for the batch-invariant mode (ports.batch_invariant).

One program reduces one row, in CHUNK-element chunks taken in order, each chunk's reduction a fixed tree: the
order of every operation on a row depends on its length alone, never on how many rows there are (a library
reduction may split a row across programs when rows are few, and so sum in another order). The rows are the
input's last dimension; the arithmetic is float32 whatever the input's type, and the result is rounded once.

- softmax and log_softmax over the last dimension, and their backward passes;
- the mean over the last dimension.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 1024  # elements of a row a step: a fixed size, so that a row's order depends on its length only


@triton.jit
def _row_max(x_ptr, cols, CHUNK: tl.constexpr):
    offsets = tl.arange(0, CHUNK)
    largest = tl.full([CHUNK], float("-inf"), tl.float32)
    for start in range(0, cols, CHUNK):
        chunk = tl.load(x_ptr + start + offsets, mask=start + offsets < cols, other=float("-inf")).to(tl.float32)
        largest = tl.maximum(largest, chunk)
    return tl.max(largest, axis=0)


@triton.jit
def _softmax_kernel(x_ptr, y_ptr, cols, LOG: tl.constexpr, CHUNK: tl.constexpr):
    """Row r of y = softmax(x) (or log_softmax): max, then the sum of exp(x - max), then y, each a pass in order."""
    row = tl.program_id(0).to(tl.int64)
    x_ptr += row * cols
    y_ptr += row * cols
    offsets = tl.arange(0, CHUNK)
    largest = _row_max(x_ptr, cols, CHUNK)
    total = tl.zeros([CHUNK], tl.float32)
    for start in range(0, cols, CHUNK):
        chunk = tl.load(x_ptr + start + offsets, mask=start + offsets < cols, other=float("-inf")).to(tl.float32)
        total += tl.exp(chunk - largest)
    total_sum = tl.sum(total, axis=0)
    for start in range(0, cols, CHUNK):
        mask = start + offsets < cols
        chunk = tl.load(x_ptr + start + offsets, mask=mask, other=0.0).to(tl.float32)
        if LOG:
            value = chunk - largest - tl.log(total_sum)
        else:
            value = tl.exp(chunk - largest) / total_sum
        tl.store(y_ptr + start + offsets, value.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_backward_kernel(g_ptr, y_ptr, dx_ptr, cols, LOG: tl.constexpr, CHUNK: tl.constexpr):
    """Row r of the input's gradient from the output's gradient g and the output y: softmax y (g - sum(g y));
    log_softmax g - exp(y) sum(g)."""
    row = tl.program_id(0).to(tl.int64)
    g_ptr += row * cols
    y_ptr += row * cols
    dx_ptr += row * cols
    offsets = tl.arange(0, CHUNK)
    total = tl.zeros([CHUNK], tl.float32)
    for start in range(0, cols, CHUNK):
        mask = start + offsets < cols
        g = tl.load(g_ptr + start + offsets, mask=mask, other=0.0).to(tl.float32)
        if LOG:
            total += g
        else:
            total += g * tl.load(y_ptr + start + offsets, mask=mask, other=0.0).to(tl.float32)
    total_sum = tl.sum(total, axis=0)
    for start in range(0, cols, CHUNK):
        mask = start + offsets < cols
        g = tl.load(g_ptr + start + offsets, mask=mask, other=0.0).to(tl.float32)
        y = tl.load(y_ptr + start + offsets, mask=mask, other=0.0).to(tl.float32)
        if LOG:
            value = g - tl.exp(y) * total_sum
        else:
            value = y * (g - total_sum)
        tl.store(dx_ptr + start + offsets, value.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _mean_kernel(x_ptr, y_ptr, cols, CHUNK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offsets = tl.arange(0, CHUNK)
    total = tl.zeros([CHUNK], tl.float32)
    for start in range(0, cols, CHUNK):
        total += tl.load(x_ptr + row * cols + start + offsets, mask=start + offsets < cols, other=0.0).to(tl.float32)
    tl.store(y_ptr + row, (tl.sum(total, axis=0) / cols).to(y_ptr.dtype.element_ty))


def _rows(x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    x = x.contiguous()
    cols = x.shape[-1] if x.dim() else 1
    return x, x.numel() // max(cols, 1), cols


def softmax(x: torch.Tensor, log: bool, dtype: torch.dtype) -> torch.Tensor:
    """softmax (or log_softmax) of x over its last dimension, in `dtype`."""
    x, rows, cols = _rows(x)
    y = torch.empty(x.shape, device=x.device, dtype=dtype)
    if rows and cols:
        _softmax_kernel[(rows,)](x, y, cols, LOG=log, CHUNK=min(CHUNK, triton.next_power_of_2(cols)))
    return y


def softmax_backward(g: torch.Tensor, y: torch.Tensor, log: bool, dtype: torch.dtype) -> torch.Tensor:
    """The gradient of softmax's (or log_softmax's) input over the last dimension, in `dtype`."""
    g, rows, cols = _rows(g)
    y = y.contiguous()
    dx = torch.empty(g.shape, device=g.device, dtype=dtype)
    if rows and cols:
        _softmax_backward_kernel[(rows,)](g, y, dx, cols, LOG=log, CHUNK=min(CHUNK, triton.next_power_of_2(cols)))
    return dx


def mean(x: torch.Tensor, keepdim: bool, dtype: torch.dtype) -> torch.Tensor:
    """The mean of x over its last dimension, in `dtype`."""
    x, rows, cols = _rows(x)
    shape = (*x.shape[:-1], 1) if keepdim else x.shape[:-1]
    y = torch.empty(rows, device=x.device, dtype=dtype)
    if rows:
        if cols:
            _mean_kernel[(rows,)](x, y, cols, CHUNK=min(CHUNK, triton.next_power_of_2(cols)))
        else:
            y.fill_(float("nan"))  # the mean of nothing, as torch gives it
    return y.reshape(shape)
