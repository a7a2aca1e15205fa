"""Do Triton's exp and division give XLA's (and torch's) bits in float32? The softmax's two elementwise steps, on
2^24 values of x - max in [-40, 0] and their quotients by sums in [1, 4096].

python results/h200/experiments/batch-invariant/exp_bits.py  (on a GPU)
"""
import jax
import jax.numpy as jnp
import numpy as np
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

N = 1 << 24


@triton.jit
def _elementwise(x_ptr, s_ptr, exp_fast, exp_libdevice, div_fast, div_rn, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets)
    s = tl.load(s_ptr + offsets)
    tl.store(exp_fast + offsets, tl.exp(x))
    tl.store(exp_libdevice + offsets, libdevice.exp(x))
    tl.store(div_fast + offsets, tl.exp(x) / s)
    tl.store(div_rn + offsets, tl.math.div_rn(libdevice.exp(x), s))


def main():
    generator = torch.Generator(device="cuda").manual_seed(0)
    x = -40 * torch.rand(N, device="cuda", generator=generator)
    s = 1 + 4095 * torch.rand(N, device="cuda", generator=generator)
    outputs = [torch.empty_like(x) for _ in range(4)]
    _elementwise[(N // 1024,)](x, s, *outputs, BLOCK=1024)
    exp_xla = torch.from_dlpack(jax.jit(jnp.exp)(jnp.asarray(x.cpu().numpy()))).cuda()
    exp_torch = torch.exp(x)
    quotient_xla = torch.from_dlpack(jax.jit(lambda x, s: jnp.exp(x) / s)(jnp.asarray(x.cpu().numpy()),
                                                                          jnp.asarray(s.cpu().numpy()))).cuda()
    quotient_torch = torch.exp(x) / s
    rows = [("exp: triton tl.exp", outputs[0]), ("exp: triton libdevice.exp", outputs[1]), ("exp: torch", exp_torch)]
    print(f"{N} float32 values; elements whose bits differ from XLA's")
    for name, values in rows:
        print(f"  {name:34s} {int((values != exp_xla).sum()):>9d}  (bfloat16 after rounding: "
              f"{int((values.bfloat16() != exp_xla.bfloat16()).sum())})")
    for name, values in [("exp/s: triton tl.exp, /", outputs[2]), ("exp/s: triton libdevice.exp, div_rn", outputs[3]),
                         ("exp/s: torch", quotient_torch)]:
        print(f"  {name:34s} {int((values != quotient_xla).sum()):>9d}  (bfloat16 after rounding: "
              f"{int((values.bfloat16() != quotient_xla.bfloat16()).sum())})")


if __name__ == "__main__":
    main()
