"""The batch-invariant modes on a small transformer decoder, in torch and in JAX: that they keep its bits.

    python -m compare invariance [--batches 1,2,4,8] [--layers 2] [--dim 32] [--cost 1,8,64,256]
                                 [--ops] [--json FILE]
    python -m compare invariance --sweep [--lengths 4097,50257] [--dtypes float32] [--json FILE]
    python -m compare invariance --model llama [--size full] [--cost 1,8,64] [--json FILE]
    python -m compare invariance --gpus N [--batches 1,2,4] [--repeats 5] [--json FILE]

One decoder (token embedding, RMSNorm, causal multi-head attention, a SiLU-gated MLP, the LM head), with the same
random weights in torch and JAX (drawn once in NumPy), runs a batch of token sequences. Its attention is torch's
`scaled_dot_product_attention` in torch (the mode runs it as its definition) and that definition in JAX. For each
framework, with its mode off and on (`batch_invariant.torch_mode`, `batch_invariant.jax_mode`), and each batch size B:

- logits: every sequence's logits in the batch of B against the same sequence run alone, bit for bit;
- gradient: the gradient of every sequence's loss (cross-entropy of its next tokens) with respect to its own
  embedded input, in the batch against alone (a weight's gradient sums over the batch, so it is batch-variant by
  definition and not compared).

Then, with both modes on, the torch and JAX logits and input gradients of the whole batch, bit for bit; where the
logits differ, the first intermediate (in the order the decoder computes them) that differs for the first sequence
names the op. With
`--cost 1,8,64,256` it also times a forward pass and a training step (every weight's gradient) at those batch sizes,
the mode off and on: the median host time of `--repeats` calls, each waited for. With `--ops` it also probes each
op a decoder runs (products, softmax, sums, norms, attention) on its own at a larger model's sizes, a sequence alone
against in each batch, each framework's mode off and on (`compare.invariance.ops`): which library kernels are
batch-variant, and that the modes' are not. `--sweep` runs, instead of the decoder, every reduction-bearing op a
transformer uses in each dtype and at row lengths no test uses, B = 1 to 256 (`compare.invariance.sweep`): with
the mode on each must be invariant or refused by name; exit 1 where one is neither. `--model llama` (or qwen2)
runs, instead of the decoder, Hugging Face's own model with random weights from its published config: greedy
generate() alone and in left-padded batches, the JAX twin against it, and with `--cost` each mode's cost under CUDA
graphs (`compare.invariance.model`). `--gpus N` runs, instead of the decoder, a tensor-parallel MLP on N devices
and on one (`compare.invariance.tensor_parallel`): the same bits, in any batch, and the scaling.

The products are bfloat16 on a GPU and float16 on a CPU (Triton's interpreter misreads bfloat16); the norms,
softmax and SiLU compute in float32. On a CPU everything runs through the interpreters, so keep it small.
Exit status 0 when each framework's mode holds every comparison, 1 otherwise, 2 for a bad argument.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from compare import help_text
from compare.invariance.decoder import Decoder, run, table
from compare.invariance.model import FAMILIES
from compare.invariance.sweep import CPU_BATCHES, CPU_LENGTHS, DTYPES, GPU_BATCHES, GPU_LENGTHS, holes, sweep
from compare.invariance.sweep import table as sweep_table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m compare invariance", description=help_text(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", help="batch sizes, comma-separated (default 1,2,4; for --sweep "
                        f"{','.join(map(str, GPU_BATCHES))} on a GPU, {','.join(map(str, CPU_BATCHES))} on a CPU)")
    parser.add_argument("--frameworks", default="torch,jax", help="torch, jax or both (default: torch,jax)")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    parser.add_argument("--length", type=int, default=8, help="tokens a sequence (default 8)")
    parser.add_argument("--dim", type=int, default=Decoder.dim, help=f"model width (default {Decoder.dim})")
    parser.add_argument("--heads", type=int, default=Decoder.heads,
                        help=f"attention heads; divides --dim (default {Decoder.heads})")
    parser.add_argument("--hidden", type=int, default=Decoder.hidden,
                        help=f"the MLP's width (default {Decoder.hidden})")
    parser.add_argument("--vocab", type=int, default=Decoder.vocab, help=f"vocabulary (default {Decoder.vocab})")
    parser.add_argument("--ops", action="store_true",
                        help="also probe each op a decoder runs on its own, each framework's mode off and on: which "
                             "of the library kernels are batch-variant (sizes of an 8B model's layer on a GPU; "
                             "default: off)")
    parser.add_argument("--sweep", action="store_true",
                        help="instead of the decoder, sweep every reduction-bearing op with the modes on and off "
                             "(default: off)")
    parser.add_argument("--lengths", help="the sweep's row lengths (default "
                        f"{','.join(map(str, GPU_LENGTHS))} on a GPU, {','.join(map(str, CPU_LENGTHS))} on a CPU)")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help=f"the sweep's dtypes (default {','.join(DTYPES)})")
    parser.add_argument("--modes", default="on,off", help="the sweep's modes, on and off (default on,off)")
    parser.add_argument("--seed", type=int, default=0, help="the weights' and tokens' seed (default 0)")
    parser.add_argument("--cost", metavar="BATCHES",
                        help="also time a forward pass and a training step, the mode off and on, at these batch sizes "
                             "(e.g. 1,8,64,256; default: none)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls a figure is the median of (default 5)")
    parser.add_argument("--model", choices=sorted(FAMILIES),
                        help="instead of the decoder, Hugging Face's model of this family (needs transformers; "
                             "default: none)")
    parser.add_argument("--size", choices=("full", "tiny"),
                        help="--model's config: the published one, or a tiny one (default: full on a GPU, tiny on a "
                             "CPU)")
    parser.add_argument("--new-tokens", type=int, default=8, help="--model: tokens generate() makes (default 8)")
    parser.add_argument("--twin", type=int, default=8, help="--model: prompts the JAX twin is checked on (default 8)")
    parser.add_argument("--context", type=int, default=512,
                        help="--model --cost: cached tokens before a decode step, and a prefill's tokens (default 512)")
    parser.add_argument("--gpus", type=int, metavar="N",
                        help="instead of the decoder, a tensor-parallel MLP on N devices and on one (without GPUs, "
                             "CPU processes and devices): its bits, in any batch, and its scaling (default: off)")
    parser.add_argument("--json", type=Path, help="write the record here (default: none)")
    args = parser.parse_args(argv)
    try:
        batches = [int(b) for b in (args.batches or ("" if args.sweep or args.model else "1,2,4")).split(",") if b]
        cost_batches = [int(b) for b in args.cost.split(",")] if args.cost else []
        lengths = [int(n) for n in (args.lengths or "").split(",") if n]
        if ((not batches and not (args.sweep or args.model)) or min(batches + cost_batches + lengths + [1]) < 1
                or min(args.repeats, args.new_tokens, args.twin, args.context) < 1):
            raise ValueError
    except ValueError:
        print(f"--batches {args.batches!r}, --cost {args.cost!r}, --lengths {args.lengths!r}, --repeats "
              f"{args.repeats}, --new-tokens {args.new_tokens}, --twin {args.twin}, --context {args.context}: give "
              "positive whole numbers, e.g. 1,2,4", file=sys.stderr)
        return 2
    frameworks = [f for f in args.frameworks.split(",") if f]
    if not frameworks or set(frameworks) - {"torch", "jax"}:
        print(f"--frameworks {args.frameworks!r}: valid: torch, jax", file=sys.stderr)
        return 2
    if args.gpus is not None:
        from compare.invariance.tensor_parallel import main_from

        return main_from(args, frameworks, batches, argv)
    if args.sweep:
        return _sweep(args, frameworks, batches, lengths, argv)
    if args.model:
        return _model(args, frameworks, cost_batches, argv)
    sizes = dict(layers=args.layers, length=args.length, dim=args.dim, heads=args.heads, hidden=args.hidden,
                 vocab=args.vocab)
    if min(sizes.values()) < 1 or args.dim % args.heads:
        print(f"{sizes}: every size must be at least 1, and --heads must divide --dim", file=sys.stderr)
        return 2
    record = run(Decoder(**sizes), batches, frameworks, args.seed,
                 progress=lambda message: print(message, file=sys.stderr, flush=True), cost_batches=cost_batches,
                 repeats=args.repeats, ops=args.ops)
    record = {"command": shlex.join(["python", "-m", "compare", "invariance",
                                     *(sys.argv[2:] if argv is None else argv)]), **record}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1, default=str))
    print(table(record))
    return 0 if record["passed"] else 1


def _model(args, frameworks: list[str], cost_batches: list[int], argv) -> int:
    """`--model`: the record, its table, and exit 1 where the mode lets a sequence's bits move."""
    import torch

    from compare.invariance import model as invariance_model
    from compare.records import device_info, provenance, versions

    on_gpu = torch.cuda.is_available()
    batches = [int(b) for b in (args.batches or ("1,2,3,8,17,64" if on_gpu else "1,2,3")).split(",")]
    header = {"command": shlex.join(["python", "-m", "compare", "invariance",
                                     *(sys.argv[2:] if argv is None else argv)]),
              **{key: value for key, value in provenance([]).items() if key != "sources"},
              **device_info(), "versions": versions()}

    def keep(found: dict) -> None:
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({**header, **found}, indent=1, default=str))

    record = {**header, **invariance_model.run(
        args.model, args.size or ("full" if on_gpu else "tiny"), batches, args.new_tokens, args.twin, frameworks,
        cost_batches, args.context, args.repeats, args.seed,
        progress=lambda message: print(message, file=sys.stderr, flush=True), keep=keep)}
    keep(record)
    print(invariance_model.table(record))
    return 0 if record["passed"] else 1


