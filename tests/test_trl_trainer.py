"""GatedGRPOTrainer runs: a gate that commits everything trains exactly like GRPOTrainer; SARA
trains only mixed groups and counts every rollout it generated; HORA's smaller groups are padded
with rows that carry no advantage; the trace replays with ``run.py replay``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

trl = pytest.importorskip("trl")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from trl_fixtures import (  # noqa: E402
    MATCHED,
    arithmetic_rows,
    by_kind,
    length_reward,
    model_dir,
    outcome_rows,
    plain_trainer,
)

from pipeline.store.tracelog import read_trace  # noqa: E402
from railgate.trl import GatedGRPOConfig, GatedGRPOTrainer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def gated(tmp_path, rows, reward, **overrides):
    args = GatedGRPOConfig(output_dir=str(tmp_path / "gated"), **{**MATCHED, "gate_probe_size": 2, **overrides})
    return GatedGRPOTrainer(
        model=model_dir(tmp_path), reward_funcs=reward, args=args, train_dataset=Dataset.from_list(rows)
    )


@pytest.mark.parametrize("batching", [{}, {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2}])
def test_a_gate_that_commits_everything_trains_exactly_like_grpo_trainer(tmp_path, batching):
    rows = arithmetic_rows(6)
    settings = {**MATCHED, "shuffle_dataset": False, **batching}  # both trainers take prompts in dataset order
    plain = plain_trainer(tmp_path, "plain", rows, length_reward, settings)
    plain.train()
    mine = gated(tmp_path, rows, length_reward, gate_kind="uniform", shuffle_dataset=False, **batching)
    mine.train()
    losses = [(a["loss"], b["loss"]) for a, b in zip(plain.state.log_history, mine.state.log_history) if "loss" in a]
    assert len(losses) == 3 and all(x == y for x, y in losses), losses
    assert all(torch.equal(p, q) for p, q in zip(plain.model.parameters(), mine.model.parameters()))
    assert any(not torch.equal(p, q) for p, q in zip(plain.model.parameters(), trl_fresh_model(tmp_path).parameters()))
    metrics = mine.gate.metrics()
    assert metrics["railgate/rollouts_generated"] == metrics["railgate/rollouts_trained"] == 3 * 8


def trl_fresh_model(tmp_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir(tmp_path))


def test_sara_trains_only_mixed_groups_and_counts_every_rollout(tmp_path):
    # easy prompts always earn 1, hard ones 0: their probes are all-same, and SARA abandons them.
    trainer = gated(
        tmp_path,
        outcome_rows(60),
        by_kind,
        gate_reference_prior=False,
        gate_probe_when="always",  # probes abandon: one step passes many prompts through the screen
        max_steps=4,
        gate_step_rollouts=50,
    )
    trainer.train()
    steps = [h for h in trainer.state.log_history if "loss" in h]
    assert len(steps) == 4 and all(h["frac_reward_zero_std"] == 0.0 for h in steps)  # every trained group is mixed
    m = trainer.gate.metrics()
    committed, abandoned = m["railgate/groups_committed"], m["railgate/groups_abandoned"]
    assert committed == 4 * 2 and abandoned >= 4  # 2 groups a step; about 2 of 3 prompts saturated
    # A committed group costs 4 rollouts, an abandoned one its probe of 2 -- nothing else is generated.
    assert m["railgate/rollouts_generated"] == 4 * committed + 2 * abandoned
    assert m["railgate/rollouts_trained"] == 4 * committed and m["railgate/pad_rows"] == m["railgate/short_steps"] == 0
    assert m["railgate/groups_mixed_trained"] == committed  # the gate's own count agrees with TRL's zero-std share
    kinds = {row["prompt"]: row["kind"] for row in outcome_rows(60)}
    trained = list(trainer._logs["prompt"])
    assert trained and all(kinds[p] == "coin" for p in trained)
    assert steps[-1]["railgate/rollouts_generated"] == m["railgate/rollouts_generated"]  # logged through TRL


def test_dynamic_sampling_trains_full_mixed_groups_and_pays_for_the_dropped_ones(tmp_path):
    trainer = gated(tmp_path, outcome_rows(60), by_kind, gate_kind="ds", max_steps=3, gate_step_rollouts=50)
    trainer.train()
    steps = [h for h in trainer.state.log_history if "loss" in h]
    assert all(h["frac_reward_zero_std"] == 0.0 for h in steps)
    m = trainer.gate.metrics()
    assert m["railgate/groups_committed"] == 3 * 2 and m["railgate/groups_abandoned"] >= 3
    assert m["railgate/rollouts_generated"] == 4 * (m["railgate/groups_committed"] + m["railgate/groups_abandoned"])


def test_hora_pads_small_groups_with_rows_that_carry_no_advantage(tmp_path):
    # 2 prompts a step, probes of 2, a budget of 6: 2 extra rollouts for one of the two groups or both.
    trainer = gated(tmp_path, arithmetic_rows(20), length_reward, gate_kind="hora", gate_hora_budget=6, max_steps=3)
    trainer.train()
    m = trainer.gate.metrics()
    assert m["railgate/rollouts_generated"] == 3 * 6 and m["railgate/pad_rows"] == 3 * 8 - 3 * 6
    completions, advantages = list(trainer._logs["completion"]), list(trainer._logs["advantages"])
    pads = [a for c, a in zip(completions, advantages) if c == ""]
    assert len(pads) >= 2 and all(a == 0.0 for a in pads)


def test_a_rollout_budget_stops_training(tmp_path):
    trainer = gated(tmp_path, outcome_rows(60), by_kind, gate_reference_prior=False, max_steps=50, gate_max_rollouts=30)
    trainer.train()
    generated = trainer.gate.rollouts_generated
    assert 30 <= generated < 30 + 8 * 4 and trainer.state.global_step < 50


def test_the_trace_replays_with_run_py_and_rail_shadow_logs_without_acting(tmp_path):
    trainer = gated(tmp_path, outcome_rows(60), by_kind, gate_reference_prior=False, gate_rail_shadow=True, max_steps=3)
    trainer.train()
    trace = read_trace(tmp_path / "gated" / "trace")
    joined = trace.joined().to_pylist()
    gate = [r for r in joined if r["decision_point"] == "gate"]
    m = trainer.gate.metrics()
    assert sum(r["chosen"] == "abandon" for r in gate) == m["railgate/groups_abandoned"]
    assert sum(r["chosen"] == "commit" for r in gate) == m["railgate/groups_committed"]
    rail = [r for r in joined if r["decision_point"] in ("group_rescue", "group_extend")]
    assert rail and all(r["mode"] == "shadow" and r["behaviour_propensity"] == 1.0 for r in rail)
    assert all(r["reward"] is not None for r in rail)  # every group closed: every decision has its outcome
    out = tmp_path / "replay"
    result = subprocess.run(
        [sys.executable, "run.py", "replay", str(tmp_path / "gated" / "trace"), "--run-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"{len(rail)} decisions used" in (out / "offpolicy.md").read_text()


def test_reference_scores_are_the_policys_log_likelihood_of_the_reference(tmp_path):
    trainer = gated(tmp_path, arithmetic_rows(40), length_reward, max_steps=1, gate_reference_exact=True)
    scorer = trainer.gate.reference
    prompts = trainer.gate.pool.peek(3)
    scores, tokens = scorer._score(prompts)
    tok, model = trainer.processing_class, trainer.model.eval()
    for p in prompts:
        prompt_ids = tok(text=trainer.train_dataset[p.prompt_id]["prompt"])["input_ids"]
        ref = list(scorer.references[p.prompt_id])
        with torch.no_grad():
            logits = model(torch.tensor([prompt_ids + ref])).logits[0, len(prompt_ids) - 1 : -1]
        expected = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(ref)[:, None]).sum().item()
        assert scores[p.prompt_id] == pytest.approx(expected, abs=1e-4)
    assert ref[-1] == trainer.eos_token_ids[0] and tokens > 0


def test_the_reference_prior_skips_prompts_it_deems_hopeless_and_drops_references_that_earn_nothing(tmp_path):
    # A random model gives any reference a tiny likelihood: with an exact reference every scored
    # prompt looks hopeless (a group would be all wrong), so SARA skips it before any rollout.
    def exact(prompts, completions, target, **kwargs):
        return [float(c.strip() == t) for c, t in zip(completions, target)]

    rows = [{**r, "target": r["answer"]} for r in arithmetic_rows(100)]
    for r in rows[::10]:
        r["answer"] = "wrong"  # a reference the reward does not accept: dropped when first checked
    trainer = gated(
        tmp_path,
        rows,
        exact,
        max_steps=1,
        gate_reference_exact=True,
        gate_reference_skip=0.45,
        gate_reference_skip_share=1.0,  # the bar alone decides: every scored prompt is skipped
        gate_probe_when="always",  # probes abandon: one step passes many prompts through the screen
    )
    trainer.train()
    m = trainer.gate.metrics()
    # Every scored prompt was skipped; the groups opened are the prompts reached before a score.
    screen = trainer.gate.reference.screen
    waiting = sum(1 for i in range(100) if screen.logprob(i) is not None)  # scored, not reached yet
    assert 10 <= m["railgate/prompts_skipped"] == m["railgate/gate/reference_scored"] - waiting
    opened = m["railgate/groups_committed"] + m["railgate/groups_abandoned"]
    assert opened == m["railgate/gate/reference_unscored"] >= 2
    checked = trainer.gate.reference.checked
    assert m["railgate/references_dropped"] == sum(1 for i in checked if i % 10 == 0) > 0
    assert all(i not in trainer.gate.reference.screen.references for i in checked if i % 10 == 0)


def test_a_step_whose_every_group_saturates_is_cut_short_and_padded(tmp_path):
    def nothing(completions, **kwargs):
        return [0.0] * len(completions)

    trainer = gated(
        tmp_path,
        arithmetic_rows(100),
        nothing,
        gate_reference_prior=False,
        max_steps=2,
        gate_step_rollouts=2,
        gate_probe_when="always",  # every group probed and abandoned (the default launches the first whole)
    )
    trainer.train()
    m = trainer.gate.metrics()
    assert m["railgate/short_steps"] == 2 and m["railgate/groups_committed"] == 0
    assert m["railgate/rollouts_generated"] == 2 * 16 and m["railgate/pad_rows"] == 2 * 8  # probes of 2, 16 a step
    assert all(h["loss"] == 0.0 for h in trainer.state.log_history if "loss" in h)
