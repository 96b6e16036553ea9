"""RailController through the Controller protocol, on hand-made snapshots and deltas."""

from __future__ import annotations

import json

import numpy as np
import pytest

from controller.rail.bandit import ControllerStateError
from controller.rail.config import RailConfig
from controller.rail.controller import RailController
from pipeline.protocols import Controller
from pipeline.types import ActionKind, GroupAction, SamplingParams
from tests.rail_fakes import ListSink, committed, delta, snapshot

PARAMS = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=256)
ABANDON = GroupAction(ActionKind.ABANDON, 1, reason="sara")


def make(**kw):
    # Group-level points decided at once (test_rail_batched_decisions covers the queued path).
    defaults = dict(
        mode="shadow", backend="river", behaviour="arpo", behaviour_epsilon=0.0, batch_group_decisions=False
    )
    defaults.update(kw)
    sink = ListSink()
    return RailController(RailConfig(**defaults), sink, PARAMS, seed=0, run_id="t"), sink


def stream(rail, group_id, index, length, logprob=-0.5, spikes=()):
    """Feed ``length`` tokens of one sample in deltas of 8, each followed by the flush the
    orchestrator's tracking loop makes; returns the actions they produced."""
    out = []
    for pos in range(0, length, 8):
        spike = next((s - pos for s in spikes if pos <= s < pos + 8), None)
        out += rail.on_tokens(
            snapshot(group_id, rewards=()), index, delta(group_id, index, pos, spike_at=spike, logprob=logprob)
        )
        out += rail.flush_decisions()
    return out


def test_implements_the_controller_protocol():
    rail, _ = make()
    assert isinstance(rail, Controller)
    assert rail.wants_tokens
    assert not make(token_decisions=False, branch_sizes=())[0].wants_tokens


def test_shadow_logs_the_learned_choice_and_acts_with_the_behaviour():
    rail, sink = make(behaviour="none")  # the behaviour never intervenes
    out = rail.on_group(snapshot(), [ABANDON])
    assert out == [ABANDON]
    [rec] = sink.decisions
    assert rec.mode == "shadow" and rec.decision_point == "group_rescue" and rec.chosen == "noop"
    assert rec.behaviour_propensity == 1.0  # the acting (behaviour) policy's
    assert 0.0 < rec.propensity < 1.0  # the learned policy's probability of the executed arm
    assert rec.actions[0] == "noop" and all(not a.startswith("branch") for a in rec.actions)  # no prefix known
    choice = int(rec.features["shadow.choice"])
    assert 0 <= choice < len(rec.actions)
    assert 0.0 < rec.features["shadow.choice_propensity"] <= 1.0
    assert np.isfinite(rec.features["shadow.choice_gain"]) and np.isfinite(rec.predicted_gain)
    rail.on_closed(None, snapshot())
    assert sink.outcomes == [(rec.decision_id, 0.0, 0)]  # a no-op earns 0 by construction


def test_rescue_branches_the_most_promising_prefix_and_replaces_the_abandon():
    rail, sink = make(token_decisions=False)
    for index, lp in enumerate((-2.0, -0.3, -1.0, -0.8)):
        stream(rail, 1, index, 40, logprob=lp)
    other = GroupAction(ActionKind.LAUNCH, 7, n=2)  # another group's action passes through
    out = rail.on_group(snapshot(rewards=(0.0,) * 4), [other, ABANDON])
    assert out[0] == other and all(a.kind is not ActionKind.ABANDON for a in out)
    [launch] = out[1:]
    [rec] = sink.decisions
    assert rec.chosen == "branch_b2_t1" and launch.origin == rec.decision_id
    assert launch.kind is ActionKind.LAUNCH and launch.n == 2 and launch.params.temperature == 1.0
    assert launch.params.max_tokens == 256 and launch.params.top_p == 0.95
    spec = launch.branch
    assert spec.source_request_id == "g1-s1"  # the highest mean log-prob
    assert spec.prefix_len == rec.token_position and 1 <= spec.prefix_len < 40
    assert spec.prefix_token_ids == tuple(range(10, 10 + spec.prefix_len))
    assert spec.prefix_logprobs == (-0.3,) * spec.prefix_len
    assert rec.sample_index == 1


