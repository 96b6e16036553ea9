"""Token-level decision points queued by ``on_tokens`` and decided together by ``flush_decisions``."""

from __future__ import annotations

import pytest

from controller.rail.config import RailConfig
from controller.rail.controller import RailController
from pipeline.types import SamplingParams
from tests.rail_fakes import ListSink, committed, delta, snapshot
from tests.test_rail_integration import run

PARAMS = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=256)


def make(batch=True, **kw):
    cfg = dict(
        mode="live",
        backend="vw",
        behaviour="none",
        gain_threshold=-1.0,
        batch_token_decisions=batch,
        max_interventions_per_group=8,
        max_token_decisions_per_group=8,
    )
    cfg.update(kw)
    sink = ListSink()
    return RailController(RailConfig(**cfg), sink, PARAMS, seed=0, run_id="t"), sink


def spikes(rail, points):
    """One high-entropy delta per (group, sample) at position 16; returns on_tokens' actions."""
    out = []
    for gid, index in points:
        out += rail.on_tokens(snapshot(gid, rewards=()), index, delta(gid, index, 0, n=16))
        out += rail.on_tokens(snapshot(gid, rewards=()), index, delta(gid, index, 16, spike_at=3))
    return out


def test_points_of_one_tick_are_queued_then_decided_in_one_batch_in_order():
    rail, sink = make()
    points = [(1, 0), (2, 0), (3, 1), (1, 2)]
    assert spikes(rail, points) == [] and sink.decisions == []  # nothing decided yet
    assert rail.queued_decisions == 4
    rail.flush_decisions()
    assert rail.queued_decisions == 0
    recs = sink.by_point("token")
    assert [(r.group_id, r.sample_index) for r in recs] == points  # in the order they arose
    assert [r.decision_id for r in recs] == sorted(r.decision_id for r in recs)
    assert rail.counts["decision_batches"] == 1 and rail.counts["decisions_token"] == 4
    assert len(rail.latency_ns) == 4 and all(ns > 0 for ns in rail.latency_ns)
    # Every logged propensity is the probability of the chosen arm under the acting distribution.
    for r in recs:
        assert 0.0 < r.propensity <= 1.0 and r.propensity == r.behaviour_propensity


def test_a_batch_decides_as_one_decision_at_a_time_would():
    """Same points, same seed: deciding them in one batch or each at once logs the same decisions
    (one point per group: within a group, a batched point's features are those of the moment it
    arose, so they do not count an intervention chosen earlier in the same batch)."""
    batched, sink_b = make(batch=True)
    single, sink_s = make(batch=False)
    points = [(g, 0) for g in range(1, 11)]
    spikes(batched, points)
    batched.flush_decisions()
    spikes(single, points)
    key = lambda r: (r.group_id, r.sample_index, r.chosen, round(r.propensity, 12), r.features)  # noqa: E731
    assert [key(r) for r in sink_b.decisions] == [key(r) for r in sink_s.decisions]
    assert len(sink_b.decisions) == len(points)


def test_a_closed_groups_points_are_dropped_unlogged():
    rail, sink = make()
    spikes(rail, [(1, 0), (2, 0)])
    rail.on_closed(committed(1, (1.0, 0.0)), snapshot(1, rewards=(1.0, 0.0)))
    rail.flush_decisions()
    assert [r.group_id for r in sink.decisions] == [2]


def test_the_intervention_cap_holds_inside_a_batch():
    rail, sink = make(
        max_interventions_per_group=1,
        branch_temperatures=(1.0,),
        branch_sizes=(2,),
        resample_sizes=(),
        gain_threshold=-10.0,
    )
    spikes(rail, [(1, i) for i in range(6)])
    actions = rail.flush_decisions()
    logged = sink.by_point("token")
    interventions = [r for r in logged if r.chosen != "noop"]
    assert len(interventions) == 1 and len(actions) == 1 and actions[0].n == 2
    assert rail.counts["token_decisions_dropped"] == 6 - len(logged)


