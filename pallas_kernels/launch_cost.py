"""The smallest Pallas kernel on the Triton lowering, for what a launch costs beside the work
(`compare.tools.call_cost`)."""
import jax
from jax.experimental import pallas as pl


def _add_one_body(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1


def add_one(on_gpu: bool):
    """A jitted kernel adding one to a small array (in interpret mode without a GPU)."""
    return jax.jit(lambda x: pl.pallas_call(_add_one_body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                            interpret=not on_gpu)(x))
