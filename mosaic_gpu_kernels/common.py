"""What the Mosaic GPU ports share: the interpreter's parameters, and the swizzled shared-memory layout that wgmma
reads and TMA writes."""
from __future__ import annotations

import jax.numpy as jnp
from jax.experimental.pallas import mosaic_gpu as plgpu

interpret_params = plgpu.InterpretGPUParams


def swizzle(width: int, dtype) -> int:
    """The swizzle, in bytes, of a shared-memory tile `width` elements wide (at most 128 bytes)."""
    return plgpu.find_swizzle(width * jnp.dtype(dtype).itemsize * 8)


def swizzled_layout(swizzle_bytes: int, dtype) -> tuple:
    """The shared-memory layout wgmma reads and TMA writes: (8 rows, one swizzle width) blocks, swizzled."""
    return (plgpu.TilingTransform((8, swizzle_bytes // jnp.dtype(dtype).itemsize)),
            plgpu.SwizzleTransform(swizzle_bytes))
