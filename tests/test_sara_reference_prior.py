"""SARA's reference prior (``gate.sara.reference_prior``): a prompt's pass rate read, before any
rollout, from the policy's likelihood of the task's reference response."""

from __future__ import annotations

import collections
import copy
import json
import math
from pathlib import Path

import anyio
import pytest
from gate_units import admit, pool_of
from run_helpers import TORCH_SMALL, cli_ok, sets

from controller.config import GateConfig, SaraConfig
from controller.gates.sara import MAX_SKIPS, SaraGate
from controller.posterior import effective_probability
from controller.prompts import PromptPool
from controller.reference import ReferenceScreen
from pipeline.config.build import ConfigError
from pipeline.tasks.arithmetic import ArithmeticTask
from pipeline.types import FinishReason, Prompt, Rollout
from railgate.config import load_config

ROOT = Path(__file__).resolve().parents[1]


def screened_gate(pass_rates: dict[int, float], exact: bool = True, **sara) -> tuple[SaraGate, ReferenceScreen]:
    """A SARA gate over prompts 0..n-1 whose screen already holds log(pass rate) for each."""
    gate = SaraGate(pool_of(len(pass_rates)), group_size=8, config=SaraConfig(reference_prior=True, **sara))
    screen = ReferenceScreen(
        {i: (3, 2) for i in pass_rates}, gate.source.peek, exact=exact, strength=64, ahead=len(pass_rates)
    )
    screen.update({i: math.log(q) if q > 0 else -1e9 for i, q in pass_rates.items()}, tokens=0)
    gate.attach_reference(screen)
    return gate, screen


def test_peek_shows_what_take_returns_across_epochs_and_skips_evicted_prompts():
    pool = PromptPool([Prompt(i, "", (i,)) for i in range(5)], seed=3)
    pool.take(3)
    pool.evict(pool.peek(1)[0].prompt_id)
    ahead = [p.prompt_id for p in pool.peek(9)]  # runs into the next epoch's permutation
    assert ahead == [p.prompt_id for p in pool.take(9)]
    assert pool.peek(0) == []


def test_saturated_prompts_are_skipped_before_any_rollout_and_mixed_ones_open_with_the_likelihood_as_prior():
    gate, screen = screened_gate({0: 0.999, 1: 0.5, 2: 0.001, 3: 0.3})
    plans = admit(gate, 2)
    opened = sorted(p.prompt.prompt_id for p in plans)
    assert opened == [1, 3]  # 0 and 2 would be all-same with chance > 0.99
    assert all(p.initial == 4 for p in plans)  # the usual probe follows
    assert gate.metrics()["gate/skip_reference"] == 2.0
    rec = {gate._groups[p.group_id].prompt_id: gate._groups[p.group_id] for p in plans}
    assert (rec[3].a, rec[3].b) == pytest.approx((64 * 0.3, 64 * 0.7))
    # A probe of four failures does not abandon a prompt the policy solves 30% of the time:
    # with q known, four more rollouts still hold a success with chance about 1 - 0.7^4 = 0.76.
    assert effective_probability(0, 4, 8, (rec[3].a, rec[3].b)) > 0.7


def test_the_counters_survive_a_checkpoint():
    gate, _ = screened_gate({0: 0.999, 1: 0.5})
    admit(gate, 1)
    state = gate.state_dict()
    resumed, screen = screened_gate({0: 0.999, 1: 0.5})
    resumed.load_state_dict(state)
    assert resumed.metrics()["gate/skip_reference"] == 1.0
    assert screen.metrics()["gate/reference_scored"] == 2.0  # the saved count, not the new screen's own


def test_a_score_is_kept_until_its_prompt_opens_and_used_once():
    line = [Prompt(0, "", (1,)), Prompt(1, "", (1,))]
    screen = ReferenceScreen({0: (1,), 1: (1,)}, lambda n: line[:n], exact=True, strength=64, ahead=2)
    assert [p.prompt_id for p in screen.wanted()] == [0, 1]
    screen.update({0: math.log(0.5), 1: math.log(0.9)}, tokens=4)
    assert screen.wanted() == []  # scored once while in line
    screen.update({1: math.log(0.8)}, tokens=2)  # a newer score of prompt 1 only
    assert screen.logprob(0) == pytest.approx(math.log(0.5)) and screen.logprob(1) == pytest.approx(math.log(0.8))
    assert screen.opening(0, (1.0, 1.0), 8)[0] == pytest.approx((32.0, 32.0))
    assert screen.logprob(0) is None and screen.opening(0, (1.0, 1.0), 8)[0] == (
        1.0,
        1.0,
    )  # the next group waits for a new score
    assert screen.metrics()["gate/reference_unscored"] == 1.0


