"""The torch mode under the models people run: left padding, a KV cache, Hugging Face's Llama with greedy `generate()`.
On a CPU the products of attention run on a planted port that rounds its running sum every few keys, as a GPU's MMA
groups K (on a GPU the mode's own port runs them, but in the first test): a left-padded sequence's keys then give its
bits alone only where they sit where they sit alone (`batch_invariant.attention._masked_keys_last`); the other
products run on the Triton port through its interpreter, in float16."""
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import batch_invariant.torch_mode as bi
import batch_invariant.attention as bia
import batch_invariant.kernels as bik
from compare.invariance.model import generate, left_padded

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float16
GROUP = 4  # keys a group of the planted port


def grouped_port(a: torch.Tensor, b: torch.Tensor, out: str) -> torch.Tensor:
    """a [B, M, K] @ b [B, K, N], the running sum over K rounded to float16 after every GROUP terms (in NumPy): a
    result that moves when the terms shift by a number of places that GROUP does not divide."""
    a64, b64 = (x.cpu().double().numpy() for x in (a, b))
    total = np.zeros((a.shape[0], a.shape[1], b.shape[2]))
    for start in range(0, a.shape[2], GROUP):
        total = (total + a64[:, :, start:start + GROUP] @ b64[:, start:start + GROUP]).astype(np.float16)
    return torch.from_numpy(total.astype(np.float32)).to(a.device, a.dtype if out == "same" else torch.float32)


@pytest.mark.parametrize("gradient", [False, True])  # the inference path, and the definition's
@pytest.mark.parametrize("masked", [None, "lowest", -1e4])  # a boolean mask; additive: the dtype's lowest, -1e4
def test_a_left_padded_sequences_attention_has_its_bits_alone(masked, gradient, monkeypatch):
    monkeypatch.setattr(bik, "_batched_port", lambda: grouped_port)
    gen = torch.Generator().manual_seed(7)
    alone, padding, heads, depth = 13, 5, 2, 8
    q, k, v = (torch.randn(2, heads, alone + padding, depth, generator=gen).to(DEVICE, DTYPE) for _ in range(3))
    causal = torch.ones(alone + padding, alone + padding, dtype=torch.bool, device=DEVICE).tril()
    keys = torch.arange(alone + padding, device=DEVICE)
    mask = causal & (keys >= torch.tensor([padding, 0], device=DEVICE)[:, None])[:, None, None, :]  # row 0 padded

    def given(allowed):
        if masked is None:
            return allowed
        lowest = torch.finfo(DTYPE).min if masked == "lowest" else masked
        return torch.zeros(allowed.shape, dtype=DTYPE, device=DEVICE).masked_fill(~allowed, lowest)

    def first_sequence(reorder: bool):
        if not reorder:
            monkeypatch.setattr(bia, "_key_order",
                                lambda rows: torch.arange(rows.shape[-1], device=rows.device).expand(rows.shape))
        with bi.batch_invariant(), torch.set_grad_enabled(gradient):
            query = q.clone().requires_grad_(gradient)
            batch = F.scaled_dot_product_attention(query, k, v, attn_mask=given(mask)).detach()
            single = F.scaled_dot_product_attention(*(x[:1, :, padding:] for x in (query, k, v)),
                                                    attn_mask=given(causal[:alone, :alone])).detach()
        if masked is None:
            assert bool((batch[0, :, :padding] == 0).all())  # padded queries see no key: zeros, as torch gives
        return batch[0, :, padding:], single[0]

    assert torch.equal(*first_sequence(reorder=True))
    assert not torch.equal(*first_sequence(reorder=False))  # the planted port catches keys shifted by the padding


