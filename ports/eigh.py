"""Batched symmetric eigendecomposition (GPU MODE's eigh problem), torch.linalg.eigh's conventions.

Input: A [batch, n, n] float32, symmetric. Output: (Q, L), Q [batch, n, n] float32 with
orthonormal eigenvector columns and L [batch, n] float32 ascending, so that A Q = Q diag(L).

Eigenvectors are not unique (signs, rotations inside clusters), so an answer is judged by
identities computed in float64, with eps the float32 machine epsilon and ||.||_1 the matrix
1-norm, per matrix:
  ||A Q - Q L||_1       <= 200 n eps ||A||_1
  ||Q L Q^T - A||_1     <= 400 n eps ||A||_1
  ||Q^T Q - I||_1       <= 100 n eps
  L ascending within 100 n eps max(|L|_inf, ||A||_1 / n) (the issue's max(|L|, 1), without the
  floor of 1, which would let tiny matrices pass in any order)
  |L - L64|_inf         <= 200 n eps max(||L64||_inf, ||A||_1 / n, 1), L64 the float64 eigenvalues
and everything finite. (The issue's text gives the eigenvalue gate without a factor; GPU MODE's
checker, whose checks the issue asks for, uses 200, and so do we: at a factor of 1 even an
accurate fp32 Jacobi, 20 to 25 eps ||A|| off, fails at n = 16.) The error figures are the residuals
divided by their allowances' scale (n eps times the norm), so a figure below the factor (200, 400,
100, 1) passes.

The case families follow GPU MODE's generators (dense with optional row/column scaling, planted
spectra, PSD, rank-deficient, near-rank-deficient, repeated, clustered, diagonal, banded,
row-scaled, mixed batches, and LAPACK DDRVST-style types), written here from their definitions.
The Triton and Pallas ports run parallel-order Jacobi on chip for n <= 64, and above it
tridiagonalisation, bisection, inverse iteration and back-transformation (the parameters both
ports share: kernel_support/eigh_common.py).
"""
from __future__ import annotations

import functools
import math

import torch

from ports import Check, Implementation, Needs, Workload, check_array, dtype_name, laid_out, like_layout

EPS = torch.finfo(torch.float32).eps
RESIDUAL_FACTOR, RECONSTRUCTION_FACTOR, ORTHOGONALITY_FACTOR, ORDER_FACTOR, EIGENVALUE_FACTOR = 200, 400, 100, 100, 200
SYMMETRY_TOLERANCE = 1e-4  # max |A - A^T| relative to max |A|


def _case(batch, n, cond, seed, family="dense", layout="contiguous"):
    return dict(batch=batch, n=n, cond=cond, seed=seed, family=family, layout=layout)


