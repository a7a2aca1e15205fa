"""Batch-invariant mode for torch: aten's matrix products routed to the project's batch-invariant matmul ports.

    import batch_invariant.torch_mode as bi

    with bi.batch_invariant():  # or bi.enable() ... bi.disable()
        logits = model(tokens)  # each row's bits whatever the batch it runs in

Inside the mode, `aten::mm`, `aten::addmm`, `aten::bmm` and `aten::baddbmm` run on a matmul port, which sums every
output element over K in one fixed order whatever M is (no split-K): `torch.matmul`, `@`, `F.linear`, `einsum` and
their backward passes decompose into those, so a row of a product has the same bits alone or in any batch, in the
forward pass and in the gradient of the activations. The port is the fastest that this machine runs among those
registered for torch (`PORT_ORDER`: Gluon on Hopper, Triton on other GPUs and, through its interpreter, on a CPU);
the ports give the same bits as each other, so the choice never changes a result.

What the mode does not cover, it refuses: a product in another dtype than bfloat16 or float16 (or of two dtypes)
raises `NotCovered` naming the op, and so does one on a CPU tensor on a machine with a GPU, or in bfloat16 on a CPU
(Triton's interpreter misreads bfloat16 and returns garbage; float16 runs); so do the products it has no kernel
for (`REFUSED`: matrix-vector and vector products, convolutions, scaled and integer products, the out= and in-place
forms). It never falls back to a library kernel, which would be batch-variant without saying so. `bmm` runs every
matrix of its batch in one launch of the Triton port's batched kernel (the same tiles as a product alone, on a
second grid axis).

The reductions a decoder runs over its rows are covered too, by row kernels whose order depends on a row's length
alone (triton_kernels.row_reductions), in float32, bfloat16 or float16, forward and backward: `softmax` and
`log_softmax` (and so cross-entropy), `sum` and `mean`, `var` and `std`, the 1-, 2- and infinity-norms, `logsumexp`,
LayerNorm (`native_layer_norm`) and RMSNorm (`F.rms_norm`'s mean, or the fused op torch may run for it). A sum over
other dimensions than the last (a weight's gradient, a loss over the batch) runs on the same kernel over the
transposed rows, in an order fixed by the sizes alone; an integer or boolean sum or running sum, exact in any order,
on a row kernel of its own. Every other reduction whose order torch's kernel chooses is refused (`ordered()`).
`scaled_dot_product_attention` runs as its definition on the mode's products and softmax, its scores in float32 as
flash attention keeps them, the keys a mask hides from the last query moved last (registered above autograd, in
place of torch's choice among flash, memory-efficient, cuDNN and math kernels). Leaving the mode restores torch's
kernels exactly (the overrides are one torch.library registration, destroyed on exit).
"""
from __future__ import annotations

import contextlib
import functools
import warnings
from typing import Callable

import torch

from batch_invariant.attention import attention
from batch_invariant.kernels import (DTYPES, PORT_ORDER, REDUCTION_DTYPES, NotCovered, _batched_product, _check,
                                           _product, _row_reductions, port_for)

__all__ = ["DTYPES", "PORT_ORDER", "NotCovered", "active", "batch_invariant", "disable", "enable", "ordered",
           "port_for"]


_library: torch.library.Library | None = None
_depth = 0