@pytest.mark.parametrize("batch", [True, False])
def test_an_orchestrated_run_batches_token_decisions_and_logs_them_all(tmp_path, monkeypatch, batch):
    monkeypatch.setattr(RailConfig, "__init__", _with_batch(RailConfig.__init__, batch))
    summary, rail, _engine = run(tmp_path, "probe_first", "live", "vw")
    tokens = rail.counts["decisions_token"]
    assert tokens > 20 and rail.counts["interventions"] > 0
    if batch:
        # Points that arise in the same tick share a batch: fewer batches than decisions.
        assert 0 < rail.counts["decision_batches"] < tokens
    else:
        assert rail.counts["decision_batches"] == 0
    assert rail.metrics()["controller/decisions"] == len(rail.latency_ns) or len(rail.latency_ns) == 20000


def _with_batch(init, batch):
    def patched(self, *args, **kwargs):
        kwargs.setdefault("batch_token_decisions", batch)
        kwargs.setdefault("batch_group_decisions", batch)
        init(self, *args, **kwargs)

    return patched


# --- group-level points (batch_group_decisions) ----------------------------------------------

from controller.gates.uniform import UniformGate  # noqa: E402
from controller.prompts import PromptPool  # noqa: E402
from pipeline.config.sections import OrchestratorConfig  # noqa: E402
from pipeline.core.messages import SampleDone, Started, Tick  # noqa: E402
from pipeline.core.tracker import GroupTracker  # noqa: E402
from pipeline.types import ActionKind, FinishReason, GroupAction, Prompt, SampleFinished, ScoredSample  # noqa: E402

ABANDON = GroupAction(ActionKind.ABANDON, 1, reason="sara")
COMMIT = GroupAction(ActionKind.COMMIT, 1, reason="sara")


def test_a_rescue_with_nothing_running_is_held_then_decided_with_the_tick_batch():
    rail, sink = make(gain_threshold=-10.0)
    spikes(rail, [(2, 0)])  # a token point of another group, queued in the same tick
    out = rail.on_group(snapshot(1), [ABANDON])
    assert [a.kind for a in out] == [ActionKind.HOLD] and out[0].group_id == 1
    assert sink.decisions == [] and rail.queued_decisions == 2
    actions = rail.flush_decisions()
    assert rail.counts["decision_batches"] == 1 and [r.decision_point for r in sink.decisions] == [
        "token",
        "group_rescue",
    ]
    rescue = sink.by_point("group_rescue")[0]
    mine = [a for a in actions if a.group_id == 1]
    if rescue.chosen == "noop":
        assert mine == [ABANDON]  # the gate's proposal, released
    else:
        # The intervention replaces the abandon; its samples name the logged decision.
        assert mine and all(a.kind is ActionKind.LAUNCH and a.origin == rescue.decision_id for a in mine)
        assert rail.counts["rescued_fail"] == 1
    assert 0.0 < rescue.propensity <= 1.0


def test_an_extend_is_held_then_its_commit_comes_back_with_the_intervention():
    rail, sink = make(gain_threshold=-10.0, token_decisions=False)
    out = rail.on_group(snapshot(1, rewards=(1.0, 0.0, 1.0, 0.0)), [COMMIT])
    assert [a.kind for a in out] == [ActionKind.HOLD]
    actions = rail.flush_decisions()
    extend = sink.by_point("group_extend")
    assert len(extend) == 1 and actions[0] == COMMIT
    assert all(a.kind is ActionKind.LAUNCH and a.origin == extend[0].decision_id for a in actions[1:])
    assert (len(actions) == 1) == (extend[0].chosen == "noop")


def test_a_group_with_samples_running_is_decided_at_once():
    rail, sink = make(gain_threshold=-10.0, token_decisions=False)
    out = rail.on_group(snapshot(1, in_flight=2), [ABANDON])
    assert ActionKind.HOLD not in [a.kind for a in out] and rail.queued_decisions == 0
    assert len(sink.by_point("group_rescue")) == 1


