"""Ports in Gluon, Triton's lower-level language: layouts, shared memory, TMA, mbarriers and wgmma made explicit.

Gluon kernels run on a GPU only: Triton's interpreter does not run them (TRITON_INTERPRET is ignored by
`gluon.jit`), so on a machine without a GPU they are compiled for sm_90 (`compare.tools.hopper_compile`) and their
numerics are checked on the H200.
"""
import torch
import triton
from triton.experimental import gluon  # noqa: F401  (the ports take these names from here)
from triton.experimental.gluon import language as gl  # noqa: F401
from triton.experimental.gluon.language.nvidia.hopper import (  # noqa: F401
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: F401

# triton 3.9 renamed the TMA copies (the 3.6 names raise there) and the CTA barrier; every other name the ports use
# is the same in both (results/h200/experiments/gluon-api/README.md)
cta_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier  # thread_barrier: triton 3.6
if hasattr(tma, "async_load"):
    tma_load, tma_store = tma.async_load, tma.async_store
else:  # triton 3.6, the H200's
    tma_load, tma_store = tma.async_copy_global_to_shared, tma.async_copy_shared_to_global


class DeviceScratch:
    """Triton's allocator of the global scratch that kernels making their TMA descriptors on the device write them
    to: one buffer per device and stream, grown as needed and reused (launches on a stream run one after another, and
    a kernel writes its descriptors as it starts; kernels on two streams may run at once, so they never share one).
    Only those kernels ask it for memory."""

    def __init__(self):
        self.buffers = {}

    def __call__(self, size: int, alignment: int, stream):
        key = (torch.cuda.current_device(), stream)
        buffer = self.buffers.get(key)
        if buffer is None or buffer.numel() < size:
            buffer = self.buffers[key] = torch.empty(max(size, 1 << 16), dtype=torch.int8, device="cuda")
        return buffer


DEVICE_SCRATCH = DeviceScratch()


def use_device_scratch() -> None:
    """Make DEVICE_SCRATCH Triton's allocator in the calling thread, before a launch of a kernel that makes its TMA
    descriptors on the device. Triton keeps its allocator in a context variable, which a new thread does not
    inherit: autograd's backward pass runs in a thread of its own, where the allocator set at import is not seen."""
    triton.set_allocator(DEVICE_SCRATCH)
