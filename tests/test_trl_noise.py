"""The gradient noise scale of TRL trainers (``railgate.trl.noise``): read before clipping, logged
by both the gated trainer and ``MeasuredGRPOTrainer`` without changing an update, and, with
``gate_probe_price_steps``, handed to SARA's probing rule, which then buys whole groups where a
run is step-limited."""

from __future__ import annotations

import math

import pytest

trl = pytest.importorskip("trl")

import torch  # noqa: E402
import trl_fixtures as fx  # noqa: E402
from datasets import Dataset  # noqa: E402

from controller.probing import ProbingRule  # noqa: E402
from railgate.trl import GatedGRPOConfig, GatedGRPOTrainer, MeasuredGRPOTrainer  # noqa: E402


def test_measured_grpo_trains_exactly_like_grpo_and_reads_the_gradient_before_clipping(tmp_path):
    rows = fx.arithmetic_rows(12)
    # a clip so small that every step is clipped: an estimate read after it would see norm 1e-4
    settings = {**fx.MATCHED, "shuffle_dataset": False, "max_steps": 4, "max_grad_norm": 1e-4}
    plain = fx.plain_trainer(tmp_path, "plain", rows, fx.length_reward, settings)
    plain.train()
    measured = fx.plain_trainer(tmp_path, "measured", rows, fx.length_reward, settings, MeasuredGRPOTrainer)
    measured.train()
    assert all(torch.equal(p, q) for p, q in zip(plain.model.parameters(), measured.model.parameters()))
    steps = [x for x in measured.state.log_history if "grad_norm" in x]
    assert len(steps) == 4
    assert "railgate/trace_sigma" not in steps[0]  # the first step has no previous gradient
    for x in steps[1:]:
        rows_trained = x["railgate/rows_trained"]
        assert rows_trained == 8
        # |G_t|² = tr(Σ) / B + G_t · G_(t-1) is TRL's pre-clip norm, squared, not the clip's 1e-4
        big_sq = x["railgate/trace_sigma"] / rows_trained + x["railgate/grad_dot_prev"]
        assert big_sq == pytest.approx(x["grad_norm"] ** 2, rel=1e-3)
        assert x["grad_norm"] > 1e-2


def test_without_clipping_the_step_is_measured_before_the_optimiser_steps(tmp_path):
    settings = {**fx.MATCHED, "max_grad_norm": 0.0}
    trainer = fx.plain_trainer(
        tmp_path, "noclip", fx.arithmetic_rows(12), fx.length_reward, settings, MeasuredGRPOTrainer
    )
    trainer.train()
    steps = [x for x in trainer.state.log_history if "grad_norm" in x]
    assert all("railgate/grad_dot_prev" in x for x in steps[1:])


def test_the_gated_trainer_prices_steps_with_its_measured_noise_scale(tmp_path):
    args = GatedGRPOConfig(
        output_dir=str(tmp_path / "gated"),
        **{**fx.MATCHED, "gate_probe_size": 2, "max_steps": 16, "gate_probe_price_steps": True},
    )
    trainer = GatedGRPOTrainer(
        model=fx.model_dir(tmp_path),
        reward_funcs=fx.by_kind,
        args=args,
        train_dataset=Dataset.from_list(fx.outcome_rows(60)),
    )
    trainer.train()
    noise = trainer.noise.value
    probing = trainer.gate.gate.probing
    assert probing is not None and math.isfinite(noise) and noise > 0
    m = trainer.gate.metrics()
    # set at the last batch, from the noise scale measured up to then
    assert math.isfinite(probing.noise_groups) and m["railgate/gate/probing_noise_groups"] == probing.noise_groups
    # the noise scale of the informative rows, in groups: B_simple x share of rows in mixed groups / G
    trainer.gate._price_steps()
    share = trainer.gate.groups_mixed * 4 / (trainer.gate.rollouts_trained + trainer.gate.pad_rows)
    assert trainer.gate.mixed_row_share == share
    assert 0 < share < 1 and probing.noise_groups == pytest.approx(noise * share / 4)
    logged = [x for x in trainer.state.log_history if "railgate/noise_scale" in x]
    assert logged and all(x["railgate/noise_scale"] > 0 for x in logged)


def test_price_steps_is_refused_where_no_probing_rule_runs():
    with pytest.raises(ValueError, match="gate_probe_price_steps=True prices steps in SARA's probing rule"):
        GatedGRPOConfig(output_dir="out", gate_kind="ds", gate_probe_price_steps=True, report_to=[], use_cpu=True)
    with pytest.raises(ValueError, match="gate_probe_when='pays'"):
        GatedGRPOConfig(
            output_dir="out", gate_probe_when="always", gate_probe_price_steps=True, report_to=[], use_cpu=True
        )


@pytest.mark.parametrize(("noise_groups", "choice"), [(math.inf, "probe"), (0.05, "whole"), (50.0, "probe")])
def test_a_step_limited_run_buys_whole_groups_where_rates_pile_at_zero(noise_groups, choice):
    # a hard start: 7 of 8 prompts never solved, the rest about half the time
    rule = ProbingRule(group_size=8, probe_size=4, tau_commit=0.5, tau_abandon=0.45, noise_groups=noise_groups)
    for i in range(64):
        rule.observe(successes=4 if i % 8 == 0 else 0, rollouts=8, whole=True)
    assert rule.choose(rule.run_prior()) == choice
