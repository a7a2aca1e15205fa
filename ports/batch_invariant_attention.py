"""`scaled_dot_product_attention` in the batch-invariant torch mode (`ports.batch_invariant`): as its definition, on
the mode's products and row kernels, each query's row of bits its own whatever the batch."""
from __future__ import annotations

import torch

from ports.batch_invariant_kernels import NotCovered, _batched_product, _check

class _Scores(torch.autograd.Function):
    """query @ key^T in float32 on the batched product, as flash attention keeps its scores. The backward pass rounds
    the scores' gradient to the inputs' dtype, as flash attention rounds dS, and takes its two products on the mode's
    bmm, in the forms the JAX transformation's product takes (dS @ key, and (query^T @ dS)^T for the key)."""

    @staticmethod
    def forward(ctx, query, key):
        _check("scaled_dot_product_attention", query, key)
        ctx.save_for_backward(query, key)
        rows, cols, depth = query.shape[-2], key.shape[-2], query.shape[-1]
        scores = _batched_product(query.reshape(-1, rows, depth), key.reshape(-1, cols, depth).transpose(1, 2),
                                  "float32")
        return scores.reshape(*query.shape[:-1], cols)

    @staticmethod
    def backward(ctx, grad):
        query, key = ctx.saved_tensors
        grad = grad.to(query.dtype)
        return grad @ key, (query.transpose(-2, -1) @ grad).transpose(-2, -1)


MASKED_AT = -1e4  # an additive mask's value at or below which a key is ordered as masked (older models' padding)


def _masked_keys_last(key, value, attn_mask):
    """The keys and values, and the mask's columns, reordered so that the keys the last query may not see come last,
    the others in their order: a left-padded sequence's keys then lie where they lie in the sequence alone, followed
    by keys whose weights are zero. The product by the values sums its keys in groups of a fixed size (an MMA's K),
    so a padded sequence's keys shifted by the padding would be grouped, and rounded, otherwise; zeros at the end add
    nothing. Earlier queries (a causal mask) see a prefix of the same keys, in the same order. Always gathered where
    a mask is given, without asking the GPU whether any key is masked (a host read a layer). A key counts as masked
    where a boolean mask is False or an additive one is at most MASKED_AT: moving any key keeps the result's value
    (the values move with it), only its rounding."""
    attn_mask = attn_mask.reshape(*[1] * (2 - attn_mask.dim()), *attn_mask.shape)  # a mask of keys alone: [1, keys]
    attn_mask = attn_mask.expand(*attn_mask.shape[:-1], key.shape[-2])  # one broadcast over the keys
    allowed = attn_mask if attn_mask.dtype == torch.bool else attn_mask > MASKED_AT
    keys = key.shape[-2]
    order = torch.argsort((~allowed[..., -1:, :]).to(torch.int8), dim=-1, stable=True)  # [..., 1, keys]
    by_key = order[..., 0, :].expand(*key.shape[:-2], keys)[..., None]
    key, value = (x.gather(-2, by_key.expand(*x.shape)) for x in (key, value))
    return key, value, attn_mask.gather(-1, order.expand(*attn_mask.shape))


def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    """scaled_dot_product_attention as its definition, on the mode's kernels: the scores in float32 (`_Scores`),
    scaled and masked in float32, softmax on the row kernel, rounded to the inputs' dtype, and bmm by the values;
    its backward pass is autograd's through those ops. Registered above autograd, in place of torch's choice among
    flash, memory-efficient, cuDNN and math kernels."""
    if dropout_p:
        raise NotCovered("batch-invariant mode: scaled_dot_product_attention with dropout is not covered")
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        key = key.repeat_interleave(query.shape[-3] // key.shape[-3], -3)
        value = value.repeat_interleave(query.shape[-3] // value.shape[-3], -3)
    if is_causal and attn_mask is not None:  # both: the causal mask joins the given one, before keys are moved
        below = torch.ones(query.shape[-2], key.shape[-2], dtype=torch.bool, device=query.device).tril()
        attn_mask = (attn_mask & below if attn_mask.dtype == torch.bool
                     else attn_mask.masked_fill(~below, float("-inf")))
        is_causal = False
    if attn_mask is not None:
        key, value, attn_mask = _masked_keys_last(key, value, attn_mask)
    scores = _Scores.apply(query, key) * (query.shape[-1] ** -0.5 if scale is None else scale)
    if is_causal:
        above = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).triu(1)
        scores = scores.masked_fill(above, float("-inf"))
    if attn_mask is not None:
        scores = (scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool
                  else scores + attn_mask.float())
    # a row whose mask allows no key gives zeros, as torch's kernels do (the definition's 0/0 would be NaN, which a
    # padded query's row would carry into every key and value of the next layer), its gradient too: its scores are
    # zeroed before softmax (a row of NaN is not such a row, and stays NaN)
    empty = (scores == float("-inf")).all(-1, keepdim=True)
    probabilities = torch.softmax(scores.masked_fill(empty, 0), -1).masked_fill(empty, 0)
    return probabilities.to(query.dtype) @ value
