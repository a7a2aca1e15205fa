"""Where the JAX ports' Pallas kernels run: compiled on JAX's default backend where it is a GPU, in Pallas's
interpret mode elsewhere; and a clear error for an input that lives on another platform than that backend."""
from __future__ import annotations

import jax


def interpreted() -> bool:
    """Whether the kernels run in Pallas's interpret mode: JAX's default backend is not a GPU."""
    return jax.default_backend() != "gpu"


def check_platform(name: str, array) -> None:
    """Raise a ValueError naming the argument and its device where `array` (a port's input) lives on another platform
    than JAX's default backend, which the port's kernels are built for: on a GPU machine, an array put on the CPU
    would otherwise fail deep in Pallas's lowering ("Only interpret mode is supported on CPU backend"). A tracer (the
    port called under jit) is not checked: jit places it."""
    if isinstance(array, jax.core.Tracer):
        return
    device = next(iter(array.devices()))
    backend = jax.default_backend()
    if device.platform != backend:
        raise ValueError(f"{name} lives on {device} ({device.platform}), but this port's kernels run on JAX's default "
                         f"backend, {backend}: put the inputs there (jax.device_put), or set JAX_PLATFORMS=cpu to run "
                         "them in Pallas's interpret mode")
