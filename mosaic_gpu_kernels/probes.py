"""The kernels of `compare.tools.mosaic_gpu_probe`: one small Mosaic GPU kernel per operation the eigh ports' stages
rest on, each over one 64 x 64 float32 tile (one warpgroup), written the plain way, with a NumPy reference."""
from __future__ import annotations

import numpy as np

N = 64


def probes():
    """{name: (what an eigh stage uses it for, op, reference)}: op maps the tile (an array) to a (64, 64) result, or,
    for the probes that need the refs themselves, op(x_gmem, o_gmem) writes the output (`READS_REFS`)."""
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl

    def dynamic_row(x_gmem, o_gmem):
        r = jnp.int32(N // 2) + lax.axis_index("program") * 0  # a row index known only at run time
        o_gmem[...] = jnp.broadcast_to(x_gmem[pl.ds(r, 1), :], (N, N))

    def scalar_loop(x_gmem, o_gmem):
        count = x_gmem[0, 0].astype(jnp.int32)  # a trip count read from memory: a per-matrix scalar
        o_gmem[...] = lax.fori_loop(0, count, lambda _, y: y * 0.5, x_gmem[...])

    def rotation(x):
        y = x * 0.25 + 1.0
        theta = (y - x) / (2.0 * jnp.where(x == 0, 1.0, x))
        t = jnp.sign(theta) / (jnp.abs(theta) + jnp.sqrt(theta * theta + 1.0))
        return t / jnp.sqrt(t * t + 1.0)

    def until_small(x):
        def step(state):
            y = state[0] * 0.5
            return y, jnp.max(jnp.abs(y))  # stop when the largest entry is small: bisection's test
        return lax.while_loop(lambda state: state[1] > 1e-3, step, (x, jnp.float32(1.0)))[0]

    def rotation_reference(x):
        y = x * 0.25 + 1.0
        theta = (y - x) / (2.0 * np.where(x == 0, 1.0, x))
        t = np.sign(theta) / (np.abs(theta) + np.sqrt(theta * theta + 1.0))
        return t / np.sqrt(t * t + 1.0)

    return {
        "row sums (axis 1)": ("Householder column norms, LayerNorm rows",
                              lambda x: lax.broadcast_in_dim(jnp.sum(x, axis=1), x.shape, (0,)),
                              lambda x: np.broadcast_to(x.sum(1, keepdims=True), x.shape)),
        "column sums (axis 0)": ("the symmetric product's mirrored sums",
                                 lambda x: lax.broadcast_in_dim(jnp.sum(x, axis=0), x.shape, (1,)),
                                 lambda x: np.broadcast_to(x.sum(0, keepdims=True), x.shape)),
        "total": ("off-diagonal norm (convergence)", lambda x: x * 0.0 + jnp.sum(x),
                  lambda x: np.full(x.shape, x.sum())),
        "rank-one update": ("trailing update A - u v^T", lambda x: x - x[:, :1] * x[:1, :],
                            lambda x: x - x[:, :1] * x[:1, :]),
        "transpose in registers": ("A^T (symmetric updates)", lambda x: x.T, lambda x: x.T),
        "gather rows (x[i ^ 1])": ("the on-chip Jacobi's pair exchange",
                                   lambda x: x[jnp.arange(N, dtype=jnp.int32) ^ 1, :], lambda x: x[np.arange(N) ^ 1]),
        "elementwise rotation": ("Jacobi angles: sqrt, divide, where, sign", rotation, rotation_reference),
        "loop, static trip count": ("sweeps, panel columns", lambda x: lax.fori_loop(0, 8, lambda _, y: y * 0.5 + x, x),
                                    lambda x: _halvings(x)),
        "while loop on a computed value": ("bisection and inverse iteration until converged", until_small,
                                           lambda x: _until_small(x)),
        "row at a run-time index": ("one row of A per step (tridiagonalisation)", dynamic_row,
                                    lambda x: np.broadcast_to(x[N // 2:N // 2 + 1], x.shape)),
        "loop, trip count from memory": ("per-matrix iteration counts", scalar_loop, lambda x: x * 0.5 ** 5),
    }


READS_REFS = ("row at a run-time index", "loop, trip count from memory")


def _halvings(x):
    y = x.copy()
    for _ in range(8):
        y = y * 0.5 + x
    return y


def _until_small(x):
    y, largest = x.copy(), 1.0
    while largest > 1e-3:
        y = y * np.float32(0.5)
        largest = np.abs(y).max()
    return y


def kernel_body(op, staged: bool, reads_refs: bool):
    """The probe's kernel body. Plain: the tile read from global memory as an array, the result stored back.
    Staged (Hopper's way, as the matmul port and JAX's attention kernel do it): TMA copies the tile to shared
    memory (swizzled, as wgmma reads it), it is loaded there in the wgmma accumulator's register layout, and the
    result goes back through shared memory and TMA."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    if reads_refs:
        return lambda x_gmem, o_gmem, x_smem, o_smem, barrier: op(x_gmem, o_gmem)
    if not staged:
        def plain(x_gmem, o_gmem, x_smem, o_smem, barrier):
            o_gmem[...] = op(x_gmem[...])
        return plain

    def through_shared_memory(x_gmem, o_gmem, x_smem, o_smem, barrier):
        plgpu.copy_gmem_to_smem(x_gmem, x_smem, barrier)
        plgpu.barrier_wait(barrier)
        o_smem[...] = op(plgpu.load(x_smem, (), layout=plgpu.Layout.WGMMA))
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, o_gmem)
        plgpu.wait_smem_to_gmem(0)
    return through_shared_memory


def probe_kernel(body, semantics, interpret):
    """The probe's kernel over one (N, N) float32 tile, in the given lowering semantics, with two swizzled
    shared-memory tiles (128-byte rows of float32, as wgmma reads them) and a barrier; `interpret`: Mosaic GPU's
    interpreter's parameters, or None for the GPU."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas import mosaic_gpu as plgpu

    swizzled = (plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(128))
    return plgpu.kernel(
        body, out_type=jax.ShapeDtypeStruct((N, N), jnp.float32),
        scratch_types=[plgpu.SMEM((N, N), jnp.float32, transforms=swizzled),
                       plgpu.SMEM((N, N), jnp.float32, transforms=swizzled), plgpu.Barrier(num_arrivals=1)],
        grid=(1,), grid_names=("program",), compiler_params=plgpu.CompilerParams(lowering_semantics=semantics),
        interpret=interpret)
