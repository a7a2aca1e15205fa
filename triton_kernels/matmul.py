"""Batch-invariant matmul in Triton: C = A @ B with a reduction order that never depends on M.

Each program owns one tile_m x tile_n tile of C and walks the whole of K in tile_k steps, in
order, accumulating in fp32 with tensor-core dots: no split-K, no stream-K, so every element is
the same sequence of operations whatever the batch. Ragged edges are masked loads (zeros, which
add exactly nothing) and masked stores. M is never specialised by the compiler
(`do_not_specialize`), so M = 1 runs the same machine code as every other M. Programs run in
grouped order (group_m row-tiles share the B tiles they read through L2), which changes only
the schedule, never the arithmetic.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ports.matmul import output_dtype, validate
from ports.matmul_common import MatmulTiling, matmul_tiling


@triton.jit(do_not_specialize=["M"])
def _matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_bk, stride_cm,
                   TILE_M: tl.constexpr, TILE_N: tl.constexpr, TILE_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, TILE_M)
    tiles_n = tl.cdiv(N, TILE_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = min(tiles_m - first_m, GROUP_M)
    rows = (first_m + (pid % per_group) % group_rows) * TILE_M + tl.arange(0, TILE_M)
    cols = ((pid % per_group) // group_rows) * TILE_N + tl.arange(0, TILE_N)
    ks = tl.arange(0, TILE_K)
    acc = tl.zeros([TILE_M, TILE_N], tl.float32)
    for k0 in range(0, K, TILE_K):
        a = tl.load(a_ptr + rows[:, None] * stride_am + (k0 + ks)[None, :],
                    mask=(rows[:, None] < M) & ((k0 + ks)[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (k0 + ks)[:, None] * stride_bk + cols[None, :],
                    mask=((k0 + ks)[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc += tl.dot(a, b)  # the same form as the Pallas port, so both compile alike
    tl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=(rows[:, None] < M) & (cols[None, :] < N))


def matmul(data, tiles: MatmulTiling | None = None) -> torch.Tensor:
    """C = a @ b for `(a, b, out)`: a [M, K], b [K, N] bf16 (or fp16); out "same" or "float32".

    `tiles` overrides the tiling chosen for M (used to test which tilings keep the bits).
    """
    validate(data)
    a, b, _ = data
    a, b = a.contiguous(), b.contiguous()
    (m, k), n = a.shape, b.shape[1]
    tiles = tiles or matmul_tiling(m, n)
    c = torch.empty((m, n), device=a.device, dtype=output_dtype(data))
    grid = (triton.cdiv(m, tiles.tile_m) * triton.cdiv(n, tiles.tile_n),)
    _matmul_kernel[grid](a, b, c, m, n, k, a.stride(0), b.stride(0), c.stride(0), TILE_M=tiles.tile_m,
                         TILE_N=tiles.tile_n, TILE_K=tiles.tile_k, GROUP_M=tiles.group_m,
                         num_warps=tiles.warps, num_stages=tiles.stages)
    return c
