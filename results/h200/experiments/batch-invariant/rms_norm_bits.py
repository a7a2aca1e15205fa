"""Where the torch mode and the JAX transformation part bits in the decoder's RMSNorm (issue 54: with the row
kernels' exp as XLA's, `compare invariance` found the frameworks' logits apart first at `norm1.0`, one element of a
sequence by one bfloat16 unit).

The decoder's RMSNorm (compare/invariance.py) is x32 * rsqrt(mean(x32^2) + eps) * w, rounded to bfloat16. Under the
modes the mean runs on the row kernels (Triton's in torch, Pallas's in JAX); the square, the sum with eps, rsqrt and
the products are each framework's own elementwise code (torch's eager kernels, XLA's fusions). This compares each
step's bits between the frameworks, on the same bfloat16 rows, and each elementwise step alone on the same float32
values:
1. the steps of the norm, each framework from its own previous step (as the decoder runs it);
2. rsqrt alone on 2^24 values in the range the norm gives it, torch's, XLA's and Triton's (libdevice's rsqrt and
   `1 / sqrt_rn`).

    PYTHONPATH=. python results/h200/experiments/batch-invariant/rms_norm_bits.py   (on a GPU; a CPU runs it small,
                                                                                    float16, through the interpreters)
"""
import jax
import jax.numpy as jnp
import numpy as np
import torch
import triton
import triton.language as tl

from ports import batch_invariant, batch_invariant_jax

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
ROWS, DIM, VALUES = (1 << 16, 1024, 1 << 24) if ON_GPU else (64, 32, 1 << 10)
TORCH_DTYPE, JAX_DTYPE = (torch.bfloat16, jnp.bfloat16) if ON_GPU else (torch.float16, jnp.float16)
EPS = 1e-5


def bits(value) -> np.ndarray:
    """The float32 bits of a torch or JAX array."""
    array = value.float().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value.astype(jnp.float32))
    return array.view(np.uint32)


def differing(a, b) -> str:
    a, b = bits(a), bits(b)
    return f"{int(np.sum(a != b)):>10} of {a.size}"


def torch_steps(x, w):
    with batch_invariant.batch_invariant():
        x32 = x.float()
        square = x32.square()
        mean = square.mean(-1, keepdim=True)
        scale = torch.rsqrt(mean + EPS)
        return {"square": square, "mean": mean, "rsqrt": scale, "output": (x32 * scale * w.float()).to(x.dtype)}


def jax_steps(x, w):
    x32 = x.astype(jnp.float32)
    square = jnp.square(x32)
    mean = jnp.mean(square, -1, keepdims=True)
    scale = jax.lax.rsqrt(mean + EPS)
    return {"square": square, "mean": mean, "rsqrt": scale, "output": (x32 * scale * w.astype(jnp.float32)).astype(
        x.dtype)}


@triton.jit
def _rsqrt(x_ptr, libdevice_out, sqrt_rn_out, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets)
    tl.store(libdevice_out + offsets, tl.rsqrt(x))
    tl.store(sqrt_rn_out + offsets, 1.0 / tl.sqrt_rn(x))


def main():
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((ROWS, DIM), dtype=np.float32)).to(DEVICE, TORCH_DTYPE)
    w = torch.from_numpy(1 + 0.1 * rng.standard_normal(DIM, dtype=np.float32)).to(DEVICE, TORCH_DTYPE)
    in_torch = torch_steps(x, w)
    in_jax = batch_invariant_jax.batch_invariant(jax_steps)(jnp.asarray(x.float().cpu().numpy(), JAX_DTYPE),
                                                            jnp.asarray(w.float().cpu().numpy(), JAX_DTYPE))
    print(f"1. the decoder's RMSNorm, modes on, {ROWS} rows of {DIM}: elements whose bits differ, torch against JAX")
    for step in in_torch:
        print(f"   {step:8} {differing(in_torch[step], in_jax[step])}")

    values = torch.from_numpy(rng.uniform(0.25, 4.0, VALUES).astype(np.float32)).to(DEVICE)
    from_xla = jax.jit(jax.lax.rsqrt)(jnp.asarray(values.cpu().numpy()))
    print(f"2. rsqrt alone on {VALUES} float32 values in [0.25, 4): elements whose bits differ from XLA's")
    print(f"   torch.rsqrt          {differing(torch.rsqrt(values), from_xla)}")
    if ON_GPU:  # Triton's interpreter runs numpy's sqrt, not the GPU's instructions
        libdevice_rsqrt, sqrt_rn = torch.empty_like(values), torch.empty_like(values)
        _rsqrt[(VALUES // 1024,)](values, libdevice_rsqrt, sqrt_rn, BLOCK=1024)
        print(f"   triton tl.rsqrt      {differing(libdevice_rsqrt, from_xla)}")
        print(f"   triton 1 / sqrt_rn   {differing(sqrt_rn, from_xla)}")
        print(f"   torch against triton tl.rsqrt {differing(torch.rsqrt(values), libdevice_rsqrt)}")


if __name__ == "__main__":
    main()
