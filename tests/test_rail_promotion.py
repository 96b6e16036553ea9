"""Shadow-to-live promotion and demotion on doubly-robust evidence."""

from __future__ import annotations

import math
import random

import pytest

from controller.rail.controller import RailController
from controller.rail.promotion import Promoter, WindowEntry
from pipeline.types import SamplingParams
from tests.rail_fakes import ListSink, rescue_round, shadow_config


def shadow_log(n, learned_better, seed=0):
    """Behaviour picks arm 0 or 1 uniformly; the learned policy puts 0.9 on arm 1.
    Arm 1 pays 0.2 (or -0.2 when the learned policy is worse), arm 0 pays 0; rewards are noisy."""
    rng = random.Random(seed)
    good = 0.2 if learned_better else -0.2
    out = []
    for _ in range(n):
        arm = rng.randint(0, 1)
        reward = (good if arm == 1 else 0.0) + rng.gauss(0.0, 0.05)
        pi = 0.9 if arm == 1 else 0.1
        q = (0.0, good)  # a reward model that learned the truth
        out.append(WindowEntry(reward, 0.5, pi, q[arm], 0.1 * q[0] + 0.9 * q[1]))
    return out


def feed(promoter, entries):
    """Record entries until the first switch (later entries would belong to the other mode)."""
    for x in entries:
        evidence = promoter.record(x)
        if evidence is not None:
            return [evidence]
    return []


def test_promotes_when_the_learned_policy_is_clearly_better():
    p = Promoter(evaluate_every=50, min_decisions=200, window=1000)
    switches = feed(p, shadow_log(400, learned_better=True))
    assert p.mode == "live" and p.promotions == 1 and len(switches) == 1
    ev = switches[0]
    assert ev.n >= 200 and ev.other.lower > ev.acting.value
    assert ev.other.value == pytest.approx(0.9 * 0.2, abs=0.03)
    assert len(p) < 400  # the window restarted with the switch


def test_does_not_promote_when_worse_or_before_min_decisions():
    worse = Promoter(evaluate_every=50, min_decisions=200, window=1000)
    assert feed(worse, shadow_log(1000, learned_better=False)) == [] and worse.mode == "shadow"
    assert worse.last is not None and worse.last.other.value < worse.last.acting.value
    early = Promoter(evaluate_every=10, min_decisions=500, window=1000)
    assert feed(early, shadow_log(400, learned_better=True)) == [] and early.mode == "shadow"


def test_demotes_when_the_live_policy_falls_back():
    p = Promoter(evaluate_every=50, min_decisions=200, window=1000, mode="live")
    rng = random.Random(1)
    entries = []
    for _ in range(400):  # live puts 0.9 on arm 1, which now costs; the behaviour would mostly no-op
        arm = 1 if rng.random() < 0.9 else 0
        reward = (-0.2 if arm == 1 else 0.0) + rng.gauss(0.0, 0.05)
        mu = 0.9 if arm == 1 else 0.1
        b = 0.2 if arm == 1 else 0.8
        q = (0.0, -0.2)
        entries.append(WindowEntry(reward, mu, b, q[arm], 0.8 * q[0] + 0.2 * q[1]))
    switches = feed(p, entries)
    assert p.mode == "shadow" and p.demotions == 1 and switches[0].acting.upper < switches[0].other.value


def test_no_switch_when_auto_promotion_is_off():
    p = Promoter(evaluate_every=50, min_decisions=200, window=1000, auto=False)
    assert feed(p, shadow_log(400, learned_better=True)) == []
    assert p.mode == "shadow" and p.last is not None and p.last.switch


def test_unusable_entries_are_ignored_and_state_round_trips():
    p = Promoter(evaluate_every=10, min_decisions=20, window=50)
    assert p.record(WindowEntry(1.0, 0.0, 0.5, 0.0, 0.0)) is None and len(p) == 0
    feed(p, shadow_log(30, True))
    q = Promoter(evaluate_every=10, min_decisions=20, window=50)
    q.load_state_dict(p.state_dict())
    assert q.evaluate() == p.evaluate()


