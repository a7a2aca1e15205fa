"""What the eigh Triton port's stages share: the input's checks, scratch buffers and register caps."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ports.eigh import check_values


EPS = torch.finfo(torch.float32).eps


@triton.jit
def checked(tile, transposed, bounds_ptr):
    """A tile of A and the same of A^T with the entries that are not finite zeroed, and the tile's max |A|; of the
    tile as read, the count of such entries, max |A| and max |A - A^T| in bounds[:3] (`check_bounds`)."""
    finite = tl.abs(tile) < float("inf")  # NaN fails the comparison too
    tl.store(bounds_ptr, tl.sum(tl.sum(tl.where(finite, 0.0, 1.0), axis=1), axis=0))
    tile = tl.where(finite, tile, 0.0)
    transposed = tl.where(tl.abs(transposed) < float("inf"), transposed, 0.0)
    largest = tl.max(tl.max(tl.abs(tile), axis=1), axis=0)
    tl.store(bounds_ptr + 1, largest)
    tl.store(bounds_ptr + 2, tl.max(tl.max(tl.abs(tile - transposed), axis=1), axis=0))
    return tile, transposed, largest


def bounds_buffer(*shape, device):
    """The buffer for a launch's checks' bounds ([*shape, 3]): zeros, so that a launch compiled and not run
    (`compare.tools.hopper_compile`) passes the check."""
    return torch.zeros(*shape, 3, device=device)


def check_bounds(bounds: torch.Tensor) -> None:
    """`ports.eigh.check_values` on the three bounds the kernels left (reduced over the batch on the device by
    `_jacobi` or `_tridiagonal`): the call's one synchronisation."""
    nonfinite, largest, asymmetry = bounds.tolist()
    check_values(nonfinite == 0, largest, asymmetry)


def empty(*shape, device):
    return torch.empty(shape, device=device, dtype=torch.float32)


def registers_for(programs_an_sm: int, warps: int) -> int:
    """The most registers a thread that let programs_an_sm programs of `warps` warps share an SM: each of its four
    schedulers has 16384 registers and holds whole warps, and registers go to a thread 8 at a time."""
    return 16384 // (32 * -(-programs_an_sm * warps // 4)) // 8 * 8


def register_cap(programs: int, uncapped_an_sm: int, programs_an_sm: int, warps: int,
                 device: torch.device) -> int | None:
    """The register cap a thread that lets programs_an_sm programs share an SM (`registers_for`), for a launch
    whose programs outnumber what the SMs hold uncapped (uncapped_an_sm each, at the registers it compiles to);
    None otherwise, and on CPU tensors (`compare.tools.hopper_compile`)."""
    if device.type != "cuda":
        return None
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return registers_for(programs_an_sm, warps) if programs > uncapped_an_sm * sms else None
