"""The one interface: workloads, their implementations, and the bridge between frameworks.

A workload (one module per workload in this package) is data plus a few functions:
cases, make_inputs, reference, check, cost (and, in its module, a `validate` that its
implementations call on their input). An implementation is a function
registered against a workload with its framework (torch | jax), its backend (one of
BACKENDS) and what it needs to run (`Needs`); it is imported only when used, so listing what
exists needs neither Triton nor JAX. The driver, the report and the tests know no backend by
name: they take every port from the registry.

Inputs are always made as torch tensors (the GPU MODE form). A JAX implementation gets
them through DLPack (to_framework), before any timing starts.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import itertools
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

WORKLOAD_MODULES = {
    "trimul": "ports.trimul",
    "matmul": "ports.matmul",
    "eigh": "ports.eigh",
}


@dataclass(frozen=True)
class Check:
    """A verdict with named error figures (max_abs, max_rel, ...) and why it failed."""

    passed: bool
    errors: dict[str, float] = field(default_factory=dict)
    reason: str = ""


# The backends an implementation may declare: the kernel languages ported to, and the library baselines.
BACKENDS = {
    "triton": "Triton, from PyTorch",
    "gluon": "Gluon, Triton's lower level",
    "pallas-triton": "Pallas on its Triton backend (deprecated since JAX 0.11)",
    "pallas-mosaic-gpu": "Pallas on Mosaic GPU, JAX's supported GPU backend",
    "library": "a library baseline (cuBLAS, cuSOLVER, XLA, ...)",
}


def ported_backend(backend: str | None) -> bool:
    """Whether a backend (as registered, or as a results record names it) is a kernel language ported to, not a
    library baseline: the registry's one answer, for implementations and records alike."""
    return backend in BACKENDS and backend != "library"


def _version_tuple(version: str) -> tuple[int, ...]:
    """'0.11.2' -> (0, 11, 2); a suffix such as '+cpu' or 'rc1' ends the numbers."""
    numbers = []
    for part in version.split("+")[0].split("."):
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        numbers.append(int(digits))
        if digits != part:
            break
    return tuple(numbers)


@dataclass(frozen=True)
class Needs:
    """What an implementation needs to run here; `missing()` names what is missing."""

    gpu: bool = False  # a CUDA GPU: no interpreter runs it on a CPU
    # the least CUDA compute capability of a GPU that runs it, e.g. (9, 0); without a GPU an interpreter runs it
    # unless `gpu` is set too
    capability: tuple[int, int] | None = None
    versions: tuple[tuple[str, str], ...] = ()  # the least versions of packages, e.g. (("jax", "0.11"),)
    # modules it imports whose package goes by several names (cupy-cuda12x, cupy-cuda13x), e.g. ("cupy",)
    modules: tuple[str, ...] = ()

    def missing(self) -> str | None:
        """Why the implementation cannot run on this machine, or None when it can."""
        import importlib.metadata
        import importlib.util

        import torch

        for module in self.modules:
            if importlib.util.find_spec(module) is None:
                return f"needs {module}, not installed"

        for package, least in self.versions:
            try:
                found = importlib.metadata.version(package)
            except importlib.metadata.PackageNotFoundError:
                return f"needs {package} >= {least}, not installed"
            if _version_tuple(found) < _version_tuple(least):
                return f"needs {package} >= {least}, found {found}"
        if not torch.cuda.is_available():
            return "needs a CUDA GPU (no interpreter runs it)" if self.gpu else None
        if self.capability and torch.cuda.get_device_capability() < self.capability:
            major, minor = torch.cuda.get_device_capability()
            return f"needs compute capability {self.capability[0]}.{self.capability[1]}, found {major}.{minor}"
        return None


