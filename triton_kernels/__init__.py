"""What the Triton ports share: a launch that skips Triton's per-call dispatch once a kernel is compiled."""
from __future__ import annotations

import torch

TRITON_ALIGNMENT = 16  # bytes: Triton specialises a pointer on whether its address is a multiple of this
MAX_KEYS = 4096  # launch shapes kept (a server's many batch sizes); past it the table starts again


class CachedLaunch:
    """Launches a `@triton.jit` kernel through its compiled kernel, found by the launch's metadata.

    Triton's own launch (`kernel[grid](...)`) binds and specialises every argument, builds a cache key and looks the
    compiled kernel up on every call: tens of microseconds of Python on a call whose kernel may take ten. Here the
    first launch of each key goes through Triton (compiling if need be) and keeps the compiled kernel it returns;
    later launches of that key hand the arguments straight to its launcher. The key holds everything Triton
    specialises on and more: each tensor's dtype, device and whether its address is 16-byte aligned, every integer
    and constexpr whole, and the launch options. Nothing of a tensor's values enters it. The Triton interpreter
    (CPU) returns no compiled kernel, so there every launch goes through Triton.

    `args` are all of the kernel's parameters in order, constexprs included (the compiled kernel's launcher takes
    them so); `options` are Triton's launch options (num_warps, num_stages)."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.compiled = {}

    def __call__(self, grid: tuple, *args, **options) -> None:
        grid = (*grid, 1, 1)[:3]  # a compiled kernel's launch takes all three of the grid's sizes
        key = (grid, *(_specialisation(arg) for arg in args), *options.items())
        compiled = self.compiled.get(key)
        if compiled is not None:
            compiled[grid](*args)
            return
        compiled = self.kernel[grid](*args, **options)
        if hasattr(compiled, "packed_metadata"):  # a CompiledKernel: not the interpreter's None
            if len(self.compiled) >= MAX_KEYS:
                self.compiled.clear()
            self.compiled[key] = compiled


def _specialisation(arg):
    if isinstance(arg, torch.Tensor):
        return arg.dtype, arg.device, arg.data_ptr() % TRITON_ALIGNMENT == 0
    return arg
