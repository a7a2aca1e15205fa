"""Where the compiler puts CTA barriers in the Gluon matmul kernel at 128 x 256 tiles (3000 x 5120 x 2880), with the
port's `cta_barrier` in `store_tile` and without it: the PTX's barriers, TMA copies, wgmma waits and shared stores
from the K loop's end to the output tile's store, compiled for sm_90 by the installed Triton (no GPU needed).

    python results/h200/experiments/gluon-matmul/barrier_ptx.py   (from the repository's root, TRITON_INTERPRET unset)
"""
import importlib.util
import pathlib
import re
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import JITFunction

sys.path.insert(0, str(pathlib.Path.cwd()))
from compare.hopper_compile import _argument_type  # noqa: E402

SOURCE = pathlib.Path("gluon_kernels/matmul.py").read_text()
UNFENCED = SOURCE.replace("    cta_barrier()\n    c_smem = gl.allocate_shared_memory(", "    c_smem = gl.allocate_shared_memory(", 1)
SHOWN = re.compile(r"bar\.sync|cp\.async\.bulk\.tensor|wgmma\.wait_group|stmatrix|st\.shared|crit_edge")


def ptx_of(text: str) -> str:
    path = pathlib.Path(tempfile.mkdtemp()) / "gluon_matmul_copy.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    compiled = {}

    def compile_instead(kernel, *args, grid, warmup, **kwargs):
        options = {"num_warps": kwargs["num_warps"]}
        bound = {p.name: p.default for p in kernel.params if p.has_default}
        bound.update(zip(kernel.arg_names, args))
        bound.update(kwargs)
        constexprs = {p.name: bound[p.name] for p in kernel.params if p.is_constexpr or bound[p.name] is None}
        signature = {n: "constexpr" if n in constexprs else _argument_type(bound[n]) for n in kernel.arg_names}
        source = GluonASTSource(fn=kernel, signature=signature, constexprs=constexprs)
        compiled["ptx"] = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]

    original, JITFunction.run = JITFunction.run, compile_instead
    try:
        m, n, k = 3000, 5120, 2880
        module.matmul((torch.zeros((m, k), dtype=torch.bfloat16), torch.zeros((k, n), dtype=torch.bfloat16), "same"))
    finally:
        JITFunction.run = original
    return compiled["ptx"]


def main():
    print(f"triton {triton.__version__}")
    for name, text in (("with cta_barrier", SOURCE), ("without it", UNFENCED)):
        lines = [line.strip() for line in ptx_of(text).splitlines() if SHOWN.search(line)]
        tail = lines[next(i for i, line in enumerate(lines) if "crit_edge" in line):]
        print(f"\n{name}: after the K loop")
        shown, count = None, 0
        for line in tail + [None]:  # runs of one instruction folded: "N x instruction"
            short = None if line is None else re.sub(r"\s+", " ", line.split("[")[0])[:70]
            if short != shown and shown is not None:
                print(f"  {count} x {shown}")
                count = 0
            shown, count = short, count + 1
            if line is not None and "cp.async.bulk.tensor.2d.global.shared" in line:
                print(f"  1 x {short}")
                break


if __name__ == "__main__":
    main()