@dataclass(frozen=True)
class Implementation:
    name: str
    framework: str  # "torch" | "jax"
    backend: str  # a key of BACKENDS
    label: str
    target: str  # "package.module:function", imported on first use, or "path/to/file.py:function"
    needs: Needs = Needs()

    def __post_init__(self):
        if self.framework not in ("torch", "jax"):
            raise ValueError(f"implementation {self.name!r}: framework {self.framework!r} is not torch or jax")
        if self.backend not in BACKENDS:
            raise ValueError(f"implementation {self.name!r}: backend {self.backend!r} is not one of "
                             f"{', '.join(BACKENDS)}")

    @property
    def ported(self) -> bool:
        """A port of the workload to a kernel language (not a library baseline)."""
        return ported_backend(self.backend)

    def source_path(self) -> str | None:
        """The file that holds the implementation's function, or the directory of the package that does (a port
        split into a module per stage), found without importing it (None if not found)."""
        module_name = self.target.rsplit(":", 1)[0]
        if module_name.endswith(".py") or os.path.isdir(module_name):
            return module_name
        try:
            spec = importlib.util.find_spec(module_name)
        except ImportError:
            return None
        if spec and spec.submodule_search_locations:
            return os.path.dirname(spec.origin)
        return spec.origin if spec else None

    def load(self, function: str | None = None) -> Callable:
        """The implementation's function, or another function of its module by name (a port's `batched_matmul`)."""
        module_name, function_name = self.target.rsplit(":", 1)
        function_name = function or function_name
        if module_name.endswith(".py") or os.path.isdir(module_name):
            return getattr(_module_from_file(module_name), function_name)
        return getattr(importlib.import_module(module_name), function_name)


@functools.cache
def _module_from_file(path: str):
    """The module in a file, or the package in a directory (its modules importing each other relatively), executed
    once: a variant of a port (a copy of its module, or of its package, with a change)."""
    name = f"variant_{abs(hash(path))}"
    if os.path.isdir(path):
        spec = importlib.util.spec_from_file_location(name, os.path.join(path, "__init__.py"),
                                                      submodule_search_locations=[path])
    else:
        spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        for loaded in [key for key in sys.modules if key == name or key.startswith(f"{name}.")]:
            del sys.modules[loaded]
        raise
    return module


@dataclass(frozen=True)
class Workload:
    name: str
    cases: dict[str, list[dict]]
    make_inputs: Callable[[dict, int, Any], Any]  # (case, seed, device) -> inputs
    reference: Callable[[Any], Any]  # inputs -> float64 answer
    check: Callable[[Any, Any, Any], Check]  # (inputs, output, reference) -> Check
    cost: Callable[[dict], tuple[float, float]]  # case -> (flops, minimum bytes)
    case_name: Callable[[dict], str]
    implementations: tuple[Implementation, ...]
    baseline: str  # the implementation speed-ups are measured against
    # vary(inputs, reference, generator) -> (inputs, reference): a never-seen input whose answer
    # follows cheaply from a known one (a random symmetry of the problem), for every timed call
    vary: Callable[[Any, Any, Any], tuple[Any, Any]] = None
    # the part of an output the ports must agree on (default: all of it);
    # eigh compares eigenvalues only, since eigenvectors are unique only up to sign and rotation
    comparable: Callable[[Any], Any] = None  # None: the whole output
    # optional checks beyond agreement: properties(function, convert, device, sizes) -> [dict],
    # with sizes picked from property_sizes["gpu"] or ["cpu"]
    properties: Callable | None = None
    property_sizes: dict | None = None
    # bounded_check(inputs, output) -> Check or None: `check`'s verdict where the output's own figures settle it
    # without the reference (eigh: its float64 eigendecomposition), else None; for hunts, whose inputs are all new
    bounded_check: Callable[[Any, Any], Any] | None = None
    benchmark_sets: tuple[str, ...] = ("bench",)  # the case sets timed on a GPU unless every set is asked for
    # the names of a call's arguments (the members of a tuple input, or the one input), for the driver's messages:
    # a port that writes into one is told which
    argument_names: tuple[str, ...] = ()

    def implementation(self, name: str) -> Implementation:
        for impl in self.implementations:
            if impl.name == name:
                return impl
        valid = ", ".join(i.name for i in self.implementations)
        raise KeyError(f"unknown implementation {name!r} for {self.name}; valid: {valid}")


