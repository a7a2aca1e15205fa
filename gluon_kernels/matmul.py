"""Batch-invariant matmul in Gluon: the algorithm of triton_kernels/matmul.py, with Hopper's parts written out.

Each program owns one tile of C and walks the whole of K in tile_k steps, in order: TMA brings the A and B tiles
into swizzled shared memory through a ring of buffers (as many as fit), each guarded by an mbarrier, and wgmma
accumulates A @ B into fp32 registers, one 16-deep tensor-core step after another, with one wgmma in flight while
the next tiles load. No split-K, so every element of C is the same sequence of operations whatever M is. Programs
run in grouped order (group_m row tiles share the B tiles they read through L2), as in the other ports. The epilogue
rounds the accumulator to the output type in registers, stores it to shared memory (the stage buffers' space, free
by then) and TMA writes it out. The tiles are the Triton port's (`kernel_support.matmul_common.matmul_tiling`); the
stages are more (`gluon_tiling`).

Differences the language forces, against the Triton port:
- No masks: TMA zero-fills the part of a tile that lies past the array and drops the part of a store that does.
  A TMA descriptor needs 16-byte aligned rows, so K and N are padded to a multiple of 8 where they are not (zero
  columns and rows that add exactly nothing); at the benchmarked shapes nothing is padded. M is never padded.
- M reaches the kernel only inside A's and C's descriptors. Where M is below the tile's rows, A's descriptor copies
  only M's rows rounded up to a power of two (8 at the least) into each ring buffer and leaves the others unwritten:
  they make only rows of C past M, which the TMA store drops, and each row of C is the same wgmma sequence on its
  own row of A whatever the box, so the bits do not move. At M = 1 and 16 that halves a stage's TMA bytes where
  B's tiles are 64-byte rows (results/h200/experiments/gluon-matmul, "TMA copies only the rows of A that exist").
"""
from __future__ import annotations

import dataclasses
import functools

import torch
import torch.nn.functional as F

from gluon_kernels import TensorDescriptor, cta_barrier, fence_async_shared, gl, gluon, mbarrier, tma, tma_load
from gluon_kernels import tma_store, use_device_scratch, warpgroup_mma, warpgroup_mma_wait
from ports.matmul import output_dtype, validate
from kernel_support.matmul_common import MatmulTiling, matmul_tiling
from kernel_support.triton_launch import launch

TMA_ALIGNMENT = 16  # bytes: a descriptor's base address and row pitch
SHARED_MEMORY = 227 * 1024  # what one program may use on sm_90
MAX_STAGES = 12
GL_TYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}


@gluon.jit
def _load_step(a_desc, b_desc, a_ring, b_ring, loaded, a_row, b_offset, step, steps, STAGES: gl.constexpr,
               B_TRANSPOSED: gl.constexpr):
    """Starts the TMA copies of the step-th K step's A and B tiles into their ring buffer (none past the last)."""
    k = step * a_desc.block_type.shape[1]
    buffer = step % STAGES
    mbarrier.expect(loaded.index(buffer), a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=step < steps)
    tma_load(a_desc, [a_row, k], loaded.index(buffer),
             a_ring.index(buffer).slice(0, a_desc.block_type.shape[0]), pred=step < steps)
    if B_TRANSPOSED:
        tma_load(b_desc, [b_offset, k], loaded.index(buffer), b_ring.index(buffer), pred=step < steps)
    else:
        tma_load(b_desc, [k, b_offset], loaded.index(buffer), b_ring.index(buffer), pred=step < steps)


