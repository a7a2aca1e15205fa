"""Where the torch mode's softmax and the JAX transformation's part bits (issue 54: the record's decoder differs
between the frameworks from its first attention on, by one bfloat16 unit in a few elements).

The torch mode runs softmax in its Triton row kernel (exp, sum and division in the kernel); the JAX transformation
leaves exp and the division to XLA and sums on the Pallas row kernel. This compares, on the same float32 rows:
1. the two modes' softmax, rounded to bfloat16 as the decoder rounds it, at row lengths 8 to 4096;
2. the elementwise steps alone: Triton's exp (`tl.exp`, libdevice's `exp`) and division (`/`, `div_rn`) against
   XLA's and torch's, on 2^24 values;
3. the Triton row kernels' softmax with libdevice's exp and a rounded division (the module's text, changed in those
   two places), against the JAX mode.

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

from ports import batch_invariant, batch_invariant_jax
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


def rounded_row_kernels():
    """triton_kernels/row_reductions.py with libdevice's exp and a correctly rounded division in its softmax: the
    module's own text, changed in those two places and loaded from a file (Triton compiles kernels from files)."""
    source = Path(row_reductions.__file__).read_text()
    changed = source.replace("tl.exp(chunk - largest) / total_sum",
                             "tl.math.div_rn(libdevice.exp(chunk - largest), total_sum)")
    changed = changed.replace("total += tl.exp(chunk - largest)", "total += libdevice.exp(chunk - largest)")
    changed = changed.replace("import triton.language as tl\n",
                              "import triton.language as tl\nfrom triton.language.extra import libdevice\n")
    assert changed.count("libdevice.exp") == 2, "the row kernels' softmax changed: update this experiment"
    path = Path(tempfile.mkdtemp()) / "row_reductions_rounded.py"
    path.write_text(changed)
    spec = importlib.util.spec_from_file_location("row_reductions_rounded", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    transformed = jax.jit(batch_invariant_jax.batch_invariant(lambda x: jax.nn.softmax(x, axis=-1)))
    rounded_kernels = rounded_row_kernels()
    for cols in LENGTHS:
        generator = torch.Generator(device="cuda").manual_seed(cols)
        scores = 4 * torch.randn(ROWS, cols, device="cuda", generator=generator)
        jax_mode = torch.from_dlpack(transformed(jnp.from_dlpack(scores))).bfloat16()
        with batch_invariant.batch_invariant():
            torch_mode = torch.softmax(scores, -1).bfloat16()
        rounded = rounded_kernels.softmax(scores, log=False, dtype=torch.float32)
        print(f"   length {cols:>5d}: torch mode {differing(torch_mode, jax_mode)}; "
              f"the kernel with libdevice exp and div_rn {differing(rounded.bfloat16(), jax_mode)}")


if __name__ == "__main__":
    softmaxes()
    elementwise()
