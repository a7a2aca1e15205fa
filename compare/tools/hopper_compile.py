"""What a Triton port's kernels cost to compile for the H200 (sm_90), on any machine: no GPU needed.

    python -m compare.tools.hopper_compile eigh --case test:3

Runs the workload's Triton implementation on CPU tensors with every kernel launch intercepted:
each distinct kernel (its constexprs, argument types, warps and stages) is compiled for sm_90 by
Triton's own pipeline instead of being run. Prints each kernel's compile time (near zero where
Triton's cache already holds the kernel: --cold compiles afresh), shared memory (an H200 program
may use at most 227 KB) and, where ptxas is found, registers and spilled bytes. No kernel output
is computed, so this suits launchers whose launches do not depend on kernel results (all the
ports here). Exit status 1 if a kernel fails to compile or needs more shared memory than the
H200 has. Triton's interpreter must be off (unset TRITON_INTERPRET). --specialise compiles as a
launch does (`_launch_specialisation`), the closer model of the GPU's registers and spills.
Neither compile bounds the other's shared memory (matmul bench:6 needs 144 KB specialised, 48
not; eigh's one-launch kernel at 2048 needed more unspecialised, as the GPU's Triton 3.6 did),
so the tests guard with both.

`lower_for_hopper` does the same for the JAX ports: a traced function lowered for CUDA as on an H200, no GPU needed.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from compare.tools.one_case import one_case, one_case_arguments
from kernel_support.triton_launch import TRITON_ALIGNMENT, through_tritons_dispatch

H200_SHARED_BYTES = 227 * 1024  # the most shared memory one program (CTA) may use on sm_90
TORCH_TYPES = {"float32": "fp32", "float64": "fp64", "float16": "fp16", "bfloat16": "bf16", "int32": "i32",
               "int64": "i64", "int8": "i8", "uint8": "u8", "bool": "i1"}


@dataclass
class CompiledKernel:
    name: str
    warps: int
    seconds: float
    shared_bytes: int | None = None
    registers: int | None = None
    spilled_bytes: int | None = None
    error: str | None = None
    ptx: str | None = None  # the compiled PTX, for reading where the compiler put its barriers and copies


def lower_for_hopper(jitted, *args, **kwargs):
    """The jitted function traced on these arguments and lowered for CUDA as on an H200, on any machine.

    jax 0.11's Pallas-Triton lowering asks the device for its compute capability and, on a machine without a GPU,
    takes it from an abstract device only (jax 0.10 assumed one). Where the plain lowering says so, the function is
    traced and lowered again under an abstract mesh whose device is an H200 (the trace reads the mesh, so it happens
    inside too). Only there: Mosaic GPU's lowering needs no device, and jax 0.11.2's fails under such a mesh
    ("Shaped arrays must be represented by ir.Values"). The abstract device's class is not exported by jax: hence
    the private import.
    """
    import jax
    from jax._src.mesh import AbstractDevice

    try:
        return jitted.trace(*args, **kwargs).lower(lowering_platforms=("cuda",))
    except RuntimeError as error:
        if "No supported GPU devices found" not in str(error):
            raise
    h200 = AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="gpu")
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("device",), abstract_device=h200)):
        return jitted.trace(*args, **kwargs).lower(lowering_platforms=("cuda",))


def triton_kernels_in(lowered) -> list[str]:
    """The names of the Pallas-Triton kernels a lowered JAX function launches (`lower_for_hopper`'s result), in the
    order the module calls them: each is a custom call of XLA's Triton target that carries the kernel's IR."""
    return re.findall(r'custom_call @__gpu\$xla\.gpu\.triton\(.*\bname = "([^"]+)", num_stages', lowered.as_text())


def _argument_type(value) -> str:
    """Triton's signature type of a launch argument."""
    import torch

    if isinstance(value, torch.Tensor):
        return "*" + TORCH_TYPES[str(value.dtype).removeprefix("torch.")]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -2**31 <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    if type(value).__name__ == "TensorDescriptor":  # a Gluon kernel's TMA descriptor
        block = ", ".join(map(str, value.block_shape))
        return f"tensordesc<{TORCH_TYPES[str(value.base.dtype).removeprefix('torch.')]}[{block}],{value.layout!r}>"
    raise TypeError(f"no Triton type for a launch argument of type {type(value).__name__}")


def _ptxas_usage(ptx: str) -> tuple[int | None, int | None]:
    """(registers, spilled bytes) of a kernel's PTX, from `ptxas -v` for sm_90a; (None, None) without ptxas."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        ptxas = get_ptxas(90).path
    except Exception:  # an older or newer Triton without this helper: leave the columns empty
        return None, None
    with tempfile.TemporaryDirectory() as folder:
        source = os.path.join(folder, "kernel.ptx")
        with open(source, "w") as handle:
            handle.write(ptx)
        report = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", source, "-o", os.devnull],
                                capture_output=True, text=True).stderr
    registers = re.search(r"Used (\d+) registers", report)
    spills = re.findall(r"(\d+) bytes spill stores", report)
    return (int(registers.group(1)) if registers else None), (sum(map(int, spills)) if spills else None)


def _launch_specialisation(kernel, bound: dict, constexprs: dict) -> tuple[dict, dict]:
    """What a launch specialises, as Triton's binder does: (constants, attributes). Integers equal to 1 become
    constants; pointers 16-byte aligned and integers divisible by 16 are marked `tt.divisibility` 16; the
    kernel's `do_not_specialize` arguments are left alone (and `do_not_specialize_on_alignment` ones unmarked)."""
    import torch

    def named(indices):
        return {kernel.arg_names[i] if isinstance(i, int) else i for i in indices or ()}

    untouched = named(kernel.do_not_specialize)
    unaligned = untouched | named(getattr(kernel, "do_not_specialize_on_alignment", ()))
    constants, marked = {}, {}
    for index, name in enumerate(kernel.arg_names):
        value = bound[name]
        if name in constexprs or name in untouched or isinstance(value, bool):
            continue
        if isinstance(value, int) and value == 1:
            constants[name] = 1
        elif name not in unaligned and (value.data_ptr() % TRITON_ALIGNMENT == 0 if isinstance(value, torch.Tensor)
                                        else isinstance(value, int) and value % TRITON_ALIGNMENT == 0):
            marked[(index,)] = [["tt.divisibility", TRITON_ALIGNMENT]]
    return constants, marked


def compile_launches(function, inputs, specialise: bool = False) -> list[CompiledKernel]:
    """Call function(inputs) with each Triton launch compiled for sm_90 instead of run; one entry per distinct kernel.
    specialise: with the launch's divisibility attributes (`_launch_specialisation`), as the GPU compiles it."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    try:
        from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction
    except ImportError:  # a Triton without Gluon
        GluonASTSource = GluonJITFunction = None

    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("the Triton interpreter is on (TRITON_INTERPRET): kernels would run, not compile")
    compiled: dict[tuple, CompiledKernel] = {}
    option_names = ("num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion")

    def compile_instead(kernel, *args, grid, warmup, **kwargs):
        options = {name: kwargs[name] for name in option_names if name in kwargs}
        for name in options.keys() - set(kernel.arg_names):  # a Gluon kernel may take num_warps as a constexpr too
            del kwargs[name]
        if getattr(kernel, "debug", None):  # a kernel built with debug=True: its device_assert compiled in
            options["debug"] = True
        bound = {param.name: param.default for param in kernel.params if param.has_default}
        bound.update(zip(kernel.arg_names, args))
        bound.update(kwargs)
        constexprs = {p.name: bound[p.name] for p in kernel.params if p.is_constexpr or bound[p.name] is None}
        attrs = None
        if specialise:
            constants, attrs = _launch_specialisation(kernel, bound, constexprs)
            constexprs.update(constants)
        signature = {name: "constexpr" if name in constexprs else _argument_type(bound[name])
                     for name in kernel.arg_names}
        key = (kernel.fn.__qualname__, tuple(signature.items()), tuple(constexprs.items()), tuple(options.items()),
               tuple(sorted(attrs or {})))
        if key in compiled:
            return None
        start = time.perf_counter()
        flags = [name for name, value in constexprs.items() if value is True]  # tells variants apart in the table
        name = kernel.fn.__name__ + (f"[{','.join(flags)}]" if flags else "")
        entry = CompiledKernel(name, options.get("num_warps", 4), 0.0)
        try:
            source = GluonASTSource if GluonJITFunction and isinstance(kernel, GluonJITFunction) else ASTSource
            binary = triton.compile(source(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs),
                                    target=GPUTarget("cuda", 90, 32), options=options)
            entry.seconds = time.perf_counter() - start
            entry.shared_bytes = binary.metadata.shared
            entry.ptx = binary.asm["ptx"]
            entry.registers, entry.spilled_bytes = _ptxas_usage(entry.ptx)
        except Exception as error:  # reported per kernel, so one failure does not hide the others
            entry.seconds = time.perf_counter() - start
            last_line = (str(error).strip().splitlines() or [""])[-1]
            entry.error = f"{type(error).__name__}: {last_line[:200]}"
        compiled[key] = entry
        return None

    original = JITFunction.run
    JITFunction.run = compile_instead
    try:
        with through_tritons_dispatch():  # a kernel this process launched before would skip the interception
            function(inputs)
    finally:
        JITFunction.run = original
    return list(compiled.values())


def main(argv=None) -> int:
    parser = one_case_arguments("python -m compare.tools.hopper_compile", __doc__, "test:0", "triton",
                                "a Triton implementation of the workload, or a --variant's name")
    parser.add_argument("--cold", action="store_true",
                        help="compile into an empty Triton cache, so the seconds are a first compile's")
    parser.add_argument("--specialise", action="store_true",
                        help="compile as a launch does (integers equal to 1 as constants, pointers and "
                             "integers divisible by 16 marked so, do_not_specialize honoured): registers and "
                             "spills as the GPU compiles them, where the default, unspecialised compile can "
                             "report far more; shared memory can differ either way")
    args = parser.parse_args(argv)
    if not args.cold:
        return compile_and_report(args)
    with tempfile.TemporaryDirectory(prefix="hopper_compile_") as cache:
        os.environ["TRITON_CACHE_DIR"] = cache
        return compile_and_report(args)


def compile_and_report(args) -> int:
    """Compile the case's kernels and print the table; the exit status."""
    try:
        workload, case = one_case(args.workload, args.case, args.variant)
        impl = workload.implementation(args.impl)
        if impl.backend not in ("triton", "gluon"):
            raise ValueError(f"{args.impl} is written in {impl.backend}, not Triton or Gluon")
        kernels = compile_launches(impl.load(), workload.make_inputs(case, case["seed"], "cpu"), args.specialise)
    except (KeyError, ValueError, RuntimeError) as error:
        print(f"bad argument: {error}", file=sys.stderr)
        return 2
    print(f"{args.workload} {workload.case_name(case)}, {impl.name}: {len(kernels)} kernels compiled for sm_90"
          + (" as launched (divisibility specialisation)" if args.specialise else ""))
    print(f"{'kernel':36s} {'warps':>5s} {'compile s':>9s} {'shared KB':>9s} {'registers':>9s} {'spilled B':>9s}")
    failed = False
    for kernel in kernels:
        if kernel.error:
            failed = True
            print(f"{kernel.name:36s} {kernel.warps:5d} {kernel.seconds:9.1f}  failed: {kernel.error}")
            continue
        over = kernel.shared_bytes > H200_SHARED_BYTES
        failed |= over
        cells = [f"{kernel.shared_bytes / 1024:9.1f}"] + [f"{value:9d}" if value is not None else f"{'-':>9s}"
                                                          for value in (kernel.registers, kernel.spilled_bytes)]
        print(f"{kernel.name:36s} {kernel.warps:5d} {kernel.seconds:9.1f} {' '.join(cells)}"
              + (f"  over the H200's {H200_SHARED_BYTES // 1024} KB" if over else ""))
    print(f"total compile time {sum(kernel.seconds for kernel in kernels):.1f} s (this machine's CPU)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
