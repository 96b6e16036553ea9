"""A decode-step attention kernel for the torch engine, plugged in through transformers' AttentionInterface.

The decode batch hands the model keys and values as views into preallocated cache buffers
(``torch_batch``). On CPU, ``scaled_dot_product_attention`` with one query token per row is
slow on such strided views; two batched matmuls and a softmax are faster (measured about
1.5x on a whole forward of the 1M-parameter benchmark model together with the buffered
cache). Prefill (more than one query token), and any call with extras this kernel does not
implement (soft-capping, attention sinks, sliding windows, position biases), go to the
stock ``sdpa`` function unchanged, so results are the same up to float rounding.

``use_decode_attention(model)`` switches a model that runs ``sdpa`` to this kernel; models
on another implementation (eager, flash) are left alone.

>>> import torch
>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> _ = torch.manual_seed(0)
>>> model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64,
...     num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa"))
>>> ids = torch.tensor([[3, 4, 5, 6]])
>>> full = model(ids).logits[:, -1]
>>> use_decode_attention(model)
True
>>> past = model(ids[:, :3], use_cache=True).past_key_values  # prefill: stock sdpa
>>> step = model(ids[:, 3:], past_key_values=past).logits[:, -1]  # one query token: this kernel
>>> bool(torch.allclose(step, full, atol=1e-5))
True
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "railgate_sdpa"
_UNSUPPORTED = ("softcap", "s_aux", "sinks", "position_bias", "sliding_window")


def decode_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Attention for one query token per row: [B, Hq, 1, D] against [B, Hkv, L, D] keys and values."""
    if query.shape[2] != 1 or dropout or any(kwargs.get(k) is not None for k in _UNSUPPORTED):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    b, hq, _, d = query.shape
    hkv = key.shape[1]
    # Grouped-query attention without repeating keys: the g query heads of a kv head form rows.
    q = query.reshape(b, hkv, hq // hkv, d)
    scores = torch.matmul(q, key.transpose(-1, -2))
    scores.mul_(scaling if scaling is not None else d**-0.5)
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores.masked_fill_(~attention_mask, torch.finfo(scores.dtype).min)
        else:
            scores.add_(attention_mask)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    out = torch.matmul(probs, value)  # [B, Hkv, g, D]
    return out.reshape(b, 1, hq, d), None


AttentionInterface.register(NAME, decode_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)


def use_decode_attention(model: torch.nn.Module) -> bool:
    """Switch ``model`` from ``sdpa`` to ``decode_attention``; return whether it was switched."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa" or not hasattr(model, "set_attn_implementation"):
        return False
    model.set_attn_implementation(NAME)
    return getattr(model.config, "_attn_implementation", None) == NAME
