"""A lean decode step for GPT-2 models (the project's own policy), straight from the model's weights.

A decode step of a small model is mostly Python: ``GPT2LMHeadModel.forward`` goes through
output-capturing wrappers, mask preparation, cache objects and ~15 module calls per layer,
about 2 ms per step on this project's CPU whatever the batch size, a quarter of a 128-row
step of the 0.4M-parameter default model. ``GPT2Decode`` computes the same step with the
same torch operations on the same parameter tensors (``Conv1D`` is ``addmm``, the attention
is ``torch_attention``'s two matmuls over the batch's KV buffers) and writes the new keys
and values into those buffers itself. It reads the parameters at every call, so in-place
weight updates (``load_state_dict``) apply at once.

``GPT2Decode.supports(model)`` says whether a model is a plain ``GPT2LMHeadModel`` this
path reproduces (no cross-attention, no reordered/upcast attention); every other model runs
its own ``forward``.

>>> import torch
>>> from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel
>>> _ = torch.manual_seed(0)
>>> model = GPT2LMHeadModel(GPT2Config(vocab_size=16, n_embd=16, n_layer=2, n_head=2, n_positions=16,
...     bos_token_id=1, eos_token_id=2)).eval()
>>> ids = torch.tensor([[3, 4, 5, 6]])
>>> with torch.inference_mode():
...     cache = DynamicCache()
...     want = model(ids, past_key_values=cache, use_cache=True).logits[:, -1]
...     keys = [torch.zeros(1, 2, 8, 8) for _ in range(2)]
...     values = [torch.zeros(1, 2, 8, 8) for _ in range(2)]
...     for i, layer in enumerate(cache.layers):  # the prompt's first 3 tokens, as the engine keeps them
...         keys[i][:, :, :3], values[i][:, :, :3] = layer.keys[:, :, :3], layer.values[:, :, :3]
...     mask = torch.zeros(1, 1, 1, 8)
...     mask[..., 4:] = torch.finfo(torch.float32).min
...     got = GPT2Decode(model)(torch.tensor([6]), torch.tensor([3]), keys, values, 3, mask)
>>> GPT2Decode.supports(model), bool(torch.allclose(got, want, atol=1e-5))
(True, True)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class GPT2Decode:
    """One decode step of a ``GPT2LMHeadModel``; see the module docstring."""

    def __init__(self, model: torch.nn.Module):
        if not self.supports(model):
            raise ValueError(f"{type(model).__name__} is not a plain GPT2LMHeadModel; run its own forward instead")
        self.model = model
        config = model.config
        self.heads = config.n_head
        self.dim = config.n_embd // config.n_head

    @staticmethod
    def supports(model: torch.nn.Module) -> bool:
        if (
            type(model).__name__ != "GPT2LMHeadModel"
            or type(model).__module__ != "transformers.models.gpt2.modeling_gpt2"
        ):
            return False
        config = model.config
        return not config.add_cross_attention and not config.reorder_and_upcast_attn

    def __call__(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        length: int,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """Logits ``[rows, vocab]`` of one token per row; writes its keys and values into column ``length``.

        ``ids``, ``positions``: ``[rows]``; ``keys``/``values``: per layer ``[rows, heads, capacity,
        head_dim]``; ``mask``: additive ``[rows, 1, 1, capacity]`` that already shows column ``length``.
        """
        t = self.model.transformer
        rows, heads, dim = ids.shape[0], self.heads, self.dim
        width = heads * dim
        h = F.embedding(ids, t.wte.weight) + F.embedding(positions, t.wpe.weight)
        for block, k_buf, v_buf in zip(t.h, keys, values):
            attn, mlp = block.attn, block.mlp
            x = F.layer_norm(h, (width,), block.ln_1.weight, block.ln_1.bias, block.ln_1.eps)
            q, k, v = torch.addmm(attn.c_attn.bias, x, attn.c_attn.weight).split(width, dim=1)
            k_buf[:, :, length] = k.view(rows, heads, dim)
            v_buf[:, :, length] = v.view(rows, heads, dim)
            w = torch.matmul(q.view(rows, heads, 1, dim), k_buf.transpose(-1, -2))
            w.mul_(attn.scaling).add_(mask)
            o = torch.matmul(torch.softmax(w, dim=-1), v_buf).view(rows, width)
            h = h + torch.addmm(attn.c_proj.bias, o, attn.c_proj.weight)
            x = F.layer_norm(h, (width,), block.ln_2.weight, block.ln_2.bias, block.ln_2.eps)
            x = mlp.act(torch.addmm(mlp.c_fc.bias, x, mlp.c_fc.weight))
            h = h + torch.addmm(mlp.c_proj.bias, x, mlp.c_proj.weight)
        h = F.layer_norm(h, (width,), t.ln_f.weight, t.ln_f.bias, t.ln_f.eps)
        return self.model.lm_head(h)
