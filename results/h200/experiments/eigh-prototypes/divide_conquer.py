"""CPU prototype (NumPy), not in the ports: the tridiagonal eigenproblem by divide and conquer, shaped for the GPU,
as the replacement of bisection, inverse iteration, the clusters' Gram-Schmidt and the repair (issue 55).

    python results/h200/experiments/eigh-prototypes/divide_conquer.py [--n 512] [--matrices 4] [--leaf 32]
        [--families psd,clustered] [--first-seed 7000] [--special] [--corpus FILE.pt] [--steps 64]

The shape a GPU port would have:
- Leaves of `leaf` rows solved on chip (here: LAPACK's float32 solver; in the ports, the on-chip Jacobi).
- Each merge (Cuppen's tear: T = diag(T1', T2') + rho v v^T, rho = |beta| > 0) sorts D, deflates (tiny z; close
  pairs of D by a Givens rotation of two columns, in one sequential pass over the sorted D), solves the secular
  equation for each root in float64 by bisection on the offset from its nearer pole (a fixed count of steps, no
  convergence test: no divergence, no data-dependent loop), recomputes z from the roots (Gu and Eisenstat, which
  makes the vectors orthogonal to working precision without any Gram-Schmidt), and forms the vectors in float64,
  rounded to float32.
- The only O(n^3) work: the merge's product Q = diag(Q1, Q2) U, float32 inputs and float32 accumulation here (the
  GPU's tf32x3 products give float32's accuracy).
The secular equation in float64 is the departure from LAPACK (dlaed4 iterates in the working precision with care at
every step): the H200's float64 rate (about 34 TFLOP/s without tensor cores) makes O(k^2) float64 work per merge
cheap, and bisection in float64 cannot fail.

It reports, per family, the gates of ports/eigh.py applied to T itself (T Q = Q L, Q^T Q = I, the eigenvalues
against float64's), as multiples of n eps ||T||_1 (orthogonality: of n eps), beside the gates' factors (200, 100,
200); T comes from a float64 Householder tridiagonalisation of the family's A, rounded to float32.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

EPS32 = float(np.finfo(np.float32).eps)
BISECTION_STEPS = 64  # halves a float64 interval to its last bits: no convergence test
SOLVER = "bisection"  # or "fixed-weight" (`secular_roots_fixed_weight`, FIXED_WEIGHT_STEPS steps)
FIXED_WEIGHT_STEPS = 10


def tridiagonal(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(d, e) of a float64 Householder tridiagonalisation of symmetric a."""
    a = a.astype(np.float64).copy()
    n = a.shape[0]
    for k in range(n - 2):
        x = a[k + 1:, k]
        alpha = -math.copysign(np.linalg.norm(x), x[0]) if x[0] else -np.linalg.norm(x)
        v = x.copy()
        v[0] -= alpha
        norm = np.linalg.norm(v)
        if norm == 0:
            continue
        v /= norm
        block = a[k + 1:, k + 1:]
        p = block @ v
        w = 2 * (p - (v @ p) * v)
        block -= np.outer(v, w) + np.outer(w, v)
        a[k + 1:, k] = a[k, k + 1:] = 0
        a[k + 1, k] = a[k, k + 1] = alpha
    return np.diag(a).copy(), np.diag(a, 1).copy()


def secular_roots(d: np.ndarray, z: np.ndarray, rho: float):
    """Roots of 1 + rho sum z_j^2 / (d_j - x) for strictly increasing d (float64), each as (origin index, offset):
    root i lies in (d_i, d_{i+1}) (the last in (d_k, d_k + rho |z|^2)); its origin is the nearer pole."""
    k = len(d)
    index = np.arange(k)
    half_gap = np.append((d[1:] - d[:-1]) / 2, np.inf)
    middle_offset = np.where(index < k - 1, half_gap, rho * (z @ z) / 2)  # the last: not a pole
    at_middle = 1 + rho * np.sum(z[None, :] ** 2 / ((d[None, :] - d[:, None]) - middle_offset[:, None]), axis=1)
    # f rises between poles: f(middle) > 0 puts root i below the middle, nearer d_i; the last root is above d_k
    below = (at_middle > 0) | (index == k - 1)
    origin = np.where(below, index, index + 1)
    low = np.where(below, 0.0, -half_gap)
    high = np.where(below, np.where(index < k - 1, half_gap, rho * (z @ z)), 0.0)
    shifted = d[None, :] - d[origin][:, None]  # d_j - d_origin, exact for float32 inputs held in float64
    for _ in range(BISECTION_STEPS):
        tau = (low + high) / 2
        value = 1 + rho * np.sum(z[None, :] ** 2 / (shifted - tau[:, None]), axis=1)
        low, high = np.where(value < 0, tau, low), np.where(value < 0, high, tau)
    return origin, (low + high) / 2, shifted