def _one_term(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a product sums one term (K = 1, a rotary embedding's outer product of frequencies and positions) in
    one floating dtype: then every element is a * b rounded once, whatever kernel forms it, and the mode forms it as
    a broadcast product in any floating dtype."""
    return (a.shape[-1] == 1 and b.shape[-2] == 1 and a.shape[:-2] == b.shape[:-2] and a.dtype == b.dtype
            and a.dtype.is_floating_point)


def _broadcast_product(a: torch.Tensor, b: torch.Tensor, out: str) -> torch.Tensor:
    """a [..., M, 1] @ b [..., 1, N] as a * b, in a's dtype (out "same") or float32 (kept wider where a is)."""
    dtype = a.dtype if out == "same" or a.dtype == torch.float64 else torch.float32
    return a.to(dtype) * b.to(dtype)


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if _one_term(a, b):
        return _broadcast_product(a, b, "same")
    _check("mm", a, b)
    return _product(a, b, "same")


def _addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta=1, alpha=1) -> torch.Tensor:
    """beta bias + alpha (a @ b), the product and the sum in float32 and rounded once, as a fused epilogue does."""
    if _one_term(a, b) and bias.dtype == a.dtype:
        return _epilogue(_broadcast_product(a, b, "float32"), bias, beta, alpha).to(a.dtype)
    _check("addmm", bias, a, b)
    return _epilogue(_product(a, b, "float32"), bias, beta, alpha).to(a.dtype)


def _epilogue(total: torch.Tensor, bias: torch.Tensor, beta, alpha) -> torch.Tensor:
    """beta bias + alpha total, in float32."""
    if alpha != 1:
        total = total * alpha
    if beta != 0:
        total = total + (bias.float() if beta == 1 else beta * bias.float())
    return total


def _bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if _one_term(a, b):
        return _broadcast_product(a, b, "same")
    _check("bmm", a, b)
    return _batched_product(a, b, "same")


def _baddbmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta=1, alpha=1) -> torch.Tensor:
    """beta bias + alpha (a @ b) for batches of products (attention's scores plus a mask in some models), rounded
    once as `_addmm`."""
    if _one_term(a, b) and bias.dtype == a.dtype:
        return _epilogue(_broadcast_product(a, b, "float32"), bias, beta, alpha).to(a.dtype)
    _check("baddbmm", bias, a, b)
    return _epilogue(_batched_product(a, b, "float32"), bias, beta, alpha).to(a.dtype)


def _refused(op: str) -> Callable:
    """A kernel for an op the mode does not cover but must not leave to torch (a product or a sum whose order a
    library kernel may choose by the batch): it raises NotCovered."""
    instead = ("mm, addmm, bmm, baddbmm, matmul, linear" if op in REFUSED else
               "sum, mean, var, std, softmax, logsumexp, the norms, over any dimensions")

    def refuse(*args, **kwargs):
        raise NotCovered(f"batch-invariant mode: {op} is not covered (torch's kernel may sum in an order chosen by "
                         f"the batch); write it with the covered ops ({instead}), or leave the mode")

    return refuse


def _result_in_reach(op: str, dtype) -> None:
    if dtype is not None and (dtype.is_floating_point or dtype.is_complex) and dtype not in REDUCTION_DTYPES:
        raise NotCovered(f"batch-invariant mode: aten::{op} to {dtype} is not covered (the row kernels sum in float32)")


def _last_dimension(op: str, x: torch.Tensor, dims) -> None:
    """NotCovered unless `dims` (an int or a list of one) is x's last dimension: the rows the kernels reduce."""
    dims = [dims] if isinstance(dims, int) else list(dims or [])
    if len(dims) != 1 or dims[0] % max(x.dim(), 1) != max(x.dim(), 1) - 1:
        raise NotCovered(f"batch-invariant mode: aten::{op} over dimension(s) {dims} of a {x.dim()}-D tensor is not "
                         "covered (the row kernels reduce the last dimension only)")


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


def _rows_of(x: torch.Tensor, dims) -> tuple[torch.Tensor, list[int]]:
    """x with the dimensions `dims` (None or [] for all of them) moved last and flattened into rows: [rows, cols];
    and the dimensions reduced."""
    reduced = sorted({d % max(x.dim(), 1) for d in ([dims] if isinstance(dims, int) else dims or range(x.dim()))})
    kept = [d for d in range(x.dim()) if d not in reduced]
    if x.dim() == 0:
        return x.reshape(1, 1), reduced
    cols = rows = 1
    for d in reduced:
        cols *= x.shape[d]
    for d in kept:
        rows *= x.shape[d]
    return x.permute(*kept, *reduced).reshape(rows, cols), reduced


def _reduced_shape(x: torch.Tensor, reduced: list[int], keepdim: bool) -> list[int]:
    return ([1 if d in reduced else size for d, size in enumerate(x.shape)] if keepdim else
            [size for d, size in enumerate(x.shape) if d not in reduced])


def _sum_or_mean(op: str, x: torch.Tensor, dim, keepdim: bool, dtype, mean: bool) -> torch.Tensor:
    """The sum (mean) over `dim` on the row kernel: over the last dimension, each row's bits its own whatever the
    batch; over other dimensions (across rows: a weight's gradient, a loss over the batch) in an order that depends
    on the sizes alone. Integer and boolean sums, exact in any order, are the last of a running sum."""
    rows, reduced = _rows_of(x, dim)
    shape = _reduced_shape(x, reduced, keepdim)
    if not mean and not x.dtype.is_floating_point and not x.dtype.is_complex and dtype in (None, torch.int64):
        if not rows.shape[-1]:
            return torch.zeros(shape, dtype=torch.int64, device=x.device)
        return _row_reductions(x.device).integer_cumsum(rows)[:, -1].reshape(shape)
    _check(op, x, dtypes_taken=REDUCTION_DTYPES)
    _result_in_reach(op, dtype)
    return _row_reductions(x.device).row_sum(rows, mean, dtype or x.dtype).reshape(shape)


