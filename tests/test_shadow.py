"""The shadow gate: a run in shadow mode trains exactly as plain GRPO (TRL's GRPOTrainer; railgate's
trainer with gate.kind=uniform), writes every step's full groups, and logs per-step figures that
``bench replay --per-step`` recomputes exactly from the log."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config.build import ConfigError
from pipeline.store.grouplog import read_group_log
from railgate.config import load_config
from railgate.shadow_gate import FIGURES, ShadowRule, replay_per_step
from railgate.train import train

ROOT = Path(__file__).resolve().parents[1]

SIM = [
    "orchestrator.steps=3",
    "orchestrator.batch_groups=8",
    "orchestrator.group_size=4",
    "sim.num_prompts=256",
    "sim.num_eval_prompts=64",
    "log.tensorboard=false",
    "log.checkpoint_every=0",
]
"""A small simulator run: 3 steps of 8 groups of 4."""

TIMING = ("pipeline/step_wall_s", "pipeline/wall_s", "eval/wall_s_total")


def _lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _bench_per_step(log_dir: Path, out: Path) -> list[dict]:
    """``python run.py bench replay LOG --per-step --out OUT``'s per_step.json."""
    cmd = [sys.executable, "run.py", "bench", "replay", str(log_dir), "--per-step", "--out", str(out), "--no-progress"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "gate rollouts" in done.stdout
    return json.loads((out / "per_step.json").read_text())


# --- railgate's own trainer -----------------------------------------------------------------


def test_railgate_shadow_run_trains_as_uniform_and_its_figures_replay_exactly(tmp_path):
    for name, extra in [
        ("uniform", ["gate.kind=uniform"]),
        ("shadow", ["gate.kind=sara", "gate.sara.probe_size=2", "gate.mode=shadow"]),
    ]:
        cfg = load_config(ROOT / "configs" / "sim.yaml", SIM + extra + [f"run_dir={tmp_path / name}"])
        train(cfg, progress=False)
    uniform, shadow = _lines(tmp_path / "uniform"), _lines(tmp_path / "shadow")
    assert len(uniform) == len(shadow) == 4  # the evaluation before training, then 3 steps
    for a, b in zip(uniform, shadow):
        ours = {k: v for k, v in b.items() if not k.startswith("shadow/") and k not in TIMING}
        assert ours == {k: v for k, v in a.items() if k not in TIMING}
    logged = [line for line in shadow if "shadow/rollouts" in line]
    assert [line["step"] for line in logged] == [1, 2, 3]
    log = read_group_log(tmp_path / "shadow" / "groups")
    assert len(log.groups) == 24 and log.group_size == 4
    assert sorted({g.step for g in log.groups}) == [0, 1, 2]
    # SARA with a probe of 2 abandons the all-same groups it probes: it generates less than GRPO
    assert sum(line["shadow/rollouts"] for line in logged) < sum(line["shadow/grpo_rollouts"] for line in logged)
    assert all(line["shadow/grpo_rollouts"] == 32 for line in logged)
    assert all(
        line["shadow/grpo_mixed"] == sum(g.is_mixed for g in log.groups if g.step == line["step"] - 1)
        for line in logged
    )
    replayed = _bench_per_step(tmp_path / "shadow" / "groups", tmp_path / "replayed")
    assert len(replayed) == 3
    for line, row in zip(logged, replayed):
        assert row["step"] == line["step"] - 1
        for name in FIGURES:
            assert row[name] == line[f"shadow/{name}"], name
            assert row[f"total_{name}"] == line[f"shadow/total_{name}"], name


def test_railgate_shadow_settings_are_checked():
    with pytest.raises(ConfigError, match="gate.mode"):
        load_config(None, ["gate.mode=maybe"])
    with pytest.raises(ConfigError, match="controller.kind=none or gate.mode=live"):
        load_config(None, ["gate.mode=shadow", "controller.kind=rail"])
    with pytest.raises(ConfigError, match="gate.sara.guidance=0"):
        load_config(None, ["gate.mode=shadow", "gate.kind=sara", "gate.sara.guidance=0.5"])


def test_per_step_refuses_a_log_without_its_rule(tmp_path):
    from pipeline.store.grouplog import GroupLogWriter, RecordedGroup

    with GroupLogWriter(tmp_path / "log", fsync=False) as w:
        w.write([RecordedGroup.of(0, 0, (1, 0, 1, 1))])
    with pytest.raises(ConfigError, match="shadow.json not found"):
        ShadowRule.load(tmp_path / "log")
    done = subprocess.run(
        [sys.executable, "run.py", "bench", "replay", str(tmp_path / "log"), "--per-step", "--no-progress"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "shadow.json not found" in done.stderr + done.stdout


# --- TRL ------------------------------------------------------------------------------------


@pytest.mark.slow  # two TRL trainers, 3 steps each: about 25 s on a shared 2-core machine
def test_trl_shadow_trains_bit_identically_to_grpo_trainer_and_its_figures_replay_exactly(tmp_path):
    pytest.importorskip("trl")
    import torch
    from datasets import Dataset
    from trl_fixtures import MATCHED, by_kind, length_reward, model_dir, outcome_rows, plain_trainer

    from railgate.trl import GatedGRPOConfig, GatedGRPOTrainer

    rows = outcome_rows(12)
    rewards = [by_kind, length_reward]
    settings = {**MATCHED, "reward_weights": [1.0, 0.5]}
    plain = plain_trainer(tmp_path, "plain", rows, rewards, settings)
    plain.train()
    args = GatedGRPOConfig(
        output_dir=str(tmp_path / "shadow"), gate_mode="shadow", gate_kind="sara", gate_probe_size=2, **settings
    )
    mine = GatedGRPOTrainer(
        model=model_dir(tmp_path), reward_funcs=rewards, args=args, train_dataset=Dataset.from_list(rows)
    )
    mine.train()
    losses = [(a["loss"], b["loss"]) for a, b in zip(plain.state.log_history, mine.state.log_history) if "loss" in a]
    assert len(losses) == 3 and all(x == y for x, y in losses), losses
    assert all(torch.equal(p, q) for p, q in zip(plain.model.parameters(), mine.model.parameters()))

    log_dir = tmp_path / "shadow" / "railgate_groups"
    log = read_group_log(log_dir)
    assert len(log.groups) == 3 * 2 and log.group_size == 4
    kinds = {r["prompt"]: r["kind"] for r in rows}
    for g in log.groups:  # each row's total reward as TRL sums it: by_kind + 0.5 x length_reward
        for s in g.samples:
            expected = by_kind([g.prompt_text], [s.text], [kinds[g.prompt_text]])[0]
            expected += 0.5 * length_reward([g.prompt_text], [s.text])[0]
            assert s.reward == pytest.approx(expected, rel=1e-6)
            assert s.num_tokens == len(s.token_ids) > 0
        assert rows[g.prompt_id]["prompt"] == g.prompt_text
    logged = [h for h in mine.state.log_history if "loss" in h]
    assert [h["railgate/shadow_step"] for h in logged] == [0, 1, 2]
    replayed = replay_per_step(log_dir)  # what bench replay --per-step prints (its CLI: the railgate test)
    for h, row in zip(logged, replayed):
        for name in FIGURES:
            assert row[name] == h[f"railgate/shadow_{name}"], name
            assert row[f"total_{name}"] == h[f"railgate/shadow_total_{name}"], name
    assert sum(r["grpo_rollouts"] for r in replayed) == 3 * 8


def test_trl_gate_mode_is_checked():
    pytest.importorskip("trl")
    from railgate.trl import GatedGRPOConfig

    with pytest.raises(ValueError, match="gate_mode='maybe' is not one of live, shadow"):
        GatedGRPOConfig(output_dir="out", gate_mode="maybe", report_to=[], use_cpu=True)


def test_railgate_shadow_on_the_torch_engine_trains_as_uniform_and_replays_exactly(tmp_path):
    """The CPU default's real model (orchestrator.deterministic, so two runs can be compared
    exactly): gate.mode=shadow trains as gate.kind=uniform, every metric alike but shadow/*, and
    ``bench replay --per-step`` gives its logged figures."""
    short = [
        "orchestrator.steps=3",
        "orchestrator.max_rollouts=0",
        "orchestrator.batch_rollouts=0",
        "orchestrator.batch_groups=4",
        "orchestrator.eval_every=3",
        "data.num_train_prompts=64",
        "data.num_eval_prompts=16",
        "learner.micro_batch=16",
        "log.checkpoint_every=0",
        "log.tensorboard=false",
    ]
    for name, extra in [
        ("uniform", ["gate.kind=uniform"]),
        ("shadow", ["gate.kind=sara", "gate.sara.reference_prior=false", "gate.mode=shadow"]),
    ]:
        cfg = load_config(ROOT / "configs" / "default.yaml", short + extra + [f"run_dir={tmp_path / name}"])
        assert cfg.orchestrator.deterministic
        train(cfg, progress=False)
    uniform, shadow = _lines(tmp_path / "uniform"), _lines(tmp_path / "shadow")
    assert len(uniform) == len(shadow) == 4 and uniform[-1]["learner/grad_norm"] > 0

    def timed(key: str) -> bool:  # wall-clock figures (engine time is wall time on the torch engine)
        return any(t in key for t in ("wall", "_s", "time"))

    for a, b in zip(uniform, shadow):
        ours = {k: v for k, v in b.items() if not k.startswith("shadow/") and not timed(k)}
        assert ours == {k: v for k, v in a.items() if not timed(k)}
    logged = [line for line in shadow if "shadow/rollouts" in line]
    replayed = _bench_per_step(tmp_path / "shadow" / "groups", tmp_path / "replayed")
    assert len(replayed) == len(logged) == 3
    for line, row in zip(logged, replayed):
        for name in FIGURES:
            assert row[name] == line[f"shadow/{name}"], name
