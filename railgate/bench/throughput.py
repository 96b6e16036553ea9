"""Sampling throughput: an engine streaming every request at once versus transformers' own samplers.

``bench_engine`` launches ``len(prompts) * group_size`` requests concurrently, reads every
stream to its end and counts the response tokens; ``bench_hf_generate`` samples the same
prompts with ``model.generate(do_sample=True, num_return_sequences=group_size)`` in one
left-padded batch and counts response tokens up to and including the first end-of-sequence
token; ``HFContinuousBatching`` runs them through transformers' continuous batching
(``model.init_continuous_batching()``, its ``ContinuousBatchingManager``). All sample the same
workload (prompts, group size, max tokens, temperature, top-p 1, no top-k) and report
``tokens_per_s`` over wall time and ``tokens_per_cpu_s`` over the process's CPU time (all its
threads): on a machine shared with other work, wall time swings with the neighbours' load and
CPU time much less. The first call of each pays one-off costs, so ``main`` builds every
contender, runs a warm-up round and then takes turns, reporting medians and each figure's
ratio to the better transformers peer.

    python run.py bench engine --model project --threads 1     # the project's 0.4M GPT-2
    python run.py bench engine --model 30m --threads 1         # the same family at 31M parameters

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
            request_id=f"bench{seed}.p{i}.s{j}",
            group_id=i,
            sample_index=j,
            prompt=_as_prompt(i, p),
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
    model,
    prompts: Sequence[PromptLike],
    group_size: int,
    max_tokens: int,
    temperature: float,
    *,
    eos_id: int | None = None,
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
            input_ids=input_ids,
            attention_mask=mask,
            do_sample=True,
            num_return_sequences=group_size,
            max_new_tokens=max_tokens,
            temperature=temperature,
            top_p=1.0,
            top_k=0,
            eos_token_id=eos_id,
            pad_token_id=0,
        )
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    new = out[:, width:]
    if eos_id is None:
        tokens = new.numel()
    else:  # tokens up to and including the first end-of-sequence token of each row
        is_eos = new == eos_id
        first = torch.where(
            is_eos.any(-1), is_eos.float().argmax(-1) + 1, torch.full_like(is_eos[:, 0], new.shape[1], dtype=torch.long)
        )
        tokens = int(first.sum())
    return _figures(new.shape[0], int(tokens), seconds, cpu)


class HFContinuousBatching:
    """transformers' own continuous batching (``model.init_continuous_batching()``) on one workload shape.

    The manager is built once, sized to the workload (a paged KV cache with room for every
    sample at once, so nothing is evicted or queued for cache), started, and reused by each
    ``run``, as the torch engine is: its start-up is not timed. Every prompt is one request
    with ``num_return_sequences=group_size``: the manager prefills the prompt once and forks
    the group's members from it (block sharing), as the torch engine copies a sibling's cache.
    Requests are not streamed (``streaming=False``: the peer's fastest mode; each result
    arrives once its sample ends). ``close`` stops the manager's generation thread.

    On CPU the manager runs its ``sdpa`` paged path (no flash attention, no CUDA graphs): each
    step gathers every resident sample's cache into one packed key/value tensor and attends
    with a ``[tokens, all cached tokens]`` mask, so a decode step costs the batch size times
    the whole batch's context, where ``generate`` and the torch engine cost the batch size
    times one row's context.
    """

    def __init__(
        self,
        model,
        group_size: int,
        max_tokens: int,
        temperature: float,
        *,
        eos_id: int | None,
        max_prompt_len: int,
        num_prompts: int,
        page_size: int = 16,
        seed: int = 0,
    ):
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        requests = num_prompts * group_size
        pages = -(-(max_prompt_len + max_tokens + 1) // page_size) + 1
        self.group_size, self.max_tokens = group_size, max_tokens
        gen = GenerationConfig(
            do_sample=True,
            temperature=temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_tokens,
            num_return_sequences=group_size,
            eos_token_id=-1 if eos_id is None else eos_id,
            pad_token_id=0,
        )
        cb = ContinuousBatchingConfig(
            page_size=page_size,
            num_blocks=requests * pages,
            max_requests_per_batch=requests,
            max_batch_tokens=max(requests, num_prompts * max_prompt_len),
            seed=seed,
        )
        self.manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
        self.manager.start()

    def run(self, prompts: Sequence[PromptLike], timeout_s: float = 600.0) -> dict:
        """Sample ``group_size`` responses of every prompt; tokens/s of the lot."""
        ids = [list(_as_prompt(i, p).token_ids) for i, p in enumerate(prompts)]
        want = len(ids) * self.group_size
        start, cpu = time.perf_counter(), time.process_time()
        self.manager.add_requests(ids, max_new_tokens=self.max_tokens)
        done = tokens = 0
        while done < want:
            out = self.manager.get_result(timeout=timeout_s)
            if out is None:
                raise RuntimeError(f"continuous batching returned {done} of {want} samples within {timeout_s:g} s")
            if out.error is not None:
                raise RuntimeError(f"continuous batching failed a request: {out.error}")
            if out.is_finished():
                done += 1
                tokens += len(out.generated_tokens)
        return _figures(want, tokens, time.perf_counter() - start, time.process_time() - cpu)

    def close(self) -> None:
        self.manager.stop(block=True)


def _figures(samples: int, tokens: int, seconds: float, cpu_seconds: float, **extra) -> dict:
    return {
        "samples": samples,
        "tokens": tokens,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "tokens_per_s": tokens / seconds,
        "tokens_per_cpu_s": tokens / max(cpu_seconds, 1e-9),
        **extra,
    }


PRESETS = {
    # The project's policy: pipeline.policy.models.build_model with the default model settings and the
    # arithmetic task's character vocabulary (0.45M parameters).
    "project": {"arch": "project", "hidden": 128, "layers": 2, "heads": 4, "max_len": 64},
    # The same family (GPT-2, same vocabulary) at about 30M parameters.
    "30m": {"arch": "project", "hidden": 512, "layers": 10, "heads": 8, "max_len": 512},
}


def _project_vocab() -> tuple[int, int]:
    """(vocab size, end-of-sequence id) of the project's model on the default task."""
    from pipeline.policy.tokenizer import CharTokenizer
    from pipeline.tasks import TaskConfig, build_task

    tok = CharTokenizer.for_tasks(build_task(TaskConfig()))
    return tok.vocab_size, tok.eos_id


