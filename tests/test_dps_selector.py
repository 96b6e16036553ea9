"""DpsSelector (the HMM filter and the selection rule) and the DPS gate built on it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from gate_harness import GateHarness, HarnessConfig
from gate_units import pool_of

from controller.gates.dps import DpsGate
from controller.gates.uniform import UniformGate
from controller.selectors.dps import PARTLY, SOLVED, UNSOLVED, DpsSelector, transition_matrix


def selector(n=6, **kwargs):
    kwargs.setdefault("explore", 0.0)
    return DpsSelector(pool_of(n), seed=0, **kwargs)


def test_filter_follows_a_prompt_from_unsolved_to_partly_to_solved():
    """Rewards move from all-0 to mixed to all-1, one group every 5 learner steps."""
    s = selector()
    step, phases, partly = 0, [], []
    for successes in (0, 0, 0, 2, 5, 3, 8, 8, 8):
        s.observe(0, successes, 8)
        partly.append(s.belief(0)[PARTLY])
        phases.append(int(np.argmax(s.belief(0))))
        for _ in range(5):
            s.advance(step)
            step += 1
        assert abs(sum(s.belief(0)) - 1) < 1e-12
    assert phases[2] == UNSOLVED and phases[5] == PARTLY and phases[8] == SOLVED
    assert partly[2] < partly[3] < partly[4] < partly[5]  # each mixed group adds evidence
    assert partly[5] > 0.9 and partly[8] < 0.01


def test_a_mixed_group_after_an_unsolved_history_points_to_partly_solved():
    s = selector()
    step = 0
    for _ in range(5):  # seen all wrong once per "epoch" of 10 learner steps
        s.observe(0, 0, 8)
        for _ in range(10):
            s.advance(step)
            step += 1
    assert s.belief(0)[UNSOLVED] > 0.8
    s.observe(0, 1, 8)  # one success in eight: mixed
    assert int(np.argmax(s.belief(0))) == PARTLY


def test_emission_uses_the_outcome_class():
    s = selector()
    s.observe(0, 1, 8)
    s.observe(1, 4, 8)
    assert s.belief(0) == s.belief(1)  # both mixed
    assert s.belief(0)[PARTLY] > 0.75


def test_transitions_drift_unseen_prompts_toward_solved():
    s = selector()
    before = s.belief(1)
    for step in range(50):
        s.advance(step)
    after = s.belief(1)
    assert after[SOLVED] > before[SOLVED] and after[UNSOLVED] < before[UNSOLVED]
    assert np.allclose(transition_matrix(0.02, 0.04, 0.01, 0.01).sum(axis=1), 1.0)


def test_take_prefers_partly_solved_and_never_doubles_a_busy_prompt():
    s = selector()
    s.observe(3, 4, 8)
    s.observe(5, 1, 8)
    s.observe(0, 0, 8)
    s.observe(1, 8, 8)
    first = [p.prompt_id for p in s.take(2)]
    assert sorted(first) == [3, 5]
    rest = [p.prompt_id for p in s.take(10)]
    assert sorted(rest) == [0, 1, 2, 4] and rest[-2:] in ([0, 1], [1, 0])  # seen-saturated come last
    assert s.take(1) == []  # everything is busy
    s.release(3)
    assert [p.prompt_id for p in s.take(1)] == [3]


def test_exploration_reaches_every_prompt():
    s = DpsSelector(pool_of(40), seed=1, explore=0.2)
    for pid in range(5):
        s.observe(pid, 4, 8)  # five very attractive prompts
    seen = set()
    for _ in range(300):
        got = s.take(4)
        seen.update(p.prompt_id for p in got)
        for p in got:
            s.release(p.prompt_id)
    assert seen == set(range(40))


def test_ranking_the_whole_pool_lets_the_favourites_monopolise():
    s = DpsSelector(pool_of(40), seed=1, explore=0.0, candidate_ratio=0)
    for pid in range(5):
        s.observe(pid, 4, 8)
    for _ in range(50):
        got = s.take(4)
        assert {p.prompt_id for p in got} <= set(range(5))
        for p in got:
            s.release(p.prompt_id)


def test_a_random_candidate_set_bounds_how_often_a_favourite_is_picked():
    """Each pick is the best of ``candidate_ratio`` random free prompts: a prompt that beats every
    other is picked about candidate_ratio / pool size of the time, not every time."""
    s = DpsSelector(pool_of(100), seed=4, explore=0.0, candidate_ratio=8)
    s.observe(7, 4, 8)  # the one prompt that looks partly solved
    picks, seen = 0, set()
    for _ in range(2000):
        got = s.take(1)
        seen.add(got[0].prompt_id)
        picks += got[0].prompt_id == 7
        s.release(got[0].prompt_id)
    assert 100 < picks < 230  # expected 2000 * 8 / 100 = 160
    assert len(seen) == 100  # and every prompt gets its turn


def test_the_candidates_are_ranked_by_partly_solved_belief():
    s = DpsSelector(pool_of(100), seed=5, explore=0.0, candidate_ratio=8)
    for pid in range(0, 100, 2):
        s.observe(pid, 0, 8)  # even prompts look unsolved
    got = [p.prompt_id for p in s.take(4)]  # the top 4 of 32 random candidates
    assert all(pid % 2 == 1 for pid in got)  # 16 odd candidates expected; the top 4 are odd


def test_checkpoint_restores_beliefs_busy_and_randomness():
    s = DpsSelector(pool_of(30), seed=3, explore=0.3)
    for pid in range(10):
        s.observe(pid, pid % 9, 8)
    s.take(5)
    s.advance(0)
    twin = DpsSelector(pool_of(30), seed=99, explore=0.3)
    twin.load_state_dict(json.loads(json.dumps(s.state_dict())))
    for _ in range(10):
        a, b = s.take(3), twin.take(3)
        assert [p.prompt_id for p in a] == [p.prompt_id for p in b]
        for p in a:
            s.release(p.prompt_id)
            twin.release(p.prompt_id)
            s.observe(p.prompt_id, 2, 8)
            twin.observe(p.prompt_id, 2, 8)
    assert np.array_equal(s.partly_probabilities(), twin.partly_probabilities())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"success_rates": (0.5, 0.2, 0.9)}, "increase"),
        ({"success_rates": (0.0, 0.5, 0.9)}, "strictly between"),
        ({"prior": (0.5, 0.5, 0.5)}, "summing to 1"),
        ({"explore": 1.5}, "explore"),
        ({"candidate_ratio": -1}, "candidate_ratio"),
        ({"partly_to_solved": 0.7, "partly_to_unsolved": 0.5}, "exceeds 1"),
    ],
)
def test_bad_settings_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        selector(**kwargs)


def test_dps_gate_spends_on_mixed_prompts_after_it_has_seen_them():
    # half the prompts are hopeless (p = 0), half are coin flips
    p = {i: (0.0 if i % 2 else 0.5) for i in range(64)}
    cfg = HarnessConfig(batch_groups=8, steps=30, max_async_steps=0)
    uniform = GateHarness(UniformGate(pool_of(64), 8), p, cfg).run()
    dps = GateHarness(DpsGate(DpsSelector(pool_of(64), seed=0), 8), p, cfg).run()
    dps.check_invariants()

    def late_yield(h):
        groups = [g for b in h.batch_log[15:] for g in b.groups]
        return sum(g.is_effective for g in groups) / len(groups)

    assert late_yield(uniform) < 0.65
    assert late_yield(dps) > 0.85


def test_dps_gate_needs_a_dps_selector():
    with pytest.raises(TypeError, match="DpsSelector"):
        DpsGate(pool_of(4), 8)