class _HoldingController:
    """Holds every proposal of the gate, then releases (or drops) it at the flush."""

    wants_tokens = False

    def __init__(self, release: bool):
        self.release = release
        self.held: list[GroupAction] = []

    @property
    def queued_decisions(self) -> int:
        return len(self.held)

    def on_group(self, snapshot, proposed):
        self.held += [a for a in proposed if a.group_id == snapshot.group_id]
        return [GroupAction(ActionKind.HOLD, snapshot.group_id)]

    def on_tokens(self, *args):
        return []

    def on_closed(self, group, snapshot):
        pass

    def flush_decisions(self):
        held, self.held = self.held, []
        return held if self.release else [GroupAction(ActionKind.LAUNCH, a.group_id, n=1, origin=99) for a in held]

    def metrics(self):
        return {}


@pytest.mark.parametrize("release", [True, False])
def test_the_tracker_logs_a_held_gate_proposal_when_it_is_decided(release):
    """The trace keeps its form: the gate's proposal is logged once, at the flush, executed
    exactly when the controller's batch released it."""
    sink = ListSink()
    controller = _HoldingController(release)
    cfg = OrchestratorConfig(batch_groups=1, group_size=2, steps=1, max_concurrent_samples=2, max_open_groups=1)
    tracker = GroupTracker(
        UniformGate(PromptPool([Prompt(i, "", (1,)) for i in range(4)], seed=0), 2), controller, cfg, trace=sink
    )
    starts = [*tracker.handle(Started()), *tracker.handle(Tick())]
    for start in starts:
        [score] = tracker.handle(SampleFinished(start.request.request_id, (7,), (0.0,), FinishReason.STOP, 0))
        tracker.handle(SampleDone(ScoredSample(score.request, score.finished, reward=1.0)))
    assert sink.decisions == [] and tracker.decisions_queued == 1
    assert tracker.handle(Tick(backlog=3)) == () and sink.decisions == []  # messages wait behind it: not yet
    out = tracker.handle(Tick(backlog=0))  # the tick's messages are in: decided now
    assert [(r.chosen, r.features.get("executed")) for r in sink.decisions] == [("commit", float(release))]
    if release:
        assert [type(a).__name__ for a in out] == ["Train"]  # the released commit shipped the group
    else:
        assert [type(a).__name__ for a in out] == ["Start"]  # the controller's launch ran in its place


def test_queued_points_are_decided_within_a_bounded_number_of_events():
    from pipeline.core.deciding import DECIDE_WITHIN_EVENTS

    controller = _HoldingController(release=True)
    controller.held = [COMMIT]
    tracker = GroupTracker(
        UniformGate(PromptPool([Prompt(0, "", (1,))], seed=0), 2),
        controller,
        OrchestratorConfig(batch_groups=1, group_size=2, steps=1),
    )
    decided = []
    for _ in range(DECIDE_WITHIN_EVENTS):
        tracker.handle(Tick(backlog=5))  # messages keep waiting behind each one
        decided.append(tracker.decisions_queued == 0)
    assert decided == [False] * (DECIDE_WITHIN_EVENTS - 1) + [True]


@pytest.mark.parametrize("backend, gain_threshold", [("vw", 0.0), ("vw", -1.0), ("river", 0.0)])
def test_a_live_batch_decides_on_arrays_as_each_context_alone_would(backend, gain_threshold):
    """``Decider.choose_many`` (arrays, one block per arms tuple) against ``choose`` on each
    context, from the same learner and the same uniform draws: the same arms, propensities
    and gains, with and without the live rule's shrinking and with two arms tuples mixed."""
    import random

    from controller.rail.features import Context

    rail, _ = make(backend=backend, gain_threshold=gain_threshold)
    rng = random.Random(0)
    contexts = []
    for k in range(40):
        arms = rail.arms if k % 3 else rail._other_arms
        feats = {
            "post_mean": rng.random(),
            "length_estimate": 0.05 + rng.random() / 10,
            "position_fraction": rng.random(),
        }
        contexts.append(Context.build("token", feats, arms))
    for k, ctx in enumerate(contexts[:20]):  # some learning, so that gains differ across arms
        rail.learner.learn_one(ctx, rail.decider.choose(ctx, "live").acted, reward=(k % 5) / 4 - 0.3)
    state = rail.decider.state_dict()
    batch = rail.decider.choose_many(contexts, "live")
    rail.decider.load_state_dict(state)
    single = [rail.decider.choose(c, "live") for c in contexts]
    for b, s in zip(batch, single):
        assert b.acted.action == s.acted.action
        assert (
            b.propensity == pytest.approx(s.propensity, abs=1e-12)
            and b.propensity == b.acted.probabilities[b.acted.action]
        )
        assert b.acted.probabilities == pytest.approx(s.acted.probabilities, abs=1e-12)
        assert b.acted.predicted_gains == pytest.approx(s.acted.predicted_gains, abs=1e-12)
        assert b.other_prob == pytest.approx(s.other_prob) and b.q_other == pytest.approx(s.q_other, abs=1e-12)
    assert len({c.acted.action for c in batch}) > 1