def _build_model(
    arch: str, hidden: int, layers: int, vocab: int, seed: int, *, heads: int | None = None, max_len: int = 512
):
    """``pipeline.policy.models.build_model`` in eval mode: ``project`` is the project's GPT-2
    (pad id 0), ``gpt2`` the same without a pad token, ``llama`` a Llama of the same shape."""
    from pipeline.policy.models import build_model

    heads = heads or max(1, hidden // 32)
    pad = 0 if arch == "project" else None
    family = "gpt2" if arch == "project" else arch
    return build_model(vocab, hidden, layers, heads, max_len, seed=seed, pad_id=pad, arch=family).eval()


def _close(contender) -> None:
    if hasattr(contender, "close"):
        contender.close()
    elif hasattr(contender, "aclose"):
        anyio.run(contender.aclose)


def _interleaved(contenders: dict[str, tuple], rounds: int) -> dict[str, list[dict]]:
    """Build every contender, run one untimed warm-up round, then ``rounds`` rounds taking turns.

    Taking turns spreads a shared machine's swings in load over every contender alike.
    """
    built: dict[str, object] = {}
    try:
        for k, (make, _) in contenders.items():
            built[k] = make()
        runs: dict[str, list[dict]] = {k: [] for k in contenders}
        for r in range(rounds + 1):  # round 0 is the warm-up
            for k, (_, run) in contenders.items():
                figures = run(built[k])
                if r:
                    runs[k].append(figures)
        return runs
    finally:
        for contender in built.values():
            _close(contender)


def add_workload_args(ap: argparse.ArgumentParser) -> None:
    """The options engine benchmarks share: a built model's shape and the sampling workload."""
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)


