"""What the Mosaic GPU ports share: the interpreter's parameters across jax versions, and the swizzled
shared-memory layout that wgmma reads and TMA writes."""
from __future__ import annotations

import jax.numpy as jnp
from jax.experimental.pallas import mosaic_gpu as plgpu

try:  # public from jax 0.11
    interpret_params = plgpu.InterpretGPUParams
    INTERPRETER_READS_PAST_THE_ARRAY = INTERPRETER_TRANSPOSES_OPERANDS = True
except AttributeError:  # jax 0.10's interpreter is private, raises on TMA reads past the array and cannot take a
    # transposed wgmma operand
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams as interpret_params
    INTERPRETER_READS_PAST_THE_ARRAY = INTERPRETER_TRANSPOSES_OPERANDS = False


def swizzle(width: int, dtype) -> int:
    """The swizzle, in bytes, of a shared-memory tile `width` elements wide (at most 128 bytes)."""
    return plgpu.find_swizzle(width * jnp.dtype(dtype).itemsize * 8)


def swizzled_layout(swizzle_bytes: int, dtype) -> tuple:
    """The shared-memory layout wgmma reads and TMA writes: (8 rows, one swizzle width) blocks, swizzled."""
    return (plgpu.TilingTransform((8, swizzle_bytes // jnp.dtype(dtype).itemsize)),
            plgpu.SwizzleTransform(swizzle_bytes))