def test_a_full_window_keeps_the_last_entries_oldest_first():
    """The window is a ring: once full, each entry replaces the oldest, and a check (and the
    saved state) sees exactly the last ``window`` entries in their order."""
    from controller.ope import doubly_robust, ips

    entries = shadow_log(130, True, seed=3)
    p = Promoter(evaluate_every=1000, min_decisions=20, window=50, auto=False)
    for x in entries:
        p.record(x)
    last = entries[-50:]
    assert len(p) == 50 and p.state_dict()["entries"] == [list(x.__dict__.values()) for x in last]
    evidence = p.evaluate()
    r, mu, pi, ql, qo = (
        [getattr(x, f) for x in last] for f in ("reward", "logged_prob", "other_prob", "q_logged", "q_other")
    )
    assert evidence.acting == ips(r, mu, mu) and evidence.other == doubly_robust(r, mu, pi, ql, qo)
    q = Promoter(evaluate_every=1000, min_decisions=20, window=30)  # a smaller window keeps the newest
    q.load_state_dict(p.state_dict())
    assert q.state_dict()["entries"] == [list(x.__dict__.values()) for x in entries[-30:]]
    with pytest.raises(ValueError, match="5 numbers"):
        q.load_state_dict({**p.state_dict(), "entries": [[1.0, 0.5]]})


def rail_for(**kw):
    promotion = dict(evaluate_every=40, min_decisions=120, window=2000, warmup_decisions=50)
    sink = ListSink()
    return RailController(shadow_config(**{**promotion, **kw}), sink, SamplingParams(max_tokens=128), seed=1), sink


def test_controller_promotes_when_rescues_pay_and_logs_the_switch():
    rail, sink = rail_for()  # the behaviour mostly does nothing, though rescues pay
    for gid in range(600):
        rescue_round(rail, gid, pays=True)
    switches = sink.by_point("promotion")
    assert rail.promoter.promotions == 1 and len(switches) == 1 and switches[0].chosen == "live"
    ev = switches[0].features
    assert ev["n"] >= 120 and ev["other_lower"] > ev["acting_value"] and ev["was_live"] == 0.0
    assert rail.metrics()["controller/promotions"] == 1 and rail.metrics()["controller/live"] == 1.0
    live = [r for r in sink.decisions if r.mode == "live" and r.decision_point == "group_rescue"]
    assert live and sum(r.chosen != "noop" for r in live) / len(live) > 0.5  # now it rescues
    # Gain-prediction error is tracked against the frozen copy taken after warm-up.
    assert rail.frozen is not None and "controller/gain_error_frozen" in rail.metrics()


def test_controller_keeps_shadow_before_min_decisions_or_without_auto_promotion():
    for kw in ({"min_decisions": 1000, "window": 2000}, {"auto_promote": False}):
        rail, sink = rail_for(**kw)
        for gid in range(300):
            rescue_round(rail, gid, pays=True)
        assert rail.mode == "shadow" and sink.by_point("promotion") == []


def test_manual_switch_is_logged():
    rail, sink = rail_for()
    rail.set_mode("live")  # no evidence yet: logged all the same
    assert rail.mode == "live"
    for gid in range(200):
        rescue_round(rail, gid, pays=True)
    rail.set_mode("shadow", policy_version=3)
    first, second = sink.by_point("promotion")
    assert first.chosen == "live" and first.features == {"manual": 1.0} and math.isnan(first.predicted_gain)
    assert second.chosen == "shadow" and second.features["manual"] == 1.0 and second.policy_version == 3
    assert second.features["n"] >= 120 and second.features["was_live"] == 1.0  # the live window's evidence
    with pytest.raises(ValueError, match="mode='off'"):
        rail.set_mode("off")
