"""Decode-step attention for the torch engine: two matmuls instead of SDPA for a single query token.

A decode step asks attention for one query token per row over a short, left-padded cache.
PyTorch's CPU ``scaled_dot_product_attention`` runs its flash kernel for that shape, which
tiles for long queries and costs about twice a plain ``softmax(q k^T / sqrt(d) + mask) v``
there (measured on this project's 2-core CPU: 128 rows x 4 heads x 44 columns x 32 dims,
1.0 ms against 0.45 ms; the result agrees to ~1e-7). ``decode_attention`` computes that for
one-token queries without gradients and hands every other call (prefills, training, dropout,
soft-capped or sliding-window models) to transformers' own SDPA function unchanged.

``use_decode_attention(model)`` registers it under ``"railgate_decode"`` (with SDPA's mask
builder) and switches a model that uses ``"sdpa"`` to it; models on another implementation
(eager, flash) are left as they are. The torch engine does this to the copy it owns.

>>> import torch
>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> _ = torch.manual_seed(0)
>>> model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64,
...     num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)).eval()
>>> ids = torch.tensor([[3, 4, 5, 6]])
>>> with torch.inference_mode():
...     before = model(ids).logits
...     switched = use_decode_attention(model)
...     after = model(ids).logits
>>> switched, model.config._attn_implementation, bool(torch.allclose(before, after, atol=1e-6))
(True, 'railgate_decode', True)
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "railgate_decode"
_UNSUPPORTED = ("softcap", "sliding_window", "s_aux")  # features only the model's own kernels implement


def decode_attention(
    module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None, **kwargs
):
    """Attention with transformers' interface: ``[batch, heads, q, dim]`` in, ``[batch, q, heads, dim]`` out."""
    if (
        query.shape[2] != 1
        or dropout
        or torch.is_grad_enabled()
        or query.shape[-1] != value.shape[-1]
        or any(kwargs.get(k) is not None for k in _UNSUPPORTED)
        or (attention_mask is not None and (attention_mask.dim() != 4 or attention_mask.shape[1] != 1))
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    b, heads, _, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    scale = dim**-0.5 if scaling is None else scaling
    # Grouped-query attention without repeating the cache: the query heads of one KV head form its rows.
    q = query.reshape(b, kv_heads, heads // kv_heads, dim)
    weights = torch.matmul(q, key.transpose(-1, -2))
    weights.mul_(scale)
    if attention_mask is not None:
        mask = attention_mask[:, :, :, :length]
        if mask.dtype == torch.bool:
            weights.masked_fill_(~mask, torch.finfo(weights.dtype).min)
        else:
            weights.add_(mask)
    out = torch.matmul(torch.softmax(weights, dim=-1), value)  # [b, kv_heads, group, dim]
    return out.reshape(b, 1, heads, dim), None


def use_decode_attention(model: torch.nn.Module) -> bool:
    """Switch ``model`` from ``"sdpa"`` to ``decode_attention``; True if it was switched."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    AttentionInterface.register(NAME, decode_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
    return True
