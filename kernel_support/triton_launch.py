"""A launch that skips Triton's per-call dispatch once a kernel is compiled (the Triton and Gluon ports' launches)."""
from __future__ import annotations

import contextlib

import torch

TRITON_ALIGNMENT = 16  # Triton specialises a pointer on whether its address is a multiple of this (bytes), and an
# integer on whether it is one
MAX_KEYS = 4096  # launch shapes kept (a server's many batch sizes); past it the table starts again


class CachedLaunch:
    """Launches a `@triton.jit` (or `@gluon.jit`) kernel through its compiled kernel, found by the launch's metadata.

    Triton's own launch (`kernel[grid](...)`) binds and specialises every argument, builds a cache key and looks the
    compiled kernel up on every call: tens of microseconds of Python on a call whose kernel may take ten. Here the
    first launch of each key goes through Triton (compiling if need be) and keeps the compiled kernel it returns;
    later launches of that key hand the arguments straight to its launcher. The key holds everything Triton
    specialises on and more: each tensor's dtype, device and whether its address is 16-byte aligned, each TMA
    descriptor's shape, strides, block and layout (its base as a tensor's), every integer and constexpr whole,
    and the launch options. Nothing of a tensor's values enters it. The Triton interpreter (CPU) returns no compiled
    kernel, so there every launch goes through Triton.

    Called as the kernel is: `launch(grid, *args, **kwargs)`, the kernel's parameters by position or by name and
    Triton's launch options (num_warps, num_stages) by name."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.names = list(kernel.arg_names)
        # (the interpreter's kernel lists no parameters: it is never launched from the table, whose key it only fills)
        self.defaults = {param.name: param.default for param in getattr(kernel, "params", ()) if param.has_default}
        self.compiled = {}

    def __call__(self, grid: tuple, *args, **kwargs) -> None:
        grid = (*grid, 1, 1)[:3]  # a compiled kernel's launch takes all three of the grid's sizes
        # every parameter in the signature's order, as the compiled kernel's launcher takes them (constexprs too)
        named = self.names[len(args):]
        bound = (*args, *(kwargs[name] if name in kwargs else self.defaults.get(name) for name in named))
        options = tuple((name, value) for name, value in kwargs.items() if name not in named)
        key = (grid, *map(_specialisation, bound), *options)
        compiled = self.compiled.get(key)
        if compiled is not None:
            compiled[grid](*bound)
            return
        compiled = self.kernel[grid](*args, **kwargs)
        if hasattr(compiled, "packed_metadata"):  # a CompiledKernel: not the interpreter's None
            if len(self.compiled) >= MAX_KEYS:
                self.compiled.clear()
            self.compiled[key] = compiled


_LAUNCHES: dict = {}


def launch(kernel, grid: tuple, *args, **kwargs) -> None:
    """`kernel[grid](*args, **kwargs)` through the kernel's `CachedLaunch`."""
    cached = _LAUNCHES.get(kernel)
    if cached is None:
        cached = _LAUNCHES[kernel] = CachedLaunch(kernel)
    cached(grid, *args, **kwargs)


@contextlib.contextmanager
def through_tritons_dispatch():
    """Inside, every launch goes through Triton's dispatch (`kernel[grid]`), none straight to a compiled kernel kept
    before: for a tool that intercepts the dispatch (`compare.tools.hopper_compile`). The table is as it was
    afterwards."""
    kept = dict(_LAUNCHES)
    _LAUNCHES.clear()
    try:
        yield
    finally:
        _LAUNCHES.clear()
        _LAUNCHES.update(kept)


def _specialisation(arg):
    if isinstance(arg, torch.Tensor):
        return arg.dtype, arg.device, arg.data_ptr() % TRITON_ALIGNMENT == 0
    if hasattr(arg, "block_shape") and hasattr(arg, "base"):  # a host-side TMA descriptor
        return (_specialisation(arg.base), tuple(arg.shape), tuple(arg.strides), tuple(arg.block_shape), arg.layout,
                arg.padding)
    return arg
