"""Hugging Face's Llama and Qwen2 causal LMs in JAX, op for op as transformers computes them in torch with the
batch-invariant mode on: the twin on which the two modes are checked against each other, bit for bit, on a real
model's structure (RoPE, grouped-query attention, SwiGLU, RMSNorm, the projections' biases where Qwen2 has them).

    weights = weights_of(hf_model)                  # the HF model's weights, in its dtype
    logits = logits_function(hf_model.config)(weights, tokens, attention_mask, position_ids)

Each op follows transformers' torch code, in its dtype and its order of roundings: RMSNorm in float32 rounded to the
model's dtype before its weight; the rotary embedding's angles in float32 (the frequencies times the positions: the
torch mode's one-term product), cos and sin rounded to the model's dtype, q cos + rotate_half(q) sin in it; attention
as the torch mode runs `scaled_dot_product_attention` (`batch_invariant.attention.attention`): the scores in
float32, the keys the last query may not see moved last, softmax in float32, masked rows zero, rounded, then the
product by the values; a projection with a bias rounded once, as addmm; SiLU as torch's kernel computes it, x / (1 +
exp(-x)) in float32. The function is jitted with XLA's excess precision off, so that a 16-bit value is rounded
wherever torch's eager ops round it.
"""
from __future__ import annotations

import functools


def weights_of(model) -> dict:
    """{name: jax array} of a transformers causal LM's state dict, in its dtype, plus the rotary embedding's
    inverse frequencies (float32) and scaling."""
    import jax.numpy as jnp
    import torch

    dtypes = {torch.bfloat16: jnp.bfloat16, torch.float16: jnp.float16, torch.float32: jnp.float32}
    weights = {name: jnp.asarray(tensor.detach().float().cpu().numpy(), dtypes[tensor.dtype])
               for name, tensor in model.state_dict().items()}
    weights.setdefault("lm_head.weight", weights["model.embed_tokens.weight"])  # tied embeddings
    rotary = model.model.rotary_emb
    weights["rotary.inv_freq"] = jnp.asarray(rotary.inv_freq.float().cpu().numpy())
    weights["rotary.scaling"] = jnp.float32(rotary.attention_scaling)
    return weights


def logits(weights: dict, tokens, attention_mask, position_ids, *, config, last_only: bool = False):
    """Logits [B, T, vocab] in the model's dtype for tokens [B, T], transformers' 0/1 attention mask [B, T] (left
    padding) and position ids [B, T]; [B, 1, vocab], the last token's, with `last_only` (as generate's prefill)."""
    import jax
    import jax.numpy as jnp

    f32 = jnp.float32
    dtype = weights["model.embed_tokens.weight"].dtype
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    batch, length = tokens.shape

    def linear(x, name):
        product = jnp.einsum("...i,oi->...o", x, weights[f"{name}.weight"],
                             preferred_element_type=f32 if f"{name}.bias" in weights else None)
        if f"{name}.bias" in weights:  # addmm: the product and the bias in float32, rounded once
            return (product + weights[f"{name}.bias"].astype(f32)).astype(dtype)
        return product

    def rms_norm(x, name):
        x32 = x.astype(f32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + config.rms_norm_eps)
        return weights[f"{name}.weight"] * normed.astype(dtype)

    angles = position_ids.astype(f32)[..., None] * weights["rotary.inv_freq"]
    angles = jnp.concatenate([angles, angles], -1)
    cos, sin = ((part(angles) * weights["rotary.scaling"]).astype(dtype)[:, None] for part in (jnp.cos, jnp.sin))

    def rotated(x):
        half = x.shape[-1] // 2
        return x * cos + jnp.concatenate([-x[..., half:], x[..., :half]], -1) * sin

    allowed = jnp.tril(jnp.ones((length, length), bool))[None, None]
    if attention_mask is not None:
        allowed = allowed & attention_mask.astype(bool)[:, None, None, :]
    # the keys the last query may not see last (`batch_invariant.attention._masked_keys_last`)
    order = jnp.argsort((~allowed[..., -1:, :]).astype(jnp.int8), axis=-1, stable=True)
    allowed = jnp.take_along_axis(jnp.broadcast_to(allowed, (batch, 1, length, length)), order, -1)
    x = weights["model.embed_tokens.weight"][tokens]
    for i in range(config.num_hidden_layers):
        prefix = f"model.layers.{i}"
        h = rms_norm(x, f"{prefix}.input_layernorm")
        q, k, v = (linear(h, f"{prefix}.self_attn.{name}_proj").reshape(batch, length, -1, head_dim)
                   .transpose(0, 2, 1, 3) for name in ("q", "k", "v"))
        q, k = rotated(q), rotated(k)
        k, v = (jnp.take_along_axis(jnp.repeat(part, heads // kv_heads, axis=1), order[..., 0, :, None], 2)
                for part in (k, v))
        scores = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=f32) * head_dim**-0.5
        probs = jax.nn.softmax(jnp.where(allowed, scores, -jnp.inf), -1)
        probs = jnp.where(allowed.any(-1, keepdims=True), probs, 0).astype(dtype)
        attention = jnp.einsum("bhqk,bhkd->bhqd", probs, v).transpose(0, 2, 1, 3).reshape(batch, length, -1)
        x = x + linear(attention, f"{prefix}.self_attn.o_proj")
        h = rms_norm(x, f"{prefix}.post_attention_layernorm")
        gate = linear(h, f"{prefix}.mlp.gate_proj").astype(f32)
        activated = (gate / (1 + jnp.exp(-gate))).astype(dtype)
        x = x + linear(activated * linear(h, f"{prefix}.mlp.up_proj"), f"{prefix}.mlp.down_proj")
    return linear(rms_norm(x[:, -1:] if last_only else x, "model.norm"), "lm_head")


def logits_function(config, invariant: bool = True, last_only: bool = False):
    """`logits` for this config, through the batch-invariant transformation (or not), jitted with XLA's excess
    precision off."""
    import jax

    from batch_invariant.jax_mode import batch_invariant

    function = functools.partial(logits, config=config, last_only=last_only)
    return jax.jit(batch_invariant(function) if invariant else function,
                   compiler_options={"xla_allow_excess_precision": False})
