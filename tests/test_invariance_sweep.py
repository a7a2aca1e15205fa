"""The sweep of reduction-bearing ops (compare.invariance.sweep), op by op on a CPU: with the mode on each op is
invariant or refused by name, and everything it reaches is the mode's own kernel, refused, or row-local (an
elementwise op, a view, a gather): nothing is left to a library reduction. On a GPU the same tests run the kernels
compiled; the sweep at GPU sizes is recorded under results/."""
import numpy as np
import pytest
import torch

import batch_invariant.torch_mode as bi
from compare.invariance.sweep import _inputs, jax_ops, sweep, torch_ops

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
LENGTH = 1025  # one past a chunk of the row kernels
REFUSED_TORCH = {"cumsum": "aten::cumsum on torch.float16", "group_norm": "aten::native_group_norm"}
REFUSED_JAX = {"cumsum": "cumsum on float16"}
# torch ops that neither sum nor mix rows, beside those tagged pointwise and the views: a copy, a scalar, and the
# negative log-likelihood's gather (its mean or sum over the batch is a function of the batch by definition)
ROW_LOCAL_TORCH = ("aten::clone", "aten::scalar_tensor", "aten::nll_loss_forward", "aten::_to_copy", "aten::copy_")
# JAX primitives that neither sum nor mix rows; the maxima are exact in any order
ROW_LOCAL_JAX = {"abs", "add", "broadcast_in_dim", "convert_element_type", "div", "exp", "is_finite", "log", "max",
                 "mul", "neg", "reduce_max", "rsqrt", "select_n", "sign", "sqrt", "square", "stop_gradient", "sub",
                 "transpose", "reshape", "integer_pow", "gt", "ge", "lt", "le", "eq", "ne"}


def _torch_operands(length: int, dtype=torch.float16):
    arrays = _inputs(length, 3, seed=5)
    return [torch.from_numpy(arrays[name]).to(DEVICE, dtype if arrays[name].dtype == np.float32 else None)
            for name in ("x", "y", "weight", "weight_t", "target")]


def _aten_reached(op, length: int) -> set[str]:
    """The aten ops that `op` dispatches with the mode on (each overload's name)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Reached(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            reached.add(func)
            return func(*args, **(kwargs or {}))

    reached = set()
    with bi.batch_invariant(), Reached(), torch.no_grad():
        try:
            op(*_torch_operands(length))
        except bi.NotCovered:
            pass
    return reached


def _unclassified(reached) -> list[str]:
    """The ops reached that are neither the mode's (covered or refused) nor row-local."""
    mode = set(bi.KERNELS) | set(bi.COVERED) | set(bi.REFUSED) | set(bi.ordered())
    unclassified = []
    for func in reached:
        name = func._schema.name + ("" if func._overloadname == "default" else f".{func._overloadname}")
        if name not in mode and not (func.is_view or torch.Tag.pointwise in func.tags
                                     or func._schema.name in ROW_LOCAL_TORCH):
            unclassified.append(name)
    return sorted(unclassified)


@pytest.mark.parametrize("name", list(torch_ops()))
def test_each_torch_op_is_invariant_or_refused_and_reaches_no_library_reduction(name):
    # the mean over tokens sums each of a row's columns in a program of its own: 1025 of them take the interpreter
    # about 40 s, so that op runs at a row of 33 there
    length = 33 if name == "mean over tokens" and DEVICE == "cpu" else LENGTH
    op = torch_ops()[name]
    assert _unclassified(_aten_reached(op, length)) == []
    record = sweep(["torch"], DEVICE == "cuda", batches=[1, 2, 3], lengths=[length], dtypes=["float16"],
                   progress=lambda _: None, ops=[name])
    verdicts = record["verdicts"]["torch"][name]["float16"][str(length)]
    if name in REFUSED_TORCH:
        assert verdicts["on"].startswith(f"refused: batch-invariant mode: {REFUSED_TORCH[name]}")
    else:
        assert verdicts["on"] == "invariant", verdicts


def _primitives(jaxpr) -> set[str]:
    """Every primitive in a jaxpr, inner jaxprs' included."""
    from batch_invariant.jax_mode import _jaxprs_in

    found = set()
    for eqn in jaxpr.eqns:
        found.add(eqn.primitive.name)
        for inner, _ in _jaxprs_in(eqn.params):
            found |= _primitives(inner)
    return found


