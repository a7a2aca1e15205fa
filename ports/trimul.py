"""TriMul: AlphaFold3's outgoing triangle multiplicative update, forward only (GPU MODE's problem).

Inputs, as GPU MODE passes them: `(x, mask, weights, config)` with
  x [B, N, N, dim] float32; mask [B, N, N] (1 keep, 0 drop; float or integer);
  weights: norm.weight, norm.bias [dim]; left_proj, right_proj, left_gate, right_gate,
  out_gate [hidden, dim]; to_out_norm.weight, to_out_norm.bias [hidden]; to_out [dim, hidden];
  config: {"dim": dim, "hidden_dim": hidden}.
Output: [B, N, N, dim] float32.

  x = LayerNorm(x)
  left  = (x Wl^T)  * mask * sigmoid(x Wlg^T)
  right = (x Wr^T)  * mask * sigmoid(x Wrg^T)
  out[b,i,j,h] = sum_k left[b,i,k,h] * right[b,j,k,h]
  result = (LayerNorm_hidden(out) * sigmoid(x Wog^T)) Wo^T

The cases are GPU MODE's (18 test, 7 bench) plus `smoke` cases small enough for the CPU
interpreters. Correct means every element within rtol = atol = 2e-2 of a float64 reference.
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from ports import (Check, Implementation, Needs, Workload, allclose_check, check_array, dtype_name, laid_out,
                   like_layout)

LAYER_NORM_EPS = 1e-5
TOLERANCE = 2e-2  # GPU MODE's rtol = atol
PROJECTIONS = ("left_proj", "left_gate", "right_proj", "right_gate", "out_gate")


def _case(seqlen, bs, dim, seed, nomask, distribution, hiddendim=128, mask_dtype="int64", layout="contiguous"):
    return dict(seqlen=seqlen, bs=bs, dim=dim, hiddendim=hiddendim, seed=seed, nomask=nomask,
                distribution=distribution, mask_dtype=mask_dtype, layout=layout)


# Transcribed from GPU MODE's trimul task definition (the `tests` and `benchmarks` lists).
TEST_CASES = [
    _case(32, 1, 128, 9371, True, "normal"),
    _case(32, 1, 128, 1092, False, "normal"),
    _case(64, 2, 256, 2291, True, "normal"),
    _case(64, 2, 256, 210284, False, "normal"),
    _case(128, 1, 768, 81934, True, "normal"),
    _case(256, 1, 128, 1932, True, "normal"),
    _case(256, 1, 128, 10432, False, "normal"),
    _case(768, 2, 128, 731, True, "normal"),
    _case(1024, 1, 384, 53121, False, "normal"),
    _case(1024, 1, 768, 31, True, "normal"),
    _case(1024, 1, 768, 4921, False, "normal"),
    _case(32, 1, 128, 937321, True, "cauchy"),
    _case(64, 2, 256, 2291, True, "cauchy"),
    _case(128, 1, 768, 8134, True, "cauchy"),
    _case(256, 1, 128, 932, True, "cauchy"),
    _case(768, 2, 128, 31, True, "cauchy"),
    _case(1024, 1, 384, 5321, False, "cauchy"),
    _case(1024, 1, 768, 491, False, "cauchy"),
]
BENCH_CASES = [
    _case(256, 2, 128, 9371, True, "normal"),
    _case(768, 1, 128, 381, True, "cauchy"),
    _case(256, 2, 384, 2301, False, "normal"),
    _case(512, 1, 128, 12819, True, "normal"),
    _case(1024, 1, 128, 381, True, "cauchy"),
    _case(768, 1, 384, 481, False, "normal"),
    _case(1024, 1, 384, 23291, True, "normal"),
]
# Small enough for the Triton interpreter and Pallas interpret mode on a CPU (seconds each);
# every family: masked and unmasked, normal and Cauchy, batch 1 to 3, hidden 32 and 128, and what ports get wrong:
# N that no tile of 16 divides, a float mask, x and the mask as strided and as transposed views, and strided at an N
# that no port pads (a view reaches the kernels as the caller made it).
SMOKE_CASES = [
    _case(16, 1, 32, 11, True, "normal", hiddendim=32),
    _case(16, 2, 64, 12, False, "normal", hiddendim=32),
    _case(32, 1, 32, 13, False, "cauchy", hiddendim=32),
    _case(16, 1, 64, 14, True, "cauchy", hiddendim=128),
    _case(20, 3, 32, 15, False, "normal", hiddendim=32, mask_dtype="float32", layout="strided"),
    _case(24, 1, 32, 16, False, "cauchy", hiddendim=32, layout="transposed"),
    _case(64, 1, 32, 17, False, "normal", hiddendim=32, layout="strided"),
]


def case_name(case: dict) -> str:
    mask = "nomask" if case["nomask"] else "fmask" if case.get("mask_dtype") == "float32" else "mask"
    layout = "" if case.get("layout", "contiguous") == "contiguous" else f"-{case['layout']}"
    return (f"n{case['seqlen']}-b{case['bs']}-d{case['dim']}-h{case['hiddendim']}-{case['distribution']}-{mask}"
            f"{layout}")


def make_inputs(case: dict, seed: int, device="cpu"):
    """GPU MODE's input distribution, drawn from a seeded generator on `device`.

    Cauchy(0, 2) is drawn by inverse CDF from the same generator (GPU MODE's own sampler uses
    the global RNG, so it is not reproducible from the seed).
    """
    batch, seq, dim, hidden = case["bs"], case["seqlen"], case["dim"], case["hiddendim"]
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)

    def randn(*shape):
        return torch.randn(shape, device=device, dtype=torch.float32, generator=gen)

    if case["distribution"] == "cauchy":
        uniform = torch.rand((batch, seq, seq, dim), device=device, dtype=torch.float64, generator=gen)
        x = (2.0 * torch.tan(math.pi * (uniform - 0.5))).to(torch.float32)
    elif case["distribution"] == "normal":
        x = randn(batch, seq, seq, dim)
    else:
        raise ValueError(f"case distribution must be 'normal' or 'cauchy', got {case['distribution']!r}")
    if case["nomask"]:
        mask = torch.ones((batch, seq, seq), device=device, dtype=torch.float32)
    else:
        mask = torch.randint(0, 2, (batch, seq, seq), device=device, generator=gen).to(
            getattr(torch, case.get("mask_dtype", "int64")))
    weights = {"norm.weight": randn(dim), "norm.bias": randn(dim)}
    for name in PROJECTIONS:
        weights[f"{name}.weight"] = randn(hidden, dim) / math.sqrt(hidden)
    weights["to_out_norm.weight"] = randn(hidden)
    weights["to_out_norm.bias"] = randn(hidden)
    weights["to_out.weight"] = randn(dim, hidden) / math.sqrt(dim)
    layout = case.get("layout", "contiguous")
    return laid_out(x, layout), laid_out(mask, layout), weights, {"dim": dim, "hidden_dim": hidden}


def validate(data, framework: str | None = None) -> None:
    """Raise a ValueError or TypeError naming the argument when `data` is not a TriMul input of `framework`'s
    arrays ("torch", "jax"; None: either; only .shape and .dtype are read)."""
    if not isinstance(data, (tuple, list)) or len(data) != 4:
        raise TypeError("trimul input must be a tuple (x, mask, weights, config)")
    x, mask, weights, config = data
    check_array("x", x, framework)
    check_array("mask", mask, framework)
    if len(x.shape) != 4 or x.shape[1] != x.shape[2]:
        raise ValueError(f"x must have shape [B, N, N, dim], got {tuple(x.shape)}")
    if min(x.shape) < 1:
        raise ValueError(f"x is empty: B, N and dim must be at least 1, got shape {tuple(x.shape)}")
    if dtype_name(x) != "float32":
        raise TypeError(f"x must be float32, got {dtype_name(x)}")
    batch, seq, _, dim = x.shape
    if tuple(mask.shape) != (batch, seq, seq):
        raise ValueError(f"mask must have shape {(batch, seq, seq)} to match x, got {tuple(mask.shape)}")
    if dtype_name(mask) == "bool" or "complex" in dtype_name(mask):
        raise TypeError(f"mask must be a real float or integer tensor of 0/1, got {dtype_name(mask)}")
    if not isinstance(config, dict) or "hidden_dim" not in config:
        raise TypeError("config must be a dict with 'hidden_dim' (and 'dim')")
    hidden = config["hidden_dim"]
    if not isinstance(hidden, int) or isinstance(hidden, bool) or hidden < 1:
        raise ValueError(f"config['hidden_dim'] must be a positive integer, got {hidden!r}")
    if config.get("dim", dim) != dim:
        raise ValueError(f"config['dim'] = {config['dim']} but x has dim {dim}")
    expected = {"norm.weight": (dim,), "norm.bias": (dim,), "to_out_norm.weight": (hidden,),
                "to_out_norm.bias": (hidden,), "to_out.weight": (dim, hidden)}
    expected.update({f"{name}.weight": (hidden, dim) for name in PROJECTIONS})
    if not isinstance(weights, dict):
        raise TypeError(f"weights must be a dict of the module's tensors, got {type(weights).__name__}")
    for name, shape in expected.items():
        if name not in weights:
            raise ValueError(f"weights[{name!r}] is missing")
        check_array(f"weights[{name!r}]", weights[name], framework)
        if tuple(weights[name].shape) != shape:
            raise ValueError(f"weights[{name!r}] must have shape {shape}, got {tuple(weights[name].shape)}")
        if dtype_name(weights[name]) != "float32":
            raise TypeError(f"weights[{name!r}] must be float32, got {dtype_name(weights[name])}")


def gated_projections(x, mask, weights):
    """The normalised x and the gated left and right projections, in whatever dtype the tensors have."""
    w = weights
    x = F.layer_norm(x, (x.shape[-1],), w["norm.weight"], w["norm.bias"], LAYER_NORM_EPS)
    mask = mask.to(x.dtype).unsqueeze(-1)
    left = (x @ w["left_proj.weight"].T) * mask * torch.sigmoid(x @ w["left_gate.weight"].T)
    right = (x @ w["right_proj.weight"].T) * mask * torch.sigmoid(x @ w["right_gate.weight"].T)
    return x, left, right


def _forward_torch(x, mask, weights, hidden: int):
    """The module's forward pass in whatever dtype the tensors have (GPU MODE's reference)."""
    w = weights
    x, left, right = gated_projections(x, mask, w)
    out = torch.einsum("bikh,bjkh->bijh", left, right)
    out = F.layer_norm(out, (hidden,), w["to_out_norm.weight"], w["to_out_norm.bias"], LAYER_NORM_EPS)
    out = out * torch.sigmoid(x @ w["out_gate.weight"].T)
    return out @ w["to_out.weight"].T


def reference(data):
    """The answer in float64, on the inputs' device."""
    x, mask, weights, config = data
    as64 = {k: v.to(torch.float64) for k, v in weights.items()}
    return _forward_torch(x.to(torch.float64), mask, as64, config["hidden_dim"])