def _sweep(args, frameworks: list[str], batches: list[int], lengths: list[int], argv) -> int:
    """`--sweep`: the record, its table, and exit 1 where the mode leaves an op variant."""
    from compare import gpu_or_interpreters
    from compare.records import device_info, provenance, versions

    dtypes, modes = ([item for item in value.split(",") if item] for value in (args.dtypes, args.modes))
    if not dtypes or set(dtypes) - set(DTYPES) or "on" not in modes or set(modes) - {"on", "off"}:
        print(f"--dtypes {args.dtypes!r}, --modes {args.modes!r}: valid: {', '.join(DTYPES)}; on, or on,off",
              file=sys.stderr)
        return 2
    on_gpu = gpu_or_interpreters()
    record = {"command": shlex.join(["python", "-m", "compare", "invariance",
                                     *(sys.argv[2:] if argv is None else argv)]),
              **{key: value for key, value in provenance([]).items() if key != "sources"},
              "started": time.strftime("%Y-%m-%dT%H:%M:%S"), **device_info(), "versions": versions()}

    def keep(found: dict) -> None:
        record.update(found, holes=holes(found))
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(record, indent=1, default=str))

    keep(sweep(frameworks, on_gpu, batches, lengths, dtypes, args.seed,
               progress=lambda message: print(message, file=sys.stderr, flush=True), keep=keep, modes=modes))
    print("\n".join(sweep_table(record)))
    for hole in record["holes"]:
        print(f"HOLE: {hole}")
    return 1 if record["holes"] else 0


if __name__ == "__main__":
    sys.exit(main())