def test_a_long_queue_is_decided_in_batches_of_at_most_decision_batch_max():
    rail, sink = make(decision_batch_max=3)
    points = [(g, 0) for g in range(1, 9)]
    spikes(rail, points)
    rail.flush_decisions()
    assert rail.counts["decision_batches"] == 3 and len(sink.by_point("token")) == 8  # 3 + 3 + 2
    assert [(r.group_id, r.sample_index) for r in sink.by_point("token")] == points


def test_decision_batch_max_must_be_positive():
    from pipeline.config.build import ConfigError

    with pytest.raises((ConfigError, ValueError), match="decision_batch_max=0"):
        RailConfig(decision_batch_max=0)


@pytest.mark.parametrize("n_points", [1, 10])  # the one-at-a-time scorer and the array path
def test_a_logged_records_features_are_its_own_copy_of_the_context(n_points):
    """Live choices share one empty, read-only ``extra_features`` (no dict per decision), and the
    trace record's features are a copy of the context's (same keys in the same order): writing
    to a logged record cannot change the context the learner later learns from."""
    rail, sink = make()
    spikes(rail, [(g, 0) for g in range(1, n_points + 1)])
    queued = [q.context for q in rail._queue]
    choices = rail.decider.choose_many(queued, "live")
    assert all(c.extra_features == {} for c in choices)
    with pytest.raises(TypeError):
        choices[0].extra_features["x"] = 1.0  # type: ignore[index]
    rail.flush_decisions()
    records = sink.by_point("token")
    assert len(records) == n_points
    for rec, ctx in zip(records, queued):
        assert list(rec.features.items()) == list(ctx.features.items()) and rec.features is not ctx.features
        rec.features["post_mean"] = -1.0
        assert ctx.features["post_mean"] != -1.0


def test_a_block_mixing_decision_points_uses_each_points_behaviour_distribution():
    """ARPO's rule depends on the decision point (branch at a token, nothing at an extend), and a
    token point and an extend point with a prefix share every arm, so one array block holds both:
    each row's other-policy probability and expectation must be those of its own point, as
    ``choose`` gives them (they feed the promotion window's doubly-robust estimates)."""
    import random

    from controller.rail.features import Context

    rail, _ = make(behaviour="arpo", behaviour_epsilon=0.2)
    rng = random.Random(1)
    contexts = [
        Context.build(
            "token" if k % 2 else "extend",
            {"post_mean": rng.random(), "length_estimate": 0.1, "position_fraction": rng.random()},
            rail.arms,
        )
        for k in range(12)
    ]
    for k, ctx in enumerate(contexts):  # some learning, so that gains differ across arms
        rail.learner.learn_one(ctx, rail.decider.choose(ctx, "live").acted, reward=(k % 5) / 4 - 0.3)
    state = rail.decider.state_dict()
    batch = rail.decider.choose_many(contexts, "live")
    rail.decider.load_state_dict(state)
    single = [rail.decider.choose(c, "live") for c in contexts]
    assert len(batch) > 4  # the array path
    for b, s in zip(batch, single):
        assert b.acted.action == s.acted.action
        assert b.other_prob == pytest.approx(s.other_prob, abs=1e-12) and b.q_other == pytest.approx(
            s.q_other, abs=1e-12
        )
    behaviour = rail.decider.behaviour
    assert behaviour.distribution(contexts[0])[0] != behaviour.distribution(contexts[1])[0]  # the points differ
