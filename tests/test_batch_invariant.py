"""The batch-invariant mode for torch (batch_invariant.torch_mode): through the Triton interpreter on a CPU, at small
sizes, the mode's products are invariant in the batch, agree with float64, carry their invariance into the gradients
of the activations, refuse what they do not cover, and leave torch's kernels exactly as they were. On a CPU the
products are float16 (the interpreter misreads bfloat16, which the mode refuses there); bfloat16 on a GPU."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import batch_invariant.torch_mode as bi
import batch_invariant.kernels as bik
from compare.tools.hopper_compile import lower_for_hopper, triton_kernels_in

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float16
TOLERANCE = 2.0**-7  # twice bf16's rounding unit, relative to |ref| + rms(ref) (the matmul workload's check)


def half(*shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE, DTYPE)


def float64_product(a, b):
    """a @ b in float64 by NumPy, on a's device: the mode refuses float64 products, sums and running sums."""
    product = a.detach().double().cpu().numpy() @ b.detach().double().cpu().numpy()
    return torch.from_numpy(product).to(a.device)


def split_k_below(rows: int):
    """A planted batch-variant port: below `rows` rows it sums K in two halves, each rounded to 16 bits (as cuBLAS
    splits K at small M)."""
    def port(data):
        a, b, _ = data
        if a.shape[0] >= rows:
            return float64_product(a, b).to(a.dtype)
        half = a.shape[1] // 2
        return (float64_product(a[:, :half], b[:half]).to(a.dtype)
                + float64_product(a[:, half:], b[half:]).to(a.dtype))

    return port


def assert_close_to_float64(output, expected, tolerance=TOLERANCE):
    scale = expected.abs() + float(np.sqrt(np.mean(np.square(expected.cpu().numpy()))))  # the mode sums no float64
    assert bool(((output.double() - expected).abs() <= tolerance * scale).all())


@pytest.fixture
def mode():
    with bi.batch_invariant():
        yield
    assert not bi.active()


def test_each_row_has_the_same_bits_in_any_batch(mode):
    x, w, bias = half(12, 48, seed=1), half(40, 48, seed=2), half(40, seed=3)
    products = {"matmul": lambda rows: rows @ w.T, "linear": lambda rows: F.linear(rows, w, bias),
                "batched": lambda rows: torch.matmul(rows.reshape(-1, 2, 48).transpose(0, 1), w.T).transpose(0, 1)
                .reshape(-1, 40)}
    for name, product in products.items():
        whole = product(x)
        for m in (2, 4, 6, 10):
            assert torch.equal(product(x[:m]), whole[:m]), (name, m)
    assert_close_to_float64(products["linear"](x), float64_product(x, w.T) + bias.double())


def test_the_gradient_of_the_activations_is_invariant_too(mode):
    w = half(24, 32, seed=4).requires_grad_()
    x = half(8, 32, seed=5)
    gradients = {}
    for m in (3, 8):
        rows = x[:m].clone().requires_grad_()
        F.linear(rows, w).float().square().sum().backward()
        gradients[m] = rows.grad
    assert torch.equal(gradients[3], gradients[8][:3])
    expected = float64_product(2 * float64_product(x, w.detach().T), w.detach())  # d/dx of sum((x W^T)^2)
    assert_close_to_float64(gradients[8], expected)


def test_an_uncovered_dtype_is_refused_naming_the_op(mode):
    with pytest.raises(bi.NotCovered, match="aten::mm on torch.float32 is not covered"):
        torch.randn(4, 8, device=DEVICE) @ torch.randn(8, 3, device=DEVICE)
    with pytest.raises(bi.NotCovered, match=f"aten::addmm on {DTYPE}, torch.float32"):
        F.linear(half(4, 8, seed=6), half(3, 8, seed=7), torch.zeros(3, device=DEVICE))
    for name, call in {"sum": lambda x: x.sum(-1, dtype=torch.float64),
                       "linalg_vector_norm": lambda x: torch.linalg.vector_norm(x, dim=-1, dtype=torch.float64),
                       }.items():
        with pytest.raises(bi.NotCovered, match=f"aten::{name} to torch.float64"):  # not float32's sum, widened
            call(torch.randn(4, 8, device=DEVICE))