def main(argv: Sequence[str] | None = None) -> dict:
    """Measure the torch engine against ``generate`` and continuous batching; print and return the figures."""
    import copy
    import statistics

    from pipeline.engines.torch_engine import TorchEngine

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--model",
        choices=(*PRESETS, "custom"),
        default="project",
        help="project: the project's 0.45M GPT-2; 30m: the same family at 31M parameters; "
        "custom: --arch/--hidden/--layers/--vocab",
    )
    ap.add_argument("--arch", choices=("llama", "gpt2"), default="llama")
    add_workload_args(ap)
    ap.add_argument("--prompt-len", type=int, default=12)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--delta-tokens", type=int, nargs="+", default=[1, 4])
    ap.add_argument(
        "--peers",
        nargs="+",
        choices=("generate", "continuous"),
        default=["generate", "continuous"],
        help="transformers baselines: generate (one padded batch), continuous (ContinuousBatchingManager)",
    )
    ap.add_argument("--eos", type=int, default=-1, help="end-of-sequence id; -1: none (every sample runs max_tokens)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    eos = None if args.eos < 0 else args.eos
    if args.model == "custom":
        arch, hidden, layers, heads, max_len, vocab = args.arch, args.hidden, args.layers, None, 512, args.vocab
    else:
        preset = PRESETS[args.model]
        arch, hidden, layers, heads, max_len = (preset[k] for k in ("arch", "hidden", "layers", "heads", "max_len"))
        vocab = _project_vocab()[0]
    if args.prompt_len + args.max_tokens > max_len:
        ap.error(
            f"--prompt-len {args.prompt_len} + --max-tokens {args.max_tokens} exceeds the model's "
            f"context of {max_len} tokens; lower one of them"
        )  # exit status 2
    model = _build_model(arch, hidden, layers, vocab, seed=0, heads=heads, max_len=max_len).to(
        getattr(torch, args.dtype)
    )
    gen = torch.Generator().manual_seed(1)
    prompts = [
        torch.randint(3, vocab, (max(1, args.prompt_len - i % 4),), generator=gen).tolist() for i in range(args.prompts)
    ]
    work = (args.group, args.max_tokens, args.temperature)
    # Each contender on its own copy of the model (the engine re-wires its copy; continuous
    # batching switches its copy's attention implementation); generate runs the stock model.
    contenders: dict[str, tuple] = {}
    if "generate" in args.peers:
        contenders["generate"] = (lambda: model, lambda m: bench_hf_generate(m, prompts, *work, eos_id=eos))
    if "continuous" in args.peers:
        contenders["continuous batching"] = (
            lambda: HFContinuousBatching(
                copy.deepcopy(model), *work, eos_id=eos, max_prompt_len=max(map(len, prompts)), num_prompts=len(prompts)
            ),
            lambda c: c.run(prompts),
        )
    for d in args.delta_tokens:
        contenders[f"engine(delta_tokens={d})"] = (
            lambda d=d: TorchEngine(copy.deepcopy(model), eos, dtype=args.dtype, delta_tokens=d),
            lambda e: anyio.run(bench_engine, e, prompts, *work),
        )
    runs = _interleaved(contenders, args.rounds)
    med = {
        k: {m: statistics.median(x[m] for x in v) for m in ("tokens_per_s", "tokens_per_cpu_s")}
        for k, v in runs.items()
    }
    params = sum(p.numel() for p in model.parameters())
    name = {"project": "the project's GPT-2", "30m": "GPT-2 (project family)"}.get(args.model, arch)
    print(
        f"{name} {params / 1e6:.2f}M params, {args.dtype}, {args.threads} threads, "
        f"{args.prompts} prompts x {args.group} samples x {args.max_tokens} tokens, median of {args.rounds} rounds"
    )
    peers = [k for k in med if not k.startswith("engine")]
    best = {m: max((med[k][m] for k in peers), default=float("nan")) for m in ("tokens_per_s", "tokens_per_cpu_s")}
    for k, m in med.items():
        print(
            f"  {k:24s} {m['tokens_per_s']:9,.0f} tok/s  ({m['tokens_per_s'] / best['tokens_per_s']:.2f}x)   "
            f"{m['tokens_per_cpu_s']:9,.0f} tok/cpu-s  ({m['tokens_per_cpu_s'] / best['tokens_per_cpu_s']:.2f}x)"
        )
    print("  (ratios against the better transformers peer of each column)")
    return {"params": params, "median": med, "runs": runs, "best_peer": best}


if __name__ == "__main__":
    main()
