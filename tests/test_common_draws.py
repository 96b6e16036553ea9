"""Held-out evaluation draws depend on (seed, prompt, sample) only: never on the step, the run,
the gate or a request's name, so an unchanged policy evaluates to the same number every time."""

from __future__ import annotations

import dataclasses
import json

import pytest
from run_helpers import TINY_REAL, cli_ok, sets, tiny_base
from torch_models import EOS, tiny_gpt2

from pipeline.engines.torch_engine import TorchEngine
from pipeline.evaluation import SamplingEvaluator
from pipeline.types import Prompt, SampleFinished, SampleRequest, SamplingParams


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


@pytest.mark.anyio
async def test_a_samples_draw_ignores_its_request_name_but_not_its_index():
    engine = TorchEngine(tiny_gpt2(), EOS, seed=7)
    base = SampleRequest(
        "eval0-p0-s0",
        group_id=-1,
        sample_index=0,
        prompt=PROMPTS[0],
        params=SamplingParams(temperature=1.0, max_tokens=16, seed=11),
    )
    try:
        first = await _tokens(engine, base)
        renamed = await _tokens(engine, dataclasses.replace(base, request_id="eval200-p0-s0#wire3"))
        other = await _tokens(engine, dataclasses.replace(base, request_id="x", sample_index=1))
    finally:
        await engine.aclose()
    assert renamed == first
    assert other != first


@pytest.mark.anyio
async def test_an_unchanged_policy_evaluates_to_the_same_number_at_every_step():
    engine = TorchEngine(tiny_gpt2(), EOS, seed=3)
    evaluator = SamplingEvaluator(
        engine, PROMPTS, ParityScorer(), samples_per_prompt=4, max_tokens=12, seed=5, concurrency=16
    )
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


@pytest.mark.anyio
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


def _evals(run_dir) -> list[dict]:
    return json.loads((run_dir / "summary.json").read_text())["evals"]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_an_unchanged_policy_and_other_gates_give_the_same_held_out_numbers_in_a_run(tmp_path):
    base = tiny_base(tmp_path / "base")
    common = [
        "--no-progress",
        "--set",
        f"model.path={base}",
        *TINY_REAL,
        *sets(
            "orchestrator.steps=3", "orchestrator.eval_every=1", "orchestrator.batch_groups=8", "log.checkpoint_every=0"
        ),
    ]
    cli_ok(
        "train",
        "--run-dir",
        str(tmp_path / "frozen"),
        *common,
        *sets("gate.kind=uniform", "learner.lr=1e-30"),
        timeout=900,
    )  # trains, and changes no weight
    evals = _evals(tmp_path / "frozen")
    assert [e["step"] for e in evals] == [0, 1, 2, 3] and evals[0]["eval/accuracy"] > 0
    assert len({(e["eval/accuracy"], e["eval/accuracy_lo"], e["eval/pass@4"]) for e in evals}) == 1
    cli_ok("train", "--run-dir", str(tmp_path / "sara"), *common, "--set", "gate.kind=sara", timeout=900)
    held_out = lambda e: {k: v for k, v in e.items() if k.startswith("eval/") and k != "eval/wall_s_total"}  # noqa: E731
    assert held_out(_evals(tmp_path / "sara")[0]) == held_out(evals[0])  # another gate, the same step-0 number