def test_a_pool_of_solved_prompts_still_opens_a_group_after_max_skips():
    gate, _ = screened_gate({i: 1.0 for i in range(MAX_SKIPS + 5)})
    plans = admit(gate, 1)
    assert len(plans) == 1
    assert gate.metrics()["gate/skip_reference"] == MAX_SKIPS


def test_unscored_prompts_start_from_the_gates_prior_and_are_counted():
    gate = SaraGate(pool_of(4), group_size=8, config=SaraConfig(reference_prior=True))
    screen = ReferenceScreen({0: (3, 2)}, gate.source.peek, exact=True, strength=64, ahead=4)
    gate.attach_reference(screen)
    plans = admit(gate, 4)
    assert len(plans) == 4 and all(
        (gate._groups[p.group_id].a, gate._groups[p.group_id].b) == (1.0, 1.0) for p in plans
    )
    assert gate.metrics()["gate/reference_unscored"] == 4.0
    assert [p.prompt_id for p in screen.wanted()] == [0]  # of the next epoch's four, only 0 has a reference


def test_reference_skip_sets_how_likely_a_mixed_group_must_be_to_open_apart_from_the_probes_test():
    rates = {0: 0.9, 1: 0.5, 2: 0.1, 3: 0.85}  # P(mixed group of 8): 0.57, 0.99, 0.57, 0.73
    default, _ = screened_gate(rates)
    assert sorted(p.prompt.prompt_id for p in admit(default, 4)) == [0, 1, 2, 3]  # all above 0.45
    strict, _ = screened_gate(rates, reference_skip=0.7)
    assert [p.prompt.prompt_id for p in admit(strict, 2)] in ([1, 3], [3, 1])
    assert strict.metrics()["gate/skip_reference"] == 2.0
    assert strict.config.tau_abandon == 0.45  # the probe's test keeps its threshold
    with pytest.raises(ConfigError, match=r"reference_skip=1.0 must be in \[0, 1\)"):
        SaraConfig(reference_skip=1.0)


def test_a_lower_bound_only_skips_prompts_it_shows_are_nearly_always_solved():
    gate, _ = screened_gate({0: 0.999, 1: 0.001, 2: 0.5}, exact=False)
    opened = sorted(p.prompt.prompt_id for p in admit(gate, 2))
    # 0.1% likelihood of the reference says nothing about other correct responses: prompt 1 opens.
    assert opened == [1, 2]
    assert all((r.a, r.b) == (1.0, 1.0) for r in gate._groups.values())
    # A high skip threshold judges a scored prompt by the bound 1 - q^8 alone, not by the uniform
    # prior's 0.778 (which would skip every prompt): only q >= 0.818 is skipped at 0.8.
    strict, _ = screened_gate({0: 0.85, 1: 0.001, 2: 0.5, 3: 0.8}, exact=False, reference_skip=0.8)
    assert sorted(p.prompt.prompt_id for p in admit(strict, 3)) == [1, 2, 3]
    assert strict.metrics()["gate/skip_reference"] == 1.0


def test_bad_scores_and_settings_are_refused_with_the_fix():
    screen = ReferenceScreen({0: (1,)}, lambda n: [], exact=True, strength=1, ahead=1)
    with pytest.raises(ValueError, match="reference log-prob 0.5 of prompt 0 is not the log of a probability"):
        screen.update({0: 0.5}, tokens=1)
    with pytest.raises(ConfigError, match="reference_prior=true reads a group's odds.*temperature=0.7"):
        GateConfig(kind="sara", sara=SaraConfig(reference_prior=True)).check_sampling(0.7, 1.0)
    with pytest.raises(ConfigError, match="gate.kind='sara_dps' does not have .*; use gate.kind=sara"):
        GateConfig(kind="sara_dps", sara=SaraConfig(reference_prior=True))
    GateConfig(kind="uniform", sara=SaraConfig(reference_prior=True))  # other gates ignore SARA's settings
    with pytest.raises(ConfigError, match="reference_strength=0"):
        SaraConfig(reference_strength=0)
    with pytest.raises(ValueError, match="reference_prior=false"):
        SaraGate(pool_of(2), 8).attach_reference(screen)