def test_products_without_a_kernel_are_refused_and_baddbmm_is_covered(mode):
    a, b, c = half(3, 5, 16, seed=11), half(3, 16, 4, seed=12), half(3, 5, 4, seed=13)
    for name, call in {"aten::mv": lambda: a[0] @ b[0, :, 0], "aten::dot": lambda: a[0, 0] @ a[0, 1],
                       "aten::mm.out": lambda: torch.mm(a[0], b[0], out=c[0].clone()),
                       "aten::convolution": lambda: F.conv1d(a, b.transpose(1, 2))}.items():
        with pytest.raises(bi.NotCovered, match=name):
            call()
    scores = torch.baddbmm(c, a, b, alpha=0.5)  # attention's scores plus a mask, as some models write it
    assert torch.equal(torch.baddbmm(c[:1], a[:1], b[:1], alpha=0.5), scores[:1])
    expected = torch.stack([0.5 * float64_product(a[i], b[i]) + c[i].double() for i in range(3)])
    assert_close_to_float64(scores, expected)


def test_leaving_the_mode_restores_torchs_kernels_exactly():
    a, b = half(6, 16, seed=8), half(16, 8, seed=9)
    before = a @ b
    with bi.batch_invariant():
        with bi.batch_invariant():  # nested: the mode ends at the outer exit
            pass
        assert bi.active()
        inside = a @ b
    assert not bi.active() and torch.equal(a @ b, before)
    torch.randn(2, 3) @ torch.randn(3, 2)  # float32 again, refused inside the mode
    assert_close_to_float64(inside, float64_product(a, b))


@pytest.mark.skipif(DEVICE == "cuda", reason="the interpreter's limit, on a CPU")
def test_bfloat16_is_refused_on_a_cpu(mode):
    with pytest.raises(bi.NotCovered, match="misreads bfloat16"):
        torch.ones(2, 3, dtype=torch.bfloat16) @ torch.ones(3, 2, dtype=torch.bfloat16)


def test_empty_products_need_no_launch(mode):
    assert (half(0, 8, seed=1) @ half(8, 3, seed=2)).shape == (0, 3)
    assert torch.equal(half(4, 0, seed=1) @ half(0, 3, seed=2), torch.zeros(4, 3, device=DEVICE, dtype=DTYPE))


def test_reductions_over_nothing_give_torchs_answers():
    x = torch.zeros(3, 0, device=DEVICE)
    ops = {"sum": lambda v: v.sum(-1), "mean": lambda v: v.mean(-1), "logsumexp": lambda v: torch.logsumexp(v, -1),
           "norm": lambda v: torch.linalg.vector_norm(v, dim=-1)}
    expected = {name: op(x) for name, op in ops.items()}
    with bi.batch_invariant():
        for name, op in ops.items():
            assert torch.equal(op(x).nan_to_num(7.0), expected[name].nan_to_num(7.0)), name


def test_the_mode_takes_gluon_on_hopper_and_triton_elsewhere():
    name, _ = bi.port_for(torch.device(DEVICE))
    expected = "gluon" if DEVICE == "cuda" and torch.cuda.get_device_capability() >= (9, 0) else "triton"
    assert name == expected


def test_a_batch_variant_port_fails_the_projects_invariance_check(mode, monkeypatch):
    # the check is not vacuous: under the mode, a planted port that splits K for small batches (as cuBLAS does),
    # each half rounded to 16 bits, fails the matmul workload's batch-invariance property (the driver's check)
    from ports import matmul as matmul_spec

    monkeypatch.setitem(bik._ports, torch.device(DEVICE).type, ("planted", split_k_below(8)))
    sizes = dict(matmul_spec.PROPERTY_SIZES["cpu"], k=48, n=40, dtype="float16", every_m=12, sampled_m=(),
                 batch_sizes=(1, 3), repeats=2, repeat_m=4)
    verdicts = {entry["property"].split(":")[0]: entry for entry in matmul_spec.properties(
        lambda data: data[0] @ data[1], lambda *inputs: inputs, DEVICE, sizes)}
    invariance = verdicts["batch invariance"]
    assert invariance["passed"] is False and invariance["first_difference"]["m"] < 8, invariance


def cotangent(out):
    """A fixed random cotangent for `out` (the gradient of sum(out * cotangent)): no cancellation in the backward
    pass beyond the op's own, so that a 16-bit output's rounding is not magnified in the input's gradient."""
    return torch.randn(out.shape, generator=torch.Generator().manual_seed(61)).to(out.device)


