"""The smallest Mosaic GPU kernel, for what a launch costs beside the work (`compare.tools.call_cost`)."""
import jax
from jax.experimental.pallas import mosaic_gpu as plgpu

from mosaic_gpu_kernels.common import interpret_params


def _add_one_body(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1


def add_one(on_gpu: bool):
    """A jitted kernel adding one to a one-element array (in Mosaic GPU's interpreter without a GPU)."""
    def call(x):
        wide = jax.numpy.broadcast_to(x, (128,))  # Mosaic GPU's plain loads take 128 elements at least
        return plgpu.kernel(_add_one_body, out_type=jax.ShapeDtypeStruct((128,), x.dtype), grid=(1,),
                            grid_names=("one",), interpret=None if on_gpu else interpret_params())(wide)[:1]
    return jax.jit(call)
