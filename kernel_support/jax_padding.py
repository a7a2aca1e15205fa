"""Zero padding and cutting back for the JAX ports (both Pallas backends).

A JAX port pads its inputs to the sizes its kernels take and cuts the result back. Done op by op, outside a
jitted function, each step would take JAX's eager path, a dispatch each
(results/h200/experiments/pallas-matmul-jitted-padding/). These two small jitted functions do each step in one
compiled call. The TriMul ports call them outside their jitted kernels, so that those compile once per padded
sequence length; the matmul ports inside theirs, so that a call is one dispatch (a compile per M, as XLA's own dot;
results/h200/experiments/jax-matmul-one-call/). Both Pallas backends use them: the Mosaic GPU ports do not import
the deprecated one's package.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


@functools.partial(jax.jit, static_argnames=("shape",))
def zero_padded(array, *, shape: tuple[int, ...]):
    """`array` with zeros appended along each axis up to `shape`."""
    return jnp.pad(array, [(0, size - length) for size, length in zip(shape, array.shape)])


@functools.partial(jax.jit, static_argnames=("shape",))
def cut_to(array, *, shape: tuple[int, ...]):
    """The leading `shape` corner of `array`."""
    return array[tuple(slice(0, size) for size in shape)]
