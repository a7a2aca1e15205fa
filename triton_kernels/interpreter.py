"""The Triton interpreter (CPU runs only) made fit for the ports: reductions by our own combiners in whole arrays,
the language patched once per kernel launch, and quiet about the lanes a kernel masks.

Reductions. The interpreter reduces with NumPy when the combiner is one of Triton's (sum, max, min, argmin,
argmax), but applies any other combiner, such as the eigh port's tuple sums (`_add_pairs`, ...), one element at a
time in Python, which took most of an n = 70 tridiagonalisation's time on a CPU (docs/findings.md, "The
interpreter's reductions"). Triton leaves a reduction's order unspecified (a combiner must be associative), and a
GPU reduces in a tree of warp shuffles; here the combiner is applied to the two halves of the reduced axis, log2(n)
calls of the port's own combine function on whole arrays: the same code runs, in a tree order, and a wrong combiner
still gives a wrong answer.

Patching once per launch. The interpreter swaps `triton.language`'s builtins for its own on every kernel launch
and puts them back after it, but it also re-patches, without putting anything back, on every call of a
`@triton.jit` helper from inside a kernel: the walk over the language's members (`inspect.getmembers`) took much
of an n = 70 eigh call's time and patched nothing new (the same findings section). Here a helper call whose language
modules the launch already patched is skipped; anything else is patched as before.

Masked lanes. A kernel computes every lane of a block and masks the result (`tl.where`, a masked store): a GPU
divides by zero or overflows there silently, and the interpreter's NumPy arithmetic warns (RuntimeWarning: divide by
zero, overflow). Those warnings, from the interpreter's module alone, are silenced; NaN and Inf that reach an output
are still caught by the workloads' checks.
"""
from __future__ import annotations

import inspect
import warnings

import numpy as np


def _tree_reduce(self, input):
    """`ReduceOps.generic_reduce`'s contract (input: a tuple of tensors; returns a list of tensors), pairwise."""
    original_axis = self.axis
    input, axis = self.unravel(input, self.axis)
    dtypes = [arg.dtype for arg in input]
    data = [arg.handle.data for arg in input]
    input_shape = data[0].shape
    while data[0].shape[axis] > 1:
        size = data[0].shape[axis]
        half = size // 2
        low = [np.take(d, np.arange(half), axis=axis) for d in data]
        high = [np.take(d, np.arange(half, 2 * half), axis=axis) for d in data]
        combined = self.combine_fn.fn(*(self.to_tensor(d, t) for d, t in zip(low, dtypes)),
                                      *(self.to_tensor(d, t) for d, t in zip(high, dtypes)))
        combined = combined if isinstance(combined, tuple) else (combined,)
        combined = [np.broadcast_to(np.asarray(c.handle.data if hasattr(c, "handle") else c, dtype=d.dtype),
                                    low[0].shape) for c, d in zip(combined, data)]
        data = [np.concatenate([c, np.take(d, np.arange(2 * half, size), axis=axis)], axis=axis)
                for c, d in zip(combined, data)]
    outputs = []
    for d, dtype in zip(data, dtypes):
        d = np.squeeze(d, axis=axis) if d.shape[axis] == 1 else np.zeros(input_shape[:axis] + input_shape[axis + 1:],
                                                                          dtype=d.dtype)
        if self.keep_dims:
            d = np.expand_dims(d, axis) if original_axis is not None else d.reshape((1,) * len(input_shape))
        elif original_axis is None:
            d = d.item()
        outputs.append(self.to_tensor(d, dtype))
    return outputs


def _patch_once_per_launch(patch_lang):
    """`_patch_lang(fn)` that patches at a kernel launch and skips the helper calls inside it."""
    import triton.language as tl

    launches = []  # the language modules the launch in progress patched (ids)

    def patch(fn):
        modules = {id(value) for value in fn.__globals__.values() if inspect.ismodule(value) and value in (tl, tl.core)}
        if launches and modules <= launches[-1]:
            return None  # a helper inside the launch, whose patch covers it (the interpreter ignores the result)
        scope = patch_lang(fn)
        if launches:  # a helper that sees other modules: patched, as the interpreter does
            return scope
        launches.append(modules)
        restore = scope.restore

        def restore_and_end():
            launches.pop()
            restore()

        scope.restore = restore_and_end
        return scope

    patch.once_per_launch = True
    return patch


def _index_by_squeeze(patch_lang_tensor):
    """`_patch_lang_tensor(tensor, scope)` with a scalar's `__index__` (a loop bound such as `range(0, K, TILE_K)`)
    read through `squeeze()`: Triton before 3.8 takes `int()` of its one-element array of rank 1, which NumPy 2.4 and
    later refuse ("only 0-dimensional arrays can be converted to Python scalars"); Triton 3.8 squeezes it first, as
    this does. The scope restores both settings after the launch, the last first."""

    def patch(tensor, scope):
        patch_lang_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patch.index_by_squeeze = True
    return patch


def prepare_interpreter() -> None:
    """Make the installed Triton interpreter reduce by our combiners pairwise, patch the language once per launch
    and read a scalar's index under any NumPy (each unchanged where the interpreter lacks what it replaces, i.e.
    another Triton than the ones this was written against), and silence the RuntimeWarnings of its arithmetic on
    masked lanes."""
    warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.runtime\.interpreter")
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    reduce_ops = getattr(interpreter, "ReduceOps", None)
    if reduce_ops is not None and hasattr(reduce_ops, "generic_reduce"):
        reduce_ops.generic_reduce = _tree_reduce
    patch_lang = getattr(interpreter, "_patch_lang", None)
    if patch_lang is not None and not getattr(patch_lang, "once_per_launch", False):
        interpreter._patch_lang = _patch_once_per_launch(patch_lang)
    patch_lang_tensor = getattr(interpreter, "_patch_lang_tensor", None)
    if patch_lang_tensor is not None and not getattr(patch_lang_tensor, "index_by_squeeze", False):
        interpreter._patch_lang_tensor = _index_by_squeeze(patch_lang_tensor)