def check_array(name: str, value, framework: str | None = None) -> None:
    """Raise a TypeError naming the argument unless `value` is an array of `framework` ("torch": a torch tensor;
    "jax": a JAX array; None: either). A NumPy array or a list is refused here, before any port reaches for what
    only those two have; so is the other framework's array: a port takes its own framework's, and
    `custom_kernel` is what converts between them (its cost is measured, never hidden in a port)."""
    found = _array_type(type(value))
    if found is None or framework not in (None, found):
        module = type(value).__module__.split(".")[0]
        shown = type(value).__name__ if module == "builtins" else f"{module}.{type(value).__qualname__}"
        wanted = {"torch": "a torch tensor", "jax": "a JAX array", None: "a torch tensor or a JAX array"}[framework]
        hint = (f"; this implementation runs in {framework}, and ports.custom_kernel(workload, implementation) takes "
                "either" if found else "")
        raise TypeError(f"{name} must be {wanted}, got {shown}{hint}")


@functools.cache
def _array_type(cls: type) -> str | None:  # by type, once: the ports validate about a dozen arrays a call
    """"torch" or "jax" for the class of an array of that framework (a tracer or a fake tensor too), else None."""
    return {"torch": "torch", "jax": "jax", "jaxlib": "jax"}.get(cls.__module__.split(".")[0])


def dtype_name(value) -> str:
    """'float32' for a torch tensor or a JAX array alike."""
    return _dtype_name(value.dtype)


@functools.cache
def _dtype_name(dtype) -> str:  # str() of a NumPy dtype (a JAX array's) costs microseconds: ports call this per array
    return str(dtype).replace("torch.", "")


LAYOUTS = ("contiguous", "strided", "transposed")  # how a case lays out its inputs in memory (`laid_out`)


def laid_out(tensor, layout: str):
    """The tensor's values in another memory layout, for the cases that check what ports get wrong about strides:
    "contiguous" (as it is); "strided": a view of every other element along the last axis of a buffer twice as
    wide; "transposed": a view of the last two axes of a buffer that holds them swapped (column-major)."""
    import torch

    if layout == "contiguous":
        return tensor
    if layout == "strided":
        wide = torch.empty((*tensor.shape[:-1], 2 * tensor.shape[-1]), dtype=tensor.dtype, device=tensor.device)
        view = wide[..., ::2]
    elif layout == "transposed":
        view = torch.empty((*tensor.shape[:-2], tensor.shape[-1], tensor.shape[-2]), dtype=tensor.dtype,
                           device=tensor.device).transpose(-1, -2)
    else:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    return view.copy_(tensor)


def like_layout(tensor, like):
    """`tensor`'s values laid out as `like` is (its strides, gaps included): a varied input keeps its case's
    layout."""
    import torch

    if like.is_contiguous():
        return tensor.contiguous()
    return torch.empty_strided(like.shape, like.stride(), dtype=tensor.dtype, device=tensor.device).copy_(tensor)


def get_workload(name: str) -> Workload:
    if name not in WORKLOAD_MODULES:
        raise KeyError(f"unknown workload {name!r}; valid: {', '.join(WORKLOAD_MODULES)}")
    return importlib.import_module(WORKLOAD_MODULES[name]).WORKLOAD


PACKED_TENSOR_BYTES = 1 << 20  # tensors up to this size cross to JAX together (see to_framework)


