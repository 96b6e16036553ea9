"""The torch engine's decode-step attention agrees with transformers' SDPA and steps aside where it must."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from pipeline.engines.torch_attention import NAME, decode_attention, use_decode_attention


class _Module(torch.nn.Module):
    is_causal = True

    def __init__(self, kv_groups: int):
        super().__init__()
        self.num_key_value_groups = kv_groups


def _inputs(batch=5, heads=4, kv_heads=2, length=9, dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, 1, dim, generator=g)
    k = torch.randn(batch, kv_heads, length, dim, generator=g)
    v = torch.randn(batch, kv_heads, length, dim, generator=g)
    start = torch.tensor([0, 3, 1, 8, 2])[:batch]
    cols = torch.arange(length)
    mask = torch.zeros(batch, 1, 1, length).masked_fill_(
        cols < start[:, None, None, None], torch.finfo(torch.float32).min
    )
    return q, k, v, mask


def test_one_token_queries_match_sdpa_with_grouped_heads_and_left_padding():
    q, k, v, mask = _inputs()
    module = _Module(kv_groups=2)
    with torch.inference_mode():
        got, _ = decode_attention(module, q, k, v, mask, scaling=0.3)
        want, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.3)
    assert got.shape == want.shape == (5, 1, 4, 8)
    assert torch.allclose(got, want, atol=1e-6)


def test_a_boolean_mask_means_the_same_as_the_additive_one():
    q, k, v, mask = _inputs(kv_heads=4)
    with torch.inference_mode():
        additive, _ = decode_attention(_Module(1), q, k, v, mask)
        boolean, _ = decode_attention(_Module(1), q, k, v, mask == 0)
    assert torch.allclose(additive, boolean, atol=1e-6)


def test_prefills_and_gradients_go_to_sdpa(monkeypatch):
    import pipeline.engines.torch_attention as mod

    calls = []
    monkeypatch.setattr(mod, "sdpa_attention_forward", lambda *a, **kw: calls.append(a[1].shape) or ("sdpa", None))
    q, k, v, mask = _inputs()
    long_q = torch.randn(5, 4, 3, 8)
    with torch.inference_mode():
        assert decode_attention(_Module(2), long_q, k, v, None)[0] == "sdpa"  # a prefill
        assert decode_attention(_Module(2), q, k, v, mask, softcap=30.0)[0] == "sdpa"  # a feature it lacks
    assert decode_attention(_Module(2), q, k, v, mask)[0] == "sdpa"  # gradients on: a learner's forward
    assert len(calls) == 3


def test_only_sdpa_models_are_switched():
    def config():
        return GPT2Config(vocab_size=16, n_embd=16, n_layer=1, n_head=2, n_positions=16, bos_token_id=1, eos_token_id=2)

    sdpa = GPT2LMHeadModel(config()).eval()
    eager = GPT2LMHeadModel(config()).eval()
    eager.set_attn_implementation("eager")
    assert use_decode_attention(sdpa) and sdpa.config._attn_implementation == NAME
    assert not use_decode_attention(eager) and eager.config._attn_implementation == "eager"
