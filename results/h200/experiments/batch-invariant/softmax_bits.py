"""Where the torch mode's softmax and the JAX transformation's part bits (issue 54: the record's decoder differs
between the frameworks from its first attention on, by one bfloat16 unit in a few elements).

The torch mode runs softmax in its Triton row kernel (exp, sum and division in the kernel); the JAX transformation
leaves exp and the division to XLA and sums on the Pallas row kernel. At the record the kernel took Triton's
`tl.exp` (2^(x log2 e) by ex2.approx); XLA calls libdevice's expf for exp and lowers float32 division to div.full
(its NVPTX option -nvptx-prec-divf32=1, as Triton's `/`), so the kernel now takes libdevice's exp and keeps `/`
(triton_kernels/row_reductions.py, `_exp`). This compares, on the same float32 rows:
1. the two modes' softmax, rounded to bfloat16 as the decoder rounds it, at row lengths 8 to 4096;
2. the elementwise steps alone: Triton's exp (`tl.exp`, libdevice's `exp`) and division (`/`, `div_rn`) against
   XLA's and torch's, on 2^24 values;
3. two variants of the row kernels (the module's text, changed in one place, loaded from a file): `tl.exp`, as at
   the record, and libdevice's exp with a correctly rounded division (`div_rn`), against the JAX mode.

    python results/h200/experiments/batch-invariant/softmax_bits.py   (on a GPU)
"""
import importlib.util
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from batch_invariant import jax_mode, torch_mode
from triton_kernels import row_reductions

N = 1 << 24
LENGTHS = (8, 32, 128, 1024, 4096)
ROWS = 8192


@triton.jit
def _elementwise(x_ptr, s_ptr, exp_fast, exp_libdevice, div_fast, div_rn, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets)
    s = tl.load(s_ptr + offsets)
    tl.store(exp_fast + offsets, tl.exp(x))
    tl.store(exp_libdevice + offsets, libdevice.exp(x))
    tl.store(div_fast + offsets, x / s)
    tl.store(div_rn + offsets, tl.math.div_rn(x, s))


def row_kernels_variant(name: str, old: str, new: str):
    """triton_kernels/row_reductions.py with `old` replaced by `new` (once), loaded from a file as module `name`
    (Triton compiles kernels from files)."""
    source = Path(row_reductions.__file__).read_text()
    assert source.count(old) == 1, "the row kernels changed: update this experiment"
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(source.replace(old, new))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


VARIANTS = {  # name: (old, new) in the row kernels' text
    "tl.exp (the record's kernel)": ("        return libdevice.exp(x)\n", "        return tl.exp(x)\n"),
    "libdevice exp and div_rn": ("_exp(chunk - largest, LIBDEVICE) / total_sum",
                                 "tl.math.div_rn(_exp(chunk - largest, LIBDEVICE), total_sum)"),
}


def differing(a: torch.Tensor, b: torch.Tensor) -> str:
    return f"{int((a != b).sum()):>9d} of {a.numel()}"


def elementwise():
    generator = torch.Generator(device="cuda").manual_seed(0)
    x = -40 * torch.rand(N, device="cuda", generator=generator)
    s = 1 + 4095 * torch.rand(N, device="cuda", generator=generator)
    outputs = [torch.empty_like(x) for _ in range(4)]
    _elementwise[(N // 1024,)](x, s, *outputs, BLOCK=1024)
    exp_xla = torch.from_dlpack(jax.jit(jnp.exp)(jnp.from_dlpack(x)))
    quotient_xla = torch.from_dlpack(jax.jit(jnp.divide)(jnp.from_dlpack(x), jnp.from_dlpack(s)))
    print(f"2. elementwise, {N} float32 values: elements whose bits differ from XLA's (float32; after bfloat16 "
          "rounding)")
    for name, values, xla in [("exp: triton tl.exp", outputs[0], exp_xla),
                              ("exp: triton libdevice.exp", outputs[1], exp_xla),
                              ("exp: torch.exp", torch.exp(x), exp_xla),
                              ("x / s: triton /", outputs[2], quotient_xla),
                              ("x / s: triton div_rn", outputs[3], quotient_xla),
                              ("x / s: torch", x / s, quotient_xla)]:
        print(f"   {name:28s} {differing(values, xla)}; {differing(values.bfloat16(), xla.bfloat16())}")


def softmaxes():
    print(f"1. and 3. softmax of the same float32 rows ({ROWS} rows), rounded to bfloat16: elements whose bits differ "
          "from the JAX mode's")
    transformed = jax.jit(jax_mode.batch_invariant(lambda x: jax.nn.softmax(x, axis=-1)))
    variants = {name: row_kernels_variant(f"row_reductions_{index}", *change)
                for index, (name, change) in enumerate(VARIANTS.items())}
    for cols in LENGTHS:
        generator = torch.Generator(device="cuda").manual_seed(cols)
        scores = 4 * torch.randn(ROWS, cols, device="cuda", generator=generator)
        jax_mode = torch.from_dlpack(transformed(jnp.from_dlpack(scores))).bfloat16()
        with torch_mode.batch_invariant():
            torch_mode = torch.softmax(scores, -1).bfloat16()
        line = f"   length {cols:>5d}: torch mode {differing(torch_mode, jax_mode)}"
        for name, module in variants.items():
            line += f"; {name} {differing(module.softmax(scores, log=False, dtype=torch.float32).bfloat16(), jax_mode)}"
        print(line)


if __name__ == "__main__":
    softmaxes()
    elementwise()
