"""triton_kernels/interpreter.py: the Triton interpreter's reductions by our combiners and its language patched once
per launch (CPU only: on a GPU the kernels are compiled, and nothing here is installed)."""
import inspect

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter runs only without a GPU")


@triton.jit
def _add_pairs(a, b, c, d):
    return a + c, b + d


@triton.jit
def _twice(x):
    return x * 2


@triton.jit
def _pair_sums(x_ptr, out_ptr, N: tl.constexpr, CALLS: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, N))
    for _ in tl.static_range(CALLS):
        x = _twice(x)
    total, squares = tl.reduce((x, x * x), 0, _add_pairs)
    tl.store(out_ptr, total)
    tl.store(out_ptr + 1, squares)


def test_a_tuple_combiner_reduces_correctly_and_the_language_is_restored():
    arange = tl.arange
    x = torch.arange(1.0, 17.0)
    out = torch.empty(2)
    _pair_sums[(1,)](x, out, N=16, CALLS=2)
    assert out.tolist() == [4 * 136.0, 16 * float(np.sum(np.arange(1.0, 17.0) ** 2))]
    assert tl.arange is arange  # the launch's patch was put back


def test_helper_calls_do_not_patch_the_language_again(monkeypatch):
    walks = []
    original = inspect.getmembers
    monkeypatch.setattr(inspect, "getmembers", lambda *args, **kwargs: walks.append(1) or original(*args, **kwargs))
    x, out = torch.arange(1.0, 17.0), torch.empty(2)
    counts = []
    for calls in (1, 6):
        walks.clear()
        _pair_sums[(1,)](x, out, N=16, CALLS=calls)
        counts.append(len(walks))
    assert counts[0] == counts[1] > 0, counts