def secular_roots_fixed_weight(d: np.ndarray, z: np.ndarray, rho: float):
    """`secular_roots` by FIXED_WEIGHT_STEPS steps of LAPACK dlaed4's fixed-weight iteration, in float64 (the
    candidate for fewer passes over the poles than bisection's): the first guess from the interval's two poles with
    the other terms frozen at its middle; then each step matches f's value and slope by a model that keeps the
    origin pole's own weight and solves its quadratic, a Newton step where that points the wrong way, half the
    way to the bracket's end where it leaves the bracket; the bracket shrinks by f's sign, and a root stops moving
    once |f| is within its rounding. The last root is modelled with the last two poles, as dlaed4 does."""
    k = len(d)
    if k == 1:
        return np.zeros(1, int), np.array([rho * z[0] ** 2]), np.zeros((1, 1))
    iterations = FIXED_WEIGHT_STEPS
    EPS = np.finfo(np.float64).eps
    i = np.arange(k)
    z2 = z * z
    rhoinv = 1 / rho
    last = i == k - 1
    # the interval's poles: interior root i in (d_i, d_{i+1}); the last in (d_{k-1}, d_{k-1} + rho |z|^2), modelled
    # with the pair (k-2, k-1) as LAPACK does
    lo_idx = np.where(last, k - 2, i)
    hi_idx = np.where(last, k - 1, i + 1)
    gap = d[hi_idx] - d[lo_idx]
    # the middle and f there
    mid = np.where(last, d[k - 1] + rho * z2.sum() / 2, (d[lo_idx] + d[hi_idx]) / 2)
    with np.errstate(all="ignore"):
        at_mid_terms = z2[None, :] / (d[None, :] - mid[:, None])
    f_mid = rhoinv + at_mid_terms.sum(axis=1)
    pair = (i[None, :] == lo_idx[:, None]) | (i[None, :] == hi_idx[:, None])
    c_frozen = rhoinv + np.where(pair, 0.0, at_mid_terms).sum(axis=1)
    # origin: the nearer pole (f(mid) >= 0: below the middle, nearer d_lo); the last root: d_{k-1}
    orgati = (f_mid >= 0) & ~last
    origin = np.where(last, k - 1, np.where(orgati, lo_idx, hi_idx))
    shifted = d[None, :] - d[origin][:, None]  # d_j - d_origin
    lower = np.where(last, 0.0, np.where(orgati, 0.0, -gap))  # the bracket, as offsets from the origin
    upper = np.where(last, rho * z2.sum(), np.where(orgati, gap / 2, 0.0))
    lower = np.where(~orgati & ~last, -gap / 2, lower)
    # first guess: the two poles with their own weights, the rest frozen at the middle (dlaed4)
    with np.errstate(all="ignore"):
        a_o = c_frozen * gap + z2[lo_idx] + z2[hi_idx]
        b_o = z2[lo_idx] * gap
        tau_o = np.where(a_o > 0, 2 * b_o / (a_o + np.sqrt(np.abs(a_o * a_o - 4 * b_o * c_frozen))),
                         (a_o - np.sqrt(np.abs(a_o * a_o - 4 * b_o * c_frozen))) / (2 * c_frozen))
        a_u = -c_frozen * gap + z2[lo_idx] + z2[hi_idx]
        b_u = -z2[hi_idx] * gap
        tau_u = np.where(a_u > 0, 2 * b_u / (a_u + np.sqrt(np.abs(a_u * a_u - 4 * b_u * c_frozen))),
                         (a_u - np.sqrt(np.abs(a_u * a_u - 4 * b_u * c_frozen))) / (2 * c_frozen))
        # the last root: relative to d_{k-1}, the pair (k-2, k-1) frozen rest at its middle
        a_l = -c_frozen * gap + z2[lo_idx] + z2[hi_idx]
        b_l = -z2[hi_idx] * gap
        tau_l = np.where(a_l <= 0, (a_l - np.sqrt(np.abs(a_l * a_l - 4 * b_l * c_frozen))) / (2 * c_frozen),
                         2 * b_l / (a_l + np.sqrt(np.abs(a_l * a_l - 4 * b_l * c_frozen))))
    tau = np.where(last, tau_l, np.where(orgati, tau_o, tau_u))
    tau = np.where(np.isfinite(tau) & (tau > lower) & (tau < upper), tau, (lower + upper) / 2)
    done = np.zeros(k, bool)
    below_pair = i[None, :] <= lo_idx[:, None]  # psi: poles j <= lo; phi: j > lo (for the last: phi = pole k-1)
    for _ in range(iterations):
        delta = shifted - tau[:, None]  # d_j - lambda
        with np.errstate(all="ignore"):
            inv = 1 / delta
        terms = z2[None, :] * inv
        psi = np.where(below_pair, terms, 0).sum(1)
        phi = np.where(below_pair, 0, terms).sum(1)
        dpsi = np.where(below_pair, terms * inv, 0).sum(1)
        dphi = np.where(below_pair, 0, terms * inv).sum(1)
        w = rhoinv + psi + phi
        dw = dpsi + dphi
        erretm = 8 * (np.abs(terms).sum(1) + rhoinv) + np.abs(tau) * dw  # w's rounding, generously
        done = done | (np.abs(w) <= EPS * erretm)
        lower = np.where(w < 0, np.maximum(lower, tau), lower)
        upper = np.where(w < 0, upper, np.minimum(upper, tau))
        d_lo = delta[i, lo_idx]
        d_hi = delta[i, hi_idx]
        z_lo, z_hi = z2[lo_idx], z2[hi_idx]
        with np.errstate(all="ignore"):
            c_int = np.where(orgati, w - d_hi * dw - (d_lo - d_hi) * z_lo / d_lo ** 2,
                             w - d_lo * dw - (d_hi - d_lo) * z_hi / d_hi ** 2)
            c_last = w - d_lo * dpsi - d_hi * dphi
            c = np.where(last, c_last, c_int)
            a = (d_lo + d_hi) * w - d_lo * d_hi * dw
            b = d_lo * d_hi * w
            root = np.sqrt(np.abs(a * a - 4 * b * c))
            eta_int = np.where(c == 0, b / a, np.where(a <= 0, (a - root) / (2 * c), 2 * b / (a + root)))
            c_abs = np.abs(c)
            root_l = np.sqrt(np.abs(a * a - 4 * b * c_abs))
            eta_last = np.where(a >= 0, (a + root_l) / (2 * c_abs), 2 * b / (a - root_l))
            eta = np.where(last, eta_last, eta_int)
            eta = np.where(w * eta >= 0, -w / dw, eta)  # the model's step the wrong way: Newton's
        new = tau + eta
        outside = ~np.isfinite(new) | (new >= upper) | (new <= lower)
        new = np.where(outside, np.where(w < 0, (tau + upper) / 2, (tau + lower) / 2), new)
        tau = np.where(done, tau, new)
    return origin, tau, shifted