def check(data, output, expected) -> Check:
    return allclose_check(output, expected, rtol=TOLERANCE, atol=TOLERANCE, dtype=torch.float32)


def cost(case: dict) -> tuple[float, float]:
    """(flops, minimum bytes): five projections, the triangle contraction, the output projection;
    bytes for x, mask, weights read once and the output written once."""
    batch, seq, dim, hidden = case["bs"], case["seqlen"], case["dim"], case["hiddendim"]
    pairs = batch * seq * seq
    flops = 2 * pairs * dim * 5 * hidden + 2 * batch * hidden * seq**3 + 2 * pairs * hidden * dim
    mask_bytes = 4 if case["nomask"] or case.get("mask_dtype") == "float32" else 8  # float32, or int64 0/1
    weight_bytes = 4 * (6 * hidden * dim + 2 * dim + 2 * hidden)
    return float(flops), float(pairs * dim * 4 * 2 + pairs * mask_bytes + weight_bytes)


def vary(data, expected, gen):
    """A never-seen input whose answer follows from a known one, every argument new (no memo, by address or by
    value, can answer it), from four symmetries of TriMul, each drawn at random:
    - one permutation of the sequence axis for i, j and k alike (x and the mask; the answer's i and j);
    - a permutation of the input channels (x's last axis, the first LayerNorm's weight and bias, the projections'
      columns and to_out's rows; the answer's last axis);
    - a permutation of the hidden channels (the projections' rows, the output LayerNorm's weight and bias and
      to_out's columns), which leaves the answer as it is;
    - the same hidden channels' rows of left_proj and right_proj negated: each product left * right is unchanged.
    Each tensor is one gather (x, the mask and the answer at once over all their permuted axes)."""
    x, mask, weights, config = data
    hidden = weights["to_out.weight"].shape[1]

    def order(size):
        return torch.randperm(size, generator=gen, device="cpu").to(x.device)

    rows, inputs, channels = order(x.shape[1]), order(x.shape[3]), order(hidden)
    signs = (2.0 * torch.randint(0, 2, (hidden, 1), generator=gen) - 1.0).to(x.device)
    varied = {"norm.weight": weights["norm.weight"][inputs], "norm.bias": weights["norm.bias"][inputs],
              "to_out_norm.weight": weights["to_out_norm.weight"][channels],
              "to_out_norm.bias": weights["to_out_norm.bias"][channels],
              "to_out.weight": weights["to_out.weight"][inputs[:, None], channels[None, :]]}
    for name in PROJECTIONS:
        varied[f"{name}.weight"] = weights[f"{name}.weight"][channels[:, None], inputs[None, :]]
    varied["left_proj.weight"] *= signs
    varied["right_proj.weight"] *= signs
    pairs = (slice(None), rows[:, None, None], rows[None, :, None], inputs[None, None, :])
    return ((like_layout(x[pairs], x), like_layout(mask[:, rows[:, None], rows[None, :]], mask), varied, dict(config)),
            expected[pairs])


