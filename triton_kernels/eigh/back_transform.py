"""The eigh Triton port's back-transformation, Q = H Z: a panel of reflectors at a time in LAPACK's compact WY
form (`_compact_wy_kernel`), applied by tensor-core products on blocks of vectors (`_back_transform_kernel`).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel_support.eigh_common import BACK_TRANSFORM
from .common import empty


@triton.jit
def _row_block(w, first, start, ks, members, n):
    """Pointers and mask of a block of an n x n matrix w: rows first + members, columns start + ks (a panel's
    reflectors in w, or a program's vectors in Z^T)."""
    rows, cols = first + members, start + ks
    return w + rows[:, None] * n + cols[None, :], (rows < n)[:, None] & (cols < n)[None, :]


@triton.jit
def _compact_wy_kernel(w_ptr, tau_ptr, t_ptr, n, REFLECTORS: tl.constexpr, CHUNK: tl.constexpr):
    """Program (b, panel): the triangular T of H_first ... H_last = I - V T V^T for the panel's REFLECTORS
    reflectors (LAPACK's dlarft, forward and columnwise): T[i, i] = tau_i, T[:i, i] = -tau_i T[:i, :i] G[:i, i],
    G = V^T V summed over the panel's nonzero columns CHUNK at a time. t is [batch, panels, REFLECTORS, REFLECTORS].
    Row j of w holds v_j in its columns after j, and the tridiagonalisation's leftovers before: this kernel writes
    zeros over those from the panel's first chunk on, so the back-transformation reads V^T's chunks unmasked."""
    matrix, panel = tl.program_id(0).to(tl.int64), tl.program_id(1)
    first = panel * REFLECTORS
    w = w_ptr + matrix * n * n
    members = tl.arange(0, REFLECTORS)
    ks = tl.arange(0, CHUNK)
    gram = tl.zeros((REFLECTORS, REFLECTORS), tl.float32)
    # this loop and the back-transformation's start past zero (unlike `gram_schmidt._gram_schmidt_pass`'s): every
    # GPU test and bench output passed with them
    for start in range((first + 1) // CHUNK * CHUNK, n, CHUNK):
        pointers, inside = _row_block(w, first, start, ks, members, n)
        chunk = tl.where((start + ks)[None, :] > (first + members)[:, None], tl.load(pointers, mask=inside, other=0.0),
                         0.0)
        tl.store(pointers, chunk, mask=inside)
        gram = tl.dot(chunk, tl.trans(chunk), gram, input_precision="ieee")
    taus = tl.load(tau_ptr + matrix * n + first + members, mask=first + members < n, other=0.0)
    rows, cols = members[:, None], members[None, :]
    t = tl.zeros((REFLECTORS, REFLECTORS), tl.float32)
    for i in range(REFLECTORS):
        tau = tl.sum(tl.where(members == i, taus, 0.0))
        g = tl.sum(tl.where((rows == i) & (cols < i), gram, 0.0), axis=0)  # G[i, :i] = G[:i, i]
        column = tl.where(members == i, tau, -tau * tl.sum(t * g[None, :], axis=1))
        t = tl.where(cols == i, column[:, None], t)
    tl.store(t_ptr + (matrix * tl.num_programs(1) + panel) * REFLECTORS * REFLECTORS + rows * REFLECTORS + cols, t)


@triton.jit
def _back_transform_kernel(w_ptr, t_ptr, z_ptr, q_ptr, n, VECTORS: tl.constexpr, REFLECTORS: tl.constexpr,
                           CHUNK: tl.constexpr, PRECISION: tl.constexpr):
    """Program (block, b): Q[:, the block's VECTORS vectors] = H_0 H_1 ... H_{n-3} Z, a panel of REFLECTORS
    reflectors at a time, last panel first, in compact WY form (`_compact_wy_kernel`): on Z^T's rows,
    Z^T -= ((Z^T V) T^T) V^T, tensor-core products whose K (the panel's nonzero columns) is walked CHUNK columns
    at a time through global memory (Z^T's rows updated in place in z, [batch, vector, n]). One pass over the
    chunks a panel: each chunk is updated by the panel and, while in registers, gives its share of the next
    panel's projection Z^T V, so Z^T is read and written once a panel; the first panel writes Q [batch, n,
    vector] instead. The grid's first axis is the block, so a matrix's programs run side by side and share its
    reflectors in L2."""
    matrix = tl.program_id(1).to(tl.int64)
    first_vector, local_vectors = tl.program_id(0) * VECTORS, tl.arange(0, VECTORS)
    vectors = first_vector + local_vectors
    members = tl.arange(0, REFLECTORS)
    ks = tl.arange(0, CHUNK)
    w, z, q = w_ptr + matrix * n * n, z_ptr + matrix * n * n, q_ptr + matrix * n * n
    panels = tl.cdiv(n, REFLECTORS)
    projection = tl.zeros((VECTORS, REFLECTORS), tl.float32)  # Z^T V of the panel to apply
    for start in range(((panels - 1) * REFLECTORS + 1) // CHUNK * CHUNK, n, CHUNK):
        block_pointers, mask = _row_block(z, first_vector, start, ks, local_vectors, n)
        pointers, inside = _row_block(w, (panels - 1) * REFLECTORS, start, ks, members, n)
        projection = tl.dot(tl.load(block_pointers, mask=mask, other=0.0),
                            tl.trans(tl.load(pointers, mask=inside, other=0.0)), projection, input_precision=PRECISION)
    for p in range(panels):
        panel = panels - 1 - p
        first = panel * REFLECTORS
        begin = (first + 1) // CHUNK * CHUNK  # the panel's reflectors are zero before column first + 1
        t_transposed = tl.load(t_ptr + (matrix * panels + panel) * REFLECTORS * REFLECTORS
                               + members[None, :] * REFLECTORS + members[:, None])
        projection = tl.dot(projection, t_transposed, input_precision=PRECISION)
        following = tl.zeros((VECTORS, REFLECTORS), tl.float32)  # the next panel's Z^T V
        for start in range(tl.maximum(first + 1 - REFLECTORS, 0) // CHUNK * CHUNK, n, CHUNK):
            cols = start + ks
            block_pointers, mask = _row_block(z, first_vector, start, ks, local_vectors, n)
            block = tl.load(block_pointers, mask=mask, other=0.0)
            pointers, inside = _row_block(w, first, start, ks, members, n)
            block -= tl.dot(projection, tl.load(pointers, mask=inside & (cols >= begin)[None, :], other=0.0),
                            input_precision=PRECISION)
            if panel == 0:
                tl.store(q + cols[None, :] * n + vectors[:, None], block, mask=mask)
            else:
                tl.store(block_pointers, block, mask=mask)
                pointers, inside = _row_block(w, first - REFLECTORS, start, ks, members, n)
                following = tl.dot(block, tl.trans(tl.load(pointers, mask=inside, other=0.0)), following,
                                   input_precision=PRECISION)
        projection = following
        tl.debug_barrier()  # the next panel reads what this one wrote


def apply(w: torch.Tensor, tau: torch.Tensor, z: torch.Tensor):
    """Q = H_0 ... H_{n-3} z^T: A's eigenvectors as columns (z is overwritten, and w's entries before each
    reflector)."""
    batch, n, _ = z.shape
    reflectors = BACK_TRANSFORM.reflectors
    panels = triton.cdiv(n, reflectors)
    t = empty(batch, panels, reflectors, reflectors, device=z.device)
    _compact_wy_kernel[(batch, panels)](w, tau, t, n, REFLECTORS=reflectors, CHUNK=BACK_TRANSFORM.chunk,
                                        num_warps=BACK_TRANSFORM.warps)
    q = empty(batch, n, n, device=z.device)
    _back_transform_kernel[(triton.cdiv(n, BACK_TRANSFORM.vectors), batch)](
        w, t, z, q, n, VECTORS=BACK_TRANSFORM.vectors, REFLECTORS=reflectors, CHUNK=BACK_TRANSFORM.chunk,
        PRECISION=BACK_TRANSFORM.precision, num_warps=BACK_TRANSFORM.warps)
    return q
