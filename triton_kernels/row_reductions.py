"""Row reductions whose bits never depend on the number of rows, for the batch-invariant torch mode
(batch_invariant.torch_mode).

One program reduces one row, in CHUNK-element chunks taken in order into a CHUNK-element float32 vector, which is
then summed as a pairwise tree written out (`_tree_sum`): the order of every operation on a row depends on its
length alone, never on how many rows there are (a library reduction may split a row across programs when rows are
few, and so sum in another order), nor on the register layout the compiler gives the vector (`tl.sum`'s tree
follows that layout, which follows what the compiler can prove of the row's alignment). So the Pallas row kernel
(pallas_kernels/row_reductions.py), the interpreters and these kernels give a row's sum the same bits. The rows are the
input's last dimension; the arithmetic is float32 whatever the input's type, and the result is rounded once.

- softmax and log_softmax over the last dimension, and their backward passes; attention's probabilities from its
  scores, scaled and masked in the same pass;
- the sum and the mean over the last dimension; the running sum of integers;
- LayerNorm and RMSNorm over the last dimensions, and the gradient of their input.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

CHUNK = 1024  # elements of a row a step: a fixed size, so that a row's order depends on its length only
_TREE_LEVELS = tl.constexpr(CHUNK.bit_length() - 1)  # halvings from CHUNK elements to one


@triton.jit
def _row_max(x_ptr, cols, CHUNK: tl.constexpr):
    offsets = tl.arange(0, CHUNK)
    largest = tl.full([CHUNK], float("-inf"), tl.float32)
    for start in range(0, cols, CHUNK):
        chunk = tl.load(x_ptr + start + offsets, mask=start + offsets < cols, other=float("-inf")).to(tl.float32)
        largest = tl.maximum(largest, chunk)
    return tl.max(largest, axis=0)


@triton.jit
def _tree_sum(values):
    """The sum of a power-of-two-long vector as a fixed pairwise tree: its halves added element by element, then
    the halves of that, down to one element. An axis of two elements is summed by one addition, whatever the
    layout."""
    for _ in tl.static_range(_TREE_LEVELS):
        if values.shape[0] > 1:
            values = tl.sum(tl.reshape(values, [2, values.shape[0] // 2]), axis=0)
    return tl.sum(values, axis=0)


@triton.jit
def _exp(x, LIBDEVICE: tl.constexpr):
    """exp(x) in float32 as XLA computes it on a GPU, with libdevice's expf (XLA's exp; so that the torch mode's
    softmax and the JAX transformation's can give the same bits): tl.exp is Triton's faster approximation, 2^(x
    log2 e) by ex2.approx, a few units in the last place away and so other bits. The interpreter runs no libdevice
    call: tl.exp there (NumPy's exp)."""
    if LIBDEVICE:
        return libdevice.exp(x)
    else:
        return tl.exp(x)


@triton.jit
def _softmax_kernel(x_ptr, y_ptr, cols, LOG: tl.constexpr, CHUNK: tl.constexpr, LIBDEVICE: tl.constexpr):
    """Row r of y = softmax(x) (or log_softmax): max, then the sum of exp(x - max), then y, each a pass in order."""
    row = tl.program_id(0).to(tl.int64)
    x_ptr += row * cols
    y_ptr += row * cols
    offsets = tl.arange(0, CHUNK)
    largest = _row_max(x_ptr, cols, CHUNK)
    total = tl.zeros([CHUNK], tl.float32)
    for start in range(0, cols, CHUNK):
        chunk = tl.load(x_ptr + start + offsets, mask=start + offsets < cols, other=float("-inf")).to(tl.float32)
        total += _exp(chunk - largest, LIBDEVICE)
    total_sum = _tree_sum(total)
    for start in range(0, cols, CHUNK):
        mask = start + offsets < cols
        chunk = tl.load(x_ptr + start + offsets, mask=mask, other=0.0).to(tl.float32)
        if LOG:
            value = chunk - largest - tl.log(total_sum)
        else:
            value = _exp(chunk - largest, LIBDEVICE) / total_sum
        tl.store(y_ptr + start + offsets, value.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _attention_scores(s_ptr, order_ptr, mask_ptr, keys, start, offsets, query, scale, mask_keys, ORDER: tl.constexpr,
                      MASK: tl.constexpr, CAUSAL: tl.constexpr):
    """A chunk of one query's scores in float32, in the keys' order: read through `order` (original columns),
    scaled, then -inf where a boolean mask is False (MASK 1) or the key is after the query (CAUSAL), or an additive
    mask added (MASK 2), as the definition's separate ops give them; -inf past the last key."""
    inside = start + offsets < keys
    column = tl.load(order_ptr + start + offsets, mask=inside, other=0) if ORDER else start + offsets
    x = tl.load(s_ptr + column, mask=inside, other=float("-inf")) * scale
    if MASK == 1:
        x = tl.where(tl.load(mask_ptr + column * mask_keys, mask=inside, other=0) != 0, x, float("-inf"))
    if MASK == 2:
        x = x + tl.load(mask_ptr + column * mask_keys, mask=inside, other=0.0).to(tl.float32)
    if CAUSAL:
        x = tl.where(column <= query, x, float("-inf"))
    return tl.where(inside, x, float("-inf"))


@triton.jit
def _attention_softmax_kernel(s_ptr, order_ptr, mask_ptr, y_ptr, keys, queries, heads, scale, order_batch,
                              mask_batch, mask_query, mask_keys, ORDER: tl.constexpr, MASK: tl.constexpr,
                              CAUSAL: tl.constexpr, CHUNK: tl.constexpr, ONE_CHUNK: tl.constexpr,
                              LIBDEVICE: tl.constexpr):
    """Row r (batch, head, query) of attention's probabilities: `_softmax_kernel`'s passes over `_attention_scores`,
    zeros for a row that sees no key. A row of one chunk (ONE_CHUNK) is read once and kept in registers: the same
    operations, in the same order, as the passes make on it."""
    row = tl.program_id(0).to(tl.int64)
    query = row % queries
    batch = row // (queries * heads)
    s_ptr += row * keys
    y_ptr += row * keys
    order_ptr += batch * order_batch
    mask_ptr += batch * mask_batch + query * mask_query
    offsets = tl.arange(0, CHUNK)
    if ONE_CHUNK:
        x = _attention_scores(s_ptr, order_ptr, mask_ptr, keys, 0, offsets, query, scale, mask_keys, ORDER, MASK,
                              CAUSAL)
        largest_value = tl.max(tl.maximum(tl.full([CHUNK], float("-inf"), tl.float32), x), axis=0)  # NaN alike
        empty = tl.sum((x != float("-inf")).to(tl.int32), axis=0) == 0
        exps = _exp(x - largest_value, LIBDEVICE)
        total_sum = _tree_sum(tl.zeros([CHUNK], tl.float32) + exps)
        value = tl.where(empty, 0.0, exps / total_sum)
        tl.store(y_ptr + offsets, value.to(y_ptr.dtype.element_ty), mask=offsets < keys)
    else:
        largest = tl.full([CHUNK], float("-inf"), tl.float32)
        seen = tl.zeros([CHUNK], tl.int32)
        for start in range(0, keys, CHUNK):
            x = _attention_scores(s_ptr, order_ptr, mask_ptr, keys, start, offsets, query, scale, mask_keys, ORDER,
                                  MASK, CAUSAL)
            largest = tl.maximum(largest, x)
            seen += (x != float("-inf")).to(tl.int32)
        largest_value = tl.max(largest, axis=0)
        total = tl.zeros([CHUNK], tl.float32)
        for start in range(0, keys, CHUNK):
            x = _attention_scores(s_ptr, order_ptr, mask_ptr, keys, start, offsets, query, scale, mask_keys, ORDER,
                                  MASK, CAUSAL)
            total += _exp(x - largest_value, LIBDEVICE)
        total_sum = _tree_sum(total)
        empty = tl.sum(seen, axis=0) == 0
        for start in range(0, keys, CHUNK):
            x = _attention_scores(s_ptr, order_ptr, mask_ptr, keys, start, offsets, query, scale, mask_keys, ORDER,
                                  MASK, CAUSAL)
            value = tl.where(empty, 0.0, _exp(x - largest_value, LIBDEVICE) / total_sum)
            tl.store(y_ptr + start + offsets, value.to(y_ptr.dtype.element_ty), mask=start + offsets < keys)


@triton.jit
def _softmax_backward_kernel(g_ptr, y_ptr, dx_ptr, cols, LOG: tl.constexpr, CHUNK: tl.constexpr,
                             LIBDEVICE: tl.constexpr):
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
    total_sum = _tree_sum(total)
    for start in range(0, cols, CHUNK):
        mask = start + offsets < cols
        g = tl.load(g_ptr + start + offsets, mask=mask, other=0.0).to(tl.float32)
        y = tl.load(y_ptr + start + offsets, mask=mask, other=0.0).to(tl.float32)
        if LOG:
            value = g - _exp(y, LIBDEVICE) * total_sum
        else:
            value = y * (g - total_sum)
        tl.store(dx_ptr + start + offsets, value.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _sum_kernel(x_ptr, y_ptr, cols, MEAN: tl.constexpr, CHUNK: tl.constexpr):
    """Row r's sum (or mean) of x."""
    row = tl.program_id(0).to(tl.int64)
    offsets = tl.arange(0, CHUNK)
    total = tl.zeros([CHUNK], tl.float32)
    for start in range(0, cols, CHUNK):
        total += tl.load(x_ptr + row * cols + start + offsets, mask=start + offsets < cols, other=0.0).to(tl.float32)
    if MEAN:
        tl.store(y_ptr + row, (_tree_sum(total) / cols).to(y_ptr.dtype.element_ty))
    else:
        tl.store(y_ptr + row, _tree_sum(total).to(y_ptr.dtype.element_ty))


@triton.jit
def _norm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, cols, eps, CENTRE: tl.constexpr,
                 HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, CHUNK: tl.constexpr):
    """Row r of y = (x - mean) rstd w + b (LayerNorm; RMSNorm without CENTRE: mean 0, no bias), rstd =
    1/sqrt(mean((x - mean)^2) + eps): the mean, then the squares, then y, each a pass in order."""
    row = tl.program_id(0).to(tl.int64)
    x_ptr += row * cols
    y_ptr += row * cols
    offsets = tl.arange(0, CHUNK)
    mean = 0.0
    if CENTRE:
        total = tl.zeros([CHUNK], tl.float32)
        for start in range(0, cols, CHUNK):
            total += tl.load(x_ptr + start + offsets, mask=start + offsets < cols, other=0.0).to(tl.float32)
        mean = _tree_sum(total) / cols
    squares = tl.zeros([CHUNK], tl.float32)
    for start in range(0, cols, CHUNK):
        mask = start + offsets < cols
        centred = tl.where(mask, tl.load(x_ptr + start + offsets, mask=mask, other=0.0).to(tl.float32) - mean, 0.0)
        squares += centred * centred
    rstd = tl.rsqrt(_tree_sum(squares) / cols + eps)
    for start in range(0, cols, CHUNK):
        mask = start + offsets < cols
        y = (tl.load(x_ptr + start + offsets, mask=mask, other=0.0).to(tl.float32) - mean) * rstd
        if HAS_WEIGHT:
            y *= tl.load(w_ptr + start + offsets, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            y += tl.load(b_ptr + start + offsets, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + start + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def _norm_backward_kernel(g_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, cols, CENTRE: tl.constexpr,
                          HAS_WEIGHT: tl.constexpr, CHUNK: tl.constexpr):
    """Row r of the input's gradient from the output's gradient g: with gw = g w and xhat = (x - mean) rstd,
    dx = rstd (gw - mean(gw) - xhat mean(gw xhat)) (RMSNorm: no mean(gw))."""
    row = tl.program_id(0).to(tl.int64)
    g_ptr += row * cols
    x_ptr += row * cols
    dx_ptr += row * cols
    offsets = tl.arange(0, CHUNK)
    mean = tl.load(mean_ptr + row) if CENTRE else 0.0
    rstd = tl.load(rstd_ptr + row)
    gw_total = tl.zeros([CHUNK], tl.float32)
    gwx_total = tl.zeros([CHUNK], tl.float32)
    for start in range(0, cols, CHUNK):
        mask = start + offsets < cols
        gw = tl.load(g_ptr + start + offsets, mask=mask, other=0.0).to(tl.float32)
        if HAS_WEIGHT:
            gw *= tl.load(w_ptr + start + offsets, mask=mask, other=0.0).to(tl.float32)
        xhat = tl.where(mask, (tl.load(x_ptr + start + offsets, mask=mask, other=0.0).to(tl.float32) - mean) * rstd,
                        0.0)
        gw_total += gw
        gwx_total += gw * xhat
    gw_mean = _tree_sum(gw_total) / cols if CENTRE else 0.0
    gwx_mean = _tree_sum(gwx_total) / cols
    for start in range(0, cols, CHUNK):
        mask = start + offsets < cols
        gw = tl.load(g_ptr + start + offsets, mask=mask, other=0.0).to(tl.float32)
        if HAS_WEIGHT:
            gw *= tl.load(w_ptr + start + offsets, mask=mask, other=0.0).to(tl.float32)
        xhat = (tl.load(x_ptr + start + offsets, mask=mask, other=0.0).to(tl.float32) - mean) * rstd
        tl.store(dx_ptr + start + offsets, ((gw - gw_mean - xhat * gwx_mean) * rstd).to(dx_ptr.dtype.element_ty),
                 mask=mask)


@triton.jit
def _integer_cumsum_kernel(x_ptr, y_ptr, cols, CHUNK: tl.constexpr):
    """Row r's running sum of integers in int64 (exact in any order), chunk by chunk with the chunks' total
    carried."""
    row = tl.program_id(0).to(tl.int64)
    offsets = tl.arange(0, CHUNK)
    carried = tl.full([], 0, tl.int64)
    for start in range(0, cols, CHUNK):
        mask = start + offsets < cols
        chunk = tl.load(x_ptr + row * cols + start + offsets, mask=mask, other=0).to(tl.int64)
        tl.store(y_ptr + row * cols + start + offsets, tl.cumsum(chunk, axis=0) + carried, mask=mask)
        carried += tl.sum(chunk, axis=0)


def _rows(x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    x = x.contiguous()
    cols = x.shape[-1] if x.dim() else 1
    return x, math.prod(x.shape[:-1]), cols


def softmax(x: torch.Tensor, log: bool, dtype: torch.dtype) -> torch.Tensor:
    """softmax (or log_softmax) of x over its last dimension, in `dtype`."""
    x, rows, cols = _rows(x)
    y = torch.empty(x.shape, device=x.device, dtype=dtype)
    if rows and cols:
        _softmax_kernel[(rows,)](x, y, cols, LOG=log, CHUNK=_chunk(cols), LIBDEVICE=x.is_cuda)
    return y


def attention_probabilities(scores: torch.Tensor, scale: float, order, mask, causal: bool, heads: int, queries: int,
                            dtype: torch.dtype) -> torch.Tensor:
    """Attention's probabilities [rows, keys] in `dtype` from its float32 scores [rows, keys], rows (batch, head,
    query) in that order: each row's scores read in `order` ([batch or 1, keys] original columns, or None), scaled,
    masked by `mask` ([batch or 1, queries or 1, keys] boolean or additive, any strides, or None) or `causal`
    (a key after its query, upper-left aligned), softmax, rounded once; a row that sees no key gives zeros. The bits
    of the definition's separate ops (scale, mask, softmax on the row kernel, zeros, rounding) in one pass."""
    rows, keys = scores.shape
    y = torch.empty((rows, keys), device=scores.device, dtype=dtype)
    order = None if order is None else order.contiguous()  # read a row at a time: each row's keys side by side
    if rows and keys:
        kind = 0 if mask is None else 1 if mask.dtype == torch.bool else 2
        mask = scores if mask is None else mask.view(torch.uint8) if kind == 1 else mask
        strides = (0, 0, 0) if kind == 0 else tuple(mask.stride(i) if mask.shape[i] > 1 else 0 for i in range(3))
        _attention_softmax_kernel[(rows,)](
            scores.contiguous(), scores if order is None else order, mask, y, keys, queries, heads, scale,
            0 if order is None or order.shape[0] == 1 else order.stride(0), *strides, ORDER=order is not None,
            MASK=kind, CAUSAL=causal, CHUNK=_chunk(keys), ONE_CHUNK=keys <= CHUNK, LIBDEVICE=scores.is_cuda,
            enable_fp_fusion=False)  # the scaled score rounded before an additive mask is added, as the definition's
    return y


def softmax_backward(g: torch.Tensor, y: torch.Tensor, log: bool, dtype: torch.dtype) -> torch.Tensor:
    """The gradient of softmax's (or log_softmax's) input over the last dimension, in `dtype`."""
    g, rows, cols = _rows(g)
    y = y.contiguous()
    dx = torch.empty(g.shape, device=g.device, dtype=dtype)
    if rows and cols:
        _softmax_backward_kernel[(rows,)](g, y, dx, cols, LOG=log, CHUNK=_chunk(cols), LIBDEVICE=g.is_cuda)
    return dx


def row_sum(x: torch.Tensor, mean: bool, dtype: torch.dtype) -> torch.Tensor:
    """The sum (or the mean) of x over its last dimension, in `dtype`, shaped x.shape[:-1]."""
    x, rows, cols = _rows(x)
    y = torch.empty(rows, device=x.device, dtype=dtype)
    if rows:
        if cols:
            _sum_kernel[(rows,)](x, y, cols, MEAN=mean, CHUNK=_chunk(cols))
        else:
            y.fill_(float("nan") if mean else 0)  # the mean of nothing is NaN, as torch gives it; the sum is 0
    return y.reshape(x.shape[:-1])


def integer_cumsum(x: torch.Tensor) -> torch.Tensor:
    """The running sum of integers (or booleans) over x's last dimension, in int64."""
    x, rows, cols = _rows(x)
    y = torch.empty(x.shape, device=x.device, dtype=torch.int64)
    if rows and cols:
        _integer_cumsum_kernel[(rows,)](x, y, cols, CHUNK=_chunk(cols))
    return y


def norm(x: torch.Tensor, cols: int, weight, bias, eps: float, centre: bool):
    """LayerNorm (centre) or RMSNorm of x's rows of `cols` elements (its last dimensions), with an optional weight
    and bias of `cols` elements: (y in x's dtype, the rows' means and 1/rms in float32, [rows])."""
    x = x.contiguous()
    rows = x.numel() // cols
    y = torch.empty_like(x)
    mean, rstd = (torch.empty(rows, device=x.device, dtype=torch.float32) for _ in range(2))
    if rows:
        _norm_kernel[(rows,)](x, _or(weight, x), _or(bias, x), y, mean, rstd, cols, eps, CENTRE=centre,
                              HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, CHUNK=_chunk(cols))
    return y, mean, rstd


def norm_backward(g: torch.Tensor, x: torch.Tensor, cols: int, weight, mean, rstd, centre: bool) -> torch.Tensor:
    """The gradient of `norm`'s input, from its output's gradient g and the means and 1/rms it returned."""
    g, x = g.contiguous(), x.contiguous()
    rows = x.numel() // cols
    dx = torch.empty_like(x)
    if rows:
        _norm_backward_kernel[(rows,)](g, x, _or(weight, x), _or(mean, rstd).contiguous(), rstd.contiguous(), dx,
                                       cols, CENTRE=centre, HAS_WEIGHT=weight is not None, CHUNK=_chunk(cols))
    return dx


def _chunk(cols: int) -> int:
    return min(CHUNK, triton.next_power_of_2(cols))


def _or(optional, stand_in):
    """An optional operand, or a tensor passed in its place that the kernel never reads (its flag is off)."""
    return stand_in if optional is None else optional.contiguous()
