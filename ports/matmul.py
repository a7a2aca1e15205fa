"""Deterministic, batch-invariant matmul: C = A @ B, bf16 in, fp32 accumulation, bf16 or fp32 out.

Inputs: `(a, b, out)` with a [M, K] and b [K, N] of one dtype (bfloat16; float16 is accepted
too, for the Triton interpreter, which misreads bf16 on CPU) and `out` either "same" (C in
the input dtype) or "float32".

Besides agreement with a float64 reference, three properties are checked by the driver:
batch invariance (row r of A[:M] @ B has the same bits for every M, and a row's bits do not
depend on where in a batch it sits), run-to-run determinism, and bitwise agreement between the
ports.
"""
from __future__ import annotations

import functools
import random

import torch

from ports import (Check, Implementation, Needs, Workload, check_array, dtype_name, first_difference, laid_out,
                   like_layout)

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
OUTPUTS = ("same", "float32")
REL_FROBENIUS_LIMIT = 1e-2
ELEMENT_RTOL = 2.0**-7  # twice bf16's rounding unit, relative to |ref| + rms(ref)


def _case(m, n, k, seed, dtype="bfloat16", out="same", layout="contiguous"):
    return dict(m=m, n=n, k=k, dtype=dtype, out=out, seed=seed, layout=layout)


BENCH_CASES = (
    [_case(m, 4096, 4096, 100 + m) for m in (1, 16, 64, 128, 512, 1024, 4096, 8192)]
    + [_case(m, 14336, 4096, 200 + m) for m in (1, 16, 128, 1024, 4096)]
    + [_case(m, 4096, 14336, 300 + m) for m in (1, 16, 128, 1024, 4096)]
)
# Ragged sizes (multiples of no tile), both output types, the LLM shapes at odd M, and 128 x 256 tiles whose K
# steps are no multiple of the ring's stages (gpt-oss-20b's qkv at M = 1000, where the Gluon port's epilogue once
# raced its K loop: `gluon_kernels.matmul.store_tile`, results/h200/experiments/gluon-matmul/README.md).
TEST_CASES = [
    _case(1, 7, 33, 1), _case(7, 33, 255, 2), _case(33, 255, 1000, 3), _case(255, 1000, 7, 4),
    _case(1000, 1, 255, 5), _case(1000, 1000, 1000, 6, out="float32"), _case(1, 4096, 4096, 7),
    _case(7, 4096, 4096, 8, out="float32"), _case(33, 14336, 4096, 9), _case(255, 4096, 14336, 10),
    _case(1000, 4096, 4096, 11), _case(4096, 4096, 4096, 12, out="float32"), _case(1000, 5120, 2880, 13),
]
# The products of real models at decode and prefill batch sizes (weights as [K, N]), for the torch-side ports'
# tile heuristic (issue 56): M, N and K ragged against the tiles, narrow N, M from 1 to 4096, K up to 16384, and
# the bench shapes' neighbours. Each names its model and layer (sizes from the models' published config.json).
_MODELS = {
    "llama-3.1-8b qkv": (6144, 4096), "llama-3.1-8b gate_up": (28672, 4096), "llama-3.1-8b down": (4096, 14336),
    "llama-3.1-8b o_proj": (4096, 4096), "llama-3.1-8b lm_head": (128256, 4096),
    "qwen2.5-7b qkv": (4608, 3584), "qwen2.5-7b o_proj": (3584, 3584),
    "gpt-oss-20b qkv": (5120, 2880), "gpt-oss-20b o_proj": (2880, 4096), "gpt-oss-20b router": (32, 2880),
    "gpt-oss-120b router": (128, 2880), "vit-b/16 head": (1000, 768), "llama-3.1-405b qkv": (18432, 16384),
}  # model layer -> (N, K)
SHAPES_CASES = [
    dict(_case(m, *_MODELS[layer], 400 + i), model=layer) for i, (layer, m) in enumerate([
        ("llama-3.1-8b qkv", 1), ("llama-3.1-8b qkv", 17), ("llama-3.1-8b qkv", 1000),
        ("llama-3.1-8b gate_up", 1), ("llama-3.1-8b gate_up", 257),
        ("llama-3.1-8b down", 3), ("llama-3.1-8b down", 2048),
        ("llama-3.1-8b lm_head", 1), ("llama-3.1-8b lm_head", 100),
        ("qwen2.5-7b qkv", 1), ("qwen2.5-7b qkv", 4096), ("qwen2.5-7b o_proj", 129),
        ("gpt-oss-20b qkv", 1), ("gpt-oss-20b qkv", 3000), ("gpt-oss-20b o_proj", 1000),
        ("gpt-oss-20b router", 1), ("gpt-oss-20b router", 4096), ("gpt-oss-120b router", 2048),
        ("vit-b/16 head", 1), ("vit-b/16 head", 256),
        ("llama-3.1-405b qkv", 1), ("llama-3.1-405b qkv", 16),
        # the bench shapes' neighbours (M next to the bench's 1, 16, 64, 128, 512, 1024 at 4096 x 4096)
        *[("llama-3.1-8b o_proj", m) for m in (2, 15, 65, 127, 513, 1025)]])]