def invariant_forward_and_backward(reduce, x, parts=(1, 4)):
    """reduce(x) and the gradient of sum(reduce(x) * cotangent), inside the mode: for the first m rows alone the
    same bits as in the whole batch, for each m in `parts`; returns the whole batch's output."""
    whole = x.clone().requires_grad_()
    out = reduce(whole)
    weights = cotangent(out)
    (out.float() * weights).sum().backward()
    for m in parts:
        part = x[:m].clone().requires_grad_()
        part_out = reduce(part)
        (part_out.float() * weights[:m]).sum().backward()
        assert torch.equal(part_out, out[:m]) and torch.equal(part.grad, whole.grad[:m]), m
    return out.detach()


@pytest.mark.parametrize("dtype", [torch.float32, DTYPE], ids=str)
def test_row_reductions_are_invariant_and_right_forward_and_backward(dtype):
    # softmax, log_softmax (cross-entropy's), mean and sum over the last dimension on the row kernels: a row's bits the
    # same in any batch, forward and backward, within float32 rounding of float64 (rows of 3000: three 1024-chunks)
    x = (3 * torch.randn(6, 3000, generator=torch.Generator().manual_seed(51))).to(DEVICE, dtype)
    x64 = x.double()  # the references, outside the mode
    shifted = x64 - x64.amax(-1, keepdim=True)
    expected = {"softmax": shifted.exp() / shifted.exp().sum(-1, keepdim=True),
                "log_softmax": shifted - shifted.exp().sum(-1, keepdim=True).log(),
                "mean": x64.square().sum(-1, keepdim=True) / x.shape[-1], "sum": x64.sum(-1)}
    reductions = {"softmax": lambda rows: torch.softmax(rows, -1),
                  "log_softmax": lambda rows: torch.log_softmax(rows, -1),
                  "mean": lambda rows: rows.square().mean(-1, keepdim=True), "sum": lambda rows: rows.sum(-1)}
    with bi.batch_invariant():
        for name, reduce in reductions.items():
            out = invariant_forward_and_backward(reduce, x)
            tolerance = 1e-5 if dtype == torch.float32 else 2e-3
            atol = tolerance * float(expected[name].abs().max())
            assert torch.allclose(out.double(), expected[name], rtol=tolerance, atol=atol), name


@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm", "_fused_rms_norm"])
def test_norms_are_invariant_and_right_forward_and_backward(norm):
    # LayerNorm and RMSNorm (F.rms_norm, which decomposes into a mean on a CPU, and the fused op torch may run on a
    # GPU) on the row kernels: invariant forward and backward; output, input and weight gradients near float64's
    # (the gradients of a random linear function of y: that of sum(y^2) cancels to a tenth of its terms, and bf16's
    # rounding of y with it, failing the tolerance on the H200)
    gen = torch.Generator().manual_seed(52)
    x = (2 + 3 * torch.randn(5, 2, 700, generator=gen)).to(DEVICE, DTYPE)
    weight = (1 + 0.1 * torch.randn(2, 700, generator=gen)).to(DEVICE, DTYPE)
    bias = (0.1 * torch.randn(2, 700, generator=gen)).to(DEVICE, DTYPE)
    functions = {"layer_norm": lambda rows, w: F.layer_norm(rows, (2, 700), w, bias, 1e-5),
                 "rms_norm": lambda rows, w: F.rms_norm(rows, (2, 700), w, 1e-5),
                 "_fused_rms_norm": lambda rows, w: torch.ops.aten._fused_rms_norm(rows, [2, 700], w, 1e-5)[0]}
    # the float64 reference: y and the gradients of sum(y^2) with respect to x and the weight, by autograd
    x64, w64 = x.double().requires_grad_(), weight.double().requires_grad_()
    rows = x64.reshape(5, -1)
    centred = rows - rows.mean(-1, keepdim=True) if norm == "layer_norm" else rows
    y64 = (centred / (centred.square().mean(-1, keepdim=True) + 1e-5).sqrt()).reshape(x.shape) * w64
    y64 = y64 + bias.double() if norm == "layer_norm" else y64
    (y64 * cotangent(y64).double()).sum().backward()
    whole, w = x.clone().requires_grad_(), weight.clone().requires_grad_()
    with bi.batch_invariant():
        invariant_forward_and_backward(lambda rows: functions[norm](rows, weight), x, parts=(1, 3))
        y = functions[norm](whole, w)
        (y.float() * cotangent(y)).sum().backward()
    for output, expected in ((y, y64), (whole.grad, x64.grad), (w.grad, w64.grad)):
        assert_close_to_float64(output.detach(), expected.detach())


