"""`scaled_dot_product_attention` in the batch-invariant torch mode (`batch_invariant.torch_mode`): as its
definition, on the mode's products and row kernels, each query's row of bits its own whatever the batch."""
from __future__ import annotations

import torch

from batch_invariant.kernels import NotCovered, _batched_product, _check, _row_reductions


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


def _key_order(mask: torch.Tensor) -> torch.Tensor:
    """The keys' order for a mask's rows [..., keys]: the keys the row may see in their order, then the others (False
    in a boolean mask, at most MASKED_AT in an additive one) in theirs."""
    allowed = mask if mask.dtype == torch.bool else mask > MASKED_AT
    return torch.argsort((~allowed).to(torch.int8), dim=-1, stable=True)


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
    keys = key.shape[-2]
    order = _key_order(attn_mask[..., -1:, :])  # [..., 1, keys]
    by_key = order[..., 0, :].expand(*key.shape[:-2], keys)[..., None]
    key, value = (x.gather(-2, by_key.expand(*x.shape)) for x in (key, value))
    return key, value, attn_mask.gather(-1, order.expand(*attn_mask.shape))


def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    """scaled_dot_product_attention as its definition, on the mode's kernels: the scores in float32 (`_Scores`),
    scaled and masked in float32, softmax on the row kernel, rounded to the inputs' dtype, and bmm by the values;
    its backward pass is autograd's through those ops. Registered above autograd, in place of torch's choice among
    flash, memory-efficient, cuDNN and math kernels. Where no gradient is asked for, 4-D inputs and a mask the same
    for every head (a model's inference) take `_inference`: the same bits with less memory traffic."""
    if dropout_p:
        raise NotCovered("batch-invariant mode: scaled_dot_product_attention with dropout is not covered")
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    if is_causal and attn_mask is not None:  # both: the causal mask joins the given one, before keys are moved
        below = torch.ones(query.shape[-2], key.shape[-2], dtype=torch.bool, device=query.device).tril()
        attn_mask = (attn_mask & below if attn_mask.dtype == torch.bool
                     else attn_mask.masked_fill(~below, float("-inf")))
        is_causal = False
    gradient = torch.is_grad_enabled() and any(x.requires_grad for x in (query, key, value))
    shapes = (query.dim() == key.dim() == value.dim() == 4 and query.shape[0] == key.shape[0]
              and value.shape[:3] == key.shape[:3]
              and (key.shape[1] == query.shape[1] or enable_gqa and query.shape[1] % key.shape[1] == 0))
    if not gradient and shapes and (attn_mask is None or attn_mask.dim() < 3 or attn_mask.shape[-3] == 1):
        return _inference(query, key, value, attn_mask, is_causal, scale)
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        key = key.repeat_interleave(query.shape[-3] // key.shape[-3], -3)
        value = value.repeat_interleave(query.shape[-3] // value.shape[-3], -3)
    if attn_mask is not None:
        key, value, attn_mask = _masked_keys_last(key, value, attn_mask)
    scores = _Scores.apply(query, key) * scale
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


def _inference(query, key, value, attn_mask, is_causal: bool, scale: float):
    """`attention`'s forward pass with its bits, in fewer passes over memory: a group of query heads that share a key
    and value head (grouped-query attention) is one product's rows, so keys and values are never repeated; the
    scores stay where the product puts them and the probabilities' kernel (`attention_probabilities`) reads them
    scaled, masked and in the moved keys' order, so that only the values are gathered. A score's bits do not depend
    on its column, nor a product's row on the rows beside it (the port sums over K alike whatever M is), so every
    value is the definition's."""
    _check("scaled_dot_product_attention", query, key, value)
    batch, heads, queries, depth = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    order = mask = None
    if attn_mask is not None:  # is_causal beside it was joined to it by `attention`
        mask = attn_mask.reshape(*[1] * (4 - attn_mask.dim()), *attn_mask.shape)
        mask = mask.expand(mask.shape[0], 1, mask.shape[2], keys)[:, 0]  # [batch or 1, queries or 1, keys]
        order = _key_order(mask[:, -1])  # [batch or 1, keys]
        value = value.gather(2, order[:, None, :, None].expand(batch, kv_heads, keys, value.shape[-1]))
    group = heads // kv_heads
    scores = _batched_product(query.reshape(batch * kv_heads, group * queries, depth),
                              key.reshape(batch * kv_heads, keys, depth).transpose(1, 2), "float32")
    probabilities = _row_reductions(query.device).attention_probabilities(
        scores.reshape(-1, keys), scale, order, mask, is_causal, heads, queries, query.dtype)
    return _batched_product(probabilities.reshape(batch * kv_heads, group * queries, keys),
                            value.reshape(batch * kv_heads, keys, value.shape[-1]), "same").reshape(
        batch, heads, queries, value.shape[-1])