@pytest.mark.parametrize("masked", [None, -1e4])  # boolean; additive (the dtype's lowest takes the same path)
def test_attention_without_a_gradient_has_the_definitions_bits(masked):
    # the inference path (grouped heads as one product's rows, the probabilities' kernel reading the scores scaled,
    # masked and in the moved keys' order) against the definition's ops, which a gradient takes: the same bits,
    # left-padded, grouped-query, causal with and without a mask, and a decode step's one query
    gen = torch.Generator().manual_seed(3)
    batch, heads, kv_heads, length, depth = 3, 4, 2, 11, 8
    q = torch.randn(batch, heads, length, depth, generator=gen).to(DEVICE, DTYPE)
    k, v = (torch.randn(batch, kv_heads, length, depth, generator=gen).to(DEVICE, DTYPE) for _ in range(2))
    keys = torch.arange(length, device=DEVICE)
    padded = (keys >= torch.tensor([3, 0, 6], device=DEVICE)[:, None])[:, None, None, :]  # [batch, 1, 1, keys]
    causal = torch.ones(length, length, dtype=torch.bool, device=DEVICE).tril()

    def given(allowed):
        if masked is None:
            return allowed
        lowest = torch.finfo(DTYPE).min if masked == "lowest" else masked
        return torch.zeros(allowed.shape, dtype=DTYPE, device=DEVICE).masked_fill(~allowed, lowest)

    # a decode step over more keys than a chunk of the probabilities' kernel, which it reads in passes
    from triton_kernels.row_reductions import CHUNK
    long_k, long_v = (torch.randn(batch, kv_heads, CHUNK + 5, depth, generator=gen).to(DEVICE, DTYPE)
                      for _ in range(2))
    long_padded = torch.arange(long_k.shape[2], device=DEVICE) >= torch.tensor([3, 0, 600], device=DEVICE)[:, None]
    cases = {"padded, causal": (q, k, v, given(padded & causal), False),
             "padded, is_causal": (q, k, v, given(padded), True), "is_causal": (q, k, v, None, True),
             "a decode step": (q[:, :, -1:], k, v, given(padded), False),
             "one mask for all": (q, k, v, given(causal), False),
             "a decode step over many keys": (q[:, :, -1:], long_k, long_v, given(long_padded[:, None, None]), False),
             # the same mask laid out batch-innermost (the keys' order it gives is too): its values, not its strides
             "a batch-innermost mask": (q, k, v, given(padded & causal).permute(1, 2, 3, 0).contiguous()
                                        .permute(3, 0, 1, 2), False),
             # a position bias (T5's, ALiBi's) added to scores scaled by 1 / sqrt(8): rounded twice, not fused
             "a bias": (q, k, v, torch.randn(batch, 1, length, length, generator=gen).to(DEVICE, DTYPE), False)}
    with bi.batch_invariant():
        for name, (queries, k, v, mask, is_causal) in cases.items():
            fast = F.scaled_dot_product_attention(queries, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=True)
            definition = F.scaled_dot_product_attention(queries.requires_grad_(), k, v, attn_mask=mask,
                                                        is_causal=is_causal, enable_gqa=True).detach()
            queries.requires_grad_(False)
            assert torch.equal(fast, definition), name


def tiny_model(family: str):
    """A transformers causal LM with random weights from a tiny config (Qwen2's attention projections carry biases:
    addmm)."""
    pytest.importorskip("transformers")
    from compare.invariance.model import hf_model

    return hf_model(family, "tiny", DEVICE, DTYPE)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_hugging_face_models_generate_the_same_bits_alone_and_in_a_left_padded_batch(family, monkeypatch):
    # greedy decoding with a KV cache, prompts of three lengths left-padded to the longest
    model = tiny_model(family)
    if DEVICE == "cpu":  # a GPU runs the mode's own port
        monkeypatch.setattr(bik, "_batched_port", lambda: grouped_port)
    prompts = [list(range(3, 12)), list(range(20, 25)), list(range(40, 54))]
    with bi.batch_invariant():
        tokens, logits = generate(model, prompts, 2)  # a prefill and a step on the KV cache
        for index, prompt in enumerate(prompts):
            tokens_alone, logits_alone = generate(model, [prompt], 2)
            assert torch.equal(tokens_alone[0], tokens[index]) and torch.equal(logits_alone[0], logits[index]), index


def test_the_model_command_reports_generate_alone_and_in_a_batch(capsys):
    from compare.invariance.command import main

    assert main(["--model", "llama", "--size", "tiny", "--batches", "2", "--new-tokens", "1",
                 "--frameworks", "torch"]) == 0
    report = capsys.readouterr().out
    assert "sequences whose new tokens / logits differ" in report and "PASSED" in report
    assert main(["--model", "llama", "--new-tokens", "0"]) == 2


