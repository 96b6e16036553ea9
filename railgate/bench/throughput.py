"""Sampling throughput: an engine streaming every request at once versus transformers ``generate``.

``bench_engine`` launches ``len(prompts) * group_size`` requests concurrently, reads every
stream to its end and counts the response tokens; ``bench_hf_generate`` samples the same
prompts with ``model.generate(do_sample=True, num_return_sequences=group_size)`` in one
left-padded batch and counts response tokens up to and including the first end-of-sequence
token. Both report ``tokens_per_s`` over wall time and ``tokens_per_cpu_s`` over the
process's CPU time (all its threads): on a machine shared with other work, wall time swings
with the neighbours' load and CPU time much less. The first call of each pays one-off costs,
so ``main`` runs a warm-up round and then interleaves the two, reporting medians.

    python -m railgate.bench.throughput --hidden 128 --layers 2 --prompts 16 --group 8 --max-tokens 32

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

    start, cpu = time.perf_counter(), time.process_time()
    async with anyio.create_task_group() as tg:
        for req in requests:
            tg.start_soon(consume, req)
    return _figures(len(requests), tokens, time.perf_counter() - start, time.process_time() - cpu, events=events)


def bench_hf_generate(
    model, prompts: Sequence[PromptLike], group_size: int, max_tokens: int, temperature: float, *, eos_id: int | None = None
) -> dict:
    """Sample ``group_size`` responses of every prompt with one ``model.generate`` call; tokens/s."""
    ids = [list(_as_prompt(i, p).token_ids) for i, p in enumerate(prompts)]
    width = max(len(x) for x in ids)
    device = next(model.parameters()).device
    input_ids = torch.tensor([[0] * (width - len(x)) + x for x in ids], device=device)
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids], device=device)
    start, cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        out = model.generate(
            input_ids=input_ids, attention_mask=mask, do_sample=True, num_return_sequences=group_size,
            max_new_tokens=max_tokens, temperature=temperature, top_p=1.0, top_k=0,
            eos_token_id=eos_id, pad_token_id=0,
        )
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    new = out[:, width:]
    if eos_id is None:
        tokens = new.numel()
    else:  # tokens up to and including the first end-of-sequence token of each row
        is_eos = new == eos_id
        first = torch.where(is_eos.any(-1), is_eos.float().argmax(-1) + 1, torch.full_like(is_eos[:, 0], new.shape[1], dtype=torch.long))
        tokens = int(first.sum())
    return _figures(new.shape[0], int(tokens), seconds, cpu)


def _figures(samples: int, tokens: int, seconds: float, cpu_seconds: float, **extra) -> dict:
    return {
        "samples": samples, "tokens": tokens, "seconds": seconds, "cpu_seconds": cpu_seconds,
        "tokens_per_s": tokens / seconds, "tokens_per_cpu_s": tokens / max(cpu_seconds, 1e-9), **extra,
    }


def _build_model(arch: str, hidden: int, layers: int, vocab: int, seed: int):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    heads = max(1, hidden // 32)
    if arch == "gpt2":
        config = GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads, n_positions=512,
                            bos_token_id=1, eos_token_id=2)
        return GPT2LMHeadModel(config).eval()
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=512,
    )
    return LlamaForCausalLM(config).eval()


def main(argv: Sequence[str] | None = None) -> dict:
    """Measure the torch engine against ``generate`` on a random model; print and return the figures."""
    import copy
    import statistics

    from pipeline.engines.torch_engine import TorchEngine

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", choices=("llama", "gpt2"), default="llama")
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
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--delta-tokens", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--eos", type=int, default=-1, help="end-of-sequence id; -1: none (every sample runs max_tokens)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    eos = None if args.eos < 0 else args.eos
    model = _build_model(args.arch, args.hidden, args.layers, args.vocab, seed=0).to(getattr(torch, args.dtype))
    gen = torch.Generator().manual_seed(1)
    prompts = [
        torch.randint(3, args.vocab, (max(1, args.prompt_len - i % 4),), generator=gen).tolist() for i in range(args.prompts)
    ]
    # Each engine owns (and re-wires) its own copy; generate runs the stock model.
    engines = {f"engine(delta_tokens={d})": TorchEngine(copy.deepcopy(model), eos, dtype=args.dtype, delta_tokens=d)
               for d in args.delta_tokens}
    runs: dict[str, list[dict]] = {"generate": [], **{k: [] for k in engines}}
    for r in range(args.rounds + 1):  # round 0 is a warm-up
        hf = bench_hf_generate(model, prompts, args.group, args.max_tokens, args.temperature, eos_id=eos)
        eng = {k: anyio.run(bench_engine, e, prompts, args.group, args.max_tokens, args.temperature) for k, e in engines.items()}
        if r:
            runs["generate"].append(hf)
            for k, v in eng.items():
                runs[k].append(v)
    med = {k: {m: statistics.median(x[m] for x in v) for m in ("tokens_per_s", "tokens_per_cpu_s")} for k, v in runs.items()}
    params = sum(p.numel() for p in model.parameters())
    print(f"{args.arch} {params / 1e6:.2f}M params, {args.dtype}, {args.threads} threads, "
          f"{args.prompts} prompts x {args.group} samples x {args.max_tokens} tokens, median of {args.rounds} rounds")
    base = med["generate"]
    for k, m in med.items():
        print(f"  {k:24s} {m['tokens_per_s']:9,.0f} tok/s  ({m['tokens_per_s'] / base['tokens_per_s']:.2f}x)   "
              f"{m['tokens_per_cpu_s']:9,.0f} tok/cpu-s  ({m['tokens_per_cpu_s'] / base['tokens_per_cpu_s']:.2f}x)")
    return {"params": params, "median": med, "runs": runs}


if __name__ == "__main__":
    main()
