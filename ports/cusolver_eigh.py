"""cuSOLVER's batched symmetric eigensolver, cusolverDnXsyevBatched (CUDA 12.6 update 2 and later), from Python through
ctypes: an eigh baseline (`ports.eigh`), the library a user would call for a batch of matrices larger than 32 where
neither torch.linalg.eigh nor CuPy's batched eigh does.

It calls the cuSOLVER library torch itself loads, on torch's current stream. cuSOLVER reads column-major matrices:
A is symmetric, so A's row-major bytes are A, the upper triangle it is told to read is the row-major lower one that
torch.linalg.eigh reads, and the eigenvectors it writes as columns come back as rows, transposed to columns here (a
view, as torch.linalg.eigh's own result). The handle and its parameters are made once a process; every call makes
its own copy of A, workspace and results.
"""
from __future__ import annotations

import ctypes
import functools

import torch

from ports.eigh import validate

_CUDA_R_32F = 0
_EIG_MODE_VECTOR = 1
_FILL_MODE_UPPER = 1
_POINTER, _INT, _INT64, _SIZE = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_size_t
_BUFFER_SIZE_ARGS = [_POINTER, _POINTER, _INT, _INT, _INT64, _INT, _POINTER, _INT64, _INT, _POINTER, _INT,
                     ctypes.POINTER(_SIZE), ctypes.POINTER(_SIZE), _INT64]
_SOLVE_ARGS = [_POINTER, _POINTER, _INT, _INT, _INT64, _INT, _POINTER, _INT64, _INT, _POINTER, _INT,
               _POINTER, _SIZE, _POINTER, _SIZE, _POINTER, _INT64]


def _succeeded(status: int, call: str) -> None:
    if status:
        raise RuntimeError(f"{call} returned cuSOLVER status {status}")


@functools.cache
def _solver(device_index: int):
    """The loaded cuSOLVER library, a handle on the device and the routine's parameters."""
    with torch.cuda.device(device_index):
        torch.linalg.eigh(torch.eye(2, device="cuda"))  # torch loads its cuSOLVER by now
        with open("/proc/self/maps") as maps:
            paths = [line.split()[-1] for line in maps if "libcusolver.so" in line]
        if not paths:
            raise RuntimeError("torch has loaded no cuSOLVER library in this process (is it built with MAGMA alone?)")
        library = ctypes.CDLL(paths[0])
        if not hasattr(library, "cusolverDnXsyevBatched"):
            raise RuntimeError(f"{paths[0]} has no cusolverDnXsyevBatched (CUDA 12.6 update 2 and later)")
        library.cusolverDnXsyevBatched_bufferSize.argtypes = _BUFFER_SIZE_ARGS
        library.cusolverDnXsyevBatched.argtypes = _SOLVE_ARGS
        handle, params = ctypes.c_void_p(), ctypes.c_void_p()
        _succeeded(library.cusolverDnCreate(ctypes.byref(handle)), "cusolverDnCreate")
        _succeeded(library.cusolverDnCreateParams(ctypes.byref(params)), "cusolverDnCreateParams")
    return library, handle, params


def eigh_xsyev_batched(a):
    """cusolverDnXsyevBatched on a batch [..., n, n] of float32 symmetric matrices: (eigenvectors as columns,
    eigenvalues ascending), as torch.linalg.eigh. Raises RuntimeError where cuSOLVER reports a matrix it could not
    solve."""
    validate(a, "torch")
    if not a.numel():  # no matrices, or empty ones: cuSOLVER takes neither
        return a.new_empty(a.shape, dtype=torch.float32), a.new_empty(a.shape[:-1], dtype=torch.float32)
    library, handle, params = _solver(a.device.index if a.device.index is not None else torch.cuda.current_device())
    n = a.shape[-1]
    vectors = a.reshape(-1, n, n).to(torch.float32, copy=True, memory_format=torch.contiguous_format)
    batch = vectors.shape[0]
    values = torch.empty((batch, n), device=a.device, dtype=torch.float32)
    info = torch.empty(batch, device=a.device, dtype=torch.int32)
    matrix = (_FILL_MODE_UPPER, n, _CUDA_R_32F, vectors.data_ptr(), n, _CUDA_R_32F, values.data_ptr(), _CUDA_R_32F)
    with torch.cuda.device(a.device):
        stream = torch.cuda.current_stream(a.device).cuda_stream
        _succeeded(library.cusolverDnSetStream(handle, ctypes.c_void_p(stream)), "cusolverDnSetStream")
        device_bytes, host_bytes = _SIZE(), _SIZE()
        _succeeded(library.cusolverDnXsyevBatched_bufferSize(
            handle, params, _EIG_MODE_VECTOR, *matrix, ctypes.byref(device_bytes), ctypes.byref(host_bytes), batch),
            "cusolverDnXsyevBatched_bufferSize")
        device_work = torch.empty(device_bytes.value, device=a.device, dtype=torch.uint8)
        host_work = ctypes.create_string_buffer(max(host_bytes.value, 1))
        _succeeded(library.cusolverDnXsyevBatched(
            handle, params, _EIG_MODE_VECTOR, *matrix, device_work.data_ptr(), device_bytes.value,
            ctypes.addressof(host_work), host_bytes.value, info.data_ptr(), batch), "cusolverDnXsyevBatched")
    failed = int(torch.count_nonzero(info))  # one synchronisation, as torch.linalg.eigh's own check
    if failed:
        raise RuntimeError(f"cusolverDnXsyevBatched could not solve {failed} of the {batch} matrices")
    return vectors.transpose(-1, -2).reshape(a.shape), values.reshape(a.shape[:-1])
