"""Zero padding and cutting back for the JAX ports (both Pallas backends).

A JAX port pads its inputs to the sizes its kernels take and cuts the result back. Done op by op, outside a
jitted function, each step would take JAX's eager path, a dispatch each
(results/h200/experiments/pallas-matmul-jitted-padding/); inside the port's jitted function, the kernels would
compile once per size rather than once per padded size. These two small jitted functions do it in one compiled
call each. Both Pallas backends use them: the Mosaic GPU ports do not import the deprecated one's package.
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
