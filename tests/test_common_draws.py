"""Held-out evaluation draws depend on (seed, prompt, sample) only: never on the step, the run,
the gate or a request's name, so an unchanged policy evaluates to the same number every time."""

from __future__ import annotations

import dataclasses

import anyio
import pytest

from pipeline.engines.torch_engine import TorchEngine
from pipeline.evaluation import SamplingEvaluator
from pipeline.types import Prompt, SampleFinished, SampleRequest, SamplingParams
from torch_models import EOS, tiny_gpt2

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


class ParityScorer:
    """A reward a random model earns half the time: the parity of its response's tokens (so an
    evaluation's per-prompt rates are spread, and a changed draw shows in them)."""

    runs_inline = True

    def __call__(self, prompt: Prompt, token_ids) -> float:
        return float(sum(token_ids) % 2)


PROMPTS = [Prompt(i, "", (3 + i % 7, 4 + i % 5, 5 + i % 3)) for i in range(24)]


async def _tokens(engine: TorchEngine, request: SampleRequest) -> tuple[int, ...]:
    final = [ev async for ev in engine.stream(request) if isinstance(ev, SampleFinished)][-1]
    return final.token_ids


async def test_a_samples_draw_ignores_its_request_name_but_not_its_index():
    engine = TorchEngine(tiny_gpt2(), EOS, seed=7)
    base = SampleRequest("eval0-p0-s0", group_id=-1, sample_index=0, prompt=PROMPTS[0],
                         params=SamplingParams(temperature=1.0, max_tokens=16, seed=11))
    try:
        first = await _tokens(engine, base)
        renamed = await _tokens(engine, dataclasses.replace(base, request_id="eval200-p0-s0#wire3"))
        other = await _tokens(engine, dataclasses.replace(base, request_id="x", sample_index=1))
    finally:
        await engine.aclose()
    assert renamed == first
    assert other != first


async def test_an_unchanged_policy_evaluates_to_the_same_number_at_every_step():
    engine = TorchEngine(tiny_gpt2(), EOS, seed=3)
    evaluator = SamplingEvaluator(engine, PROMPTS, ParityScorer(), samples_per_prompt=4, max_tokens=12, seed=5,
                                  concurrency=16)
    try:
        results, rates = [], []
        for step in (0, 2, 4, 200):
            results.append(await evaluator.evaluate(step))
            rates.append(evaluator.last_rates)
    finally:
        await engine.aclose()
    assert all(r == results[0] for r in results[1:])
    assert all(r == rates[0] for r in rates[1:])  # prompt by prompt, not only on average
    assert len(set(rates[0])) > 1  # the draws are not all alike: the check has teeth
    assert results[0]["eval/accuracy_lo"] < results[0]["eval/accuracy"] < results[0]["eval/accuracy_hi"]


async def test_another_seed_draws_other_samples():
    scores = []
    for seed in (5, 6):
        engine = TorchEngine(tiny_gpt2(), EOS, seed=3)
        evaluator = SamplingEvaluator(engine, PROMPTS, ParityScorer(), samples_per_prompt=4, max_tokens=12, seed=seed)
        try:
            await evaluator.evaluate(0)
        finally:
            await engine.aclose()
        scores.append(evaluator.last_rates)
    assert scores[0] != scores[1]