# Transcribed from GPU MODE's eigh task definition (39 tests, 13 benchmarks).
TEST_CASES = [
    _case(20, 32, 1, 53124), _case(40, 176, 1, 3321), _case(40, 352, 1, 1200), _case(16, 512, 2, 32523),
    _case(4, 1024, 2, 4327), _case(2, 2048, 1, 224466),
    _case(16, 512, 4, 32524, "spectrum"), _case(16, 512, 2, 32525, "psd"), _case(16, 512, 0, 32526, "rankdef"),
    _case(16, 512, 0, 32527, "nearrank"), _case(16, 512, 0, 32528, "repeated"),
    _case(16, 512, 0, 32529, "clustered"), _case(16, 512, 0, 32530, "band"), _case(16, 512, 0, 32531, "rowscale"),
    _case(4, 1024, 4, 4328, "spectrum"), _case(4, 1024, 0, 4329, "rankdef"), _case(4, 1024, 0, 4330, "clustered"),
    _case(2, 2048, 2, 224467, "mixed"), _case(1, 4096, 1, 75343, "diagonal"), _case(16, 512, 2, 32532, "mixed"),
    _case(4, 1024, 2, 4331, "mixed"),
    _case(16, 512, 0, 920001, "lapack_zero"), _case(16, 512, 0, 920002, "lapack_identity"),
    _case(16, 512, 0, 920003, "lapack_diag_even_spectrum"),
    _case(16, 512, 0, 920004, "lapack_diag_geometric_spectrum"),
    _case(16, 512, 0, 920005, "lapack_diag_clustered_spectrum"),
    _case(16, 512, 0, 920006, "lapack_diag_geometric_high_magnitude"),
    _case(16, 512, 0, 920007, "lapack_diag_geometric_low_magnitude"),
    _case(16, 512, 0, 920008, "lapack_dense_even_spectrum"),
    _case(16, 512, 0, 920009, "lapack_dense_geometric_spectrum"),
    _case(4, 1024, 0, 920010, "lapack_dense_clustered_spectrum"),
    _case(4, 1024, 0, 920011, "lapack_dense_even_high_magnitude"),
    _case(4, 1024, 0, 920012, "lapack_dense_even_low_magnitude"),
    _case(4, 1024, 0, 920013, "lapack_random_symmetric"),
    _case(4, 1024, 0, 920014, "lapack_random_symmetric_high_magnitude"),
    _case(4, 1024, 0, 920015, "lapack_random_symmetric_low_magnitude"),
    _case(4, 1024, 0, 920016, "lapack_band_even_spectrum"),
    _case(4, 1024, 0, 920017, "lapack_band_even_high_magnitude"),
    _case(4, 1024, 0, 920018, "lapack_band_even_low_magnitude"),
]
BENCH_CASES = [
    _case(20, 32, 1, 43214), _case(40, 176, 1, 423011), _case(40, 352, 1, 123456), _case(640, 512, 2, 1029),
    _case(60, 1024, 2, 75342), _case(8, 2048, 1, 224466),
    _case(640, 512, 2, 770001, "mixed"), _case(60, 1024, 2, 770002, "mixed"), _case(640, 512, 0, 770003, "rankdef"),
    _case(640, 512, 0, 770004, "clustered"), _case(60, 1024, 0, 770005, "nearrank"),
    _case(640, 512, 0, 780001, "lapack_dense_even_spectrum"),
    _case(60, 1024, 0, 780007, "lapack_dense_geometric_spectrum"),
]
FAMILIES = ("dense", "spectrum", "psd", "rankdef", "nearrank", "repeated", "clustered", "diagonal", "band",
            "rowscale", "mixed")
LAPACK_TYPES = {  # DDRVST's matrix types 1..18: (structure, spectrum, magnitude)
    "lapack_zero": ("zero", None, "normal"), "lapack_identity": ("identity", None, "normal"),
    "lapack_diag_even_spectrum": ("diagonal", "even", "normal"),
    "lapack_diag_geometric_spectrum": ("diagonal", "geometric", "normal"),
    "lapack_diag_clustered_spectrum": ("diagonal", "clustered", "normal"),
    "lapack_diag_geometric_high_magnitude": ("diagonal", "geometric", "high"),
    "lapack_diag_geometric_low_magnitude": ("diagonal", "geometric", "low"),
    "lapack_dense_even_spectrum": ("dense", "even", "normal"),
    "lapack_dense_geometric_spectrum": ("dense", "geometric", "normal"),
    "lapack_dense_clustered_spectrum": ("dense", "clustered", "normal"),
    "lapack_dense_even_high_magnitude": ("dense", "even", "high"),
    "lapack_dense_even_low_magnitude": ("dense", "even", "low"),
    "lapack_random_symmetric": ("uniform", None, "normal"),
    "lapack_random_symmetric_high_magnitude": ("uniform", None, "high"),
    "lapack_random_symmetric_low_magnitude": ("uniform", None, "low"),
    "lapack_band_even_spectrum": ("band", "even", "normal"),
    "lapack_band_even_high_magnitude": ("band", "even", "high"),
    "lapack_band_even_low_magnitude": ("band", "even", "low"),
}
MAGNITUDES = {"normal": 1.0, "high": math.sqrt(torch.finfo(torch.float32).max),
              "low": math.sqrt(torch.finfo(torch.float32).tiny)}