def rank_one_update(d: np.ndarray, z: np.ndarray, rho: float):
    """Eigenvalues (float64) and vectors (float64, k x k) of diag(d) + rho z z^T, d increasing, z without zeros."""
    origin, tau, shifted = (secular_roots_fixed_weight if SOLVER == "fixed-weight" else secular_roots)(d, z, rho)
    values = d[origin] + tau
    # differences lambda_i - d_j = tau_i - (d_j - d_origin(i)), never formed from two rounded eigenvalues
    gaps = tau[:, None] - shifted  # [i, j]: lambda_i - d_j
    # Gu and Eisenstat: the z for which the computed roots are exact, so that the vectors are orthogonal
    # zhat_j^2 = (lambda_j - d_j) / rho * prod_{i != j} (lambda_i - d_j) / (d_i - d_j): ratios near 1 by the
    # interlacing, so the product neither overflows nor underflows
    apart = d[:, None] - d[None, :]  # [i, j]: d_i - d_j
    np.fill_diagonal(apart, rho)
    zhat2 = np.prod(gaps / apart, axis=0)
    zhat = np.sign(z) * np.sqrt(np.abs(zhat2))
    vectors = zhat[:, None] / -gaps.T  # [j, i]: zhat_j / (d_j - lambda_i)
    return values, vectors / np.linalg.norm(vectors, axis=0)