# float16 so that the Triton interpreter reads its inputs correctly on CPU; A and B as transposed (column-major)
# and as strided views too.
SMOKE_CASES = [
    _case(1, 64, 64, 21, "float16"), _case(7, 33, 40, 22, "float16"),
    _case(65, 70, 96, 23, "float16", out="float32"), _case(128, 128, 128, 24, "float16"),
    _case(20, 48, 40, 25, "float16", layout="transposed"), _case(3, 40, 72, 26, "float16", layout="strided"),
]


def case_name(case: dict) -> str:
    layout = "" if case.get("layout", "contiguous") == "contiguous" else f"-{case['layout']}"
    return f"m{case['m']}-n{case['n']}-k{case['k']}-{case['dtype']}-out_{case['out']}{layout}"


def make_inputs(case: dict, seed: int, device="cpu"):
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    dtype = DTYPES[case["dtype"]]
    a = torch.randn((case["m"], case["k"]), device=device, generator=gen).to(dtype)
    b = torch.randn((case["k"], case["n"]), device=device, generator=gen).to(dtype)
    layout = case.get("layout", "contiguous")
    return laid_out(a, layout), laid_out(b, layout), case["out"]


def validate(data, framework: str | None = None) -> None:
    """Raise a ValueError or TypeError naming the argument when `data` is not (a, b, out) of `framework`'s arrays
    ("torch", "jax"; None: either)."""
    if not isinstance(data, (tuple, list)) or len(data) != 3:
        raise TypeError("matmul input must be a tuple (a, b, out)")
    a, b, out = data
    check_array("a", a, framework)
    check_array("b", b, framework)
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise ValueError(f"a and b must be 2-D, got a {tuple(a.shape)} and b {tuple(b.shape)}")
    _validate_product(a, b, out, a.shape, b.shape)


def validate_batch(a, b, out, a_transposed: bool = False, b_transposed: bool = False,
                   framework: str | None = None) -> None:
    """`validate` for a port's `batched_matmul`: a [B, M, K] and b [B, K, N] (a_transposed: A^T, [B, K, M];
    b_transposed: B^T, [B, N, K]) with one B >= 1, each product as `validate` takes it."""
    check_array("a", a, framework)
    check_array("b", b, framework)
    a_form, b_form = "[B, K, M]" if a_transposed else "[B, M, K]", "[B, N, K]" if b_transposed else "[B, K, N]"
    if len(a.shape) != 3 or len(b.shape) != 3 or a.shape[0] != b.shape[0] or a.shape[0] < 1:
        raise ValueError(f"a batch of products takes a {a_form} and b {b_form} with one B >= 1, got a "
                         f"{tuple(a.shape)} and b {tuple(b.shape)}")
    _validate_product(a, b, out, a.shape[:0:-1] if a_transposed else a.shape[1:],
                      b.shape[:0:-1] if b_transposed else b.shape[1:])


def _validate_product(a, b, out, a_shape, b_shape) -> None:
    if a_shape[1] != b_shape[0]:
        raise ValueError(f"a is [M, K] = {tuple(a_shape)} but b is [K, N] = {tuple(b_shape)}: K differs")
    if min(a_shape[0], a_shape[1], b_shape[1]) < 1:
        raise ValueError(f"M, N and K must be at least 1, got a {tuple(a_shape)} and b {tuple(b_shape)}")
    if dtype_name(a) not in DTYPES or dtype_name(b) != dtype_name(a):
        raise TypeError(f"a and b must both be bfloat16 or both float16, got {dtype_name(a)} and {dtype_name(b)}")
    if out not in OUTPUTS:
        raise ValueError(f"out must be one of {OUTPUTS}, got {out!r}")