# Every family at sizes the CPU can check in seconds, then the ports' route above n = 64 (the tridiagonalisation),
# A a transposed view (column-major), and A a strided view.
SMOKE_CASES = ([_case(3, 16, 2, 500 + i, family) for i, family in enumerate(FAMILIES)]
               + [_case(2, 24, 0, 600 + i, family) for i, family in enumerate(LAPACK_TYPES)]
               + [_case(1, 65, 2, 650, "dense", layout="transposed"), _case(3, 16, 2, 651, "mixed", layout="strided")])


def case_name(case: dict) -> str:
    layout = "" if case.get("layout", "contiguous") == "contiguous" else f"-{case['layout']}"
    return f"{case['batch']}x{case['n']}-{case['family']}-cond{case['cond']}{layout}"


def _symmetric(a):
    return 0.5 * (a + a.transpose(-1, -2))


def _random_orthogonal(batch, n, gen, device):
    """Haar-distributed orthogonal matrices (QR of a Gaussian, R's diagonal made positive)."""
    q, r = torch.linalg.qr(torch.randn((batch, n, n), device=device, generator=gen))
    return q * torch.where(torch.diagonal(r, dim1=-2, dim2=-1) < 0, -1.0, 1.0).unsqueeze(-2)


def _with_spectrum(values, gen):
    """Q diag(values) Q^T with a random orthogonal Q per matrix."""
    q = _random_orthogonal(values.shape[0], values.shape[1], gen, values.device)
    return _symmetric((q * values.unsqueeze(-2)) @ q.transpose(-1, -2))


def _signed_log_spectrum(batch, n, cond, device):
    """Magnitudes from 10^-cond to 1, alternating in sign."""
    values = torch.logspace(-float(max(cond, 1)), 0.0, n, device=device)
    values[::2] *= -1.0
    return values.expand(batch, n).contiguous()