def test_attention_is_invariant_and_right_forward_and_backward():
    # scaled_dot_product_attention, causal and with a boolean mask, as its definition on the mode's kernels
    gen = torch.Generator().manual_seed(53)
    q, k, v = (torch.randn(4, 2, 24, 16, generator=gen).to(DEVICE, DTYPE) for _ in range(3))
    mask = torch.rand(24, 24, generator=gen).to(DEVICE) < 0.8
    mask.fill_diagonal_(True)
    for options in (dict(is_causal=True), dict(attn_mask=mask)):
        with bi.batch_invariant():
            out = invariant_forward_and_backward(
                lambda rows: F.scaled_dot_product_attention(rows, k[:len(rows)], v[:len(rows)], **options), q)
        allowed = torch.ones(24, 24, dtype=torch.bool, device=DEVICE).tril() if options.get("is_causal") else mask
        scores = (q.double() @ k.double().transpose(-1, -2) / 4).masked_fill(~allowed, float("-inf"))
        assert_close_to_float64(out, torch.softmax(scores, -1) @ v.double())  # the scores kept in float32
        # the gradients of the query, key and value against float64's: the scores' backward on the port
        operands = [x.clone().requires_grad_() for x in (q, k, v)]
        operands64 = [x.double().requires_grad_() for x in (q, k, v)]
        with bi.batch_invariant():
            out = F.scaled_dot_product_attention(*operands, **options)
            (out.float() * cotangent(out)).sum().backward()
        # the reference takes the cotangent the mode receives, rounded to the output's dtype; the mode's backward
        # rounds dP = dO V^T and dS to 16 bits (flash attention rounds dS too, but keeps dP in float32), and dQ and dK
        # sum dS's rounding over the rows: on the GPU's bfloat16 they need twice the products' tolerance
        scores = (operands64[0] @ operands64[1].transpose(-1, -2) / 4).masked_fill(~allowed, float("-inf"))
        ((torch.softmax(scores, -1) @ operands64[2]) * cotangent(out).to(DTYPE).double()).sum().backward()
        for operand, operand64 in zip(operands, operands64):
            assert_close_to_float64(operand.grad, operand64.grad, 2 * TOLERANCE)
    with bi.batch_invariant(), pytest.raises(bi.NotCovered, match="dropout"):
        F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)


def test_sums_across_rows_and_of_integers():
    x = torch.randn(3, 4, 5, device=DEVICE)
    with bi.batch_invariant():
        across = x.sum(dim=(0, 2), keepdim=True)  # across rows (a weight's gradient): in an order fixed by the sizes
        whole, mean0 = x.sum(), x.mean(dim=0)
        counted = torch.tensor([[True, False], [True, True]], device=DEVICE).sum(-1)  # exact in any order
        integers = torch.arange(10, device=DEVICE).sum()
        with pytest.raises(bi.NotCovered, match="aten::sum on torch.float64"):
            x.double().sum(-1)
        with pytest.raises(bi.NotCovered, match="over dimension"):
            torch.softmax(x, dim=0)
    assert across.shape == (1, 4, 1) and torch.allclose(across, x.sum(dim=(0, 2), keepdim=True), atol=1e-5)
    assert whole.shape == () and torch.allclose(whole, x.sum(), atol=1e-4)
    assert torch.allclose(mean0, x.mean(dim=0), atol=1e-6)
    assert counted.tolist() == [1, 2] and counted.dtype == torch.int64 and int(integers) == 45


# --- JAX: batch_invariant.jax_mode.batch_invariant(f) -------------------------------------------------------------

def jax_inputs(rows, depth, cols, seed):
    jnp = pytest.importorskip("jax.numpy")
    x, w = half(rows, depth, seed=seed).float().cpu().numpy(), half(depth, cols, seed=seed + 1).float().cpu().numpy()
    dtype = jnp.bfloat16 if DEVICE == "cuda" else jnp.float16
    return jnp.asarray(x, dtype), jnp.asarray(w, dtype)


def decoder_layer(x, w):
    """A product inside a jit and under a custom-derivative activation, as models write them."""
    import jax

    return jax.nn.relu(jax.jit(lambda rows: rows @ w)(x)) * 2


