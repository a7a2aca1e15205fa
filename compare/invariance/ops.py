"""Which of a decoder's ops keep a sequence's bits whatever the batch, one op at a time, in torch and JAX, each
framework's batch-invariant mode off (its own kernels: cuBLAS, torch's reductions and attention; XLA) and on.

For each op and batch size B, a batch of B sequences runs the op, and the first sequence's result is compared, bit
for bit, with the result of that sequence run alone. An op is `invariant` when every B agrees, `variant at B=...`
at the first B that does not, `refused` when the mode raises NotCovered for it, and `failed` when it raises anything
else (the message is kept). Part of `python -m compare invariance --ops`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class OpSizes:
    dim: int  # the activations' last dimension, and the product's K and N
    heads: int
    head_dim: int
    length: int  # tokens a sequence


GPU_SIZES = OpSizes(dim=4096, heads=32, head_dim=128, length=128)
CPU_SIZES = OpSizes(dim=96, heads=2, head_dim=16, length=8)
EPS = 1e-5


def _inputs(sizes: OpSizes, batch: int, seed: int) -> dict[str, np.ndarray]:
    """Float32 inputs in NumPy, the same for both frameworks: activations [B, T, dim], attention's q, k, v
    [B, heads, T, head_dim], a weight [dim, dim] and a norm's weight and bias [dim]."""
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((batch, sizes.length, sizes.dim), np.float32),
            "qkv": rng.standard_normal((3, batch, sizes.heads, sizes.length, sizes.head_dim), np.float32),
            "weight": (rng.standard_normal((sizes.dim, sizes.dim)) / np.sqrt(sizes.dim)).astype(np.float32),
            "scale": (1 + 0.1 * rng.standard_normal(sizes.dim)).astype(np.float32),
            "shift": (0.1 * rng.standard_normal(sizes.dim)).astype(np.float32)}


def torch_ops(device: str, dtype, arrays: dict) -> dict:
    """name -> function of the batch's leading slice (a number of sequences) -> its output, in torch."""
    import torch
    import torch.nn.functional as F

    x, qkv, weight, scale, shift = (torch.from_numpy(arrays[name]).to(device, dtype)
                                    for name in ("x", "qkv", "weight", "scale", "shift"))
    q, k, v = qkv
    dim = x.shape[-1]
    return {
        "matmul": lambda b: x[:b] @ weight,
        "batched matmul (attention scores)": lambda b: q[:b] @ k[:b].transpose(-1, -2),
        "softmax": lambda b: torch.softmax(x[:b].float(), -1),
        "log_softmax": lambda b: torch.log_softmax(x[:b].float(), -1),
        "sum": lambda b: x[:b].float().sum(-1),
        "mean": lambda b: x[:b].float().square().mean(-1),
        "layer_norm": lambda b: F.layer_norm(x[:b], (dim,), scale, shift, EPS),
        "rms_norm": lambda b: F.rms_norm(x[:b], (dim,), scale, EPS),
        "attention": lambda b: F.scaled_dot_product_attention(q[:b], k[:b], v[:b], is_causal=True),
    }


def jax_ops(dtype, arrays: dict) -> dict:
    """The same ops in JAX (each a function of the batch's leading slice, jitted by the caller)."""
    import jax
    import jax.numpy as jnp

    f32 = jnp.float32

    def layer_norm(x):
        x = x.astype(f32)
        centred = x - jnp.mean(x, -1, keepdims=True)
        return centred * jax.lax.rsqrt(jnp.mean(jnp.square(centred), -1, keepdims=True) + EPS)

    def rms_norm(x):
        x = x.astype(f32)
        return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), -1, keepdims=True) + EPS)

    def attention(q, k, v):  # JAX's layout is [B, T, heads, head_dim]
        q, k, v = (part.transpose(0, 2, 1, 3) for part in (q, k, v))
        return jax.nn.dot_product_attention(q, k, v, is_causal=True)

    return {  # each takes (x, qkv, weight, scale, shift), positionally (the transformation's custom VJP takes no
        # keyword arguments that are arrays)
        "matmul": lambda x, qkv, weight, scale, shift: x @ weight,
        "batched matmul (attention scores)": lambda x, qkv, *_: qkv[0] @ qkv[1].transpose(0, 1, 3, 2),
        "softmax": lambda x, *_: jax.nn.softmax(x.astype(f32), -1),
        "log_softmax": lambda x, *_: jax.nn.log_softmax(x.astype(f32), -1),
        "sum": lambda x, *_: jnp.sum(x.astype(f32), -1),
        "mean": lambda x, *_: jnp.mean(jnp.square(x.astype(f32)), -1),
        "layer_norm": lambda x, qkv, weight, scale, shift: (layer_norm(x) * scale.astype(f32)
                                                            + shift.astype(f32)).astype(dtype),
        "rms_norm": lambda x, qkv, weight, scale, shift: (rms_norm(x) * scale.astype(f32)).astype(dtype),
        "attention": lambda x, qkv, *_: attention(*qkv),
    }


