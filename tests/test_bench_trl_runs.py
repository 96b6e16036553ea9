"""bench trl's runs: the trainers of a seed draw the same prompts in the same order."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from trl_fixtures import model_dir  # noqa: E402

from railgate.bench.trl import TrlBenchSpec, build_trainer  # noqa: E402
from railgate.bench.trl_tasks import TrlTask, last_number_reward  # noqa: E402


def tiny_task(n: int = 24) -> TrlTask:
    rows = [{"prompt": f"{i}+{i}=", "answer": str(2 * i), "reference": str(2 * i)} for i in range(n)]
    return TrlTask("tiny", rows, rows[:2], last_number_reward, 4, reference_exact=False, reference_skip=0.45)


SPEC = TrlBenchSpec(budget=64, prompts_per_step=2, group_size=4, eval_every=32)


def first_prompts(trainer: str, seed: int, tmp_path, n: int = 12) -> list[str]:
    """The first ``n`` prompts the trainer would generate for, read off its sampler without training."""
    run, _ = build_trainer(trainer, seed, SPEC, tiny_task(), model_dir(tmp_path), tmp_path)
    if trainer == "grpo":  # TRL's RepeatSampler gives each prompt num_generations times in a row
        indices = list(run._get_train_sampler())[:: SPEC.group_size][:n]
    else:  # the gate's PromptPool: what it opens next, in order
        indices = [p.prompt_id for p in run.gate.pool.peek(n)]
    return [run.train_dataset[i]["prompt"] for i in indices]


def test_both_trainers_of_a_seed_draw_the_same_prompts_in_the_same_order(tmp_path):
    grpo, gated = first_prompts("grpo", 3, tmp_path), first_prompts("gated", 3, tmp_path)
    assert grpo == gated
    assert grpo != [f"{i}+{i}=" for i in range(12)]  # shuffled by the seed, not the task's order
    assert first_prompts("grpo", 4, tmp_path) != grpo  # and each seed has its own order


def even_length(prompts, completions, answer, **kwargs):
    """A reward that gives the tiny random model mixed groups: 1 for a completion of even length."""
    return [float(len(c) % 2 == 0) for c in completions]


def test_every_optimiser_step_is_recorded_and_survives_trl_json(tmp_path):
    import dataclasses
    import json

    from railgate.bench.trl import RunRecord, _write, run_one

    spec = dataclasses.replace(SPEC, budget=32, eval_every=16, eval_prompts=2, eval_samples=2)
    task = dataclasses.replace(tiny_task(), reward=even_length)
    runs = [run_one(t, 0, spec, task, model_dir(tmp_path), tmp_path) for t in ("grpo", "gated")]
    grpo, gated = runs
    assert [s.step for s in grpo.step_logs] == [1, 2, 3, 4] and grpo.steps == 4
    assert [s.rollouts for s in grpo.step_logs] == [8, 16, 24, 32]  # 2 prompts x 4 a step
    for s in grpo.step_logs:
        assert s.grad_norm is not None and s.grad_norm >= 0 and s.mixed_groups in (0, 1, 2)
        assert s.mixed_groups == round(2 * (1 - s.frac_reward_zero_std))
    assert [s.step for s in gated.step_logs] == list(range(1, gated.steps + 1))
    rollouts = [s.rollouts for s in gated.step_logs]
    assert rollouts == sorted(rollouts) and rollouts[-1] == gated.rollouts >= 32
    assert sum(s.mixed_groups for s in gated.step_logs) == gated.gate["railgate/groups_mixed_trained"]
    assert all(p.step <= gated.steps for p in gated.points)  # evaluations say at which step they were taken
    _write(spec, runs, tmp_path)
    stored = json.loads((tmp_path / "trl.json").read_text())["runs"]
    assert [RunRecord.from_json(r) for r in stored] == runs


def test_gate_defaults_leave_the_reference_settings_to_gated_grpo_config(tmp_path):
    import dataclasses

    from railgate.trl import GatedGRPOConfig

    task = dataclasses.replace(tiny_task(), reference_exact=True, reference_skip=0.8)
    told, _ = build_trainer("gated", 0, SPEC, task, model_dir(tmp_path), tmp_path)
    assert (told.args.gate_reference_exact, told.args.gate_reference_skip) == (True, 0.8)  # the task's
    spec = dataclasses.replace(SPEC, gate_defaults=True)
    own, _ = build_trainer("gated", 0, spec, task, model_dir(tmp_path), tmp_path / "defaults")
    defaults = GatedGRPOConfig(output_dir=str(tmp_path / "d"), use_cpu=True, bf16=False)
    assert own.args.gate_reference_exact == defaults.gate_reference_exact is False
    assert own.args.gate_reference_skip == defaults.gate_reference_skip
    assert own.args.gate_reference_calibrate is True


def test_gate_set_overrides_the_task_and_the_defaults_and_refuses_an_unknown_field(tmp_path):
    import dataclasses

    import pytest

    task = dataclasses.replace(tiny_task(), reference_exact=True, reference_skip=0.8)
    spec = dataclasses.replace(
        SPEC, gate_settings=(("gate_reference_skip", "0.6"), ("gate_reference_skip_share", "0.5"))
    )
    gated, _ = build_trainer("gated", 0, spec, task, model_dir(tmp_path), tmp_path)
    assert (gated.args.gate_reference_skip, gated.args.gate_reference_skip_share) == (0.6, 0.5)
    assert gated.args.gate_reference_exact is True  # the task's, not overridden
    assert spec.label.endswith("-gate_reference_skip=0.6-gate_reference_skip_share=0.5")
    with pytest.raises(ValueError, match="no field gate_reference_skp.*e.g. gate_reference_skip"):
        dataclasses.replace(SPEC, gate_settings=(("gate_reference_skp", "0.6"),)).check()
    with pytest.raises(ValueError, match="gate_reference_exact=maybe: not a bool"):
        dataclasses.replace(SPEC, gate_settings=(("gate_reference_exact", "maybe"),)).check()
