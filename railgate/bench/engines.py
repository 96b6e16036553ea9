"""Engine benchmarks: the vllm engine against raw ``AsyncLLM``, and Ray replicas.

``bench_vllm`` streams the same requests (``prompts x group`` samples, one request each,
every sample running ``max_tokens``) through ``VllmEngine`` and straight through its
``AsyncLLM`` (``generate`` with the same sampling parameters), alternating rounds in one
run on one engine, and reports the medians and their ratio (target >= 0.95).

``bench_ray`` runs the torch engine in one and in two Ray replicas (one torch thread each)
on the same workload, alternating rounds, and measures the Ray hop's per-request overhead:
the median latency of a 1-token request through a 1-replica pool minus the same request on
an in-process torch engine. Figures come with the load average, since the machine is shared.

    python -m railgate.bench.engines vllm --prompts 16 --group 8 --max-tokens 32
    python -m railgate.bench.engines ray --prompts 16 --group 8 --max-tokens 32
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from pipeline.types import Prompt, SampleRequest, SamplingParams
from railgate.bench.throughput import add_workload_args, bench_engine


def _prompts(n: int, vocab: int, length: int = 8, seed: int = 0) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[1] + [rng.randrange(3, vocab) for _ in range(length - i % 3)] for i in range(n)]


async def raw_asyncllm(
    llm, prompts: Sequence[Sequence[int]], group_size: int, max_tokens: int, temperature: float, tag: str
) -> dict:
    """The same workload straight through ``AsyncLLM.generate``: one request per sample, deltas read as they come."""
    from vllm.inputs.engine import tokens_input
    from vllm.sampling_params import RequestOutputKind
    from vllm.sampling_params import SamplingParams as VllmParams

    params = VllmParams(
        n=1,
        temperature=temperature,
        max_tokens=max_tokens,
        logprobs=0,
        output_kind=RequestOutputKind.DELTA,
        detokenize=False,
        skip_special_tokens=False,
        ignore_eos=True,
    )
    tokens = 0

    async def one(rid: str, ids: Sequence[int]) -> None:
        nonlocal tokens
        async for out in llm.generate(tokens_input(list(ids), cache_salt="railgate-policy-v0"), params, rid):
            tokens += len(out.outputs[0].token_ids)

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i, ids in enumerate(prompts):
            for j in range(group_size):
                tg.start_soon(one, f"raw{tag}.p{i}.s{j}", ids)
    seconds = time.perf_counter() - start
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


async def bench_vllm(
    engine, prompts, group_size: int, max_tokens: int, temperature: float = 1.0, rounds: int = 5
) -> dict[str, Any]:
    """Median tokens/s of ``VllmEngine`` and of its raw ``AsyncLLM`` on the same requests (first round: warm-up).

    The engine must be unseeded (``seed=None``) and have ``eos_id=None`` so both paths sample
    alike and every sample runs ``max_tokens``.
    """
    if engine.seed is not None or engine.eos_id is not None:
        raise ValueError(
            "bench_vllm needs VllmEngine(..., seed=None, eos_id=None): both paths must sample the same way"
        )
    ours, raw = [], []
    for r in range(rounds + 1):
        a = await bench_engine(engine, prompts, group_size, max_tokens, temperature, seed=r)
        b = await raw_asyncllm(engine.llm, prompts, group_size, max_tokens, temperature, tag=str(r))
        if r:
            ours.append(a["tokens_per_s"])
            raw.append(b["tokens_per_s"])
    e, w = statistics.median(ours), statistics.median(raw)
    return {
        "engine_tokens_per_s": e,
        "raw_tokens_per_s": w,
        "ratio": e / w,
        "rounds": rounds,
        "engine_all": ours,
        "raw_all": raw,
    }


async def _latency(engine, prompt: Sequence[int], n: int, tag: str) -> float:
    """Median seconds of one 1-token request, sent one after another."""
    times = []
    for i in range(n):
        req = SampleRequest(
            f"lat{tag}.{i}",
            group_id=i,
            sample_index=0,
            prompt=Prompt(0, "", tuple(prompt)),
            params=SamplingParams(max_tokens=1, seed=i),
        )
        t0 = time.perf_counter()
        async for _ in engine.stream(req):
            pass
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


async def bench_ray(
    model_dir: str | Path,
    prompts,
    group_size: int,
    max_tokens: int,
    rounds: int = 3,
    latency_n: int = 50,
    delta_tokens: int = 1,
) -> dict[str, Any]:
    """Torch engine in 1 vs 2 Ray replicas (tokens/s), and the Ray hop's per-request overhead (us).

    ``delta_tokens`` is the torch engines' fewest tokens per delta (the in-process one too).
    """
    import ray
    import torch
    from transformers import AutoModelForCausalLM

    from pipeline.engines.ray_engine import RayEngine
    from pipeline.engines.ray_replica import TorchEngineFactory
    from pipeline.engines.torch_engine import TorchEngine

    torch.set_num_threads(1)
    owns = not ray.is_initialized()
    if owns:
        ray.init(
            num_cpus=3,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}},
        )
    factory = TorchEngineFactory(str(model_dir), eos_id=None, engine_kwargs=(("delta_tokens", delta_tokens),))
    one, two = RayEngine(factory, replicas=1), RayEngine(factory, replicas=2)
    local = TorchEngine(AutoModelForCausalLM.from_pretrained(str(model_dir)), None, delta_tokens=delta_tokens)
    try:
        tps: dict[str, list[float]] = {"1": [], "2": [], "local": []}
        for r in range(rounds + 1):
            for key, eng in (("1", one), ("2", two), ("local", local)):
                res = await bench_engine(eng, prompts, group_size, max_tokens, 1.0, seed=r)
                if r:
                    tps[key].append(res["tokens_per_s"])
        lat_ray = await _latency(one, prompts[0], latency_n, "ray")
        lat_local = await _latency(local, prompts[0], latency_n, "local")
    finally:
        for eng in (one, two, local):
            await eng.aclose()
        if owns:
            ray.shutdown()
    med = {k: statistics.median(v) for k, v in tps.items()}
    return {
        "replicas_1_tokens_per_s": med["1"],
        "replicas_2_tokens_per_s": med["2"],
        "local_tokens_per_s": med["local"],
        "speedup_2_vs_1": med["2"] / med["1"],
        "ray_request_latency_us": lat_ray * 1e6,
        "local_request_latency_us": lat_local * 1e6,
        "ray_overhead_us_per_request": (lat_ray - lat_local) * 1e6,
    }


def _tiny_model(directory: Path, vocab: int, hidden: int, layers: int, max_len: int) -> Path:
    """The project's GPT-2 shape (``build_model``, seed 0, head size 32), saved into ``directory``."""
    from pipeline.policy.models import build_model

    build_model(vocab, hidden, layers, max(1, hidden // 32), max_len, seed=0).save_pretrained(str(directory))
    return directory


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("which", choices=["vllm", "ray"])
    ap.add_argument("--model", default="", help="a save_pretrained model directory; default: a random GPT-2 built here")
    add_workload_args(ap)
    ap.add_argument("--delta-tokens", type=int, default=1, help="ray: the torch engines' fewest tokens per delta")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix=f"railgate-bench-{args.which}-"))
    model_dir = (
        Path(args.model) if args.model else _tiny_model(work / "model", args.vocab, args.hidden, args.layers, 128)
    )
    prompts = _prompts(args.prompts, args.vocab)
    load_before = os.getloadavg()
    if args.which == "vllm":
        from pipeline.engines.vllm_engine import VllmEngine

        async def run() -> dict[str, Any]:
            engine = VllmEngine(model_dir, work / "cache", seed=None, eos_id=None)
            try:
                return await bench_vllm(engine, prompts, args.group, args.max_tokens, rounds=args.rounds)
            finally:
                await engine.aclose()

        result = asyncio.run(run())
    else:
        result = anyio.run(
            bench_ray, model_dir, prompts, args.group, args.max_tokens, args.rounds, 50, args.delta_tokens
        )
    result.update(
        load_before=load_before, load_after=os.getloadavg(), workload=f"{args.prompts}x{args.group}x{args.max_tokens}"
    )
    for k, v in result.items():
        print(f"{k}: {v}")
    return result


if __name__ == "__main__":
    main()