def _verdict(run, batches: list[int]) -> str:
    """Run `run(b)` (the first sequence's result, as a NumPy array, in a batch of b) alone and at each batch size."""
    from compare.invariance.sweep import verdict

    return verdict(lambda batch: run(max(batch, 1))[None], batches, last=False)


def probe(frameworks: list[str], on_gpu: bool, batches: list[int], seed: int = 0, progress=print,
          sizes: OpSizes | None = None) -> dict:
    """{framework: {op: {"off": verdict, "on": verdict}}}, and the sizes (by default GPU_SIZES on a GPU, CPU_SIZES
    on the interpreters)."""
    sizes = sizes or (GPU_SIZES if on_gpu else CPU_SIZES)
    arrays = _inputs(sizes, max(batches), seed)
    verdicts = {}
    if "torch" in frameworks:
        import contextlib

        import torch

        import batch_invariant.torch_mode as bi

        device, dtype = ("cuda", torch.bfloat16) if on_gpu else ("cpu", torch.float16)
        for name, op in torch_ops(device, dtype, arrays).items():
            progress(f"ops: torch {name} ...")
            entry = verdicts.setdefault("torch", {}).setdefault(name, {})
            for mode in ("off", "on"):
                def first(batch, op=op, mode=mode):
                    with bi.batch_invariant() if mode == "on" else contextlib.nullcontext(), torch.no_grad():
                        return op(batch)[0].float().cpu().numpy()

                entry[mode] = _verdict(first, batches)
    if "jax" in frameworks:
        import jax
        import jax.numpy as jnp

        from batch_invariant.jax_mode import batch_invariant

        dtype = jnp.bfloat16 if on_gpu else jnp.float16
        inputs = {name: jnp.asarray(value, dtype) for name, value in arrays.items()}
        for name, op in jax_ops(dtype, arrays).items():
            progress(f"ops: jax {name} ...")
            entry = verdicts.setdefault("jax", {}).setdefault(name, {})
            for mode in ("off", "on"):
                function = jax.jit(batch_invariant(op) if mode == "on" else op)

                def first(batch, function=function):
                    return np.asarray(function(inputs["x"][:batch], inputs["qkv"][:, :batch], inputs["weight"],
                                               inputs["scale"], inputs["shift"])[0].astype(jnp.float32))

                entry[mode] = _verdict(first, batches)
    return {"sizes": sizes.__dict__, "batches": batches, "verdicts": verdicts}


def table(ops: dict) -> list[str]:
    """Lines: each op's verdicts, a column a framework and mode."""
    columns = [(framework, mode) for framework in ops["verdicts"] for mode in ("off", "on")]
    names = list(dict.fromkeys(name for entries in ops["verdicts"].values() for name in entries))
    lines = [f"one op at a time, a sequence alone against in a batch of {ops['batches']} ({ops['sizes']}):",
             (f"  {'op':34} " + " ".join(f"{f'{framework} {mode}':22}" for framework, mode in columns)).rstrip()]
    for name in names:
        cells = [ops["verdicts"][framework].get(name, {}).get(mode, "-") for framework, mode in columns]
        lines.append((f"  {name:34} " + " ".join(f"{cell.split(':')[0]:22}" for cell in cells)).rstrip())
    return lines