def output_dtype(data):
    return torch.float32 if data[2] == "float32" else data[0].dtype


def reference(data):
    a, b, _ = data
    return a.to(torch.float64) @ b.to(torch.float64)


def check(data, output, expected) -> Check:
    """Relative Frobenius error within 1e-2 and every element within bf16 tolerance."""
    if not isinstance(output, torch.Tensor):
        return Check(False, reason=f"output is {type(output).__name__}, not a tensor")
    if tuple(output.shape) != tuple(expected.shape):
        return Check(False, reason=f"output shape {tuple(output.shape)}, expected {tuple(expected.shape)}")
    if output.dtype != output_dtype(data):
        return Check(False, reason=f"output dtype {dtype_name(output)}, expected {output_dtype(data)}")
    out = output.detach().to(device=expected.device, dtype=torch.float64)
    diff = (out - expected).abs().nan_to_num(nan=float("inf"))
    scale = expected.abs() + expected.square().mean().sqrt()
    bad = int((diff > ELEMENT_RTOL * scale).sum())
    errors = {"max_abs": float(diff.max()),
              "rel_fro": float(torch.linalg.vector_norm(out.nan_to_num() - expected)
                               / torch.linalg.vector_norm(expected).clamp_min(1e-300)),
              "mismatched": bad}
    if not torch.isfinite(out).all():
        return Check(False, errors, f"{int((~torch.isfinite(out)).sum())} non-finite elements")
    if errors["rel_fro"] > REL_FROBENIUS_LIMIT:
        return Check(False, errors, f"relative Frobenius error {errors['rel_fro']:.2e} > {REL_FROBENIUS_LIMIT}")
    if bad:
        return Check(False, errors, f"{bad} elements outside bf16 tolerance")
    return Check(True, errors)


def cost(case: dict) -> tuple[float, float]:
    m, n, k = case["m"], case["n"], case["k"]
    out_bytes = 4 if case["out"] == "float32" else 2
    return 2.0 * m * n * k, float(2 * (m * k + k * n) + out_bytes * m * n)


# Sizes for the property sweeps: on a GPU, K = N = 4096 with M across all five tile configurations that
# matmul_tiling picks there (64 x 32 up to M = 64, 64 x 64 up to 192, 64 x 128 up to 256, 128 x 128 up to 512 and
# from 1025 to 1536, 128 x 256 between and above). On CPU the interpreters' dots (numpy for Triton, XLA's CPU dot
# for Pallas) sum in orders that depend on the tile's shape, unlike the GPU's tensor-core instructions, so the CPU
# sweep stays inside one configuration (M <= 64 at N = 48: 64 x 32).
PROPERTY_SIZES = {
    "gpu": dict(k=4096, n=4096, dtype="bfloat16", every_m=64,
                sampled_m=(65, 96, 127, 128, 129, 255, 256, 257, 511, 777, 1000, 1024, 2047, 3001, 4096, 5555, 8192),
                batch_sizes=(1, 3, 64, 100, 1000, 8192), repeats=100, repeat_m=1000),
    "cpu": dict(k=200, n=48, dtype="float16", every_m=64, sampled_m=(65, 96, 129), batch_sizes=(1, 3, 17, 64),
                repeats=100, repeat_m=65),
}


