"""Batched symmetric eigendecomposition in Triton: parallel-order Jacobi.

n <= 64 (padded to a power of two N >= 16), on chip: one program per matrix holds its
N x N matrix A and the accumulated rotations V in registers. A sweep is N - 1 rounds of the
round-robin ("circle") pairing (a table from ports.eigh.round_robin_partners, shared with the
Pallas port), in which the N/2 pairs are disjoint, so one round is a single
orthogonal J made of N/2 plane rotations: A <- J^T A J, V <- V J, as fp32 products (IEEE, no
TF32). The rotation for a pair (p, q) zeroes A[p, q] (Golub & Van Loan's symmetric Schur
decomposition). Padding rows and columns are zero off the diagonal, so they never mix with the
matrix. The matrix is scaled by 1/max|A| and symmetrised first (no overflow or underflow at the
extreme magnitudes; both rows of a pair then compute the same rotation), sweeps stop once every
off-diagonal element is below eps, and eigenvalues are sorted by the launcher (glue).

n > 64, blocked: the same parallel order over blocks of BLOCK rows (ports.eigh.blocked_layouts).
Each round holds A in a layout where the two blocks of every pair sit side by side; the pairs'
2 BLOCK x 2 BLOCK diagonal blocks, read in place in A, are diagonalised by the on-chip kernel
above (one program per pair, at most BLOCK_SWEEPS sweeps), giving one rotation J_P per pair,
and `_rotate_blocks_kernel` applies them all: A[P, Q] <- J_P^T A[P, Q] J_Q per pair-sized block
of A, V[R, Q] <- V[R, Q] J_Q per block of V (fp32 IEEE products; each program reads and writes
only its own block, so the update is in place). Moving to the next round's layout is a gather
(glue). Sweeps stop when the off-diagonal Frobenius norm is below 16 eps ||A||_F for every
matrix, or at a rounding floor below 100 eps (ports.eigh.blocked_converged).
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ports.eigh import (BLOCK, BLOCK_SWEEPS, BLOCKED_MAX_SWEEPS, JACOBI_MAX_N, JACOBI_MAX_SWEEPS, blocked_converged,
                        blocked_layouts, check_offsets, jacobi_size, jacobi_warps, round_robin_partners, validate)

EPS = torch.finfo(torch.float32).eps


@triton.jit
def _jacobi_kernel(a_ptr, partners_ptr, q_ptr, l_ptr, tolerance, stride, blocks, N: tl.constexpr,
                   MAX_SWEEPS: tl.constexpr):
    """Program i diagonalises diagonal block i % blocks (N x N) of matrix i // blocks of `a`
    (rows `stride` apart; blocks = 1, stride = N for whole matrices)."""
    matrix = tl.program_id(0)
    rows = tl.arange(0, N)
    offsets = matrix * N * N + rows[:, None] * N + rows[None, :]
    block_origin = (matrix // blocks) * blocks * N * stride + (matrix % blocks) * N * (stride + 1)
    a = tl.load(a_ptr + block_origin + rows[:, None] * stride + rows[None, :])
    eye = (rows[:, None] == rows[None, :]).to(tl.float32)
    scale = tl.max(tl.max(tl.abs(a), axis=1), axis=0)
    scale = tl.where(scale > 0, scale, 1.0)
    a = a / scale
    a = 0.5 * (a + tl.trans(a))  # exactly symmetric from the start: both rows of a pair must agree on J
    v = eye
    off = tl.max(tl.max(tl.abs(a) * (1.0 - eye), axis=1), axis=0)
    sweep = 0
    while (sweep < MAX_SWEEPS) & (off > tolerance):
        for r in range(N - 1):
            partner = tl.load(partners_ptr + r * N + rows)  # the round-robin pairing of round r
            meets = (rows[None, :] == partner[:, None]).to(tl.float32)  # row i has a 1 at its partner
            diagonal = tl.sum(a * eye, axis=1)
            a_ij = tl.sum(a * meets, axis=1)
            d_j = tl.sum(diagonal[None, :] * meets, axis=1)
            first = rows < partner  # row i is p (else q) of its pair
            tau = tl.where(first, d_j - diagonal, diagonal - d_j) / (2.0 * a_ij)
            t = tl.where(tau >= 0, 1.0, -1.0) / (tl.abs(tau) + tl.sqrt_rn(1.0 + tau * tau))
            t = tl.where(a_ij == 0.0, 0.0, t)
            c = 1.0 / tl.sqrt_rn(1.0 + t * t)  # IEEE square roots, as the Pallas lowering takes
            s = tl.where(first, t * c, -t * c)
            j = eye * c[:, None] + meets * s[:, None]
            a = tl.dot(tl.trans(j), tl.dot(a, j, input_precision="ieee"), input_precision="ieee")
            a = 0.5 * (a + tl.trans(a))  # keep A exactly symmetric, so both rows of a pair agree on J
            v = tl.dot(v, j, input_precision="ieee")
        off = tl.max(tl.max(tl.abs(a) * (1.0 - eye), axis=1), axis=0)
        sweep += 1
    tl.store(q_ptr + offsets, v)
    tl.store(l_ptr + matrix * N + rows, tl.sum(a * eye, axis=1) * scale)


@triton.jit
def _rotate_blocks_kernel(x_ptr, rotations_ptr, size, LEFT: tl.constexpr, PAIR: tl.constexpr):
    """Program (matrix, R, Q): X[R, Q] <- X[R, Q] J_Q, and with LEFT also J_R^T on the left;
    blocks are PAIR x PAIR, J_P = rotations[matrix, P]."""
    matrix, row_block, col_block = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    pairs = size // PAIR
    offsets = tl.arange(0, PAIR)
    square = offsets[:, None] * PAIR + offsets[None, :]
    block_ptrs = (x_ptr + matrix * size * size + (row_block * PAIR + offsets)[:, None] * size
                  + col_block * PAIR + offsets[None, :])
    x = tl.load(block_ptrs)
    x = tl.dot(x, tl.load(rotations_ptr + (matrix * pairs + col_block) * PAIR * PAIR + square),
               input_precision="ieee")
    if LEFT:
        left = tl.load(rotations_ptr + (matrix * pairs + row_block) * PAIR * PAIR + square)
        x = tl.dot(tl.trans(left), x, input_precision="ieee")
    tl.store(block_ptrs, x)


def _on_chip(a: torch.Tensor, size: int, partners: torch.Tensor, max_sweeps: int = JACOBI_MAX_SWEEPS):
    """(V, diagonal) of the on-chip Jacobi, unsorted, for each size x size diagonal block of each
    matrix of a [batch, size * blocks, size * blocks]: [batch * blocks, size, size], [batch * blocks, size]."""
    count = a.shape[0] * (a.shape[1] // size)
    vectors = torch.empty((count, size, size), device=a.device, dtype=torch.float32)
    values = torch.empty((count, size), device=a.device, dtype=torch.float32)
    _jacobi_kernel[(count,)](a, partners, vectors, values, EPS, a.shape[1], a.shape[1] // size, N=size,
                             MAX_SWEEPS=max_sweeps, num_warps=jacobi_warps(size))
    return vectors, values


@functools.lru_cache(maxsize=16)
def _partners(size: int, device: torch.device) -> torch.Tensor:
    return torch.tensor(round_robin_partners(size), device=device, dtype=torch.int32)


@functools.lru_cache(maxsize=16)
def _schedule(n: int, device: torch.device):
    """The blocked schedule as device index tables (they depend on n only, like compiled code):
    (size, rounds, first layout, moves, positions of the real indices in the last layout)."""
    size, layouts, moves = blocked_layouts(n, BLOCK)
    keep = [at for at, index in enumerate(layouts[-1]) if index < n]
    return size, len(layouts), *(torch.tensor(table, device=device) for table in (layouts[0], moves, keep))


def _blocked(a: torch.Tensor):
    """(V, diagonal) of the blocked Jacobi for the real (unpadded) indices, unsorted."""
    batch, n, _ = a.shape
    size, rounds, first, moves, keep = _schedule(n, a.device)
    check_offsets(batch, size)
    pair = 2 * BLOCK
    pairs = size // pair
    partners = _partners(pair, a.device)
    scale = a.abs().amax(dim=(1, 2), keepdim=True)
    x = F.pad(0.5 * (a + a.mT) / torch.where(scale > 0, scale, 1.0), (0, size - n, 0, size - n))
    x = x[:, first[:, None], first]
    v = torch.eye(size, device=a.device)[:, first].expand(batch, size, size).contiguous()
    previous = torch.inf
    for sweep in range(BLOCKED_MAX_SWEEPS):
        for r in range(rounds):
            if sweep or r:
                x, v = x[:, moves[r][:, None], moves[r]], v[:, :, moves[r]].contiguous()
            rotations, _ = _on_chip(x, pair, partners, BLOCK_SWEEPS)  # each pair's diagonal block
            for target, left in ((x, True), (v, False)):
                _rotate_blocks_kernel[(batch, pairs, pairs)](target, rotations, size, LEFT=left, PAIR=pair,
                                                             num_warps=4)
        diagonal = x.diagonal(dim1=1, dim2=2)
        off = ((x - torch.diag_embed(diagonal)).square().sum(dim=(1, 2)) / x.square().sum(dim=(1, 2))).sqrt()
        worst = off.nan_to_num(0.0).max().item()  # an all-zero matrix gives 0 / 0
        if blocked_converged(worst, previous):
            break
        previous = worst
    return v[:, :n][:, :, keep], (diagonal * scale[:, :, 0])[:, keep]


def eigh(a: torch.Tensor):
    """(Q, L) for a [batch, n, n] float32 symmetric: A Q = Q diag(L), L ascending."""
    validate(a)
    batch, n, _ = a.shape
    if batch == 0:
        return torch.empty_like(a), torch.empty((0, n), device=a.device, dtype=a.dtype)
    if n > JACOBI_MAX_N:
        vectors, values = _blocked(a)
    else:
        size = jacobi_size(n)
        check_offsets(batch, size)
        vectors, values = _on_chip(F.pad(a, (0, size - n, 0, size - n)).contiguous(), size, _partners(size, a.device))
        vectors, values = vectors[:, :n, :n], values[:, :n]
    values, order = values.sort(dim=-1)
    return vectors.gather(-1, order.unsqueeze(-2).expand(batch, n, n)), values
