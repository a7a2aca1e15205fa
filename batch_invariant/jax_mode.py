"""Batch-invariant JAX: `batch_invariant(f)` runs f with every `dot_general` on the project's Pallas matmul ports.

    from batch_invariant.jax_mode import batch_invariant

    logits = jax.jit(batch_invariant(model))(params, tokens)  # each row's bits whatever the batch

f is traced to a jaxpr and evaluated equation by equation, each `dot_general` replaced by the port, which sums every
output element over K in one fixed order whatever M is (no split-K). The rows of a product are the lhs's free
dimensions flattened, so a row has the same bits alone or in any batch. The port is the first of `PORT_ORDER` that
this machine runs (Mosaic GPU on Hopper, Pallas-Triton on other GPUs; on a CPU through their interpreters); on the
GPU the ports give the same bits as each other and as the torch mode's (`batch_invariant.torch_mode`).

Each floating-point `reduce_sum` (softmax's, log-softmax's, a mean's, a variance's, a norm's), over any axes, runs
on a row kernel whose order depends on the length of what it sums alone (`pallas_kernels.row_reductions`, the
Triton row kernels' order); integer sums and maxima (exact in any order) are left to XLA; floating products,
running sums and windowed sums are refused (`ORDERED`). The 16-bit values those kernels read, and those widened to
float32, are rounded where they are made (`_rounded_where_made`).

It composes with `jax.jit` and `jax.grad` either way round: a product's gradient runs on the port too (a custom VJP:
the gradient of the lhs, g b^T, keeps the rows' invariance; the rhs's, a^T g, sums over the batch), and a row sum's
is a broadcast. Inner `jit`s are entered; a custom-derivative function whose body holds a product or a sum is
entered too (its custom rule then gives way to the body's own), one without either is left whole.

What it does not cover it refuses with `batch_invariant.NotCovered`, never falling back to XLA's dot: a
product in another dtype than bfloat16 or float16 (or of two dtypes, or with a preferred type other than its own
or float32), a product or sum inside a control-flow primitive (`scan`, `while`, `cond`), whose body this
evaluator does not enter, and the products it has no port for (`REFUSED`: cuDNN's attention, convolutions, grouped
and block-scaled products). The gradient of a product with a float32 result rounds its cotangent to the operands' dtype.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from batch_invariant import NotCovered

PORT_ORDER = ("mosaic_gpu", "pallas")  # fastest first among the JAX ports that give the same bits
DTYPES = (jnp.bfloat16, jnp.float16)
CALLS = ("jit", "pjit", "closed_call", "core_call")  # call primitives whose jaxpr is entered
CUSTOM = ("custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr")  # entered only where they hold a product
# products the ports do not replace, refused rather than left to a library kernel: cuDNN's attention and fusions,
# block-scaled and grouped (ragged) products, convolutions
REFUSED = ("dot_product_attention", "cudnn_fusion", "scaled_matmul", "ragged_dot", "conv_general_dilated")


@functools.cache
def port() -> tuple[str, callable]:
    """(name, batched matmul function) of the port the transformation runs: the first of PORT_ORDER this machine
    runs."""
    from ports import matmul as spec

    for name in PORT_ORDER:
        impl = spec.WORKLOAD.implementation(name)
        if impl.needs.missing() is None:
            return name, impl.load("batched_matmul")
    raise RuntimeError(f"batch_invariant: none of the JAX matmul ports {PORT_ORDER} runs on this machine")


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _product(a, b, out: str, a_transposed: bool = False, b_transposed: bool = False):
    """A [B, M, K] @ B [B, K, N] on the port in one launch, in a's dtype (out "same") or float32: a holds A, or A^T
    ([B, K, M]) with a_transposed; b holds B, or B^T ([B, N, K]) with b_transposed; the port reads each as it lies."""
    rows, cols = a.shape[2 if a_transposed else 1], b.shape[1 if b_transposed else 2]
    if 0 in a.shape or cols == 0:
        return jnp.zeros((a.shape[0], rows, cols), a.dtype if out == "same" else jnp.float32)
    return port()[1](a, b, out, a_transposed=a_transposed, b_transposed=b_transposed)


def _product_forward(a, b, out, a_transposed, b_transposed):
    return _product(a, b, out, a_transposed, b_transposed), (a, b)


def _product_backward(out, a_transposed, b_transposed, residuals, g):
    """The gradients on the port, each operand read as it lies (no transposed copy): the lhs's g B^T, or its
    transpose B g^T where a holds A^T; the rhs's A^T g, or its transpose g^T A where b holds B^T. Used by second
    derivatives: a first derivative is the gradient of f by JAX's own rules, evaluated on the port
    (`batch_invariant`)."""
    a, b = residuals
    g = g.astype(a.dtype)
    lhs = (_product(b, g, "same", b_transposed, True) if a_transposed  # B g^T: B as b lies, g^T given as g
           else _product(g, b, "same", False, not b_transposed))  # g B^T
    rhs = (_product(g, a, "same", True, a_transposed) if b_transposed  # g^T A: g^T given as g, A as a lies
           else _product(a, g, "same", not a_transposed, False))  # A^T g
    return lhs, rhs


_product.defvjp(_product_forward, _product_backward)

REDUCTION_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _sum(x, axes: tuple[int, ...]):
    """x summed over `axes` on the row kernel (pallas_kernels.row_reductions): the axes moved last (a transposed
    copy unless they are last already) and flattened into rows, so a sum's order depends on the sizes of the axes
    it sums alone."""
    from pallas_kernels.row_reductions import row_sum

    kept = [d for d in range(x.ndim) if d not in axes]
    if axes != tuple(range(len(kept), x.ndim)):
        x = jnp.transpose(x, (*kept, *axes))
    return row_sum(x.reshape(*x.shape[:len(kept)], math.prod(x.shape[len(kept):])))


def _sum_forward(x, axes):
    return _sum(x, axes), x.shape


def _sum_backward(axes, shape, g):
    return (jnp.broadcast_to(jnp.expand_dims(g, axes), shape),)


_sum.defvjp(_sum_forward, _sum_backward)
# reductions and scans whose floating-point result depends on the order of their terms, which XLA chooses by the
# shape (and so by the batch): refused for floating-point operands (integer and boolean ones are exact in any order)
ORDERED = ("reduce_prod", "cumsum", "cumprod", "cumlogsumexp", "reduce_window_sum", "reduce_window", "reduce")


def _inexact(*values) -> bool:
    return any(jnp.issubdtype(value.dtype, jnp.inexact) for value in values)


def _reduce_sum(x, axes) -> jax.Array:
    """A floating-point reduce_sum on the row kernel, in the types it takes; refused in others."""
    axes = tuple(sorted(axes))
    if x.dtype not in REDUCTION_DTYPES:
        raise NotCovered(f"batch_invariant: reduce_sum on {x.dtype} is not covered (the row kernel takes "
                         f"{', '.join(jnp.dtype(dtype).name for dtype in REDUCTION_DTYPES)})")
    if not axes:
        return x
    return _sum(x, axes)


def _dot_general(lhs, rhs, *, dimension_numbers, preferred_element_type=None, **_):
    """`lax.dot_general` on the port: the batch dimensions as one batch of products (one launch), the lhs's free
    dimensions as rows. A float32 operand beside a 16-bit one is rounded to the 16-bit type first: that is how the
    backward pass of a product kept in float32 (attention's scores) reaches dot_general, and flash attention and the
    torch mode round the scores' gradient alike."""
    narrow = next((dtype for dtype in DTYPES if {lhs.dtype, rhs.dtype} == {jnp.dtype(jnp.float32), jnp.dtype(dtype)}),
                  None)
    if narrow is not None:
        lhs, rhs = lhs.astype(narrow), rhs.astype(narrow)
    if lhs.dtype != rhs.dtype or lhs.dtype not in DTYPES:
        raise NotCovered(f"batch_invariant: dot_general on {lhs.dtype} and {rhs.dtype} is not covered (the matmul "
                         "ports take bfloat16 or float16, both operands alike)")
    if preferred_element_type in (None, lhs.dtype):
        out = "same"
    elif preferred_element_type == jnp.float32:
        out = "float32"
    else:
        raise NotCovered(f"batch_invariant: dot_general to {preferred_element_type} is not covered")
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
    lhs_free = [d for d in range(lhs.ndim) if d not in lhs_contract and d not in lhs_batch]
    rhs_free = [d for d in range(rhs.ndim) if d not in rhs_contract and d not in rhs_batch]
    batch_shape = [lhs.shape[d] for d in lhs_batch]
    rows_shape, cols_shape = [lhs.shape[d] for d in lhs_free], [rhs.shape[d] for d in rhs_free]
    depth = math.prod(lhs.shape[d] for d in lhs_contract)
    batch, rows, cols = math.prod(batch_shape), math.prod(rows_shape), math.prod(cols_shape)
    # each operand as it lies where it is already A^T or B^T (contracted dimensions first in the lhs, last in the rhs,
    # as JAX's rule for a product's gradients and einsum's "...md" keys make them): no transposed copy
    a_transposed = _lies_transposed(lhs.ndim, lhs_batch, lhs_free, lhs_contract)
    b_transposed = _lies_transposed(rhs.ndim, rhs_batch, rhs_contract, rhs_free)
    a = (lhs.reshape(batch, depth, rows) if a_transposed
         else jnp.transpose(lhs, (*lhs_batch, *lhs_free, *lhs_contract)).reshape(batch, rows, depth))
    b = (rhs.reshape(batch, cols, depth) if b_transposed
         else jnp.transpose(rhs, (*rhs_batch, *rhs_contract, *rhs_free)).reshape(batch, depth, cols))
    return _product(a, b, out, a_transposed, b_transposed).reshape(*batch_shape, *rows_shape, *cols_shape)


def _lies_transposed(ndim: int, batch, first, second) -> bool:
    """Whether an operand whose port form is (batch, first, second) lies as (batch, second, first) instead: its
    transposed form is then a reshape, the port form a copy."""
    in_place = tuple(range(ndim))
    return (*batch, *first, *second) != in_place and (*batch, *second, *first) == in_place


def _jaxprs_in(params: dict):
    """The (jaxpr, consts) pairs an equation's parameters hold: closed jaxprs, open ones, and those in tuples (the
    branches of a cond)."""
    for value in params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if hasattr(item, "jaxpr") and hasattr(item, "consts"):
                yield item.jaxpr, item.consts
            elif hasattr(item, "eqns"):
                yield item, ()


def _holds_what_is_replaced(jaxpr) -> bool:
    """Whether a jaxpr holds, at any depth, what the transformation replaces (a dot_general or a reduce_sum) or
    refuses."""
    return any(eqn.primitive.name in ("dot_general", "reduce_sum", *ORDERED) or eqn.primitive.name.startswith(REFUSED)
               or any(_holds_what_is_replaced(inner) for inner, _ in _jaxprs_in(eqn.params)) for eqn in jaxpr.eqns)


def _rounded_where_made(jaxpr) -> set:
    """The 16-bit floating variables that a replaced product or sum reads, that are widened to a wider float, or
    that are made by narrowing a wider float: each is put behind an optimization barrier where it is made, so that
    it is computed once, rounded to its type, and read from memory by every consumer alike. Without it XLA may
    compute such a value again inside another consumer's fusion and keep it in float32 there (excess precision:
    a narrowing and a widening convert in one fusion cancel), in fusions it chooses by the shape. jax.nn.softmax in
    bfloat16 gave rows other bits in a batch than alone twice over: its exp(x - max), widened for its sum, and the
    sum, narrowed to bfloat16 and divided by (docs/findings.md, "The modes, op by op, at sizes no test used")."""
    narrow = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
    kept = set()
    for eqn in jaxpr.eqns:
        converted = eqn.primitive.name == "convert_element_type" and jnp.issubdtype(eqn.params["new_dtype"],
                                                                                     jnp.floating)
        widened = converted and jnp.finfo(eqn.params["new_dtype"]).bits > 16
        if eqn.primitive.name in ("dot_general", "reduce_sum") or widened:
            kept |= {var for var in eqn.invars if not hasattr(var, "val") and var.aval.dtype in narrow}
        if converted and eqn.outvars[0].aval.dtype in narrow and eqn.invars[0].aval.dtype not in narrow:
            kept.add(eqn.outvars[0])
    return kept


def _evaluate(jaxpr, consts, *args):
    """The jaxpr's outputs for `args`, every dot_general on the port."""
    env = {}

    def read(var):
        return var.val if hasattr(var, "val") else env[var]

    rounded = _rounded_where_made(jaxpr)

    def keep(var, value):
        env[var] = jax.lax.optimization_barrier(value) if var in rounded else value

    for var, value in zip(jaxpr.constvars, consts):
        keep(var, value)
    for var, value in zip(jaxpr.invars, args):
        keep(var, value)
    for eqn in jaxpr.eqns:
        values = [read(var) for var in eqn.invars]
        name = eqn.primitive.name
        if name.startswith(REFUSED):
            raise NotCovered(f"batch_invariant: {name} is not covered (its products run on a library kernel, which "
                             "may be batch-variant); write it with dot_general (jax.nn.dot_product_attention: "
                             "implementation='xla'), or leave f untransformed")
        if name == "dot_general":
            outputs = [_dot_general(*values, **eqn.params)]
        elif name == "reduce_sum" and _inexact(values[0]):  # integer sums are exact in any order: XLA's
            outputs = [_reduce_sum(values[0], eqn.params["axes"])]
        elif name in ORDERED and _inexact(*values):
            raise NotCovered(f"batch_invariant: {name} on {values[0].dtype} is not covered (its terms' order is "
                             "XLA's, chosen by the shape); leave f untransformed")
        elif (name in CALLS or name in CUSTOM) and _holds_what_is_replaced(next(_jaxprs_in(eqn.params))[0]):
            outputs = _evaluate(*next(_jaxprs_in(eqn.params)), *values)  # the call's own (jaxpr, consts) first
        elif any(_holds_what_is_replaced(inner) for inner, _ in _jaxprs_in(eqn.params)):
            raise NotCovered(f"batch_invariant: a dot_general or reduce_sum inside {name} is not covered (this "
                             "evaluator does not enter control flow); move it out, or leave f untransformed")
        else:
            outputs = eqn.primitive.bind(*values, **eqn.primitive.get_bind_params(eqn.params))  # as eval_jaxpr
            outputs = outputs if eqn.primitive.multiple_results else [outputs]
        for var, value in zip(eqn.outvars, outputs):
            keep(var, value)
    return [read(var) for var in jaxpr.outvars]


def _run(f, args):
    """f(*args) with its jaxpr evaluated by `_evaluate`."""
    closed, shapes = jax.make_jaxpr(f, return_shape=True)(*args)
    outputs = _evaluate(closed.jaxpr, closed.consts, *jax.tree_util.tree_leaves(args))
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shapes), outputs)


def batch_invariant(f):
    """f with every matrix product on the batch-invariant matmul ports and every row sum on the row kernel (see the
    module's docstring). Its gradient is the gradient of f with the same replacements: the backward pass, whose
    sums over a row come from the transposes of broadcasts, is evaluated like the forward pass (a custom VJP), so
    `jax.grad(batch_invariant(f))` is as invariant as `batch_invariant(jax.grad(f))`."""

    @functools.wraps(f)
    def transformed(*args, **kwargs):
        function = functools.partial(f, **kwargs)

        @jax.custom_vjp
        def evaluated(*args):
            return _run(function, args)

        def forward(*args):
            return _run(function, args), args

        def backward(args, cotangent):
            return _run(lambda *inputs: jax.vjp(function, *inputs[:-1])[1](inputs[-1]), (*args, cotangent))

        evaluated.defvjp(forward, backward)
        return evaluated(*args)

    return transformed
