"""The empirical-Bayes prior per difficulty level, and SARA starting groups from it."""

from __future__ import annotations

import random

import pytest
from gate_units import admit, checkpoint_roundtrip, closing, kinds, snap, update

from controller.config import SaraConfig
from controller.gates.sara import SaraGate
from controller.level_prior import LevelPrior
from controller.prompts import PromptPool
from pipeline.config.build import ConfigError
from pipeline.types import Prompt


@pytest.mark.parametrize("a, b", [(0.5, 4.5), (2.0, 2.0), (6.0, 1.5)])
def test_the_fit_recovers_a_known_beta_from_groups_of_mixed_sizes(a, b):
    """Prompts' rates drawn from Beta(a, b), groups of 4 (abandoned probes) and 8: the fit's
    mean and strength come back within sampling error."""
    rng = random.Random(0)
    prior = LevelPrior(window=4000, min_groups=2, max_strength=50.0)
    for i in range(4000):
        p = rng.betavariate(a, b)
        n = 4 if i % 2 else 8
        prior.observe(3.0, sum(rng.random() < p for _ in range(n)), n)
    fa, fb = prior.prior(3.0)
    assert fa / (fa + fb) == pytest.approx(a / (a + b), abs=0.02)
    assert fa + fb == pytest.approx(a + b, rel=0.25)


def test_a_level_forgets_beyond_its_window_and_falls_back_below_min_groups():
    prior = LevelPrior(window=8, min_groups=4, fallback=(2.0, 3.0))
    for _ in range(3):
        prior.observe(1.0, 0, 4)
    assert prior.prior(1.0) == (2.0, 3.0) and prior.prior(9.0) == (2.0, 3.0)
    prior.observe(1.0, 0, 4)
    assert prior.prior(1.0)[0] < 0.5  # four failing groups: a rate near 0
    for _ in range(8):  # the policy learned the level: the old failures leave the window
        prior.observe(1.0, 4, 4)
    a, b = prior.prior(1.0)
    assert a / (a + b) > 0.9
    prior.observe(1.0, 0, 0)  # a group that ended with no rollout says nothing
    assert prior.prior(1.0) == (a, b)


def test_bad_arguments_say_what_to_change():
    with pytest.raises(ValueError, match="min_groups=9"):
        LevelPrior(window=8, min_groups=9)
    with pytest.raises(ValueError, match="successes=5"):
        LevelPrior().observe(1.0, 5, 4)
    with pytest.raises(ConfigError, match="level_min_groups=100"):
        SaraConfig(level_prior=True, level_window=64, level_min_groups=100)


def levels_pool():
    """Prompts 0-9 at difficulty 5 (hard), 10-19 at difficulty 1 (easy)."""
    return PromptPool([Prompt(i, f"p{i}", (i,), difficulty=5.0 if i < 10 else 1.0) for i in range(20)], seed=0)


def test_sara_abandons_a_hopeless_level_after_a_two_rollout_probe():
    """With the level prior, two failures of a level that always failed abandon the group; from
    the uniform prior two failures leave P_eff = 6/9 and the group is committed (and spent on);
    a mixed probe commits either way."""
    config = SaraConfig(probe_size=2, level_prior=True, level_min_groups=4)
    gate = SaraGate(levels_pool(), group_size=8, config=config)
    for _ in range(6):
        gate.levels.observe(5.0, 0, 4)
    uniform = SaraGate(levels_pool(), group_size=8, config=SaraConfig(probe_size=2))
    for g in (gate, uniform):
        plans = admit(g, 20)
        hard = next(p for p in plans if p.prompt.difficulty == 5.0)
        verdict = kinds(update(g, snap(hard.group_id, hard.prompt, (0, 0))))
        assert verdict == (
            [("abandon", hard.group_id, 0)]
            if g is gate
            else [("launch", hard.group_id, 6), ("commit", hard.group_id, 0)]
        )
        easy = next(p for p in plans if p.prompt.difficulty == 1.0)
        assert kinds(update(g, snap(easy.group_id, easy.prompt, (1, 0))))[-1] == ("commit", easy.group_id, 0)
    a, b = gate.levels.prior(5.0)
    assert a < 0.5 < b and gate.levels.prior(1.0) == (1.0, 1.0)  # the easy level has no fit yet


def test_the_level_fit_learns_from_abandoned_and_shipped_groups_and_survives_a_checkpoint():
    config = SaraConfig(probe_size=2, level_prior=True, level_min_groups=2)
    gate = SaraGate(levels_pool(), group_size=8, config=config)
    plans = admit(gate, 4)
    for plan in plans:
        last = snap(plan.group_id, plan.prompt, (0, 0) if plan.prompt.difficulty == 5.0 else (1, 0))
        update(gate, last)
        gate.on_closed(closing(last, plan.prompt.difficulty != 5.0), committed=plan.prompt.difficulty != 5.0)
    abandoned = sum(p.prompt.difficulty == 5.0 for p in plans)
    assert len(gate.levels._levels.get(5.0, ())) == abandoned
    restored = checkpoint_roundtrip(gate, lambda: SaraGate(levels_pool(), group_size=8, config=config))
    assert restored.levels.state_dict() == gate.levels.state_dict()
    assert restored._level_of == gate._level_of
