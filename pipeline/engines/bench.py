"""Sampling throughput: an engine streaming every request at once versus transformers ``generate``.

``bench_engine`` launches ``len(prompts) * group_size`` requests concurrently, reads every
stream to its end and counts the response tokens; ``bench_hf_generate`` samples the same
prompts with ``model.generate(do_sample=True, num_return_sequences=group_size)`` in one
left-padded batch and counts response tokens up to and including the first end-of-sequence
token. Both report ``tokens_per_s`` over wall time. Run a warm-up call of each first: the
first forward of a process pays one-off costs.

    python -m pipeline.engines.bench --hidden 128 --layers 2 --prompts 16 --group 8 --max-tokens 32

>>> import anyio, torch
>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> from pipeline.engines.torch_engine import TorchEngine
>>> _ = torch.manual_seed(0)
>>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
...     num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=64))
>>> prompts = [[5, 6, 7], [8, 9]]
>>> hf = bench_hf_generate(model, prompts, group_size=2, max_tokens=4, temperature=1.0, eos_id=None)
>>> eng = anyio.run(bench_engine, TorchEngine(model, None), prompts, 2, 4, 1.0)
>>> hf["tokens"], eng["tokens"]
(16, 16)
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import anyio
import torch

from pipeline.types import Prompt, SampleFinished, SampleRequest, SamplingParams

PromptLike = Prompt | Sequence[int]


def _as_prompt(i: int, p: PromptLike) -> Prompt:
    return p if isinstance(p, Prompt) else Prompt(prompt_id=i, text="", token_ids=tuple(int(t) for t in p))


async def bench_engine(
    engine, prompts: Sequence[PromptLike], group_size: int, max_tokens: int, temperature: float, *, seed: int = 0
) -> dict:
    """Stream ``group_size`` samples of every prompt through ``engine`` at once; tokens/s of the lot."""
    requests = [
        SampleRequest(
            request_id=f"bench{seed}.p{i}.s{j}", group_id=i, sample_index=j, prompt=_as_prompt(i, p),
            params=SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed),
        )
        for i, p in enumerate(prompts)
        for j in range(group_size)
    ]
    tokens = 0
    events = 0

    async def consume(req: SampleRequest) -> None:
        nonlocal tokens, events
        async for ev in engine.stream(req):
            events += 1
            if isinstance(ev, SampleFinished):
                tokens += ev.num_tokens

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for req in requests:
            tg.start_soon(consume, req)
    seconds = time.perf_counter() - start
    return {"samples": len(requests), "tokens": tokens, "events": events, "seconds": seconds, "tokens_per_s": tokens / seconds}


def bench_hf_generate(
    model, prompts: Sequence[PromptLike], group_size: int, max_tokens: int, temperature: float, *, eos_id: int | None = None
) -> dict:
    """Sample ``group_size`` responses of every prompt with one ``model.generate`` call; tokens/s."""
    ids = [list(_as_prompt(i, p).token_ids) for i, p in enumerate(prompts)]
    width = max(len(x) for x in ids)
    device = next(model.parameters()).device
    input_ids = torch.tensor([[0] * (width - len(x)) + x for x in ids], device=device)
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids], device=device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=input_ids, attention_mask=mask, do_sample=True, num_return_sequences=group_size,
            max_new_tokens=max_tokens, temperature=temperature, top_p=1.0, top_k=0,
            eos_token_id=eos_id, pad_token_id=0,
        )
    seconds = time.perf_counter() - start
    new = out[:, width:]
    if eos_id is None:
        tokens = new.numel()
    else:  # tokens up to and including the first end-of-sequence token of each row
        is_eos = new == eos_id
        first = torch.where(is_eos.any(-1), is_eos.float().argmax(-1) + 1, torch.full_like(is_eos[:, 0], new.shape[1], dtype=torch.long))
        tokens = int(first.sum())
    return {"samples": new.shape[0], "tokens": int(tokens), "seconds": seconds, "tokens_per_s": tokens / seconds}


def _build_model(hidden: int, layers: int, vocab: int, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    heads = max(1, hidden // 32)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=512,
    )
    return LlamaForCausalLM(config).eval()


def main(argv: Sequence[str] | None = None) -> dict:
    """Measure the torch engine against ``generate`` on a random Llama model; print and return the figures."""
    from pipeline.engines.torch_engine import TorchEngine

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=12)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--delta-tokens", type=int, default=1)
    ap.add_argument("--eos", type=int, default=-1, help="end-of-sequence id; -1: none (every sample runs max_tokens)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    eos = None if args.eos < 0 else args.eos
    model = _build_model(args.hidden, args.layers, args.vocab, seed=0).to(getattr(torch, args.dtype))
    gen = torch.Generator().manual_seed(1)
    prompts = [
        torch.randint(3, args.vocab, (args.prompt_len - i % 4,), generator=gen).tolist() for i in range(args.prompts)
    ]
    engine = TorchEngine(model, eos, dtype=args.dtype, delta_tokens=args.delta_tokens)
    hf, eng = [], []
    for r in range(args.repeats + 1):  # the first round is a warm-up
        hf.append(bench_hf_generate(model, prompts, args.group, args.max_tokens, args.temperature, eos_id=eos))
        eng.append(anyio.run(lambda: bench_engine(engine, prompts, args.group, args.max_tokens, args.temperature, seed=r)))
    hf_tps = max(x["tokens_per_s"] for x in hf[1:])
    eng_tps = max(x["tokens_per_s"] for x in eng[1:])
    params = sum(p.numel() for p in model.parameters())
    result = {"params": params, "hf_tokens_per_s": hf_tps, "engine_tokens_per_s": eng_tps, "ratio": eng_tps / hf_tps}
    print(
        f"{params / 1e6:.2f}M params, {args.dtype}, {args.threads} threads, {args.prompts}x{args.group}x{args.max_tokens}: "
        f"generate {hf_tps:,.0f} tok/s, torch engine {eng_tps:,.0f} tok/s, ratio {eng_tps / hf_tps:.2f}"
    )
    return result


if __name__ == "__main__":
    main()
