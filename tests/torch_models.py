"""Tiny real transformers models and request helpers shared by the torch engine's tests."""

from __future__ import annotations

import torch
from transformers import GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from pipeline.policy.models import build_model, model_config
from pipeline.types import Prompt, SampleRequest, SamplingParams

EOS = 2
GREEDY = 1e-5  # a temperature this small samples the argmax unless two logits tie within ~1e-4


def llama_config(
    vocab_size: int, hidden: int = 32, layers: int = 2, heads: int = 2, context: int = 64, **extra
) -> LlamaConfig:
    """The tests' tiny Llama shape (``pipeline.policy.models.model_config``): MLP width 2 x
    ``hidden``, as many key/value heads as heads, no pad token; ``extra`` are further
    ``LlamaConfig`` fields."""
    return model_config(vocab_size, hidden, layers, heads, context, None, arch="llama", mlp_ratio=2, **extra)


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    # peaked logits (initializer_range 0.2): no near-ties for greedy parity
    return tiny_model("llama", seed)


def tiny_gpt2(seed: int = 0) -> GPT2LMHeadModel:
    return tiny_model("gpt2", seed)


def tiny_model(arch: str, seed: int = 0):
    """``pipeline.policy.models.build_model``'s ``arch`` at the engine tests' shape: vocabulary
    64, width 32, 2 layers, 2 heads, context 64, peaked logits; seeded, in eval mode."""
    mlp = 2 if arch == "llama" else 4
    return build_model(64, 32, 2, 2, 64, seed=seed, pad_id=None, initializer_range=0.2, arch=arch, mlp_ratio=mlp).eval()


def request(rid: str, tokens, *, max_tokens=12, temperature=GREEDY, top_p=1.0, seed=0, branch=None) -> SampleRequest:
    prompt = Prompt(prompt_id=0, text="", token_ids=tuple(tokens))
    params = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=seed)
    return SampleRequest(rid, group_id=0, sample_index=0, prompt=prompt, params=params, branch=branch)


async def collect(engine, req) -> list:
    return [ev async for ev in engine.stream(req)]


def greedy_reference(model, tokens, max_tokens) -> list[int]:
    ids = torch.tensor([list(tokens)])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_tokens,
        eos_token_id=EOS,
        pad_token_id=0,
    )
    return out[0, len(tokens) :].tolist()


PROMPTS = [(5, 6, 7), (9, 10, 11, 12, 13, 14, 15, 16, 17), (20,), (30, 31, 32, 33, 34, 35)]
