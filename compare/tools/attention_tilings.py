"""Which programs keep attention's probabilities' bits, and what each costs: the torch mode's probabilities kernel
(`triton_kernels.row_reductions.attention_probabilities`) under each AttentionTiling of `tilings()`, compared
bitwise.

    python -m compare.tools.attention_tilings [--batches 8,64] [--keys 512] [--heads 32]

For each B: a prefill of B sequences of K tokens (K queries over K keys) and a decode step (one query over K + 1
keys), with Llama-3.2-1B's 32 query heads by default. The scores are random float32; the mask is additive, as
transformers hands it (left padding and the causal mask, the dtype's lowest where a key is hidden), and the keys'
order is the one the mode's inference path takes from it (`batch_invariant.attention`). Every tiling runs on the
same inputs; its output is compared with the first tiling's bit for bit, and on a GPU its kernel time is printed
(the median of 10 calls, each after an L2 flush) beside a cast of the scores to the output's dtype: one read of the
scores and one write, the bytes' floor. On a CPU the Triton interpreter runs small sizes in float16, and only the
bits say anything.
"""
from __future__ import annotations

import argparse
import sys

import torch

from compare import gpu_or_interpreters
from compare.timing import median_kernel_us

PADDING = 40  # the most left padding a sequence gets (each sequence's is random, below this and the keys)


def tilings():
    from triton_kernels.row_reductions import AttentionTiling

    return [AttentionTiling(elements=1, warps=4), AttentionTiling(elements=1024, warps=2),
            AttentionTiling(elements=2048, warps=4), AttentionTiling(elements=4096, warps=4),
            AttentionTiling(elements=4096, warps=8), AttentionTiling(elements=8192, warps=8)]


def inputs(batch: int, heads: int, queries: int, keys: int, device: str, dtype, seed: int = 0):
    """The probabilities kernel's arguments for one attention: (scores, scale, order, mask, causal, heads, queries,
    dtype), the mask joined with the causal one and the order taken from the last query's row, as `_inference`
    takes them."""
    from batch_invariant.attention import _key_order

    gen = torch.Generator(device=device).manual_seed(seed)
    scores = torch.randn(batch * heads * queries, keys, device=device, generator=gen) * 3
    padding = torch.randint(0, min(PADDING, keys), (batch,), device=device, generator=gen)
    key = torch.arange(keys, device=device)
    last_seen = keys - queries + torch.arange(queries, device=device)  # the causal mask, queries at the end
    allowed = (key >= padding[:, None, None]) & (key <= last_seen[None, :, None])
    mask = torch.zeros(allowed.shape, device=device, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return scores, 0.125, _key_order(mask[:, -1]), mask, False, heads, queries, dtype


def compare_tilings(name: str, arguments, on_gpu: bool) -> None:
    """One line a tiling: whether its output has the first tiling's bits, and on a GPU its kernel time."""
    from ports import first_difference
    from triton_kernels import row_reductions

    scores = arguments[0]
    floor = median_kernel_us(lambda data: data[0].to(data[1]), (scores, arguments[-1])) if on_gpu else None
    print(f"{name}: {scores.shape[0]} rows of {scores.shape[1]} keys"
          + (f"; the scores' cast to {arguments[-1]} {floor:.1f} us" if on_gpu else ""), flush=True)
    kept, reference = row_reductions.ATTENTION, None
    try:
        for tiling in tilings():
            row_reductions.ATTENTION = tiling
            out = row_reductions.attention_probabilities(*arguments)
            reference = out if reference is None else reference
            difference = first_difference(out, reference)
            timing = ""
            if on_gpu:
                us = median_kernel_us(lambda data: row_reductions.attention_probabilities(*data), arguments)
                timing = f"  {us:9.1f} us"
            bits = "equal to the first" if difference is None else f"DIFFERS: {difference}"
            print(f"  {tiling.elements:5} elements, {tiling.warps} warps (rows a program: "
                  f"{tiling.rows(scores.shape[1])}): {bits}{timing}{'  (the default)' if tiling == kept else ''}",
                  flush=True)
    finally:
        row_reductions.ATTENTION = kept


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m compare.tools.attention_tilings", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    on_gpu = gpu_or_interpreters()
    parser.add_argument("--batches", default="8,64" if on_gpu else "2", help="comma-separated batch sizes")
    parser.add_argument("--keys", type=int, default=512 if on_gpu else 40, help="tokens a sequence (K)")
    parser.add_argument("--heads", type=int, default=32 if on_gpu else 2, help="query heads")
    args = parser.parse_args(argv)
    batches = [int(text) for text in args.batches.split(",")]
    if min(batches) < 1 or args.keys < 1 or args.heads < 1:
        parser.error("--batches, --keys and --heads must be positive")
    device, dtype = ("cuda", torch.bfloat16) if on_gpu else ("cpu", torch.float16)
    for batch in batches:
        for name, queries, keys in (("prefill", args.keys, args.keys), ("decode", 1, args.keys + 1)):
            compare_tilings(f"{name} B={batch}", inputs(batch, args.heads, queries, keys, device, dtype), on_gpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