def _family(a, family, cond, gen):
    """A [batch, n, n] Gaussian draw turned into the family's matrices."""
    batch, n, _ = a.shape
    device = a.device
    decay = lambda power: torch.logspace(0.0, -float(power), n, device=device)  # noqa: E731
    if family == "dense":
        a = _symmetric(a)
        if cond:
            a = decay(cond)[:, None] * a * decay(cond)[None, :]
    elif family == "spectrum":
        a = _with_spectrum(_signed_log_spectrum(batch, n, cond, device), gen)
    elif family == "psd":
        g = a * decay(max(cond, 1))[None, None, :]
        a = g @ g.transpose(-1, -2) / n
    elif family in ("rankdef", "nearrank"):
        rank = max(1, 3 * n // 4)
        values = torch.zeros((batch, n), device=device)
        values[:, n - rank:] = torch.logspace(-float(max(cond, 1)), 0.0, rank, device=device)
        if family == "nearrank":
            values[:, :n - rank] = 1e-6 * torch.logspace(-2.0, 0.0, n - rank, device=device)
        a = _with_spectrum(values, gen)
    elif family == "repeated":
        groups = max(1, min(16, n // 8))
        values = torch.linspace(-1.0, 1.0, groups, device=device).repeat_interleave(-(-n // groups))[:n]
        a = _with_spectrum(values.expand(batch, n).contiguous(), gen)
    elif family == "clustered":
        jitter = torch.linspace(-1.0, 1.0, n, device=device)
        values = torch.where(jitter > 0, 1.0, -1.0) + 1e-5 * jitter  # two clusters at -1 and 1
        values[n // 3: 2 * n // 3] = 1.0 + 1e-6 * jitter[n // 3: 2 * n // 3]
        a = _with_spectrum(values.sort().values.expand(batch, n).contiguous(), gen)
    elif family == "diagonal":
        a = torch.diag_embed(_signed_log_spectrum(batch, n, cond, device))
    elif family == "band":
        width = max(2, min(32, n // 32))
        index = torch.arange(n, device=device)
        a = _symmetric(a) * ((index[:, None] - index[None, :]).abs() <= width)
        a = a + torch.diag(torch.linspace(-1.0, 1.0, n, device=device))
    elif family == "rowscale":
        scale = decay(max(cond, 4))
        a = scale[:, None] * _symmetric(a) * scale[None, :]
    else:
        raise ValueError(f"unknown eigh case family {family!r}; valid: {', '.join(FAMILIES + tuple(LAPACK_TYPES))}")
    return _symmetric(a)


def _mixed(a, cond, gen):
    """Each matrix its own family, drawn with weights dense 6, psd 2, each other family 1; at least
    one dense and one other when batch >= 2."""
    batch = a.shape[0]
    families = FAMILIES[:-1]
    weights = torch.tensor([6.0] + [2.0 if f == "psd" else 1.0 for f in families[1:]], device=a.device)
    labels = torch.multinomial(weights, batch, replacement=True, generator=gen)
    if batch >= 2 and bool((labels == 0).all()):
        labels[0] = 1 + int(torch.randint(0, len(families) - 1, (1,), device=a.device, generator=gen))
    if batch >= 2 and not bool((labels == 0).any()):
        labels[0] = 0
    out = torch.empty_like(a)
    for index, family in enumerate(families):
        chosen = labels == index
        if bool(chosen.any()):
            out[chosen] = _family(a[chosen], family, cond, gen)
    return out


def _lapack(batch, n, kind, gen, device):
    structure, spectrum, magnitude = LAPACK_TYPES[kind]
    scale = MAGNITUDES[magnitude]
    if structure == "zero":
        return torch.zeros((batch, n, n), device=device)
    if structure == "identity":
        return torch.eye(n, device=device).expand(batch, n, n) * scale
    if structure == "uniform":
        return _symmetric(torch.rand((batch, n, n), device=device, generator=gen) * 2 - 1) * scale
    ulp = 2 * EPS
    if spectrum == "even":
        values = torch.linspace(1.0, ulp, n, device=device)
    elif spectrum == "geometric":
        values = torch.logspace(0.0, math.log10(ulp), n, device=device)
    else:  # one eigenvalue at 1, the rest clustered at ulp
        values = torch.full((n,), ulp, device=device)
        values[0] = 1.0
    signs = torch.randint(0, 2, (batch, n), device=device, generator=gen) * 2.0 - 1.0
    values = values * signs * scale
    if structure == "diagonal":
        return torch.diag_embed(values)
    a = _with_spectrum(values, gen)
    if structure == "band":  # a random bandwidth per matrix cuts the planted matrix to a band
        width = torch.randint(0, n, (batch,), device=device, generator=gen)
        index = torch.arange(n, device=device)
        a = a * ((index[None, :, None] - index[None, None, :]).abs() <= width[:, None, None])
    return a


def make_inputs(case: dict, seed: int, device="cpu"):
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    batch, n, family = case["batch"], case["n"], case["family"]
    if family in LAPACK_TYPES:
        a = _lapack(batch, n, family, gen, device)
    else:
        a = torch.randn((batch, n, n), device=device, generator=gen)
        a = _mixed(a, case["cond"], gen) if family == "mixed" else _family(a, family, case["cond"], gen)
    return laid_out(a.contiguous(), case.get("layout", "contiguous"))


def check_shape(a, framework: str | None = None) -> None:
    """Raise a ValueError or TypeError naming the problem when `a` (a torch or JAX array) is not a batch of square
    float32 matrices."""
    check_array("A", a, framework)
    if len(a.shape) != 3:
        raise ValueError(f"A must have shape [batch, n, n], got {tuple(a.shape)}")
    if a.shape[1] != a.shape[2]:
        raise ValueError(f"A must be square, got {a.shape[1]} x {a.shape[2]}")
    if dtype_name(a) != "float32":
        raise TypeError(f"A must be float32, got {dtype_name(a)}")


def check_values(finite: bool, largest: float, asymmetry: float) -> None:
    """Raise a ValueError naming the problem unless A's entries are all finite and max |A - A^T| (asymmetry) is
    within SYMMETRY_TOLERANCE of max |A| (largest). The ports compute the three in the kernels that read A first
    (the on-chip Jacobi's or the symmetrize kernel) and check them after their last; the baselines in `validate`."""
    if not finite:
        raise ValueError("A contains NaN or Inf")
    if asymmetry > SYMMETRY_TOLERANCE * max(largest, 1e-300):
        raise ValueError(f"A is not symmetric: max |A - A^T| = {asymmetry:.3g}")


def validate(a, framework: str | None = None) -> None:
    """`check_shape` and `check_values` by torch reductions, before the call: the baselines' checks."""
    check_shape(a, framework)
    a = a if isinstance(a, torch.Tensor) else torch.from_dlpack(a)  # a JAX array, viewed without a copy
    if not a.numel():
        return
    # two reductions and one synchronisation (aminmax propagates NaN; Inf leaves an infinite bound)
    low, high, asymmetry_low, asymmetry_high = torch.stack(
        [*torch.aminmax(a), *torch.aminmax(a - a.transpose(-1, -2))]).tolist()
    check_values(all(math.isfinite(bound) for bound in (low, high)), max(-low, high),
                 max(-asymmetry_low, asymmetry_high))


def reference(a):
    """The float64 eigenvalues of A's symmetric part (A is symmetric up to roundoff); the
    eigenvectors are judged by the identities, not against a reference."""
    return torch.linalg.eigvalsh(_symmetric(a.to(torch.float64)))


def _norm1(m):
    return torch.linalg.matrix_norm(m, ord=1, dim=(-2, -1))


def check(a, output, eigenvalues64) -> Check:
    """The identities of the module docstring, per matrix, in float64."""
    return _verdict(a, output, eigenvalues64)


def bounded_check(a, output) -> Check | None:
    """`check`'s verdict without the float64 eigenvalues, where the output's own figures settle it (a hunt's check:
    the float64 eigendecomposition costs far more than the ports at the bench sizes); None where they do not.

    The eigenvalue gate is judged by an upper bound of |L - L64|_inf from Q's own figures, in float64. With
    G = Q^T Q, delta = ||G - I||_2 < 1 and B = Q^T A Q: Ostrowski's theorem gives lambda_i(B) = theta_i lambda_i(A)
    with theta_i in [1 - delta, 1 + delta]; B - diag(L) = Q^T (A Q - Q L) + (G - I) L, so by Weyl's theorem
    |lambda_i(B) - L_i| <= ||B - diag(L)||_2 for L ascending; hence |lambda_i(A) - L_i| <= (delta |L|_inf +
    ||B - diag(L)||_2) / (1 - delta), each 2-norm bounded by a 1-norm of a symmetric matrix, plus how far L is from
    ascending and an allowance for float64's rounding. The bound sits far above the true error and far inside the
    gate for sound outputs (results/h200/experiments/eigh-reliability/bounded-check-tightness.txt); an output whose
    bound exceeds the gate is left to `check`. The errors name the bound `eigenvalues_bound_scaled`."""
    return _verdict(a, output, None)


def _verdict(a, output, eigenvalues64) -> Check | None:
    """`check` (eigenvalues64 given) or `bounded_check` (None)."""
    if not isinstance(output, (tuple, list)) or len(output) != 2:
        return Check(False, reason="output must be a tuple (Q, L)")
    q, values = output
    batch, n, _ = a.shape
    for name, tensor, shape in (("Q", q, (batch, n, n)), ("L", values, (batch, n))):
        if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != shape or tensor.dtype != torch.float32:
            got = (tuple(tensor.shape), tensor.dtype) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            return Check(False, reason=f"{name} must be float32 of shape {shape}, got {got}")
        if not bool(torch.isfinite(tensor).all()):
            return Check(False, reason=f"{name} contains NaN or Inf")
    a64 = _symmetric(a.to(torch.float64))  # the matrix whose eigenvalues `reference` gives
    q64, l64 = q.to(device=a.device, dtype=torch.float64), values.to(device=a.device, dtype=torch.float64)
    unit = n * EPS
    scale_a = _norm1(a64).clamp_min(1e-300)
    eye = torch.eye(n, device=a.device, dtype=torch.float64)
    order_scale = torch.maximum(l64.abs().amax(-1), scale_a / n).clamp_min(1e-300)
    residual = a64 @ q64 - q64 * l64.unsqueeze(-2)
    gram = q64.transpose(-1, -2) @ q64 - eye
    figures = {
        "residual": (_norm1(residual) / (unit * scale_a), RESIDUAL_FACTOR),
        "reconstruction": (_norm1((q64 * l64.unsqueeze(-2)) @ q64.transpose(-1, -2) - a64) / (unit * scale_a),
                           RECONSTRUCTION_FACTOR),
        "orthogonality": (_norm1(gram) / unit, ORTHOGONALITY_FACTOR),
    }
    if eigenvalues64 is not None:
        eigenvalue_scale = torch.maximum(eigenvalues64.abs().amax(-1), scale_a / n).clamp_min(1.0)
        figures["eigenvalues"] = ((l64 - eigenvalues64).abs().amax(-1) / (unit * eigenvalue_scale), EIGENVALUE_FACTOR)
    else:
        figures["eigenvalues_bound"] = (_eigenvalue_bound(a64, q64, l64, residual, gram, scale_a, unit),
                                        EIGENVALUE_FACTOR)
    figures["order"] = ((l64[:, :-1] - l64[:, 1:]).clamp_min(0).amax(-1) / (unit * order_scale) if n > 1
                        else torch.zeros(batch, dtype=torch.float64, device=a.device), ORDER_FACTOR)
    errors = {f"{name}_scaled": float(value.max()) for name, (value, _) in figures.items()}
    for name, (value, factor) in figures.items():
        worst = int(value.argmax()) if bool(torch.isfinite(value).all()) else None
        if name == "eigenvalues_bound" and (worst is None or float(value[worst]) > factor):
            return None  # the bound does not settle it: the float64 eigenvalues do (`check`)
        if worst is None:
            return Check(False, errors, f"{name} figure is not finite")
        if float(value[worst]) > factor:
            figure = float(value[worst])
            return Check(False, errors, f"{name}: matrix {worst} has scaled figure {figure:.3g} > {factor}")
    return Check(True, errors)


def _eigenvalue_bound(a64, q64, l64, residual, gram, scale_a, unit):
    """An upper bound of |L - L64|_inf / (n eps max(|L64|_inf, ||A||_1 / n, 1)) per matrix (`bounded_check`): inf
    where Q is too far from orthogonal for it."""
    n = a64.shape[-1]
    ascending = l64.sort(-1).values
    delta = _norm1(gram)  # ||G - I||_2 <= ||G - I||_1 (G symmetric)
    difference = q64.transpose(-1, -2) @ residual + gram * ascending.unsqueeze(-2)  # B - diag(L), L ascending
    largest = ascending.abs().amax(-1)
    rounding = n * n * torch.finfo(torch.float64).eps * (scale_a + largest)  # float64's, in the products above
    error = ((delta * largest + _norm1(0.5 * (difference + difference.transpose(-1, -2)))) / (1 - delta)
             + (l64 - ascending).abs().amax(-1) + rounding)
    scale = torch.maximum(torch.maximum(largest - error, scale_a / n), torch.ones_like(largest))  # |L64|_inf at least
    return torch.where(delta < 1, error / (unit * scale), torch.full_like(error, torch.inf))


def cost(case: dict) -> tuple[float, float]:
    """About 9 n^3 flops per matrix (symmetric QR with vectors, Golub & Van Loan); A read, Q and L written."""
    batch, n = case["batch"], case["n"]
    return 9.0 * batch * n**3, 4.0 * batch * (2 * n * n + n)


def vary(a, eigenvalues64, gen):
    """s P A P^T, P a random permutation and s = 2 or 1/2 (exact in floating point), has the
    eigenvalues s L: a new input with a known answer (the zero matrix stays itself)."""
    order = torch.randperm(a.shape[-1], generator=gen, device="cpu").to(a.device)
    factor = 2.0 if torch.randint(0, 2, (1,), generator=gen).item() else 0.5
    return like_layout(a[:, order[:, None], order[None, :]] * factor, a), eigenvalues64 * factor


def eigh_torch(a):
    """torch.linalg.eigh (cuSOLVER on the GPU)."""
    validate(a, "torch")
    values, vectors = torch.linalg.eigh(a)
    return vectors, values


def eigh_cupy(a):
    """cupy.linalg.eigh on the batch (cuSOLVER's syevjBatched), on torch's current stream, the arrays shared through
    DLPack."""
    validate(a, "torch")
    import cupy

    stream = torch.cuda.current_stream(a.device).cuda_stream
    with cupy.cuda.Device(a.device.index), cupy.cuda.ExternalStream(stream, a.device.index):  # a's GPU, not CuPy's
        values, vectors = cupy.linalg.eigh(cupy.from_dlpack(a))
    return torch.from_dlpack(vectors), torch.from_dlpack(values)


@functools.cache
def _jitted_eigh():
    import jax
    import jax.numpy as jnp

    def decompose(matrix):
        values, vectors = jnp.linalg.eigh(matrix)
        return vectors, values

    return jax.jit(decompose)


def eigh_jax(a):
    """jnp.linalg.eigh under jax.jit."""
    validate(a, "jax")
    return _jitted_eigh()(a)


WORKLOAD = Workload(
    name="eigh",
    cases={"smoke": SMOKE_CASES, "test": TEST_CASES, "bench": BENCH_CASES},
    make_inputs=make_inputs,
    reference=reference,
    check=check,
    cost=cost,
    case_name=case_name,
    implementations=(
        Implementation("triton", "torch", "triton", "Triton port: on-chip Jacobi (n <= 64), tridiagonalisation above",
                       "triton_kernels.eigh:eigh"),
        Implementation("pallas", "jax", "pallas-triton",
                       "Pallas port: on-chip Jacobi (n <= 64), tridiagonalisation above", "pallas_kernels.eigh:eigh"),
        Implementation("torch", "torch", "library", "torch.linalg.eigh (cuSOLVER)", "ports.eigh:eigh_torch"),
        Implementation("jax_xla", "jax", "library", "jnp.linalg.eigh under jax.jit", "ports.eigh:eigh_jax"),
        Implementation("cupy", "torch", "library", "cupy.linalg.eigh (cuSOLVER syevjBatched)", "ports.eigh:eigh_cupy",
                       Needs(gpu=True, modules=("cupy",))),
        Implementation("xsyev_batched", "torch", "library", "cusolverDnXsyevBatched through ctypes",
                       "ports.cusolver_eigh:eigh_xsyev_batched", Needs(gpu=True)),
    ),
    baseline="jax_xla",
    vary=vary,
    comparable=lambda output: output[1],
    bounded_check=bounded_check,
    argument_names=("A",),
)