def merge(q1, l1, q2, l2, beta: float):
    """Eigenpairs of the torn tridiagonal's merge: diag(Q1 L1 Q1^T, Q2 L2 Q2^T) + |beta| v v^T."""
    n1, n2 = len(l1), len(l2)
    rho = abs(beta)
    sign = 1.0 if beta >= 0 else -1.0
    z = np.concatenate([q1[-1, :], sign * q2[0, :]]).astype(np.float64)
    d = np.concatenate([l1, l2]).astype(np.float64)
    q = np.zeros((n1 + n2, n1 + n2), np.float32)
    q[:n1, :n1], q[n1:, n1:] = q1, q2
    order = np.argsort(d, kind="stable")
    d, z, q = d[order], z[order], q[:, order]
    norm2 = z @ z
    rho, z = rho * norm2, z / math.sqrt(norm2)
    tol = 8 * EPS32 * max(np.max(np.abs(d)), rho)
    kept = np.abs(rho * z) > tol
    z[~kept] = 0
    last = None  # the last kept index: close pairs rotated together, one sequential pass
    for j in range(len(d)):
        if not kept[j]:
            continue
        if last is not None:
            r = math.hypot(z[last], z[j])
            c, s = z[j] / r, -z[last] / r
            if abs((d[j] - d[last]) * c * s) <= tol:
                z[last], z[j] = 0.0, r
                q_last, q_j = q[:, last].copy(), q[:, j].copy()  # Q G^T, G z = (0, r) on the pair
                q[:, last], q[:, j] = c * q_last + s * q_j, c * q_j - s * q_last
                d_last, d_j = d[last], d[j]
                d[last], d[j] = d_last * c * c + d_j * s * s, d_last * s * s + d_j * c * c
                kept[last] = False
        last = j
    live = np.flatnonzero(kept)
    values = d.copy()
    if len(live):
        inner = np.argsort(d[live], kind="stable")
        live = live[inner]
        live_values, u = rank_one_update(d[live], z[live], rho)
        values[live] = live_values
        q[:, live] = q[:, live] @ u.astype(np.float32)  # the merge's one O(n^3) product, float32
    order = np.argsort(values, kind="stable")
    return q[:, order], values[order].astype(np.float32)


def divide_and_conquer(d: np.ndarray, e: np.ndarray, leaf: int):
    """(Q, L) of the float32 tridiagonal (d, e), recursively (a GPU port would go level by level)."""
    n = len(d)
    if n <= leaf:
        t = np.diag(d) + np.diag(e, 1) + np.diag(e, -1)
        values, vectors = np.linalg.eigh(t.astype(np.float32))
        return vectors.astype(np.float32), values.astype(np.float32)
    half = n // 2
    beta = float(e[half - 1])
    d1, d2 = d[:half].copy(), d[half:].copy()
    d1[-1] = np.float32(d1[-1] - np.float32(abs(beta)))
    d2[0] = np.float32(d2[0] - np.float32(abs(beta)))
    q1, l1 = divide_and_conquer(d1, e[:half - 1], leaf)
    q2, l2 = divide_and_conquer(d2, e[half:], leaf)
    return merge(q1, l1, q2, l2, beta)


def gates(d, e, q, values):
    """The eigh gates' figures on T: residual / (n eps ||T||_1), orthogonality / (n eps), eigenvalues / (n eps
    max(|L64|, ||T||_1 / n, 1))."""
    n = len(d)
    t = (np.diag(d) + np.diag(e, 1) + np.diag(e, -1)).astype(np.float64)
    q64, l64 = q.astype(np.float64), values.astype(np.float64)
    norm = np.abs(t).sum(axis=0).max()
    unit = n * EPS32
    exact = np.linalg.eigvalsh(t)
    residual = np.abs(t @ q64 - q64 * l64).sum(axis=0).max() / (unit * max(norm, 1e-300))
    orthogonality = np.abs(q64.T @ q64 - np.eye(n)).sum(axis=0).max() / unit
    eigenvalues = np.abs(l64 - exact).max() / (unit * max(np.abs(exact).max(), norm / n, 1))
    return residual, orthogonality, eigenvalues