def to_framework(framework: str, inputs):
    """Hand torch inputs to a framework: unchanged for torch, through DLPack for JAX.

    A DLPack import costs JAX host time whatever the tensor's size
    (results/h200/experiments/call-cost-dlpack-pieces.txt), so the
    tensors of up to PACKED_TENSOR_BYTES (TriMul's eleven weights and a small mask) are copied as bytes into one
    buffer per device, imported once and split and bit-cast back to their types by one jitted function; larger
    tensors, and 64-bit ones, are imported alone, as views with no copy.
    JAX runs with 64-bit types off, so 64-bit integer tensors (GPU MODE's 0/1 mask) are narrowed to int32 on the
    torch side first; values are unchanged.
    """
    if framework == "torch":
        return inputs
    import torch

    tensors = []

    def collect(value):  # the inputs' structure, each tensor replaced by its place in `tensors`
        if isinstance(value, torch.Tensor):
            tensors.append(value.to(torch.int32) if value.dtype == torch.int64 else value.contiguous())
            return _TensorPlace(len(tensors) - 1)
        if isinstance(value, dict):
            return {k: collect(v) for k, v in value.items()}
        if isinstance(value, (tuple, list)):
            return type(value)(collect(v) for v in value)
        return value

    def fill(value):
        if isinstance(value, _TensorPlace):
            return converted[value.index]
        if isinstance(value, dict):
            return {k: fill(v) for k, v in value.items()}
        if isinstance(value, (tuple, list)):
            return type(value)(fill(v) for v in value)
        return value

    structure = collect(inputs)
    converted = _import_to_jax(tensors)
    return fill(structure)


@dataclass(frozen=True)
class _TensorPlace:
    index: int


def _import_to_jax(tensors: list) -> list:
    """JAX arrays of the same values: the small tensors of each dtype and device packed into one import."""
    import torch

    converted = [None] * len(tensors)
    groups = {}
    for index, tensor in enumerate(tensors):
        if (tensor.numel() * tensor.element_size() <= PACKED_TENSOR_BYTES and tensor.element_size() <= 4
                and not tensor.is_complex()):
            groups.setdefault(tensor.device, []).append(index)
    for members in groups.values():
        if len(members) > 1:
            packed = _dlpack_import(torch.cat([tensors[index].reshape(-1).view(torch.uint8) for index in members]))
            layout = tuple((tensors[index].numel() * tensors[index].element_size(), tuple(tensors[index].shape),
                            str(tensors[index].dtype).removeprefix("torch.")) for index in members)
            for index, part in zip(members, _unpacker()(packed, layout=layout)):
                converted[index] = part
    return [_dlpack_import(tensor) if array is None else array for array, tensor in zip(converted, tensors)]


def _dlpack_import(tensor):
    import jax

    converted = jax.dlpack.from_dlpack(tensor)
    if str(converted.dtype) != str(tensor.dtype).replace("torch.", ""):
        raise TypeError(f"a {tensor.dtype} tensor would reach JAX as {converted.dtype} "
                        "(64-bit types need jax_enable_x64)")
    return converted


@functools.cache
def _unpacker():
    """A jitted split of a packed byte buffer into arrays of the layout's (bytes, shape, dtype)s, each bit-cast back
    to its type: one dispatch for them all."""
    import jax
    import jax.numpy as jnp

    def typed(piece, dtype):
        if dtype == jnp.bool_:
            return piece != 0
        if dtype.itemsize == 1:
            return jax.lax.bitcast_convert_type(piece, dtype)
        return jax.lax.bitcast_convert_type(piece.reshape(-1, dtype.itemsize), dtype)

    def unpack(packed, *, layout):
        starts = itertools.accumulate((size for size, _, _ in layout), initial=0)
        return tuple(typed(packed[start:start + size], jnp.dtype(dtype)).reshape(shape)
                     for start, (size, shape, dtype) in zip(starts, layout))

    return jax.jit(unpack, static_argnames="layout")


def to_torch(output):
    """A framework's output as torch tensors (DLPack for JAX arrays, no copy on the GPU);
    tuples and lists of outputs are converted element by element."""
    import torch

    if isinstance(output, (tuple, list)):
        return type(output)(to_torch(value) for value in output)
    if isinstance(output, torch.Tensor):
        return output
    return torch.from_dlpack(output)


