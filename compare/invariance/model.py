"""Hugging Face's Llama and Qwen2 causal LMs under the batch-invariant modes: the model people run.

    python -m compare invariance --model llama [--size full] [--batches 1,2,3,8,17,64] [--new-tokens 8]
                                 [--cost 1,8,64] [--context 512] [--json FILE]

The model is transformers' own `LlamaForCausalLM` (or `Qwen2ForCausalLM`) with random weights, built from the
published config of Llama-3.2-1B (Qwen2.5-0.5B) with `--size full`, or from a tiny one with `--size tiny` (the
default without a GPU); nothing is downloaded. Prompts of different lengths (random tokens) are left-padded to the
longest, as a server batches them.

- generate: greedy `generate()` with its KV cache, each batch of the first B prompts against each prompt alone: how
  many sequences' new tokens, and how many sequences' logits, differ by a bit, with the torch mode
  (`batch_invariant.torch_mode`) on and off.
- twin: the JAX twin (`compare.invariance.llama_jax`) with the model's weights, both modes on, against the model's
  logits on the left-padded batch of the first `--twin` prompts: how many logits differ by a bit.
- cost (`--cost`, a GPU only): a decode step after `--context` cached tokens, and a prefill of B x `--context`
  tokens, each captured into a CUDA graph and replayed (the median of `--repeats` replays, CUDA events), the torch
  mode off and on; and the same step called eagerly (host time, waited for). In JAX, the twin's prefill under jit,
  the JAX mode off and on.

Exit status 0 when the mode keeps every sequence's bits in every batch and the twin's logits are the model's (on a
GPU; within two float16 units at the largest logit on a CPU, whose interpreters sum in orders of their own), 1
otherwise, 2 for a bad argument.
"""
from __future__ import annotations

import contextlib
import statistics
import traceback

import numpy as np

