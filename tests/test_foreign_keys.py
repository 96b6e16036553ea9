"""A key a TRL or verl user types is answered with the railgate key it means: one table
(``pipeline.config.foreign_keys``), read by the unknown-key error, every entry naming a real key."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from pipeline.config.build import ConfigError
from pipeline.config.foreign_keys import FOREIGN_KEYS
from railgate.cli import main
from railgate.config import RunConfig, load_config


@pytest.mark.parametrize(
    "override, railgate_key",
    [
        ("num_generations=8", "orchestrator.group_size"),
        ("learner.beta=0.04", "learner.kl_coef"),
        ("learning_rate=1e-6", "learner.lr"),
        ("max_completion_length=256", "orchestrator.max_tokens"),
        ("epsilon_high=0.28", "learner.clip_high"),
        ("actor_rollout_ref.rollout.n=8", "orchestrator.group_size"),
        ("per_device_train_batch_size=8", "orchestrator.batch_groups"),
        ("algorithm.kl_ctrl.kl_coef=0.001", "learner.kl_coef"),
        ("actor_rollout_ref.actor.optim.lr=1e-6", "learner.lr"),
        ("data.max_response_length=512", "orchestrator.max_tokens"),
        ("orchestrator.num_generations=8", "orchestrator.group_size"),
    ],
)
def test_trl_and_verl_names_are_answered_with_the_railgate_key(override, railgate_key):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    message = str(info.value)
    assert f"is {railgate_key} here" in message and "did you mean" not in message


def test_beta_no_longer_suggests_adams_betas():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["learner.beta=0.04"])
    assert "did you mean 'betas'" not in str(info.value) and "TRL's beta is learner.kl_coef" in str(info.value)


def test_a_plain_typo_still_gets_the_close_spelling():
    with pytest.raises(ConfigError, match="did you mean 'group_size'"):
        load_config(None, ["orchestrator.group_sise=8"])


def _keys(cls, prefix="") -> set[str]:
    out = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        name = f"{prefix}{f.name}"
        out.add(name)
        if dataclasses.is_dataclass(hints[f.name]):
            out |= _keys(hints[f.name], name + ".")
    return out


def test_every_entry_names_a_real_railgate_key():
    keys = _keys(RunConfig)
    assert {e.railgate for e in FOREIGN_KEYS.values()} <= keys
    assert not set(FOREIGN_KEYS) & {
        k.rsplit(".", 1)[-1] for k in keys if "." not in k
    }  # never shadows a real top-level key


def test_the_cli_answers_in_one_line(tmp_path, capsys):
    assert main(["train", "--no-progress", "--run-dir", str(tmp_path / "r"), "--set", "num_generations=16"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "orchestrator.group_size" in err and not (tmp_path / "r").exists()