def custom_kernel(workload: str, implementation: str) -> Callable:
    """The GPU MODE entry point for any registered implementation.

    `custom_kernel("trimul", "pallas")((x, mask, weights, config))` takes torch tensors and
    returns a torch tensor, converting to and from JAX by DLPack for JAX implementations.
    An implementation this machine cannot run (`Needs.missing`) is refused here, before its first call, with a
    RuntimeError that names what it needs.
    """
    impl = get_workload(workload).implementation(implementation)
    missing = impl.needs.missing()
    if missing:
        raise RuntimeError(f"{workload} implementation {implementation!r} cannot run on this machine: {missing}")
    function = impl.load()

    def run(data):
        return to_torch(function(to_framework(impl.framework, data)))

    run.__name__ = f"{workload}_{implementation}"
    return run


CHECK_CHUNK = 1 << 25  # elements compared at a time: float64 temporaries of a whole TriMul output were 6 GiB each


def allclose_check(output, expected, rtol: float, atol: float, dtype) -> Check:
    """Elementwise |out - ref| <= atol + rtol |ref| in float64; NaN, Inf, a wrong shape or another dtype than
    `dtype` (a torch dtype) fail. Compared CHECK_CHUNK elements at a time: whole, a large output's temporaries ran
    the GPU out of memory."""
    import torch

    if not isinstance(output, torch.Tensor):
        return Check(False, reason=f"output is {type(output).__name__}, not a tensor")
    if tuple(output.shape) != tuple(expected.shape):
        return Check(False, reason=f"output shape {tuple(output.shape)}, expected {tuple(expected.shape)}")
    if output.dtype != dtype:
        return Check(False, reason=f"output dtype {dtype_name(output)}, expected {_dtype_name(dtype)}")
    outputs, references = output.detach().flatten(), expected.flatten()
    nonfinite = bad = 0
    max_abs = max_rel = difference_squares = reference_squares = 0.0
    for start in range(0, references.numel(), CHECK_CHUNK):
        out = outputs[start:start + CHECK_CHUNK].to(device=expected.device, dtype=torch.float64)
        ref = references[start:start + CHECK_CHUNK]
        finite = torch.isfinite(out)
        nonfinite += int((~finite).sum())
        diff = torch.where(finite, (out - ref).abs(), float("inf"))
        bad += int((diff > atol + rtol * ref.abs()).sum())
        max_abs = max(max_abs, float(diff.max()))
        max_rel = max(max_rel, float((diff / ref.abs().clamp_min(atol)).max()))
        difference_squares += float((out.nan_to_num() - ref).square().sum())
        reference_squares += float(ref.square().sum())
    errors = {"max_abs": max_abs, "max_rel": max_rel,
              "rel_fro": (math.sqrt(difference_squares / reference_squares) if reference_squares
                         else math.inf if difference_squares else math.nan),
              "mismatched": bad}
    if nonfinite:
        return Check(False, errors, f"{nonfinite} non-finite elements")
    if bad:
        return Check(False, errors, f"{bad} of {expected.numel()} elements outside rtol={rtol} atol={atol}")
    return Check(True, errors)


def bit_view(tensor):
    """The tensor's bits as integers, so that equality is bitwise (NaN == NaN, -0 != +0)."""
    import torch

    integer = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
    return tensor.contiguous().view(integer)


def first_difference(x, y):
    """None when x and y are bitwise equal, else where they first differ and by how much."""
    if x.shape != y.shape:
        return {"where": f"shapes {tuple(x.shape)} and {tuple(y.shape)}", "max_abs_diff": float("inf")}
    unequal = bit_view(x) != bit_view(y)
    if not unequal.any():
        return None
    index = tuple(int(i) for i in unequal.nonzero()[0])
    return {"where": index, "max_abs_diff": float((x.double() - y.double()).abs().nan_to_num(nan=float("inf")).max())}


def output_digest(output) -> str:
    """SHA-256 of an output's bits, shapes and dtypes (a tensor, or a tuple or list of them): equal digests on the
    same seeded input mean the same bits."""
    import hashlib

    digest = hashlib.sha256()
    for tensor in output if isinstance(output, (tuple, list)) else (output,):
        digest.update(f"{tuple(tensor.shape)} {tensor.dtype};".encode())
        digest.update(bit_view(tensor.detach()).cpu().numpy().tobytes())
    return digest.hexdigest()
