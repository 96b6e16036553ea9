"""Tiny real transformers models and request helpers shared by the torch engine's tests."""

from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from pipeline.types import Prompt, SampleRequest, SamplingParams

EOS = 2
GREEDY = 1e-5  # a temperature this small samples the argmax unless two logits tie within ~1e-4


def llama_config(
    vocab_size: int, hidden: int = 32, layers: int = 2, heads: int = 2, context: int = 64, **extra
) -> LlamaConfig:
    """The tests' tiny Llama shape: MLP width 2 x ``hidden``, as many key/value heads as heads;
    ``extra`` are further ``LlamaConfig`` fields."""
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=context,
        **extra,
    )


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    # peaked logits (initializer_range 0.2): no near-ties for greedy parity
    return LlamaForCausalLM(llama_config(64, initializer_range=0.2)).eval()


def tiny_gpt2(seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=64,
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_positions=64,
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=EOS,
    )
    return GPT2LMHeadModel(config).eval()


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