def _run_without_tf32(forward, data):
    """forward(x, mask, weights, hidden) with TF32 matmuls off, as GPU MODE's reference runs."""
    validate(data, "torch")
    x, mask, weights, config = data
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return forward(x, mask, weights, config["hidden_dim"])
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def trimul_torch_fp32(data):
    """The GPU MODE reference: torch eager, float32, TF32 off."""
    return _run_without_tf32(_forward_torch, data)


@functools.cache
def _compiled_forward():
    # one graph per shape: the default limit of 8 would fall back to eager on the test cases
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    return torch.compile(_forward_torch, dynamic=False)


def trimul_torch_compile(data):
    """torch.compile of the float32 reference (TF32 off); compiled once per shape by torch."""
    return _run_without_tf32(_compiled_forward(), data)


def _forward_jax(x, mask, weights, hidden: int):
    import jax
    import jax.numpy as jnp

    def layer_norm(v, gamma, beta):
        mean = v.mean(-1, keepdims=True)
        var = ((v - mean) ** 2).mean(-1, keepdims=True)
        return (v - mean) * jax.lax.rsqrt(var + LAYER_NORM_EPS) * gamma + beta

    def linear(v, name):
        return jnp.matmul(v, weights[f"{name}.weight"].T, precision=jax.lax.Precision.HIGHEST)

    x = layer_norm(x, weights["norm.weight"], weights["norm.bias"])
    mask = mask.astype(x.dtype)[..., None]
    left = linear(x, "left_proj") * mask * jax.nn.sigmoid(linear(x, "left_gate"))
    right = linear(x, "right_proj") * mask * jax.nn.sigmoid(linear(x, "right_gate"))
    out = jnp.einsum("bikh,bjkh->bijh", left, right, precision=jax.lax.Precision.HIGHEST)
    out = layer_norm(out, weights["to_out_norm.weight"], weights["to_out_norm.bias"])
    out = out * jax.nn.sigmoid(linear(x, "out_gate"))
    return linear(out, "to_out")