FULL = {  # the published configs, as their config.json files give them
    "llama": dict(  # meta-llama/Llama-3.2-1B
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
        head_dim=64, vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    "qwen2": dict(  # Qwen/Qwen2.5-0.5B
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        vocab_size=151936, max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
}
TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=96, max_position_embeddings=64)
FAMILIES = {"llama": "Llama", "qwen2": "Qwen2"}
PAD = 0  # the padding token's id
PROMPT_LENGTHS = {"full": (8, 48), "tiny": (3, 14)}  # a prompt's tokens, fewest and most


def hf_model(family: str, size: str, device, dtype, seed: int = 0):
    """transformers' causal LM of `family` ("llama", "qwen2") with random weights, in `dtype` on `device`."""
    import torch
    import transformers

    config = getattr(transformers, f"{FAMILIES[family]}Config")(
        **(FULL[family] if size == "full" else TINY), pad_token_id=PAD, bos_token_id=1, eos_token_id=None)
    torch.manual_seed(seed)
    with torch.device(device):
        model = getattr(transformers, f"{FAMILIES[family]}ForCausalLM")(config)
    return model.to(dtype).eval()


def prompts(count: int, vocab: int, lengths: tuple[int, int], seed: int = 0) -> list[list[int]]:
    """`count` prompts of random tokens (never the padding id), of random lengths in `lengths`."""
    rng = np.random.default_rng(seed)
    return [rng.integers(PAD + 1, vocab, rng.integers(lengths[0], lengths[1] + 1)).tolist() for _ in range(count)]


def left_padded(batch: list[list[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens, attention mask, position ids) [B, longest], the prompts left-padded."""
    width = max(map(len, batch))
    tokens = np.full((len(batch), width), PAD, np.int64)
    mask = np.zeros((len(batch), width), np.int64)
    for row, prompt in enumerate(batch):
        tokens[row, width - len(prompt):] = prompt
        mask[row, width - len(prompt):] = 1
    return tokens, mask, np.maximum(mask.cumsum(-1) - 1, 0)


def generate(model, batch: list[list[int]], new_tokens: int):
    """(new tokens [B, new_tokens], their logits [B, new_tokens, vocab]) of greedy decoding with a KV cache."""
    import torch

    tokens, mask, _ = left_padded(batch)
    device = model.device
    out = model.generate(input_ids=torch.from_numpy(tokens).to(device),
                         attention_mask=torch.from_numpy(mask).to(device), max_new_tokens=new_tokens,
                         do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=PAD)
    return out.sequences[:, tokens.shape[1]:], torch.stack(out.logits, 1)


def _mode(invariant: bool):
    import batch_invariant.torch_mode as bi

    return bi.batch_invariant() if invariant else contextlib.nullcontext()


def generate_comparisons(model, batch_prompts: list[list[int]], batches: list[int], new_tokens: int,
                         invariant: bool, progress=print) -> dict:
    """{B: how many of the batch's sequences' new tokens, and logits, differ from the sequence's alone}."""
    import torch

    entries = {}
    with _mode(invariant), torch.no_grad():
        alone = [generate(model, [prompt], new_tokens) for prompt in batch_prompts[:max(batches)]]
        for batch in batches:
            progress(f"generate: mode {'on' if invariant else 'off'}, B = {batch} ...")
            tokens, logits = generate(model, batch_prompts[:batch], new_tokens)
            entries[batch] = {
                "sequences": batch,
                "tokens_differ": sum(not torch.equal(tokens[i], alone[i][0][0]) for i in range(batch)),
                "logits_differ": sum(not torch.equal(logits[i], alone[i][1][0]) for i in range(batch))}
    return entries


def twin_comparison(model, batch: list[list[int]]) -> dict:
    """The JAX twin's logits (both modes on) against the model's, over the batch's real (unpadded) tokens."""
    import jax.numpy as jnp
    import torch

    from compare.invariance.llama_jax import logits_function, weights_of

    tokens, mask, positions = left_padded(batch)
    with _mode(True), torch.no_grad():
        expected = model(**{name: torch.from_numpy(value).to(model.device) for name, value in
                            (("input_ids", tokens), ("attention_mask", mask), ("position_ids", positions))}
                         ).logits.float().cpu().numpy()
    got = np.asarray(logits_function(model.config)(weights_of(model), tokens, mask, positions).astype(jnp.float32))
    real = mask.astype(bool)
    return {"sequences": len(batch), "logits": int(expected[real].size),
            "differing": int((got[real] != expected[real]).sum()),
            "largest_difference": float(np.abs(got[real] - expected[real]).max()),
            "largest_logit": float(np.abs(expected[real]).max())}


def graph_replay_ms(step, repeats: int) -> float:
    """Median milliseconds (CUDA events) of `step` replayed from a CUDA graph (`compare.timing.captured`)."""
    from compare.timing import captured, replay_seconds

    graph, _ = captured(step)
    return statistics.median(replay_seconds(graph) for _ in range(repeats)) * 1e3


def steps(model, batch: int, context: int, seed: int) -> dict:
    """{"decode": a decode step after `context` cached tokens, "prefill": a prefill of `context` tokens}, each a
    call on fixed tensors with a StaticCache of its own (filled by one prefill), which it rewinds to the tokens
    cached before it, so that each call (or replay) computes the same step. The cache holds `context` + 1 tokens, so
    a prefill's queries see one key masked, as a static cache's are."""
    import torch
    from transformers import StaticCache

    generator = torch.Generator(model.device).manual_seed(seed)
    vocab = model.config.vocab_size

    def ids(length):
        return torch.randint(PAD + 1, vocab, (batch, length), generator=generator, device=model.device)

    prompt, token = ids(context), ids(1)
    positions = torch.arange(context + 1, device=model.device)
    caches = {name: StaticCache(config=model.config, max_cache_len=context + 1) for name in ("decode", "prefill")}
    for cache in caches.values():  # the cache's tensors are made by its first update, outside any graph
        model(input_ids=prompt, past_key_values=cache, cache_position=positions[:context], logits_to_keep=1)

    # the keys each query sees, given as transformers' 4D mask: it builds one itself only while a graph is captured
    # (and skips it in an eager decode step), which would capture a path the warm-up never ran and compiled
    seen = torch.ones(context + 1, context + 1, dtype=torch.bool, device=model.device).tril()

    def step(name: str, cached: int, ids_in):
        mask = seen[cached:cached + ids_in.shape[1]].expand(batch, 1, -1, -1)

        def call():
            for layer in caches[name].layers:  # a static layer appends at its own count of cached tokens
                layer.cumulative_length.fill_(cached)
            return model(input_ids=ids_in, attention_mask=mask, past_key_values=caches[name],
                         cache_position=positions[cached:cached + ids_in.shape[1]], logits_to_keep=1).logits

        return call

    return {"decode": step("decode", context, token), "prefill": step("prefill", 0, prompt)}


def _waited(step):
    """`step`, returning once the GPU has done its work."""
    import torch

    def call():
        step()
        torch.cuda.synchronize()

    return call


KERNELS_KEPT = 12  # a step's kernels recorded, the longest first
TRACEBACK_KEPT = 6000  # characters of a failed part's traceback recorded, the last


def kernel_times(step) -> tuple[float, list]:
    """(total device ms of one call of `step`, [[kernel, ms], ...] of its KERNELS_KEPT longest kernels, summed by
    name) from torch.profiler: where a step's time goes."""
    from compare.timing import device_ms, profiled

    _, profiler = profiled(lambda _: step(), None, 1)
    totals = device_ms(profiler)
    longest = sorted(totals.items(), key=lambda item: -item[1])[:KERNELS_KEPT]
    return sum(totals.values()), [[name[:120], round(ms, 4)] for name, ms in longest]


def torch_costs(model, batches: list[int], context: int, repeats: int, seed: int = 0, progress=print) -> dict:
    """{B: {"decode"/"prefill": {"graph_ms"/"eager_ms"/"kernel_ms"/"kernels": {"off", "on"}}}}: each step replayed
    from a CUDA graph, called eagerly (host time, waited for), and profiled once (its kernels' total and longest),
    the torch mode off and on."""
    import torch

    from compare.timing import median_after_warm_up

    entries = {}
    for batch in batches:
        entry = entries[batch] = {}
        for mode in ("off", "on"):
            progress(f"cost: torch, mode {mode}, B = {batch} ...")
            with _mode(mode == "on"), torch.no_grad():
                for name, step in steps(model, batch, context, seed).items():
                    times = entry.setdefault(name, {"graph_ms": {}, "eager_ms": {}, "kernel_ms": {}, "kernels": {}})
                    times["graph_ms"][mode] = graph_replay_ms(step, repeats)
                    times["eager_ms"][mode] = median_after_warm_up(_waited(step), repeats) * 1e3
                    times["kernel_ms"][mode], times["kernels"][mode] = kernel_times(step)
            torch.cuda.empty_cache()
    return entries


def jax_costs(model, batches: list[int], context: int, repeats: int, seed: int = 0, progress=print) -> dict:
    """{B: {"prefill_ms": {"off", "on"}}}: the twin's logits of the last token of B x `context` tokens under jit,
    the median host time of a call (waited for), the JAX mode off and on."""
    from compare.invariance.llama_jax import logits_function, weights_of
    from compare.timing import median_after_warm_up

    weights = weights_of(model)
    rng = np.random.default_rng(seed)
    entries = {}
    for batch in batches:
        tokens = rng.integers(PAD + 1, model.config.vocab_size, (batch, context))
        mask, positions = np.ones_like(tokens), np.broadcast_to(np.arange(context), tokens.shape)
        entries[batch] = {"prefill_ms": {}}
        for mode in ("off", "on"):
            progress(f"cost: jax, mode {mode}, B = {batch} ...")
            function = logits_function(model.config, invariant=mode == "on", last_only=True)
            entries[batch]["prefill_ms"][mode] = median_after_warm_up(
                lambda f=function: f(weights, tokens, mask, positions).block_until_ready(), repeats) * 1e3
    return entries


def run(family: str, size: str, batches: list[int], new_tokens: int, twin: int, frameworks: list[str],
        cost_batches: list[int], context: int, repeats: int, seed: int = 0, progress=print, keep=None) -> dict:
    """The record: the model, each comparison, the costs (on a GPU), and whether the modes passed; `keep(record)`
    after each part, so that a part that fails (its error is recorded) loses none before it."""
    import torch

    from compare import gpu_or_interpreters

    on_gpu = gpu_or_interpreters()
    dtype = torch.bfloat16 if on_gpu else torch.float16
    progress(f"building {FAMILIES[family]} ({size}) with random weights ...")
    model = hf_model(family, size, "cuda" if on_gpu else "cpu", dtype, seed)
    batch_prompts = prompts(max(batches + [twin]), model.config.vocab_size, PROMPT_LENGTHS[size], seed)
    import transformers

    record = {"model": {"family": FAMILIES[family], "size": size, "dtype": str(dtype).removeprefix("torch."),
                        "config": FULL[family] if size == "full" else TINY, "transformers": transformers.__version__},
              "batches": batches, "new_tokens": new_tokens, "prompt_lengths": [len(p) for p in batch_prompts]}
    keep = keep or (lambda found: None)
    parts = []
    if "torch" in frameworks:
        parts.append((("generate",), lambda: {mode: generate_comparisons(
            model, batch_prompts, batches, new_tokens, mode == "on", progress) for mode in ("on", "off")}))
    if "jax" in frameworks:
        parts.append((("twin",), lambda: twin_comparison(model, batch_prompts[:twin])))
    if cost_batches and on_gpu:
        record["cost"] = {"context": context, "repeats": repeats}
        for framework, costs in (("torch", torch_costs), ("jax", jax_costs)):
            if framework in frameworks:
                parts.append((("cost", framework), lambda costs=costs: costs(
                    model, cost_batches, context, repeats, seed, progress)))
    elif cost_batches:
        record["cost"] = "not measured: CUDA graphs need a GPU"
    for path, part in parts:
        place = record
        for key in path[:-1]:
            place = place[key]
        try:
            place[path[-1]] = part()
        except Exception as error:  # noqa: BLE001 - a part's failure is a finding, recorded with the parts before it
            # with the traceback and the errors it was raised during: a failed CUDA-graph capture reports only that
            # the capture was invalidated, and the error that invalidated it is the one before
            place[path[-1]] = {"failed": f"{type(error).__name__}: {error}",
                               "traceback": "".join(traceback.format_exception(error))[-TRACEBACK_KEPT:]}
            progress(f"{' '.join(path)} failed: {type(error).__name__}: {error}")
        keep(record)
    twin_held = "twin" not in record or "failed" not in record["twin"] and (
        record["twin"]["differing"] == 0 if on_gpu
        else record["twin"]["largest_difference"] <= 2**-10 * record["twin"]["largest_logit"])
    generated = record.get("generate", {})
    record["passed"] = twin_held and "failed" not in generated and all(
        entry["tokens_differ"] == entry["logits_differ"] == 0 for entry in generated.get("on", {}).values())
    return record


def table(record: dict) -> str:
    """The record as the lines a person reads."""
    model = record["model"]
    lengths = record["prompt_lengths"]
    lines = [f"{model['family']} ({model['size']} config, random weights) in {model['dtype']}: greedy generate() of "
             f"{record['new_tokens']} tokens, prompts of {min(lengths)} to {max(lengths)} tokens left-padded"]
    for part in ("generate", "twin"):
        if "failed" in record.get(part, {}):
            lines.append(f"{part}: FAILED: {record[part]['failed']}")
    if "generate" in record and "failed" not in record["generate"]:
        lines.append("  sequences whose new tokens / logits differ from the sequence's alone")
        lines.append(f"  {'B':>4}  {'mode on':>12}  {'mode off':>12}")
        for batch, on in record["generate"]["on"].items():
            off = record["generate"]["off"][batch]
            lines.append(f"  {batch:>4}  {on['tokens_differ']:>4} / {on['logits_differ']:<5}  "
                         f"{off['tokens_differ']:>4} / {off['logits_differ']:<5}")
    if "twin" in record and "failed" not in record["twin"]:
        twin = record["twin"]
        lines.append(f"the JAX twin, both modes on, against the model over {twin['sequences']} left-padded prompts: "
                     f"{twin['differing']} of {twin['logits']} logits differ (largest difference "
                     f"{twin['largest_difference']:.3g}, largest logit {twin['largest_logit']:.3g})")
    cost = record.get("cost")
    if isinstance(cost, str):
        lines.append(f"cost: {cost}")
    elif cost:
        lines.append(f"cost, ms (median of {cost['repeats']}), after {cost['context']} cached tokens / a prefill of "
                     f"B x {cost['context']}: CUDA graph replay, and eager (host time) in brackets")
        lines.append(f"  {'framework':9} {'B':>4} {'step':8} {'mode off':>18} {'mode on':>18} {'on/off':>7}")
        for framework in ("torch", "jax"):
            if "failed" in cost.get(framework, {}):
                lines.append(f"  {framework}: FAILED: {cost[framework]['failed']}")
        for batch, steps in cost.get("torch", {}).items():
            if batch == "failed":
                continue
            for name, times in steps.items():
                graph, eager = times["graph_ms"], times["eager_ms"]
                lines.append(f"  {'torch':9} {batch:>4} {name:8} {graph['off']:8.3f} ({eager['off']:7.3f}) "
                             f"{graph['on']:8.3f} ({eager['on']:7.3f}) {graph['on'] / graph['off']:6.2f}x")
                for mode in ("off", "on") if "kernels" in times else ():
                    longest = ", ".join(f"{kernel[:40]} {ms:.3f}" for kernel, ms in times["kernels"][mode][:3])
                    lines.append(f"      mode {mode}: kernels {times['kernel_ms'][mode]:.3f} ms, longest {longest}")
        for batch, steps in cost.get("jax", {}).items():
            if batch == "failed":
                continue
            times = steps["prefill_ms"]
            lines.append(f"  {'jax':9} {batch:>4} {'prefill':8} {times['off']:8.3f} {'':9} {times['on']:8.3f} "
                         f"{'':9} {times['on'] / times['off']:6.2f}x  (jit, host time)")
    lines.append("PASSED" if record["passed"] else "FAILED: the mode lets a sequence's bits depend on its batch, "
                 "or the twin's logits are not the model's")
    return "\n".join(lines)