def test_jax_rows_have_the_same_bits_in_any_batch_under_jit_and_grad():
    jax = pytest.importorskip("jax")

    from batch_invariant.jax_mode import batch_invariant

    x, w = jax_inputs(12, 48, 40, seed=21)
    layer = batch_invariant(decoder_layer)
    whole = layer(x, w)
    for m in (1, 3, 7):
        assert bool((layer(x[:m], w) == whole[:m]).all()), m
    assert bool((jax.jit(layer)(x, w) == whole).all())
    expected = np.maximum(np.asarray(x, np.float64) @ np.asarray(w, np.float64), 0) * 2
    scale = np.abs(expected) + np.sqrt(np.mean(expected**2))
    assert bool((np.abs(np.asarray(whole, np.float64) - expected) <= TOLERANCE * scale).all())
    for gradient in (jax.grad(lambda rows: layer(rows, w).astype("float32").sum()),  # grad of the transformed f
                     batch_invariant(jax.grad(lambda rows: decoder_layer(rows, w).astype("float32").sum()))):
        assert bool((gradient(x[:3]) == gradient(x)[:3]).all())


def transposed_shapes(jaxpr) -> list[tuple]:
    """The shapes of the operands that a jaxpr's transposes move (not the identity's), at any depth but inside a
    kernel (a pallas_call's own body)."""
    shapes = []
    for eqn in jaxpr.eqns:
        permutation = tuple(eqn.params.get("permutation", ()))
        if eqn.primitive.name == "transpose" and permutation != tuple(range(len(permutation))):
            shapes.append(tuple(eqn.invars[0].aval.shape))
        if eqn.primitive.name != "pallas_call":
            for value in eqn.params.values():
                for item in value if isinstance(value, (tuple, list)) else (value,):
                    inner = getattr(item, "jaxpr", item)
                    shapes += transposed_shapes(inner) if hasattr(inner, "eqns") else []
    return shapes


@pytest.mark.parametrize("port_name", ["pallas", "mosaic_gpu"])
def test_jax_takes_transposed_operands_as_they_lie(port_name, monkeypatch):
    # an rhs with its contracted dimension last reaches the port as B^T, an lhs with it first as A^T, with no
    # transposed copy: einsum's "nd" keys, and the gradients JAX's rule for a product makes (g W^T, and the weight's
    # g^T x), so that a training step copies neither a weight nor an output's gradient; the bits are those of the
    # operands transposed first, the gradients within rounding of float64
    jax = pytest.importorskip("jax")

    import batch_invariant.jax_mode as bij
    from ports import matmul as spec

    impl = spec.WORKLOAD.implementation(port_name)
    if impl.needs.missing():
        pytest.skip(f"{port_name}: {impl.needs.missing()}")
    monkeypatch.setattr(bij, "port", lambda: (port_name, impl.load("batched_matmul")))
    x, w = jax_inputs(13, 40, 70, seed=31)
    w_t = w.T.copy()  # [70, 40]: B^T as it lies
    as_it_lies = bij.batch_invariant(lambda x, w_t: jax.numpy.einsum("md,nd->mn", x, w_t))
    transposed_first = bij.batch_invariant(lambda x, w_t: x @ jax.numpy.transpose(w_t))
    assert transposed_shapes(jax.make_jaxpr(as_it_lies)(x, w_t).jaxpr) == []
    assert bool((as_it_lies(x, w_t) == transposed_first(x, w_t)).all())

    def loss(f):
        return lambda x, w_t: f(x, w_t).astype("float32").sum()

    gradients = jax.grad(loss(as_it_lies), argnums=(0, 1))(x, w_t)
    assert bool((gradients[0] == jax.grad(loss(transposed_first))(x, w_t)).all())  # g @ B^T, B read either way
    ones = np.ones((13, 70))
    expected = (ones @ np.asarray(w_t, np.float64), ones.T @ np.asarray(x, np.float64))
    for got, want in zip(gradients, expected):
        assert np.allclose(np.asarray(got, np.float64), want, rtol=TOLERANCE, atol=TOLERANCE * np.abs(want).max())
    for rhs, f in ((w_t, as_it_lies), (w, bij.batch_invariant(lambda x, w: x @ w))):
        backward = transposed_shapes(jax.make_jaxpr(jax.grad(loss(f), argnums=(0, 1)))(x, rhs).jaxpr)
        assert tuple(rhs.shape) not in backward and (13, 70) not in backward, backward


