"""Batched symmetric eigendecomposition in Pallas (Triton lowering), one module per stage: the algorithms of
the Triton port (triton_kernels/eigh), stage for stage and kernel for kernel, with the same module names.

n <= 64: the on-chip Jacobi (`jacobi`). n > 64: `tridiagonal`, `bisection`, `inverse_iteration` (with
`gram_schmidt` and the repair), `back_transform`; or, for T's eigenpairs, `divide_conquer` (EIGENVECTORS, as in the
Triton port: its own jitted call, with x64 on). The differences the language forces, written down in each
stage: the Jacobi's exchange goes through global memory (no gather of values); a pallas_call's grid is static, so
the launches per column are a jax.lax.fori_loop; scratch buffers are pallas_call outputs, carried between
launches through input_output_aliases; the barriers (pltriton.debug_barrier) are left out under the interpreter,
which has no lowering for them and runs each program in order; and the loads of what a program wrote itself carry
no ".cg" cache modifier (this JAX's Triton lowering rejects every cache modifier). The input's checks come, as in
the Triton port, from the kernels that read A first (`common.checked`); the call reads their bounds after its
jitted call.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ports import to_torch
from ports.eigh import check_shape, check_values
from kernel_support.eigh_common import JACOBI, check_offsets
from kernel_support.jax_backend import check_platform, interpreted
from . import back_transform, bisection, divide_conquer, inverse_iteration, jacobi, tridiagonal

# T's eigenpairs: "inverse_iteration" or "divide_conquer" (the candidate of issue 55, as in the Triton port; the
# H200's A/B is a copy of this package with this line changed)
EIGENVECTORS = "inverse_iteration"


def _tridiagonal(a, *, interpret):
    """(Q, L, the checks' bounds) by tridiagonalisation, bisection, inverse iteration and back-transformation
    (n > 64), the Triton port's kernels: the scratch buffers are outputs, updated in place across launches through
    input_output_aliases."""
    w, d, e, tau, scale, bounds = tridiagonal.reduce(a, interpret=interpret)
    values, norm, eigenvalues = bisection.eigenvalues(d, e, scale, interpret=interpret)
    z = inverse_iteration.vectors(d, e, values, norm, interpret=interpret)
    return back_transform.apply(w, tau, z, interpret=interpret), eigenvalues, jnp.max(bounds, axis=(0, 1))


def _jacobi(a, *, interpret):
    """(Q, L, the checks' bounds) by the on-chip Jacobi (n <= 64)."""
    batch, n, _ = a.shape
    size = JACOBI.size(n)
    check_offsets(batch, size, jacobi.PALLAS_JACOBI.exchange_slots)
    padded = jnp.pad(a, ((0, 0), (0, size - n), (0, size - n)))
    vectors, values, _, bounds = jacobi.on_chip(padded, interpret=interpret)
    vectors, values = vectors[:, :n, :n], values[:, :n]
    order = jnp.argsort(values, axis=-1)
    return (jnp.take_along_axis(vectors, order[:, None, :], axis=-1), jnp.take_along_axis(values, order, axis=-1),
            jnp.max(bounds, axis=0))


@functools.partial(jax.jit, static_argnames=("interpret",))
def _eigh(a, *, interpret):
    """(Q, L, the input's checks' bounds), the kernels of one path in one jitted call."""
    return (_tridiagonal if a.shape[1] > JACOBI.max_n else _jacobi)(a, interpret=interpret)


_reduce = jax.jit(tridiagonal.reduce, static_argnames=("interpret",))
_back_transform = jax.jit(back_transform.apply, static_argnames=("interpret",))


def _divide_and_conquer(a, *, interpret):
    """(Q, L, the checks' bounds) by tridiagonalisation, divide and conquer and back-transformation (n > 64), three
    jitted calls: the middle one with x64 on (`divide_conquer.solve`)."""
    w, d, e, tau, scale, bounds = _reduce(a, interpret=interpret)
    z, _, eigenvalues = divide_conquer.solve(d, e, scale, interpret=interpret)
    return _back_transform(w, tau, z, interpret=interpret), eigenvalues, jnp.max(bounds, axis=(0, 1))


def eigh(a):
    """(Q, L) for a [batch, n, n] float32 symmetric JAX array: A Q = Q diag(L), L ascending.

    Runs the compiled kernels on a GPU and Pallas interpret mode elsewhere. Waits for its kernels: the input's
    checks are read after the last.
    """
    check_shape(a, "jax")
    check_platform("A", a)
    if a.size == 0:
        return jnp.zeros_like(a), jnp.zeros(a.shape[:2], a.dtype)
    interpret = interpreted()
    if a.shape[1] > JACOBI.max_n and EIGENVECTORS == "divide_conquer":
        q, values, bounds = _divide_and_conquer(a, interpret=interpret)
    else:
        q, values, bounds = _eigh(a, interpret=interpret)
    nonfinite, largest, asymmetry = to_torch(bounds).tolist()  # read by torch: faster than jax.device_get
    check_values(nonfinite == 0, largest, asymmetry)
    return q, values
