"""What the eigh Pallas port's stages share: the input's checks, masked loads, barriers, block specs."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

EPS = float(jnp.finfo(jnp.float32).eps)
DOT_ALGORITHMS = {"tf32x3": jax.lax.DotAlgorithmPreset.TF32_TF32_F32_X3,  # Triton's input_precision names
                  "ieee": jax.lax.DotAlgorithmPreset.F32_F32_F32}


def dot_ieee(a, b):
    """a b in float32 arithmetic throughout (Triton's input_precision="ieee": no TF32)."""
    return jnp.dot(a, b, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)


def barrier(interpret):
    """tl.debug_barrier() between a program's global-memory writes and its reads of them. The
    interpreter runs each program's operations in order, and debug_barrier has no CPU lowering."""
    if not interpret:
        pltriton.debug_barrier()


def window(start, size):
    """pl.ds(start, size) for a slice of a ref that may run past the ref's end (a power-of-two block over n
    entries), the entries beyond masked by the load or store that takes it. jax 0.12 refuses such a slice where its
    start is a Python int ("Out of bound slice"); it checks no start that is an array, known or not, which is how
    this port gives every start, as Triton's pointer arithmetic takes it."""
    return pl.ds(jnp.int32(start) if isinstance(start, int) else start, size)


def masked_load(ref, mask, other=0.0):
    # No cache modifier: the Triton port loads what the program itself wrote with ".cg", but this
    # JAX's Triton lowering fails on every cache_modifier (its table is keyed "cg", not ".cg"); the
    # barrier before each such load is what makes the writes visible.
    return pltriton.load(ref, mask=mask, other=other)


def checked(tile, transposed, bounds_ref, first):
    """As the Triton port's `checked`: the tile of A and the same of A^T with the entries that are not finite
    zeroed, and the tile's max |A|; of the tile as read, the count of such entries, max |A| and max |A - A^T| in
    bounds[first:first + 3]."""
    finite = jnp.abs(tile) < jnp.inf  # NaN fails the comparison too
    bounds_ref[first] = jnp.sum(jnp.sum(jnp.where(finite, 0.0, 1.0), axis=1), axis=0)
    tile = jnp.where(finite, tile, 0.0)
    transposed = jnp.where(jnp.abs(transposed) < jnp.inf, transposed, 0.0)
    largest = jnp.max(jnp.max(jnp.abs(tile), axis=1), axis=0)  # one axis at a time, as Triton reduces
    bounds_ref[first + 1] = largest
    bounds_ref[first + 2] = jnp.max(jnp.max(jnp.abs(tile - transposed), axis=1), axis=0)
    return tile, transposed, largest


f32 = functools.partial(jax.ShapeDtypeStruct, dtype=jnp.float32)


def per_matrix(*shape):
    """Matrix b's block of a [batch, *shape] operand, for a grid (b, ...)."""
    return pl.BlockSpec((None, *shape), lambda b, *_: (b,) + (0,) * len(shape))


LOOP_INDEX = pl.BlockSpec((1,), lambda *_: (0,))  # a (1,) int32 operand every program reads whole (`loop_index`)


def loop_index(value):
    """A loop's counter (or any int32 scalar) as a (1,) operand: a reshape, which costs no XLA kernel, where
    arithmetic on it in XLA would cost one a step."""
    return jnp.reshape(jnp.asarray(value, jnp.int32), (1,))