def test_jax_second_derivatives_run_on_the_port():
    # a derivative of a gradient differentiates the products the gradient ran on the port (the product's own custom
    # VJP, each operand read as it lies: lhs and rhs, plain and transposed): within rounding of XLA's in float32
    jax = pytest.importorskip("jax")

    from batch_invariant.jax_mode import batch_invariant

    x, w = jax_inputs(9, 24, 20, seed=41)
    v, big_v = jax_inputs(9, 24, 20, seed=43)

    def loss(x, w):
        return 0.5 * jax.numpy.sum(jax.numpy.square((x @ w).astype("float32")))

    def curvature(gradient):  # the gradient's projection on (v, V), differentiated again
        return jax.grad(lambda x, w: sum(jax.numpy.sum(d.astype("float32") * t.astype("float32"))
                                         for d, t in zip(gradient(x, w), (v, big_v))), argnums=(0, 1))

    got = curvature(jax.grad(batch_invariant(loss), argnums=(0, 1)))(x, w)
    as_float32 = [operand.astype("float32") for operand in (x, w)]
    with jax.default_matmul_precision("highest"):
        want = curvature(jax.grad(loss, argnums=(0, 1)))(*as_float32)
    for g, e in zip(got, want):
        e = np.asarray(e, np.float64)
        assert np.abs(np.asarray(g, np.float64) - e).max() <= 2e-2 * np.abs(e).max()


def test_jax_row_sums_run_on_the_row_kernel_forward_and_backward():
    # softmax, log-softmax and a mean reach XLA as reduce_sum over the last axis: on the row kernel, a row's bits the
    # same in any batch, its gradient too, within float32 rounding of float64 (rows of 3000: three 1024-chunks)
    jax = pytest.importorskip("jax")

    from batch_invariant.jax_mode import batch_invariant

    x = jax.numpy.asarray(3 * np.random.default_rng(61).standard_normal((6, 3000)), jax.numpy.float32)
    reductions = {"softmax": lambda rows: jax.nn.softmax(rows, axis=-1),
                  "log_softmax": lambda rows: jax.nn.log_softmax(rows, axis=-1),
                  "mean": lambda rows: jax.numpy.mean(jax.numpy.square(rows), axis=-1)}
    x64 = np.asarray(x, np.float64)
    shifted = x64 - x64.max(-1, keepdims=True)
    expected = {"softmax": np.exp(shifted) / np.exp(shifted).sum(-1, keepdims=True),
                "log_softmax": shifted - np.log(np.exp(shifted).sum(-1, keepdims=True)),
                "mean": np.square(x64).mean(-1)}
    for name, reduce in reductions.items():
        transformed = batch_invariant(reduce)
        gradient = jax.grad(lambda rows: jax.numpy.sum(jax.numpy.square(transformed(rows))))
        whole, whole_gradient = transformed(x), gradient(x)
        for m in (1, 4):
            assert bool((transformed(x[:m]) == whole[:m]).all()) and bool((gradient(x[:m]) == whole_gradient[:m]).all())
        assert np.allclose(np.asarray(whole, np.float64), expected[name], rtol=1e-5,
                           atol=1e-5 * np.abs(expected[name]).max()), name
    jaxpr = str(jax.make_jaxpr(batch_invariant(reductions["mean"]))(x))
    assert "batch_invariant_row_sum" in jaxpr  # the sum is the row kernel's