def test_the_sim_engine_is_refused_with_the_fix(tmp_path):
    from railgate.build import build_components
    from railgate.config import load_config

    cfg = load_config(
        None, [f"run_dir={tmp_path}", "engine.kind=sim", "gate.kind=sara", "gate.sara.reference_prior=true"]
    )
    with pytest.raises(ConfigError, match="engine.kind=sim has neither"):
        build_components(cfg, progress=False)


def test_only_solutions_the_reward_accepts_become_references():
    import dataclasses

    from pipeline.tasks.countdown import CountdownTask
    from railgate.build import _earns_reward

    for task in (ArithmeticTask(), CountdownTask()):
        problem = task.train_problems(1, seed=0)[0]
        assert _earns_reward(task, problem)
        assert not _earns_reward(task, dataclasses.replace(problem, solution=""))
        assert not _earns_reward(task, dataclasses.replace(problem, solution="9" * 9))


def test_only_an_exact_answer_on_the_compact_form_is_a_unique_response():
    assert ArithmeticTask().unique_response
    assert not ArithmeticTask(reward="numeric", reverse_answer=False, template="What is {a} {op} {b}?").unique_response
    assert not ArithmeticTask(scratchpad=True).unique_response


def test_the_learners_likelihood_of_a_response_is_how_often_the_engine_samples_it():
    """The claim the prior rests on: exp(summed learner log-probs) is the engine's sampling
    probability at temperature 1 (here of a two-token response, over 4,000 samples)."""
    import torch
    from torch_models import request, tiny_gpt2

    from learner.config import LearnerConfig
    from learner.torch_learner import TorchLearner
    from pipeline.engines.torch_engine import TorchEngine

    torch.manual_seed(0)
    model = tiny_gpt2()
    with torch.no_grad():  # flatter logits: several likely responses
        model.lm_head.weight.mul_(0.3)
    engine = TorchEngine(copy.deepcopy(model), tokenizer_eos_id=None, max_batch=512, seed=1)
    prompt = (5, 6, 7)
    n = 4000

    async def sample_all():
        out = []
        for start in range(0, n, 500):

            async def one(i):
                events = [
                    ev async for ev in engine.stream(request(f"r{i}", prompt, max_tokens=2, temperature=1.0, seed=i))
                ]
                out.append(events[-1].token_ids)

            async with anyio.create_task_group() as tg:
                for i in range(start, start + 500):
                    tg.start_soon(one, i)
        return out

    samples = anyio.run(sample_all)
    anyio.run(engine.aclose)
    counts = collections.Counter(samples)
    learner = TorchLearner(model, LearnerConfig(), pad_id=0)
    for response, seen in counts.most_common(3):
        rollout = Rollout("ref", 0, prompt, response, (), 1.0, FinishReason.STOP, -1)
        q = math.exp(sum(learner.logprobs([rollout])[0]))
        se = math.sqrt(q * (1 - q) / n)
        assert abs(seen / n - q) < 4 * se + 1e-3, (response, seen / n, q)


@pytest.mark.slow
def test_a_torch_run_scores_the_next_prompts_and_skips_with_them(tmp_path):
    cli_ok(
        *TORCH_SMALL,
        *sets(
            f"run_dir={tmp_path}",
            "model.warm_start_steps=300",
            "orchestrator.steps=4",
            "orchestrator.eval_every=4",
            "gate.kind=sara",
            "gate.sara.reference_prior=true",
        ),
        timeout=1500,
    )
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    last = steps[-1]
    # The default's gate scores the prompts in line (its scoring window) at the start, then
    # those entering the line after each of the 4 steps: each prompt once.
    ahead = load_config(ROOT / "configs/default.yaml").gate.sara.scored_ahead(8)
    opened = last["gate/commit"] + last.get("gate/abandon", 0) + last["gate/skip_reference"]
    assert ahead < last["gate/reference_scored"] <= ahead + opened
    assert last["gate/reference_scored_tokens"] > 2 * last["gate/reference_scored"]
    assert last["gate/reference_unscored"] < last["gate/commit"]