@gluon.jit
def k_loop(a_desc, b_desc, a_row, b_offset, K, acc, STAGES: gl.constexpr, B_TRANSPOSED: gl.constexpr):
    """acc + A[a_row:, :K] @ B[:K, b_offset:] over the descriptors' tiles, K walked in order in 16-deep wgmma steps:
    TMA fills a ring of STAGES buffers, each guarded by an mbarrier, one wgmma in flight while the next tiles load.
    B_TRANSPOSED: b_desc holds B^T ([N, K], tiles [tile_n, tile_k] from row b_offset), read through a transposed
    view of shared memory. The TriMul port's contraction takes it too."""
    gl.static_assert(STAGES >= 2, "the ring's first wait needs a tile loaded before it")
    ROWS: gl.constexpr = acc.shape[0]
    # A's tiles have acc's rows; a_desc's box may have fewer (the rows that exist at small M), the rest
    # unwritten: they make only rows of C past M, which the TMA store drops
    a_ring = gl.allocate_shared_memory(a_desc.dtype, [STAGES, ROWS, a_desc.block_type.shape[1]], a_desc.layout)
    b_ring = gl.allocate_shared_memory(b_desc.dtype, [STAGES, b_desc.block_type.shape[0], b_desc.block_type.shape[1]],
                                       b_desc.layout)
    loaded = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for buffer in gl.static_range(STAGES):
        mbarrier.init(loaded.index(buffer), count=1)
    steps = gl.cdiv(K, a_desc.block_type.shape[1])
    for buffer in gl.static_range(STAGES - 1):  # fill all but one buffer, for the first steps
        _load_step(a_desc, b_desc, a_ring, b_ring, loaded, a_row, b_offset, buffer, steps, STAGES, B_TRANSPOSED)
    for step in range(steps):
        stage = step % STAGES
        mbarrier.wait(loaded.index(stage), (step // STAGES) & 1)
        if B_TRANSPOSED:
            b_tile = b_ring.index(stage).permute((1, 0))
        else:
            b_tile = b_ring.index(stage)
        # at most this step's wgmma still runs: the step before has read its buffer, which now refills
        acc = warpgroup_mma(a_ring.index(stage), b_tile, acc, is_async=True)
        acc, _, _ = warpgroup_mma_wait(1, deps=(acc, a_ring.index(stage), b_ring.index(stage)))
        _load_step(a_desc, b_desc, a_ring, b_ring, loaded, a_row, b_offset, step + STAGES - 1, steps, STAGES,
                   B_TRANSPOSED)
    for buffer in gl.static_range(STAGES):
        mbarrier.invalidate(loaded.index(buffer))
    return warpgroup_mma_wait(0, deps=(acc,))


@gluon.jit
def store_tile(value, c_desc, row, col):
    """value, rounded to c_desc's type, into C at (row, col): through shared memory and a TMA store.

    Its buffer may reuse the shared memory of a K loop's ring (the allocator sees the ring's last use end), while
    another warpgroup's last wgmma still reads that ring: every warp waits at a barrier first, or that read sees
    this tile's values (results/h200/experiments/gluon-matmul/README.md)."""
    cta_barrier()
    c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
    c_smem.store(value.to(c_desc.dtype))
    fence_async_shared()
    tma_store(c_desc, [row, col], c_smem)
    tma.store_wait(0)


@gluon.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_a, stride_b, stride_c, A_ROWS: gl.constexpr,
                   TILE_M: gl.constexpr, TILE_N: gl.constexpr, TILE_K: gl.constexpr, A_LAYOUT: gl.constexpr,
                   B_LAYOUT: gl.constexpr, C_LAYOUT: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                   B_TRANSPOSED: gl.constexpr, num_warps: gl.constexpr):
    # the TMA descriptors made here, on the device, in global scratch: none is encoded by the host at the launch
    a_desc = tma.make_tensor_descriptor(a_ptr, [M, K], [stride_a, 1], [A_ROWS, TILE_K], A_LAYOUT)
    if B_TRANSPOSED:
        b_desc = tma.make_tensor_descriptor(b_ptr, [N, K], [stride_b, 1], [TILE_N, TILE_K], B_LAYOUT)
    else:
        b_desc = tma.make_tensor_descriptor(b_ptr, [K, N], [stride_b, 1], [TILE_K, TILE_N], B_LAYOUT)
    c_desc = tma.make_tensor_descriptor(c_ptr, [M, N], [stride_c, 1], [TILE_M, TILE_N], C_LAYOUT)
    pid = gl.program_id(0)
    tiles_m = gl.cdiv(M, TILE_M)
    tiles_n = gl.cdiv(N, TILE_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = min(tiles_m - first_m, GROUP_M)
    row = (first_m + (pid % per_group) % group_rows) * TILE_M
    col = ((pid % per_group) // group_rows) * TILE_N
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                     instr_shape=[16, TILE_N, 16])
    acc = k_loop(a_desc, b_desc, row, col, K, gl.zeros([TILE_M, TILE_N], gl.float32, layout), STAGES,
                 B_TRANSPOSED)
    store_tile(acc, c_desc, row, col)


@functools.lru_cache(maxsize=None)
def shared_layout(block: tuple[int, ...], dtype: torch.dtype) -> gl.NVMMASharedLayout:
    """The swizzled shared-memory layout that wgmma reads, for tiles of `block` (a function of the tile's shape and
    type alone, kept: Gluon's host time to work one out, several times a call, is a large share of a small call's;
    docs/findings.md, "Where a host path goes, per function")."""
    return gl.NVMMASharedLayout.get_default_for(list(block), GL_TYPES[dtype])


def descriptor(tensor: torch.Tensor, block: list[int]) -> TensorDescriptor:
    """A TMA descriptor of the tensor in `block` tiles, in the swizzled shared-memory layout that wgmma reads."""
    return TensorDescriptor.from_tensor(tensor, block, shared_layout(tuple(block), tensor.dtype))


def _tma_ready(tensor: torch.Tensor, rows: int, columns: int) -> torch.Tensor:
    """The tensor zero-padded to `rows` x `columns`, contiguous with row-major strides, at a 16-byte aligned address.

    torch counts a tensor of one row as contiguous whatever its row stride (x.t() of a column [K, 1] has strides
    (1, 1)), and a TMA descriptor takes that stride as its row pitch, which must be a multiple of 16 bytes: such a
    tensor is given the row-major strides, which address the same elements."""
    if tensor.shape != (rows, columns):
        tensor = F.pad(tensor, (0, columns - tensor.shape[1], 0, rows - tensor.shape[0]))
    tensor = tensor.contiguous()
    if tensor.stride() != (columns, 1):
        tensor = tensor.as_strided((rows, columns), (columns, 1))
    return tensor if tensor.data_ptr() % TMA_ALIGNMENT == 0 else tensor.clone()


@functools.lru_cache(maxsize=4096)
def gluon_tiling(m: int, n: int) -> MatmulTiling:
    """The Triton port's tiles (`kernel_support.matmul_common.matmul_tiling`), with more stages
    (results/h200/experiments/gluon-matmul): 64-row tiles as many as shared memory holds, up to 12 (without split-K,
    the bytes in flight per SM bound small-M latency); 128-row tiles 4 (faster at M = 512 than the Triton port's 3
    or than 7; no change at M >= 1024)."""
    tiles = matmul_tiling(m, n)
    per_stage = (tiles.tile_m * tiles.tile_k + tiles.tile_k * tiles.tile_n) * 2
    wanted = MAX_STAGES if tiles.tile_m == 64 else 4
    return dataclasses.replace(tiles, stages=min(wanted, SHARED_MEMORY // per_stage))


def matmul(data, tiles: MatmulTiling | None = None) -> torch.Tensor:
    """C = a @ b for `(a, b, out)`: a [M, K], b [K, N] bf16 (or fp16) on a CUDA GPU; out "same" or "float32".

    `tiles` overrides the tiling chosen for M (used to test which tilings keep the bits).
    """
    validate(data, "torch")
    a, b, _ = data
    (m, k), n = a.shape, b.shape[1]
    tiles = tiles or gluon_tiling(m, n)
    padded_k, padded_n = -(-k // 8) * 8, -(-n // 8) * 8  # 16-byte rows for 2-byte inputs and any output
    # B^T's rows are B's columns: a transposed B (a weight's W.t(), as F.linear passes it) is read as it lies
    transposed = b.stride(0) == 1 and b.stride(1) != 1
    a = _tma_ready(a, m, padded_k)
    b = _tma_ready(b.t(), padded_n, padded_k) if transposed else _tma_ready(b, padded_k, padded_n)
    b_block = (tiles.tile_n, tiles.tile_k) if transposed else (tiles.tile_k, tiles.tile_n)
    c = torch.empty((m, padded_n), device=a.device, dtype=output_dtype(data))
    # integer arithmetic, not triton.cdiv and triton.next_power_of_2: slow on the host (experiments/cached-launch)
    grid = (-(-m // tiles.tile_m) * -(-padded_n // tiles.tile_n),)
    a_rows = min(tiles.tile_m, max(8, 1 << (m - 1).bit_length()))  # A's rows that exist, to a power of two
    use_device_scratch()
    launch(_matmul_kernel, grid, a, b, c, m, padded_n, padded_k, a.stride(0), b.stride(0), c.stride(0), A_ROWS=a_rows,
           TILE_M=tiles.tile_m, TILE_N=tiles.tile_n, TILE_K=tiles.tile_k,
           A_LAYOUT=shared_layout((a_rows, tiles.tile_k), a.dtype), B_LAYOUT=shared_layout(b_block, b.dtype),
           C_LAYOUT=shared_layout((tiles.tile_m, tiles.tile_n), c.dtype), GROUP_M=tiles.group_m,
           STAGES=tiles.stages, B_TRANSPOSED=transposed, num_warps=tiles.warps)
    return c if padded_n == n else c[:, :n]
