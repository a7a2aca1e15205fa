"""Pallas ports on the Triton lowering, one module per workload; and what the JAX ports share.

A JAX port pads its inputs to the sizes its kernels take and cuts the result back. Done op by op, outside a
jitted function, each step takes JAX's eager path (0.2-0.4 ms of host time each on the H200's host); inside the
port's jitted function, the kernels would compile once per size rather than once per padded size. These two small
jitted functions do it in one compiled call each.
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