@functools.cache
def _jitted_forward():
    import jax

    return jax.jit(_forward_jax, static_argnames="hidden")


def trimul_jax_xla(data):
    """jax.jit of the same float32 computation (XLA, precision HIGHEST: no TF32)."""
    validate(data, "jax")
    x, mask, weights, config = data
    return _jitted_forward()(x, mask, weights, hidden=config["hidden_dim"])


# The ports that shard TriMul by rows i across devices (`python -m compare trimul --gpus N`): each one's function, in
# its own module, for a shard's rows: a torch port's over a torch.distributed group, `f(data, group)`, this rank's rows;
# a JAX port's by jax.shard_map, `f(data, mesh, axis_name)`, the whole output sharded by rows.
SHARDED_BY_ROWS = {"triton": "trimul_rows", "pallas": "trimul_sharded"}


WORKLOAD = Workload(
    name="trimul",
    cases={"smoke": SMOKE_CASES, "test": TEST_CASES, "bench": BENCH_CASES},
    make_inputs=make_inputs,
    reference=reference,
    check=check,
    cost=cost,
    case_name=case_name,
    implementations=(
        Implementation("triton", "torch", "triton", "Triton port (fp16 tensor cores, fp32 accumulate)",
                       "triton_kernels.trimul:trimul"),
        Implementation("gluon", "torch", "gluon", "Gluon port (TMA, wgmma, fp16 tensor cores)",
                       "gluon_kernels.trimul:trimul", Needs(gpu=True, capability=(9, 0))),
        Implementation("pallas", "jax", "pallas-triton", "Pallas port (Triton lowering, fp16 tensor cores)",
                       "pallas_kernels.trimul:trimul"),
        Implementation("mosaic_gpu", "jax", "pallas-mosaic-gpu",
                       "Pallas port on Mosaic GPU (TMA, wgmma, fp16 tensor cores)", "mosaic_gpu_kernels.trimul:trimul",
                       Needs(capability=(9, 0))),
        Implementation("torch", "torch", "library", "torch eager fp32, TF32 off (GPU MODE reference)",
                       "ports.trimul:trimul_torch_fp32"),
        Implementation("torch_compile", "torch", "library", "torch.compile of the fp32 reference",
                       "ports.trimul:trimul_torch_compile"),
        Implementation("jax_xla", "jax", "library", "jax.jit fp32 (XLA), precision HIGHEST",
                       "ports.trimul:trimul_jax_xla"),
    ),
    baseline="torch",
    vary=vary,
    argument_names=("x", "mask", "weights", "config"),
)