def _sum_out(x: torch.Tensor, dim=None, keepdim: bool = False, *, dtype=None, out: torch.Tensor) -> torch.Tensor:
    """`sum(..., out=)`, which torch's losses (mse_loss, smooth_l1_loss) call: the covered sum, copied out."""
    return _copied_out(_sum(x, dim, keepdim, dtype=dtype), out)


def _mean_out(x: torch.Tensor, dim=None, keepdim: bool = False, *, dtype=None, out: torch.Tensor) -> torch.Tensor:
    return _copied_out(_mean(x, dim, keepdim, dtype=dtype), out)


def _copied_out(result: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    if out.shape != result.shape:
        out.resize_(result.shape)
    return out.copy_(result)


def _variance(op: str, x: torch.Tensor, dim, correction, keepdim: bool, root: bool):
    """(the variance, or its root, and the mean) over `dim`, in x's dtype: the mean on the row kernel in float32,
    then the deviations' squares summed on it, over max(0, N - correction) (torch's definition; correction 1 by
    default)."""
    _check(op, x, dtypes_taken=REDUCTION_DTYPES)
    rows, reduced = _rows_of(x, dim)
    sums = _row_reductions(x.device).row_sum
    rows = rows.float()
    mean = sums(rows, True, torch.float32)
    deviations = rows - mean[:, None]
    variance = sums(deviations * deviations, False, torch.float32) / max(
        0, rows.shape[-1] - (1 if correction is None else correction))
    shape = _reduced_shape(x, reduced, keepdim)
    spread = variance.sqrt() if root else variance
    return spread.to(x.dtype).reshape(shape), mean.to(x.dtype).reshape(shape)


def _var(x, dim=None, *, correction=None, keepdim=False):
    return _variance("var", x, dim, correction, keepdim, root=False)[0]


def _std(x, dim=None, *, correction=None, keepdim=False):
    return _variance("std", x, dim, correction, keepdim, root=True)[0]


def _var_mean(x, dim=None, *, correction=None, keepdim=False):
    return _variance("var_mean", x, dim, correction, keepdim, root=False)


def _std_mean(x, dim=None, *, correction=None, keepdim=False):
    return _variance("std_mean", x, dim, correction, keepdim, root=True)


def _vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """The 1-, 2- or infinity-norm over `dim` (every dimension by default), in float32 on the row kernel, rounded
    once to `dtype` (x's by default); other orders refused."""
    _check("linalg_vector_norm", x, dtypes_taken=REDUCTION_DTYPES)
    _result_in_reach("linalg_vector_norm", dtype)
    rows, reduced = _rows_of(x, dim)
    magnitudes = rows.float().abs()
    sums = _row_reductions(x.device).row_sum
    if ord == 2:
        norm = sums(magnitudes * magnitudes, False, torch.float32).sqrt()
    elif ord == 1:
        norm = sums(magnitudes, False, torch.float32)
    elif ord in (float("inf"), float("-inf")):
        norm = magnitudes.amax(-1) if ord > 0 else magnitudes.amin(-1)  # exact in any order
    else:
        raise NotCovered(f"batch-invariant mode: aten::linalg_vector_norm of order {ord} is not covered (orders 1, "
                         "2 and infinity are)")
    return norm.to(dtype or x.dtype).reshape(_reduced_shape(x, reduced, keepdim))


def _logsumexp(x, dim, keepdim=False):
    """log(sum(exp(x))) over `dim`: the maximum (exact in any order) taken out, the exponentials summed on the row
    kernel in float32, rounded once to x's dtype."""
    _check("logsumexp", x, dtypes_taken=REDUCTION_DTYPES)
    rows, reduced = _rows_of(x, dim)
    rows = rows.float()
    if not rows.shape[-1]:  # the log of an empty sum, as torch gives it
        return torch.full(_reduced_shape(x, reduced, keepdim), float("-inf"), dtype=x.dtype, device=x.device)
    largest = rows.amax(-1)
    largest = largest.masked_fill(largest.isinf(), 0)  # rows of infinities: their own sum gives the answer
    total = _row_reductions(x.device).row_sum((rows - largest[:, None]).exp(), False, torch.float32)
    return (total.log() + largest).to(x.dtype).reshape(_reduced_shape(x, reduced, keepdim))


def _cumsum(x, dim, *, dtype=None):
    """The running sum of integers or booleans (exact in any order) on a row kernel, in int64 (or `dtype`); of
    floating types refused: torch's scan sums a lone row in another order than a batch of rows (CUB's scan then)."""
    if x.dtype.is_floating_point or x.dtype.is_complex or (dtype is not None and not (
            dtype == torch.bool or not (dtype.is_floating_point or dtype.is_complex))):
        raise NotCovered(f"batch-invariant mode: aten::cumsum on {x.dtype} (to {dtype}) is not covered (torch's scan "
                         "sums a row alone in another order than many rows); integers and booleans are")
    if x.dim() == 0:
        return x.to(dtype or torch.int64).clone()
    running = _row_reductions(x.device).integer_cumsum(x.movedim(dim, -1)).movedim(-1, dim)
    return running if dtype in (None, torch.int64) else running.to(dtype)


def _sum(x: torch.Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> torch.Tensor:
    return _sum_or_mean("sum", x, dim, keepdim, dtype, mean=False)


def _mean(x: torch.Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> torch.Tensor:
    return _sum_or_mean("mean", x, dim, keepdim, dtype, mean=True)


def _norm_rows(op: str, x: torch.Tensor, normalized_shape, *operands) -> int:
    """The length of the rows a norm normalises (its last len(normalized_shape) dimensions), after the checks."""
    _check(op, x, dtypes_taken=REDUCTION_DTYPES)
    if any(operand is not None and operand.device != x.device for operand in operands):
        raise NotCovered(f"batch-invariant mode: aten::{op} with operands on two devices is not covered")
    cols = 1
    for size in normalized_shape:
        cols *= size
    return cols


def _statistics_shape(x: torch.Tensor, normalized_shape) -> list[int]:
    return [*x.shape[:x.dim() - len(normalized_shape)], *[1] * len(normalized_shape)]


def _layer_norm(x, normalized_shape, weight, bias, eps):
    cols = _norm_rows("native_layer_norm", x, normalized_shape, weight, bias)
    y, mean, rstd = _row_reductions(x.device).norm(x, cols, weight, bias, eps, centre=True)
    shape = _statistics_shape(x, normalized_shape)
    return y, mean.reshape(shape), rstd.reshape(shape)


def _parameter_gradients(g, x, cols, mean, rstd, weight, bias, mask_weight, mask_bias):
    """The gradients of a norm's weight and bias: sums over the rows (over the batch, so a function of it by
    definition), on the row kernel over the transposed rows, in float32 rounded once."""
    sums = _row_reductions(x.device).row_sum
    g32 = g.reshape(-1, cols).float()
    grad_weight = grad_bias = None
    if weight is not None and mask_weight:
        xhat = (x.reshape(-1, cols).float() - (0 if mean is None else mean.reshape(-1, 1))) * rstd.reshape(-1, 1)
        grad_weight = sums((g32 * xhat).t(), False, weight.dtype).reshape(weight.shape)
    if bias is not None and mask_bias:
        grad_bias = sums(g32.t(), False, bias.dtype).reshape(bias.shape)
    return grad_weight, grad_bias


def _layer_norm_backward(g, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    cols = _norm_rows("native_layer_norm_backward", x, normalized_shape, weight, bias)
    rows = _row_reductions(x.device)
    grad_input = rows.norm_backward(g, x, cols, weight, mean.float(), rstd.float(), centre=True) if output_mask[
        0] else None
    return grad_input, *_parameter_gradients(g, x, cols, mean.float(), rstd.float(), weight, bias, *output_mask[1:])


def _rms_norm(x, normalized_shape, weight, eps):
    cols = _norm_rows("_fused_rms_norm", x, normalized_shape, weight)
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    y, _, rstd = _row_reductions(x.device).norm(x, cols, weight, None, eps, centre=False)
    return y, rstd.reshape(_statistics_shape(x, normalized_shape))


def _rms_norm_backward(g, x, normalized_shape, rstd, weight, output_mask):
    cols = _norm_rows("_fused_rms_norm_backward", x, normalized_shape, weight)
    rows = _row_reductions(x.device)
    grad_input = rows.norm_backward(g, x, cols, weight, None, rstd.float(), centre=False) if output_mask[0] else None
    return grad_input, _parameter_gradients(g, x, cols, None, rstd.float(), weight, None, output_mask[1], False)[0]


KERNELS = {  # op -> the mode's kernel, on the CPU and CUDA dispatch keys
    "aten::mm": _mm, "aten::addmm": _addmm, "aten::bmm": _bmm, "aten::baddbmm": _baddbmm,
    "aten::_softmax": _softmax, "aten::_log_softmax": functools.partial(_softmax, log=True),
    "aten::_softmax_backward_data": _softmax_backward,
    "aten::_log_softmax_backward_data": functools.partial(_softmax_backward, log=True),
    "aten::mean.dim": _mean, "aten::sum.dim_IntList": _sum, "aten::sum": _sum,
    "aten::var.correction": _var, "aten::std.correction": _std, "aten::var_mean.correction": _var_mean,
    "aten::std_mean.correction": _std_mean, "aten::linalg_vector_norm": _vector_norm, "aten::logsumexp": _logsumexp,
    "aten::cumsum": _cumsum, "aten::sum.IntList_out": _sum_out, "aten::mean.out": _mean_out,
    "aten::native_layer_norm": _layer_norm, "aten::native_layer_norm_backward": _layer_norm_backward,
    "aten::_fused_rms_norm": _rms_norm, "aten::_fused_rms_norm_backward": _rms_norm_backward,
}
COVERED = (*KERNELS, "aten::scaled_dot_product_attention")  # torch.matmul, @, F.linear decompose into the products
# products the mode has no kernel for, and the out= and in-place forms of those it has: refused, not left to torch
REFUSED = ("aten::mm.out", "aten::addmm.out", "aten::addmm_", "aten::bmm.out", "aten::baddbmm.out", "aten::baddbmm_",
           "aten::addbmm", "aten::addmv", "aten::mv", "aten::dot", "aten::vdot", "aten::addr",
           "aten::_addmm_activation", "aten::_scaled_mm", "aten::_int_mm", "aten::convolution")


# sums and scans the mode has no kernel for, beside the reductions torch tags (`ordered`): refused, not left to torch
ORDERED = ("aten::native_group_norm", "aten::native_group_norm_backward", "aten::native_batch_norm",
           "aten::native_batch_norm_backward", "aten::_native_batch_norm_legit",
           "aten::_native_batch_norm_legit.no_stats", "aten::_native_batch_norm_legit_no_training",
           "aten::_batch_norm_with_update", "aten::cudnn_batch_norm",
           "aten::cumsum.out", "aten::cumsum_", "aten::cumprod", "aten::cumprod.out", "aten::cumprod_",
           "aten::_logcumsumexp", "aten::logcumsumexp", "aten::_cdist_forward", "aten::renorm", "aten::_embedding_bag",
           "aten::_embedding_bag_forward_only", "aten::trace")
EXACT = ("max", "min", "amax", "amin", "aminmax", "argmax", "argmin", "all", "any", "count_nonzero")  # in any order


@functools.cache
def ordered() -> tuple[str, ...]:
    """The ops refused for their order: `ORDERED`, and every op torch tags a reduction, other than those the mode
    covers and those exact in any order (`EXACT`), that has a CPU or CUDA kernel of its own (one that only
    decomposes reaches the ops it is made of)."""
    def has_kernel(op: str) -> bool:
        try:
            return any(torch._C._dispatch_has_kernel_for_dispatch_key(op, key) for key in ("CPU", "CUDA"))
        except RuntimeError:  # not an op of this torch
            return False

    tagged = []
    for name in torch._C._dispatch_get_all_op_names():
        base, _, overload = name.removeprefix("aten::").partition(".")
        if not name.startswith("aten::") or base in EXACT or name in KERNELS:
            continue
        packet = getattr(torch.ops.aten, base, None)
        operator = getattr(packet, overload or "default", None) if packet is not None else None
        if operator is not None and torch.Tag.reduction in operator.tags:
            tagged.append(name)
    return tuple(op for op in dict.fromkeys((*ORDERED, *sorted(tagged))) if has_kernel(op))


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
            for op, kernel in KERNELS.items():
                library.impl(op, kernel, key)
            for op in (*REFUSED, *ordered()):
                library.impl(op, _refused(op), key)
        for key in ("CPU", "CUDA", "AutogradCPU", "AutogradCUDA"):  # above autograd: its backward is autograd's
            library.impl("aten::scaled_dot_product_attention", attention, key)
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