@pytest.mark.parametrize("name", list(jax_ops()))
def test_each_jax_op_is_invariant_or_refused_and_holds_no_library_reduction(name):
    jax = pytest.importorskip("jax")
    from batch_invariant.jax_mode import CALLS, CUSTOM, ORDERED, REFUSED

    arrays = _inputs(LENGTH, 3, seed=5)
    jaxpr = jax.make_jaxpr(jax_ops()[name])(*(jax.numpy.asarray(arrays[key], jax.numpy.float16 if arrays[
        key].dtype == np.float32 else None) for key in ("x", "y", "weight", "weight_t", "target")))
    replaced_or_refused = {"dot_general", "reduce_sum", *ORDERED, *REFUSED, *CALLS, *CUSTOM}  # calls: entered
    assert _primitives(jaxpr.jaxpr) - replaced_or_refused - ROW_LOCAL_JAX == set()
    record = sweep(["jax"], DEVICE == "cuda", batches=[1, 2, 3], lengths=[LENGTH], dtypes=["float16"],
                   progress=lambda _: None, ops=[name])
    verdicts = record["verdicts"]["jax"][name]["float16"][str(LENGTH)]
    if name in REFUSED_JAX:
        assert verdicts["on"].startswith(f"refused: batch_invariant: {REFUSED_JAX[name]}")
    else:
        assert verdicts["on"] == "invariant", verdicts


def test_the_sweep_fails_on_a_batch_variant_row_kernel_and_names_it(monkeypatch, capsys):
    # a planted row kernel that sums a batch of rows in another order than one row: the sweep exits 1, naming the op
    from compare.invariance.command import main
    from triton_kernels import row_reductions

    honest = row_reductions.row_sum

    def planted(x, mean, dtype):
        total = honest(x, mean, torch.float32)
        return (total * (1 + 2.0**-10) if x.shape[0] > 2 else total).to(dtype)

    monkeypatch.setattr(row_reductions, "row_sum", planted)
    code = main(["--sweep", "--frameworks", "torch", "--lengths", "33", "--dtypes", "float32", "--batches", "1,3"])
    out = capsys.readouterr().out
    assert code == 1 and "HOLE: torch sum float32 length 33: variant at B=3" in out
    assert "VARIANT B=3" in out.split("\n  sum ")[1].splitlines()[0]


def test_the_sweep_catches_a_batch_variant_jax_row_kernel(monkeypatch, capsys):
    # the same for the JAX transformation: a planted Pallas row sum whose last bit moves with the number of rows
    pytest.importorskip("jax")
    from compare.invariance.command import main
    from pallas_kernels import row_reductions

    honest = row_reductions.row_sum
    monkeypatch.setattr(row_reductions, "row_sum",
                        lambda x: honest(x) * (1 + 2.0**-10) if x.size // max(x.shape[-1], 1) > 4 else honest(x))
    code = main(["--sweep", "--frameworks", "jax", "--lengths", "33", "--dtypes", "float32", "--batches", "1,3",
                 "--modes", "on"])
    assert code == 1 and "HOLE: jax sum float32 length 33: variant at B=3" in capsys.readouterr().out


def test_jax_16_bit_values_are_rounded_where_they_are_made():
    # XLA's excess precision computes a bfloat16 value again inside a consumer's fusion, in float32, in fusions it
    # picks by the shape: bfloat16 softmax moved bits at B = 2 on an H100 through its exp (widened for the sum) and
    # through its sum (narrowed, then divided by). The mode keeps both behind an optimization barrier.
    import jax
    import jax.numpy as jnp

    from batch_invariant.jax_mode import batch_invariant

    def eqns(jaxpr):
        for eqn in jaxpr.eqns:
            yield eqn
            for param in eqn.params.values():
                inner = getattr(param, "jaxpr", None)
                if inner is not None:
                    yield from eqns(getattr(inner, "jaxpr", inner))

    closed = jax.make_jaxpr(batch_invariant(lambda v: jax.nn.softmax(v, -1)))(jnp.ones((2, 8), jnp.bfloat16))
    made = {var: eqn.primitive.name for eqn in eqns(closed.jaxpr) for var in eqn.outvars}
    kept = [made[eqn.invars[0]] for eqn in eqns(closed.jaxpr) if eqn.primitive.name == "optimization_barrier"]
    assert sorted(kept) == ["convert_element_type", "exp"]
