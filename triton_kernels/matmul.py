"""Batch-invariant matmul in Triton: C = A @ B with a reduction order that never depends on M.

Each program owns one tile_m x tile_n tile of C and walks the whole of K in tile_k steps, in
order, accumulating in fp32 with tensor-core dots: no split-K, no stream-K, so every element is
the same sequence of operations whatever the batch. Ragged edges are masked loads (zeros, which
add exactly nothing) and masked stores. M is never specialised by the compiler
(`do_not_specialize`), so M = 1 runs the same machine code as every other M. Programs run in
grouped order (group_m row-tiles share the B tiles they read through L2), which changes only
the schedule, never the arithmetic.

A batch of products (`batched_matmul`, the batch-invariant mode's bmm) runs on a second grid axis, one matrix a
program column: each matrix is the same tiles, in the same order, as the product alone, so its bits are the
product's alone whatever the batch. `matmul` is the batch of one.

Operands are read through their strides, row-major or transposed (a weight's `W.t()`, as `F.linear` passes it; a
gradient's `x.t()`) without a copy; Triton specialises a stride of 1, so the contiguous case compiles as before.
The dot is the same whichever way a tile was laid out, so the bits are too. Offsets inside a matrix are 32-bit, or
64-bit where one can reach 2**31 (a constexpr, so the common case's machine code is as it was).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ports.matmul import output_dtype, validate, validate_batch
from kernel_support.matmul_common import MatmulTiling, matmul_tiling
from kernel_support.triton_launch import launch


@triton.jit(do_not_specialize=["M"])
def _matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_ab,
                   stride_bb, stride_cb, TILE_M: tl.constexpr, TILE_N: tl.constexpr, TILE_K: tl.constexpr,
                   GROUP_M: tl.constexpr, WIDE: tl.constexpr):
    pid = tl.program_id(0)
    matrix = tl.program_id(1).to(tl.int64)
    a_ptr += matrix * stride_ab
    b_ptr += matrix * stride_bb
    c_ptr += matrix * stride_cb
    tiles_m = tl.cdiv(M, TILE_M)
    tiles_n = tl.cdiv(N, TILE_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = min(tiles_m - first_m, GROUP_M)
    rows = (first_m + (pid % per_group) % group_rows) * TILE_M + tl.arange(0, TILE_M)
    cols = ((pid % per_group) // group_rows) * TILE_N + tl.arange(0, TILE_N)
    ks = tl.arange(0, TILE_K)
    if WIDE:  # an offset inside one matrix can reach 2**31 (`_offsets_past_int32`): offsets in 64 bits
        rows, cols, ks = rows.to(tl.int64), cols.to(tl.int64), ks.to(tl.int64)
    acc = tl.zeros([TILE_M, TILE_N], tl.float32)
    for k0 in range(0, K, TILE_K):
        a = tl.load(a_ptr + rows[:, None] * stride_am + (k0 + ks)[None, :] * stride_ak,
                    mask=(rows[:, None] < M) & ((k0 + ks)[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (k0 + ks)[:, None] * stride_bk + cols[None, :] * stride_bn,
                    mask=((k0 + ks)[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc += tl.dot(a, b)  # the same form as the Pallas port, so both compile alike
    tl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=(rows[:, None] < M) & (cols[None, :] < N))


def matmul(data, tiles: MatmulTiling | None = None) -> torch.Tensor:
    """C = a @ b for `(a, b, out)`: a [M, K], b [K, N] bf16 (or fp16); out "same" or "float32".

    `tiles` overrides the tiling chosen for M (used to test which tilings keep the bits).
    """
    validate(data, "torch")
    return _launch(*data, tiles)


def batched_matmul(a: torch.Tensor, b: torch.Tensor, out: str, tiles: MatmulTiling | None = None) -> torch.Tensor:
    """C[i] = a[i] @ b[i] for a [B, M, K], b [B, K, N] (bf16 or fp16, validated as `matmul`'s), each product's bits
    those of the product alone. Any batch and row strides are read without a copy (a stride-0 batch: one matrix
    broadcast)."""
    validate_batch(a, b, out, framework="torch")
    return _launch(a, b, out, tiles)


def _offsets_past_int32(*matrices: torch.Tensor) -> bool:
    """Whether an element's offset inside one matrix of any of these (its row and column through their strides) can
    reach 2**31, past the 32-bit offsets the kernel computes otherwise: a product with more than 2**31 elements in A,
    B or C (attention's scores at long context, a vocabulary's logits for many tokens)."""
    return any((x.shape[-2] - 1) * abs(x.stride(-2)) + (x.shape[-1] - 1) * abs(x.stride(-1)) >= 2**31
               for x in matrices)


def _launch(a: torch.Tensor, b: torch.Tensor, out: str, tiles: MatmulTiling | None) -> torch.Tensor:
    """a [M, K] @ b [K, N], or a [B, M, K] @ b [B, K, N] on the grid's second axis."""
    if a.dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1":  # as the batch-invariant mode does
        raise TypeError("the Triton matmul port runs on a CPU in Triton's interpreter, which misreads bfloat16 and "
                        "returns garbage: pass float16 there (bfloat16 runs on a GPU)")
    a, b = (x if 1 in (x.stride(-1), x.stride(-2)) or 1 in x.shape[-2:] else x.contiguous() for x in (a, b))
    (m, k), n = a.shape[-2:], b.shape[-1]
    batch = a.shape[0] if a.dim() == 3 else 1
    # a batch's programs count on a GPU, where every tiling gives the same bits; the interpreter's dots sum in an
    # order that depends on the tile's shape, so there the tiling is one product's
    tiles = tiles or matmul_tiling(m, n, batch if a.is_cuda else 1)
    c = torch.empty((*a.shape[:-2], m, n), device=a.device, dtype=output_dtype((a, b, out)))
    grid = (-(-m // tiles.tile_m) * -(-n // tiles.tile_n), batch)  # not triton.cdiv: slow on the host
    # one product: batch strides 0, so that its launch, like its machine code, never depends on M
    batch_strides = (x.stride(0) if batch > 1 else 0 for x in (a, b, c))
    launch(_matmul_kernel, grid, a, b, c, m, n, k, *a.stride()[-2:], *b.stride()[-2:], c.stride(-2), *batch_strides,
           tiles.tile_m, tiles.tile_n, tiles.tile_k, tiles.group_m, _offsets_past_int32(a, b, c), num_warps=tiles.warps,
           num_stages=tiles.stages)
    return c