def test_a_failed_part_is_recorded_with_the_error_it_was_raised_during(monkeypatch):
    # as a CUDA-graph capture fails: the error raised names only the invalidated capture, the cause is the one before
    import compare.invariance.model as im

    def fails_during_another(*args):
        try:
            raise ValueError("the first error")
        except ValueError:
            raise RuntimeError("the capture was invalidated")  # noqa: B904 - chained implicitly, as torch's is

    monkeypatch.setattr(im, "generate_comparisons", fails_during_another)
    kept = []
    record = im.run("llama", "tiny", [1], 1, 0, ["torch"], [], 4, 1, keep=kept.append, progress=lambda line: None)
    failure = record["generate"]
    assert failure["failed"] == "RuntimeError: the capture was invalidated"
    assert "ValueError: the first error" in failure["traceback"] and not record["passed"] and kept


# qwen2 (biased q, k and v) on a GPU and with --run-slow only: the test command's 15 minutes on CI's 2 cores
@pytest.mark.parametrize("family", ["llama", pytest.param("qwen2", marks=pytest.mark.slow)])
def test_the_jax_twin_computes_the_hugging_face_models_logits(family):
    # the twin (compare.invariance.llama_jax) with the HF model's weights, both modes on, a left-padded batch: on a
    # GPU the same bits; on a CPU the interpreters sum in their own orders, so within float16's rounding there; and
    # each sequence's bits in the batch those of the sequence alone
    jax = pytest.importorskip("jax")
    from compare.invariance.llama_jax import logits_function, weights_of

    model = tiny_model(family)
    lengths = [9, 5, 14]
    width = max(lengths)
    tokens, mask, positions = left_padded([list(range(3 + 7 * row, 3 + 7 * row + count)) for row, count in
                                           enumerate(lengths)])
    with bi.batch_invariant(), torch.no_grad():
        expected = model(input_ids=torch.from_numpy(tokens).to(DEVICE), attention_mask=torch.from_numpy(mask).to(
            DEVICE), position_ids=torch.from_numpy(positions).to(DEVICE)).logits.float().cpu().numpy()
    twin = logits_function(model.config)
    weights = weights_of(model)
    got = np.asarray(twin(weights, tokens, mask, positions).astype(jax.numpy.float32))
    real = mask.astype(bool)
    if DEVICE == "cuda":
        assert np.array_equal(got[real], expected[real])
    else:
        # two float16 units at the largest logit: a 1% error in one norm's weight, or doubled rotary frequencies,
        # is four times that
        assert np.abs(got[real] - expected[real]).max() <= 2**-10 * np.abs(expected[real]).max()
    for row, count in enumerate(lengths):  # alone: no padding
        alone = twin(weights, tokens[row:row + 1, width - count:], mask[row:row + 1, width - count:],
                     positions[row:row + 1, width - count:])
        assert np.array_equal(np.asarray(alone.astype(jax.numpy.float32))[0], got[row, width - count:]), row


@pytest.mark.skipif(DEVICE == "cpu", reason="CUDA graphs need a GPU")
def test_steps_replayed_from_cuda_graphs_under_the_mode_give_their_eager_bits():
    from compare.invariance.model import kernel_times, steps
    from compare.timing import captured

    model = tiny_model("llama")
    with bi.batch_invariant(), torch.no_grad():
        for name, step in steps(model, 3, 12, 0).items():
            eager = step().clone()
            graph, output = captured(step)
            output.zero_()
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(output, eager) and torch.equal(step(), eager), name  # a call gives the same step again
            total, longest = kernel_times(step)
            assert total + 1e-3 >= sum(ms for _, ms in longest) > 0, longest  # the profiler saw the step's kernels


def test_the_attention_probabilities_kernel_compiles_for_hopper_without_spills():
    script = """
import torch
from compare.tools.hopper_compile import compile_launches
from triton_kernels import row_reductions

def launches(_):
    scores = torch.zeros(3 * 4 * 5, 4097)
    row_reductions.attention_probabilities(scores, 0.125, torch.zeros(3, 4097, dtype=torch.int64),
                                           torch.ones(3, 1, 4097, dtype=torch.bool), False, 4, 5, torch.bfloat16)
    row_reductions.attention_probabilities(scores, 0.125, None, None, True, 4, 5, torch.bfloat16)
    row_reductions.attention_probabilities(scores[:, :513], 0.125, None, None, True, 4, 5, torch.bfloat16)  # one chunk

kernels = compile_launches(launches, None, specialise=True)
assert len(kernels) == 3 and all(k.error is None and not k.spilled_bytes for k in kernels), kernels
"""
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=pathlib.Path(__file__).resolve().parents[1],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