def test_abandon_waits_for_the_rescue_samples_then_passes():
    rail, sink = make(
        token_decisions=False, branch_sizes=(), resample_sizes=(2,), resample_temperatures=(1.3,), behaviour_epsilon=0.0
    )
    [launch] = rail.on_group(snapshot(tokens=400), [ABANDON])
    d = launch.origin
    # One rescue sample back (a failure), one still running: the gate's new ABANDON is held back.
    waiting = snapshot(rewards=(0.0,) * 5, origins=(-1,) * 4 + (d,), in_flight=1, tokens=470)
    assert rail.on_group(waiting, [ABANDON]) == []
    assert rail.counts["abandons_deferred"] == 1
    # Both back, still all failures: the rescue cap is reached, so the abandon goes through.
    done = snapshot(rewards=(0.0,) * 6, origins=(-1,) * 4 + (d, d), in_flight=0, tokens=540)
    assert rail.on_group(done, [ABANDON]) == [ABANDON]
    assert len(sink.decisions) == 1
    rail.on_closed(None, done)
    [(decision_id, reward, tokens)] = sink.outcomes
    assert decision_id == d and tokens == 140  # every token after the rescue is its cost
    assert rail.length_estimate == 128  # max_tokens / 2 until a response is seen
    # dropped: no gain; the cost in rollout-equivalents, tokens / mean tokens per rollout
    assert reward == pytest.approx(-rail.config.cost_lambda * 140 / 128)


def test_successful_rescue_earns_the_groups_variance_minus_its_rollout_equivalents():
    rail, sink = make(token_decisions=False, branch_sizes=(), resample_sizes=(2,), resample_temperatures=(1.3,))
    [launch] = rail.on_group(snapshot(tokens=400), [ABANDON])
    d = launch.origin
    rewards = (0.0,) * 4 + (1.0, 0.0, 1.0, 0.0)  # a success came back; the gate then filled the group
    final = snapshot(rewards=rewards, origins=(-1,) * 4 + (d, d, -1, -1), tokens=1000)
    rail.on_closed(committed(1, rewards), final)
    [(decision_id, reward, tokens)] = sink.outcomes
    assert tokens == 600 and reward == pytest.approx(
        np.var(rewards) - rail.config.cost_lambda * 600 / rail.length_estimate
    )
    assert rail.learner.learned == 1


def test_token_decisions_branch_at_entropy_spikes_with_rate_limits():
    rail, sink = make(max_token_decisions_per_group=2, max_interventions_per_group=5, min_tokens_between_decisions=16)
    actions = stream(rail, 1, 0, 64, spikes=(19, 27, 50))  # 27 is too close to 19
    tokens = rail.buffers.get("g1-s0").tokens
    assert [a.branch.prefix_len for a in actions] == [19, 50]
    first = actions[0]
    assert first.branch.source_request_id == "g1-s0"
    assert first.branch.prefix_token_ids == tuple(tokens[:19])
    recs = sink.by_point("token")
    assert [r.token_position for r in recs] == [19, 50] and all(r.chosen == "branch_b2_t1" for r in recs)
    assert recs[0].features["token_entropy"] == 3.0 and recs[0].features["point_token"] == 1.0
    # The per-group cap of two token decisions is spent.
    assert stream(rail, 1, 1, 64, spikes=(20,)) == []


def test_no_entropies_means_no_token_decisions_but_prefixes_are_kept():
    rail, sink = make()
    for pos in range(0, 32, 8):
        assert rail.on_tokens(snapshot(rewards=()), 0, delta(1, 0, pos, entropies=False)) == []
    assert sink.decisions == [] and rail.buffers.get("g1-s0").length == 32


def test_branch_of_a_branch_knows_its_whole_prefix():
    rail, _ = make(max_interventions_per_group=5)
    [branch] = stream(rail, 1, 0, 32, spikes=(19,))
    # The branch streams from position 19 on; its buffer takes the source's prefix over.
    rail.on_tokens(snapshot(rewards=()), 4, delta(1, 4, 19, n=8))
    buf = rail.buffers.get("g1-s4")
    assert buf.known and buf.length == 27
    assert buf.prefix(21)[0] == branch.branch.prefix_token_ids + (10 + 19, 10 + 20)