def special_tridiagonals(n: int = 512) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Tridiagonals known to be hard for tridiagonal solvers: glued Wilkinson matrices (pairs of eigenvalues
    that agree to many digits), the 1-2-1 Toeplitz and Clement matrices, a graded one, equal diagonals."""
    m = 10  # Wilkinson's W21: d = |i - 10|, e = 1
    d, e = np.abs(np.arange(2 * m + 1) - m).astype(np.float32), np.ones(2 * m, np.float32)
    copies = n // (2 * m + 1)
    glued = {f"glued Wilkinson {copies} x W21, glue {glue:g}": (
        np.tile(d, copies), np.concatenate([np.append(e, np.float32(glue)) for _ in range(copies)])[:-1])
        for glue in (1e-5, 1e-12)}
    k = np.arange(1, n)
    graded = 10.0 ** (-np.arange(n) / 50)
    return {**glued, "1-2-1 Toeplitz": (np.full(n, 2, np.float32), np.ones(n - 1, np.float32)),
            "Clement": (np.zeros(n, np.float32), np.sqrt(k * (n - k)).astype(np.float32)),
            "graded 10^(-i/50)": (graded.astype(np.float32), (graded[:-1] * np.random.default_rng(1).random(
                n - 1)).astype(np.float32)),
            "equal diagonal, e = 1e-7": (np.ones(n, np.float32), np.full(n - 1, 1e-7, np.float32))}


def main(argv=None) -> int:
    global BISECTION_STEPS, SOLVER, FIXED_WEIGHT_STEPS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--matrices", type=int, default=4, help="matrices a family")
    parser.add_argument("--leaf", type=int, default=32)
    parser.add_argument("--families", help="comma-separated (default: every family of the test and bench cases)")
    parser.add_argument("--first-seed", type=int, default=7000)
    parser.add_argument("--special", action="store_true", help="also the hard tridiagonals (glued Wilkinson, ...)")
    parser.add_argument("--corpus", help="also the T's of a saved corpus (a list of dicts with d, e, figures)")
    parser.add_argument("--steps", type=int, default=BISECTION_STEPS, help="bisection steps a root (default 64)")
    parser.add_argument("--solver", choices=("bisection", "fixed-weight"), default=SOLVER,
                        help="the secular equation's roots by bisection (--steps) or dlaed4's fixed-weight iteration "
                             "(--fixed-weight-steps)")
    parser.add_argument("--fixed-weight-steps", type=int, default=FIXED_WEIGHT_STEPS)
    args = parser.parse_args(argv)
    BISECTION_STEPS, SOLVER, FIXED_WEIGHT_STEPS = args.steps, args.solver, args.fixed_weight_steps
    sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
    from ports import eigh as spec

    families = args.families.split(",") if args.families else sorted(
        {case["family"] for case in spec.TEST_CASES + spec.BENCH_CASES})

    steps = (f"{args.steps} bisection steps" if SOLVER == "bisection"
             else f"{args.fixed_weight_steps} fixed-weight steps")
    print(f"divide and conquer, n={args.n}, leaf={args.leaf}, {steps}, {args.matrices} matrices "
          "a family; figures: worst "
          "over the family, as multiples of the gates' units (gates: residual 200, orthogonality 100, eigenvalues 200)")
    print(f"{'family':34} {'residual':>9} {'orthog.':>9} {'eigenv.':>9} {'seconds':>8}")
    worst_all = 0.0
    for index, family in enumerate(families):
        case = spec._case(args.matrices, args.n, 2, args.first_seed + index, family)
        a = spec.make_inputs(case, case["seed"]).numpy()
        figures, start = [], time.time()
        for matrix in a:
            d, e = tridiagonal((matrix + matrix.T) / 2)
            d, e = d.astype(np.float32), e.astype(np.float32)
            q, values = divide_and_conquer(d, e, args.leaf)
            figures.append(gates(d, e, q, values))
        worst = np.max(np.array(figures), axis=0)
        worst_all = max(worst_all, worst[0] / 200, worst[1] / 100, worst[2] / 200)
        print(f"{family:34} {worst[0]:9.3g} {worst[1]:9.3g} {worst[2]:9.3g} {time.time() - start:8.1f}")
    if args.corpus:
        import torch

        entries = torch.load(args.corpus, weights_only=False)
        figures = []
        for entry in entries:
            d = entry["d"].numpy().astype(np.float32)
            e = entry["e"].numpy().astype(np.float32)[:len(d) - 1]
            figures.append(gates(d, e, *divide_and_conquer(d, e, args.leaf)))
        worst = np.max(np.array(figures), axis=0)
        worst_all = max(worst_all, worst[0] / 200, worst[1] / 100, worst[2] / 200)
        print(f"{f'corpus: {len(entries)} T':34} {worst[0]:9.3g} {worst[1]:9.3g} {worst[2]:9.3g}   (worst over the "
              "corpus; the ports' figures on them, as recorded: " + "; ".join(
                  entry["figures"] for entry in entries[:3]) + "; ...)")
    if args.special:
        for name, (d, e) in special_tridiagonals(args.n).items():
            start = time.time()
            figures = gates(d, e, *divide_and_conquer(d, e, args.leaf))
            worst_all = max(worst_all, figures[0] / 200, figures[1] / 100, figures[2] / 200)
            print(f"{name:34} {figures[0]:9.3g} {figures[1]:9.3g} {figures[2]:9.3g} {time.time() - start:8.1f}")
    print("every gate held" if worst_all <= 1 else f"a gate failed (worst {worst_all:.3g} of its allowance)")
    return 0 if worst_all <= 1 else 1


if __name__ == "__main__":
    sys.exit(main())