def properties(function, convert, device, sizes: dict) -> list[dict]:
    """Batch invariance, placement invariance and run-to-run determinism of one implementation.

    `function` takes framework inputs made by `convert(a, b, out)` and returns a torch tensor.
    Each entry: {"property", "passed", "checked", "first_difference" (or None)}.
    """
    gen = torch.Generator(device=device)
    gen.manual_seed(4242)
    dtype = DTYPES[sizes["dtype"]]
    m_values = list(range(1, sizes["every_m"] + 1)) + list(sizes["sampled_m"])
    m_max = max(m_values + list(sizes["batch_sizes"]))
    a = torch.randn((m_max, sizes["k"]), device=device, generator=gen).to(dtype)
    b = torch.randn((sizes["k"], sizes["n"]), device=device, generator=gen).to(dtype)

    def run(rows):
        return function(convert(rows, b, "same"))

    full = run(a)
    results = []

    failure = None
    for m in m_values:
        failure = first_difference(run(a[:m]), full[:m])
        if failure:
            failure["m"] = m
            break
    results.append({"property": "batch invariance: rows of A[:M] @ B equal the full product's",
                    "passed": failure is None,
                    "checked": f"M = 1..{sizes['every_m']}, {len(sizes['sampled_m'])} more up to {m_max}",
                    "first_difference": failure})

    rng = random.Random(7)
    failure, placements = None, 0
    for source_row in rng.sample(range(m_max), 4):
        for batch in sizes["batch_sizes"]:
            position = rng.randrange(batch)
            others = torch.randn((batch, sizes["k"]), device=device, generator=gen).to(dtype)
            others[position] = a[source_row]
            placements += 1
            failure = first_difference(run(others)[position], full[source_row])
            if failure:
                failure.update(row=source_row, batch=batch, position=position)
                break
        if failure:
            break
    results.append({"property": "placement invariance: a row's bits do not depend on its batch or position",
                    "passed": failure is None, "checked": f"{placements} placements", "first_difference": failure})

    first = run(a[:sizes["repeat_m"]])
    failure = None
    for repeat in range(1, sizes["repeats"]):
        failure = first_difference(run(a[:sizes["repeat_m"]]), first)
        if failure:
            failure["repeat"] = repeat
            break
    results.append({"property": "run-to-run determinism", "passed": failure is None,
                    "checked": f"{sizes['repeats']} runs at M = {sizes['repeat_m']}", "first_difference": failure})
    return results


def vary(data, expected, gen):
    """Permuting A's rows and B's columns permutes C's rows and columns: a new input (also at
    M = 1) for the price of two gathers."""
    a, b, out = data
    rows = torch.randperm(a.shape[0], generator=gen, device="cpu").to(a.device)
    cols = torch.randperm(b.shape[1], generator=gen, device="cpu").to(a.device)
    return (like_layout(a[rows], a), like_layout(b[:, cols], b), out), expected[rows][:, cols]


def matmul_torch(data):
    """cuBLAS through torch (fp32 output through torch.mm's out_dtype on CUDA)."""
    validate(data, "torch")
    a, b, out = data
    if out == "float32":
        if a.is_cuda:
            return torch.mm(a, b, out_dtype=torch.float32)
        return (a.float() @ b.float())
    return a @ b


@functools.cache
def _jitted_dot():
    import jax
    import jax.numpy as jnp

    def dot(a, b, out):
        product = jnp.matmul(a, b, preferred_element_type=jnp.float32)
        return product if out == "float32" else product.astype(a.dtype)

    return jax.jit(dot, static_argnames="out")


def matmul_xla(data):
    """XLA's dot through jax.jit, fp32 accumulation."""
    validate(data, "jax")
    a, b, out = data
    return _jitted_dot()(a, b, out=out)


WORKLOAD = Workload(
    name="matmul",
    cases={"smoke": SMOKE_CASES, "test": TEST_CASES, "bench": BENCH_CASES, "shapes": SHAPES_CASES},
    make_inputs=make_inputs,
    reference=reference,
    check=check,
    cost=cost,
    case_name=case_name,
    implementations=(
        Implementation("triton", "torch", "triton", "Triton port: fixed K order, no split-K",
                       "triton_kernels.matmul:matmul"),
        Implementation("gluon", "torch", "gluon", "Gluon port: TMA ring and wgmma, fixed K order, no split-K",
                       "gluon_kernels.matmul:matmul", Needs(gpu=True, capability=(9, 0))),
        Implementation("pallas", "jax", "pallas-triton", "Pallas port (Triton lowering): fixed K order, no split-K",
                       "pallas_kernels.matmul:matmul"),
        Implementation("mosaic_gpu", "jax", "pallas-mosaic-gpu",
                       "Pallas port (Mosaic GPU): TMA pipeline and wgmma, fixed K order, no split-K",
                       "mosaic_gpu_kernels.matmul:matmul", Needs(capability=(9, 0))),
        Implementation("torch", "torch", "library", "torch.matmul (cuBLAS)", "ports.matmul:matmul_torch"),
        Implementation("jax_xla", "jax", "library", "jnp.matmul under jax.jit (XLA)", "ports.matmul:matmul_xla"),
    ),
    baseline="torch",
    vary=vary,
    properties=properties,
    property_sizes=PROPERTY_SIZES,
    benchmark_sets=("bench", "shapes"),
    argument_names=("a", "b", "out"),
)
