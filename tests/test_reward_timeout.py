"""Rewards cannot stall the loop: a reward call that holds the GIL (a huge power computed in one
C call, as math-verify does for ``9^{9^{9^{9}}}``) is stopped at its timeout, in training
(``ScoringService``) and in the held-out evaluation, and counted as a timeout with reward 0.

Without worker processes the timeout cannot fire: the event loop never gets the GIL back."""

from __future__ import annotations

import time

import anyio

from pipeline.config.sections import SimConfig
from pipeline.evaluation import SamplingEvaluator
from pipeline.policy.tokenizer import CharTokenizer
from pipeline.sim.engine import SimEngine
from pipeline.sim.world import SimWorld
from pipeline.tasks.rewards import MathVerifyReward
from pipeline.tasks.rewards.scoring import ScoringService
from pipeline.types import Prompt


class HoldsTheGil:
    """Even prompts: a power with hundreds of millions of digits (one C call, minutes); odd: 1."""

    runs_inline = False
    runs_in_process = True

    def __call__(self, prompt, token_ids):
        if prompt.prompt_id % 2 == 0:
            return float(pow(9, 9**9 + prompt.prompt_id) % 2)
        return 1.0


def test_a_reward_holding_the_gil_times_out_in_training():
    service = ScoringService(HoldsTheGil(), timeout_s=1.0, threads=1)
    started = time.monotonic()
    reward, error = anyio.run(service.score, Prompt(0, "", ()), (1,))
    assert (reward, service.timeouts) == (0.0, 1) and "timed out" in error
    assert anyio.run(service.score, Prompt(1, "", ()), (1,)) == (1.0, "")  # a fresh worker took over
    assert time.monotonic() - started < 60  # start-up of two workers included; the power alone takes minutes
    service.close()


def test_math_verify_on_a_power_tower_times_out():
    tok = CharTokenizer("0123456789^{}\\boxed ")
    service = ScoringService(MathVerifyReward(decode=tok.decode), timeout_s=2.0, threads=1)
    prompt = Prompt(0, "", (), answer="1")
    assert anyio.run(service.score, prompt, tok.encode("\\boxed{1}")) == (1.0, "")
    started = time.monotonic()
    reward, error = anyio.run(service.score, prompt, tok.encode("\\boxed{9^{9^{9^{9}}}}"))
    assert reward == 0.0 and "timed out after 2.0s" in error and service.timeouts == 1
    assert time.monotonic() - started < 10
    service.close()


def test_the_held_out_evaluation_has_the_same_timeout():
    engine = SimEngine(SimWorld(SimConfig(num_prompts=8, num_eval_prompts=4)))
    prompts = [engine.prompt(i) for i in range(4)]
    evaluator = SamplingEvaluator(
        engine, prompts, HoldsTheGil(), samples_per_prompt=1, max_tokens=64, reward_timeout_s=1.0, reward_threads=2
    )
    started = time.monotonic()
    result = anyio.run(evaluator.evaluate, 0)
    assert result["eval/accuracy"] == 0.5  # the two even prompts timed out: no reward
    assert evaluator.scoring.timeouts == 2
    assert time.monotonic() - started < 60
    evaluator.scoring.close()