def test_extend_adds_samples_after_the_gates_commit_in_live_mode():
    rail, sink = make(mode="live", token_decisions=False, branch_sizes=(), gain_threshold=-1.0)
    proposed = [GroupAction(ActionKind.LAUNCH, 1, n=4), GroupAction(ActionKind.COMMIT, 1)]
    seen = set()
    for gid in range(2, 40):
        snap = snapshot(group_id=gid, rewards=(1.0, 0.0, 0.0, 0.0))
        prop = [GroupAction(a.kind, gid, n=a.n) for a in proposed]
        out = rail.on_group(snap, prop)
        assert out[:2] == prop  # the gate's own actions stay, in order
        seen.add(len(out))
        rec = sink.decisions[-1]
        assert rec.mode == "live" and rec.decision_point == "group_extend"
        assert rec.propensity == rec.behaviour_propensity  # live: the acting policy is the learned one
    assert seen == {2, 3}  # sometimes no-op, sometimes one more LAUNCH


def test_live_threshold_rule_shrinks_interventions():
    rail, _ = make(mode="live", gain_threshold=10.0, below_threshold_explore=0.1)
    from controller.rail.features import Context

    ctx = Context.build("rescue", {"length_estimate": 0.1}, rail.arms)
    probs, gains = rail.learner.distribution(ctx)
    live = rail.decider.live_distribution(ctx, probs, gains)
    assert sum(live[1:]) == pytest.approx(0.1 * sum(probs[1:]))
    assert sum(live) == pytest.approx(1.0) and min(live) > 0


def test_closed_group_drops_buffers_and_state():
    rail, _ = make()
    stream(rail, 1, 0, 16)
    stream(rail, 2, 0, 16)
    rail.on_closed(None, snapshot(group_id=1))
    assert rail.buffers.group(1) == [] and len(rail.buffers.group(2)) == 1
    assert 1 not in rail._groups


def test_metrics_are_namespaced():
    rail, _ = make(behaviour="none")
    rail.on_group(snapshot(), [ABANDON])
    rail.on_closed(None, snapshot())
    m = rail.metrics()
    assert all(k.startswith("controller/") for k in m)
    assert m["controller/live"] == 0.0 and m["controller/decisions"] == 1.0
    assert m["controller/decision_p99_us"] > 0


@pytest.mark.parametrize("backend", ["vw", "river"])
def test_state_file_round_trip(tmp_path, backend):
    rail, _ = make(backend=backend, behaviour="none", behaviour_epsilon=0.5, token_decisions=False)
    for gid in range(30):
        rail.on_group(snapshot(group_id=gid), [GroupAction(ActionKind.ABANDON, gid)])
        rail.on_closed(None, snapshot(group_id=gid))
    path = tmp_path / "rail.json"
    rail.save(path)
    other, _ = make(backend=backend, behaviour="none", behaviour_epsilon=0.5, token_decisions=False)
    other.load(path)
    from controller.rail.features import Context

    ctx = Context.build("rescue", {"length_estimate": 0.1}, rail.arms)
    assert other.learner.predict_gains(ctx) == pytest.approx(rail.learner.predict_gains(ctx))
    assert other.counts == rail.counts and other.mode == rail.mode
    # Both continue identically (same random streams).
    for c in (rail, other):
        c.on_group(snapshot(group_id=99), [GroupAction(ActionKind.ABANDON, 99)])
    assert rail.sink.decisions[-1].chosen == other.sink.decisions[-1].chosen


def test_corrupt_state_files_are_clear_errors(tmp_path):
    rail, _ = make()
    path = tmp_path / "rail.json"
    rail.save(path)
    text = path.read_text()
    bad = tmp_path / "bad.json"
    bad.write_text(text[: len(text) // 2])
    with pytest.raises(ControllerStateError, match="not valid JSON"):
        rail.load(bad)
    with pytest.raises(ControllerStateError, match="does not exist"):
        rail.load(tmp_path / "missing.json")
    state = json.loads(text)
    bad.write_text(json.dumps(dict(state, format="other")))
    with pytest.raises(ControllerStateError, match="format"):
        rail.load(bad)
    bad.write_text(json.dumps(dict(state, version=99)))
    with pytest.raises(ControllerStateError, match="version 99"):
        rail.load(bad)
    state["learner"]["models"] = state["learner"]["models"][:-8] + "AAAAAAAA"
    bad.write_text(json.dumps(state))
    with pytest.raises(ControllerStateError, match="checksum"):
        rail.load(bad)
    vw, _ = make(backend="vw")
    with pytest.raises(ControllerStateError, match="backend"):
        vw.load(path)
    del state["promoter"]
    with pytest.raises(ControllerStateError, match="corrupt"):
        rail.load_state_dict(state)