def ordered_row_sum(rows: np.ndarray, chunk: int = 1024) -> np.ndarray:
    """The row kernels' order in NumPy, float32 throughout: chunks of min(chunk, the next power of two) added in
    order element by element, then the vector's halves added until one element is left."""
    cols = rows.shape[-1]
    width = min(chunk, 1 << max(cols - 1, 0).bit_length())
    padded = np.zeros((rows.shape[0], -(-cols // width) * width), np.float32)
    padded[:, :cols] = rows
    total = np.zeros((rows.shape[0], width), np.float32)
    for start in range(0, cols, width):
        total = total + padded[:, start:start + width]
    while total.shape[1] > 1:
        total = total[:, :total.shape[1] // 2] + total[:, total.shape[1] // 2:]
    return total[:, 0]


@pytest.mark.parametrize("cols", [1, 7, 1000, 1025, 3001])
def test_row_sums_add_in_the_written_order_in_both_frameworks(cols):
    # the bits of a row's sum are those of ordered_row_sum, on the Triton and the Pallas row kernels alike, on a CPU
    # and on a GPU: the order is written out, never a reduction's own tree (which follows the compiler's register
    # layout, and on a GPU the layout followed whether one row or many were summed)
    from triton_kernels.row_reductions import row_sum

    rows = np.random.default_rng(cols).standard_normal((5, cols)).astype(np.float32) * 3
    expected = ordered_row_sum(rows)
    for batch in (1, 2, 5):
        torch_sum = row_sum(torch.from_numpy(rows[:batch]).to(DEVICE), False, torch.float32).cpu().numpy()
        assert np.array_equal(torch_sum, expected[:batch]), batch
    jax = pytest.importorskip("jax")
    from pallas_kernels.row_reductions import row_sum as pallas_row_sum

    for batch in (1, 2, 5):
        assert np.array_equal(np.asarray(jax.jit(pallas_row_sum)(jax.numpy.asarray(rows[:batch]))), expected[:batch])


def test_jax_refuses_what_it_does_not_cover():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    from batch_invariant import NotCovered
    from batch_invariant.jax_mode import batch_invariant

    x, w = jax_inputs(4, 16, 8, seed=31)
    with pytest.raises(NotCovered, match="dot_general on float32"):
        batch_invariant(lambda a, b: a @ b)(x.astype(jnp.float32), w.astype(jnp.float32))
    # a float32 operand beside a 16-bit one (a float32-out product's backward pass) is rounded to the 16-bit type
    mixed = batch_invariant(lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32))
    assert bool(jnp.array_equal(mixed(x.astype(jnp.float32), w), mixed(x, w)))
    scanned = lambda a, b: jax.lax.scan(lambda carry, row: (carry, row @ b), 0.0, a)[1]  # noqa: E731
    with pytest.raises(NotCovered, match="inside scan"):
        batch_invariant(scanned)(x, w)

    def convolved(a, b):
        return jax.lax.conv_general_dilated(a[None, None], b[None, None, :3, :3], (1, 1), "SAME")

    with pytest.raises(NotCovered, match="conv_general_dilated is not covered"):
        batch_invariant(convolved)(x, w)
    inside_custom = jax.custom_jvp(convolved)  # a library product behind a custom rule is found too
    inside_custom.defjvp(lambda primals, tangents: (convolved(*primals), convolved(*primals)))
    with pytest.raises(NotCovered, match="conv_general_dilated"):
        batch_invariant(inside_custom)(x, w)


@pytest.mark.skipif(DEVICE != "cuda", reason="the interpreters sum in their own orders: same bits only on the GPU")
def test_torch_and_jax_give_the_same_bits():
    pytest.importorskip("jax")

    from batch_invariant.jax_mode import batch_invariant

    x, w = jax_inputs(16, 64, 48, seed=41)
    with bi.batch_invariant():
        torch_bits = (torch.from_numpy(np.asarray(x.astype("float32"))).to(DEVICE, DTYPE)
                      @ torch.from_numpy(np.asarray(w.astype("float32"))).to(DEVICE, DTYPE))
    jax_bits = batch_invariant(lambda a, b: a @ b)(x, w)
    assert np.array_equal(torch_bits.float().cpu().numpy(), np.asarray(jax_bits.astype("float32")))


# --- the proof on a decoder: python -m compare invariance ----------------------------------------------------------

def test_the_decoder_keeps_every_sequences_bits_in_any_batch_with_the_modes_on(tmp_path):
    pytest.importorskip("jax")
    import json

    from compare.__main__ import main

    path = tmp_path / "invariance.json"
    assert main(["invariance", "--batches", "1,2", "--layers", "1", "--length", "4", "--cost", "2", "--repeats", "1",
                 "--json", str(path)]) == 0
    record = json.loads(path.read_text())
    assert record["passed"] and set(record["frameworks"]) == {"torch", "jax"}
    assert all(times[mode] > 0 for framework in record["cost"].values() for times in framework["2"].values()
               for mode in ("off", "on"))
    assert all(entry["logits"] and entry["gradient"] for framework in record["frameworks"].values()
               for entry in framework["on"].values())
    assert {"logits_equal", "gradient_equal"} <= set(record["cross"])
    assert record["cost"]["torch"]["switch_ms"] > 0 and "switch_ms" not in record["cost"]["jax"]
    assert record["command"].startswith("python -m compare invariance --batches 1,2 --layers 1")
    assert record["commit"] and record["started"] and "sources" not in record  # what made the run


def test_torch_against_jax_traces_the_first_sequence_whose_logits_differ():
    from compare.invariance.decoder import cross_comparison, cross_verdict

    class Runner:  # every intermediate is the tokens; `bump` adds one to sequence 1's from "mlp" on
        def __init__(self, bump):
            self.bump = bump

        def trace(self, tokens):
            bumped = self.bump and int(tokens[0, 0]) == 1
            return {op: tokens.astype(float) + (bumped and op != "attention") for op in ("attention", "mlp")}

        def logits(self, tokens, invariant):
            return np.stack([self.trace(tokens[i:i + 1])["mlp"][0] for i in range(len(tokens))])

        def input_gradients(self, tokens, invariant):
            return self.logits(tokens, invariant)

    tokens = np.arange(3)[:, None].repeat(2, 1)  # sequence i is [i, i]
    cross = cross_comparison(Runner(False), Runner(True), tokens)
    assert not cross["logits_equal"] and cross["first_differing_sequence"] == 1
    assert cross["first_difference"]["op"] == "mlp" and cross["gradient_max_abs_diff"] == 1.0
    assert cross_verdict(cross) == ("torch against JAX, both modes on: logits differ (first in sequence 1 at `mlp`: "
                                    "2 of 2 elements, by up to 1); input gradients differ, by up to 1.")
    same = cross_comparison(Runner(False), Runner(False), tokens)
    assert same["logits_equal"] and same["first_difference"] is None and same["gradient_equal"]
    assert cross_verdict(same) == "torch against JAX, both modes on: the same bits, logits and input gradients."


@pytest.mark.parametrize("arguments", [["--batches", "0"], ["--cost", "x"], ["--frameworks", "numpy"],
                                       ["--layers", "0"], ["--dim", "30", "--heads", "4"]])
def test_the_decoder_proof_refuses_bad_arguments_with_code_2(arguments, capsys):
    from compare.__main__ import main

    assert main(["invariance", *arguments]) == 2 and capsys.readouterr().err


def test_the_decoder_proof_catches_a_batch_variant_port(monkeypatch):
    # a planted torch port that splits K below 8 rows: a sequence of 4 tokens alone (M = 4) and in a batch of two
    # (M = 8) sum in different orders, and the proof fails
    from compare.invariance.decoder import Decoder, run

    monkeypatch.setitem(bik._ports, torch.device(DEVICE).type, ("planted", split_k_below(8)))
    record = run(Decoder(layers=1, length=4), [1, 2], ["torch"], progress=lambda _: None)
    assert not record["passed"] and not record["frameworks"]["torch"]["on"][2]["logits"]
    assert record["frameworks"]["torch"]["on"][2]["first_differing_op"] == "qkv.0"  # the first product names it


def test_the_op_probe_names_a_batch_variant_kernel(monkeypatch):
    # the probe's verdicts can fail: a planted port that splits K below 16 rows makes the mode's matmul variant (a
    # sequence of 8 tokens alone: 8 rows; in a batch of two: 16), while the row kernels stay invariant
    pytest.importorskip("jax")
    from compare.invariance.ops import CPU_SIZES, probe, table

    monkeypatch.setitem(bik._ports, torch.device(DEVICE).type, ("planted", split_k_below(16)))
    ops = probe(["torch"], DEVICE == "cuda", [1, 2], progress=lambda _: None, sizes=CPU_SIZES)
    verdicts = ops["verdicts"]["torch"]
    assert verdicts["matmul"]["on"] == "variant at B=2" and verdicts["softmax"]["on"] == "invariant"
    assert any("matmul" in line and "variant" in line for line in table(ops))


@pytest.mark.skipif(DEVICE == "cuda", reason="on a GPU the other tests compile and run the kernel")
def test_the_pallas_row_kernel_lowers_for_cuda():
    # interpret mode skips the lowering to Triton IR: lower it for CUDA here (no GPU needed), a row longer than a chunk
    jax = pytest.importorskip("jax")
    import functools

    from pallas_kernels.row_reductions import _row_sum

    rows = jax.ShapeDtypeStruct((6, 3000), jax.numpy.bfloat16)
    lowered = lower_for_hopper(jax.jit(functools.partial(_row_sum, interpret=False)), rows)
    assert triton_kernels_in(lowered) == ["batch_invariant_row_sum"]
