"""Batched symmetric eigendecomposition in Triton: parallel-order Jacobi, one program per matrix.

Small matrices only so far (n <= 64, padded to a power of two N >= 16): each program holds its
N x N matrix A and the accumulated rotations V in registers. A sweep is N - 1 rounds of the
round-robin ("circle") pairing (a table from ports.eigh.round_robin_partners, shared with the
Pallas port), in which the N/2 pairs are disjoint, so one round is a single
orthogonal J made of N/2 plane rotations: A <- J^T A J, V <- V J, as fp32 products (IEEE, no
TF32). The rotation for a pair (p, q) zeroes A[p, q] (Golub & Van Loan's symmetric Schur
decomposition). Padding rows and columns are zero off the diagonal, so they never mix with the
matrix. The matrix is scaled by 1/max|A| and symmetrised first (no overflow or underflow at the
extreme magnitudes; both rows of a pair then compute the same rotation), sweeps stop once every off-diagonal element is below eps, and eigenvalues are
sorted by the launcher (glue). Larger n needs a blocked algorithm: not written yet.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ports.eigh import JACOBI_MAX_SWEEPS, jacobi_size, jacobi_warps, round_robin_partners, validate


@triton.jit
def _jacobi_kernel(a_ptr, partners_ptr, q_ptr, l_ptr, tolerance, N: tl.constexpr, MAX_SWEEPS: tl.constexpr):
    matrix = tl.program_id(0)
    rows = tl.arange(0, N)
    offsets = matrix * N * N + rows[:, None] * N + rows[None, :]
    a = tl.load(a_ptr + offsets)
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


def eigh(a: torch.Tensor):
    """(Q, L) for a [batch, n, n] float32 symmetric: A Q = Q diag(L), L ascending."""
    validate(a)
    batch, n, _ = a.shape
    size = jacobi_size(n)
    if batch == 0:
        return torch.empty_like(a), torch.empty((0, n), device=a.device, dtype=a.dtype)
    padded = F.pad(a, (0, size - n, 0, size - n)).contiguous()
    vectors = torch.empty_like(padded)
    values = torch.empty((batch, size), device=a.device, dtype=torch.float32)
    partners = torch.tensor(round_robin_partners(size), device=a.device, dtype=torch.int32)
    _jacobi_kernel[(batch,)](padded, partners, vectors, values, torch.finfo(torch.float32).eps, N=size,
                             MAX_SWEEPS=JACOBI_MAX_SWEEPS, num_warps=jacobi_warps(size))
    values, order = values[:, :n].sort(dim=-1)
    return vectors[:, :n, :n].gather(-1, order.unsqueeze(-2).expand(batch, n, n)), values
