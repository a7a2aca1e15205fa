"""What the Mosaic GPU ports share: the interpreter's parameters, and the swizzled shared-memory layout that wgmma
reads and TMA writes."""
from __future__ import annotations

import jax.numpy as jnp
import numpy
from jax.experimental.pallas import mosaic_gpu as plgpu


class _RowByRowNumpy:
    """numpy, but for matmul of a 2-d left operand: a row at a time, so that each row's sums are the same whatever
    rows the tile holds besides it."""

    def __getattr__(self, name):
        return getattr(numpy, name)

    @staticmethod
    def matmul(a, b, **kwargs):
        if numpy.ndim(a) != 2:
            return numpy.matmul(a, b, **kwargs)
        return numpy.stack([numpy.matmul(row, b, **kwargs) for row in a])


def interpret_params() -> plgpu.InterpretGPUParams:
    """Mosaic GPU's interpreter, for a run without a GPU, its products made a row at a time.

    The interpreter multiplies a wgmma's tiles with np.matmul, whose float32 rows depend on the operand's other rows
    on some CPUs (NumPy's OpenBLAS on an AMD EPYC: a[:m] @ b differs from (a @ b)[:m] at most m). A batch-invariant
    port would look batch-variant there, as no GPU sees it; a row at a time, each row goes through the same gemv
    whatever the tile (docs/findings.md, "The interpreter's reductions")."""
    try:
        from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks
    except ImportError:  # a jax whose interpreter lives elsewhere: its products as it makes them
        gpu_callbacks = None
    if gpu_callbacks is not None and not isinstance(gpu_callbacks.np, _RowByRowNumpy):
        gpu_callbacks.np = _RowByRowNumpy()
    return plgpu.InterpretGPUParams()


def swizzle(width: int, dtype) -> int:
    """The swizzle, in bytes, of a shared-memory tile `width` elements wide (at most 128 bytes)."""
    return plgpu.find_swizzle(width * jnp.dtype(dtype).itemsize * 8)


def swizzled_layout(swizzle_bytes: int, dtype) -> tuple:
    """The shared-memory layout wgmma reads and TMA writes: (8 rows, one swizzle width) blocks, swizzled."""
    return (plgpu.TilingTransform((8, swizzle_bytes // jnp.dtype(dtype).itemsize)),
            plgpu.SwizzleTransform(swizzle_bytes))
