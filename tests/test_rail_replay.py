"""Offline replay of RAIL decisions from a trace written with TraceLog."""

from __future__ import annotations

import math

import pytest

from controller.rail.controller import RailController
from controller.rail.learners import build_learner
from controller.rail.replay import ReplayError, load_logged, replay, train
from pipeline.store.arrowio import SegmentKind, SegmentWriter
from pipeline.store.tracelog import DECISIONS, TraceFormatError, TraceLog
from pipeline.types import TRACE_SCHEMA_VERSION, DecisionRecord, SamplingParams
from tests.rail_fakes import rescue_round, shadow_config

CFG = shadow_config(auto_promote=False)


def write_run(directory, run_id, groups=300, flush_every=64):
    with TraceLog(directory, run_id=run_id, flush_every=flush_every) as log:
        rail = RailController(CFG, log, SamplingParams(max_tokens=128), seed=2, run_id=run_id)
        for gid in range(groups):
            rescue_round(rail, gid, pays=True)
        log.log_decision(gate_record(log.next_decision_id(), run_id))  # not RAIL's: left out
    return rail


def gate_record(i, run_id, point="gate", propensity=1.0, actions=("commit", "abandon"), chosen="commit"):
    return DecisionRecord(
        i,
        0.0,
        run_id,
        "live",
        point,
        0,
        0,
        -1,
        -1,
        {"length_estimate": 0.1},
        actions,
        chosen,
        propensity,
        propensity,
        0.0,
        0,
    )


def test_replay_estimates_the_learned_and_fixed_policies(tmp_path):
    write_run(tmp_path, "a")
    logged = load_logged(tmp_path)
    assert len(logged.records) == 300 and logged.skipped_not_rail == 1 and logged.run_ids == ("a",)
    assert logged.skipped_no_outcome == 0 and logged.skipped_zero_propensity == 0 and logged.torn == ()
    first = logged.records[0]
    assert first.mode == "shadow" and first.context.point == "rescue" and first.context.arms[0].name == "noop"
    assert not any(k.startswith("shadow.") for k in first.context.features)  # logged-only keys stripped
    report = replay(logged, CFG, seed=0)
    assert report.n == 300
    for p in report.policies:
        for est in (p.ips, p.snips, p.dr):
            assert est.lower <= est.value <= est.upper and est.n == 300
    noop = report.policy("noop")
    assert noop.ips.value == 0.0 and noop.dr.value == pytest.approx(0.0, abs=0.02)  # the no-op earns 0
    learned = report.policy("learned")
    # Rescues pay here and the logged behaviour mostly did nothing: the learned policy beats it.
    assert learned.dr.value > report.logged_value.value
    assert learned.dr.lower > noop.dr.upper
    with pytest.raises(KeyError, match="no policy 'oracle'"):
        report.policy("oracle")


def test_train_warm_starts_a_learner(tmp_path):
    write_run(tmp_path, "a", groups=200)
    learner = build_learner(CFG, seed=0)
    assert train(learner, load_logged(tmp_path)) == 200 and learner.learned == 200


def test_traces_of_several_runs_need_a_run_id(tmp_path):
    write_run(tmp_path, "first", groups=30)
    write_run(tmp_path, "second", groups=20)
    with pytest.raises(ReplayError, match="2 runs \\(first, second\\)"):
        load_logged(tmp_path)
    assert len(load_logged(tmp_path, run_id="second").records) == 20
    with pytest.raises(ReplayError, match="no run 'third'; its runs are: first, second"):
        load_logged(tmp_path, run_id="third")


def test_torn_trace_uses_the_complete_batches_and_reports(tmp_path):
    write_run(tmp_path, "a", groups=300, flush_every=64)
    path = sorted(tmp_path.glob("decisions-*.arrows"))[0]
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 500])  # a crash mid-batch
    logged = load_logged(tmp_path)
    assert logged.torn == (path,)
    assert 0 < len(logged.records) < 300
    assert len(logged.records) % 64 == 0  # whole batches only
    replay(logged, CFG)  # still usable


def test_other_schema_version_surfaces_as_trace_format_error(tmp_path):
    future = SegmentKind(DECISIONS.prefix, DECISIONS.schema, TRACE_SCHEMA_VERSION + 1)
    SegmentWriter(tmp_path, future, number=0, run_id="r").close()
    with pytest.raises(TraceFormatError, match=f"version {TRACE_SCHEMA_VERSION + 1}"):
        load_logged(tmp_path)
    with pytest.raises(TraceFormatError, match="does not exist"):
        load_logged(tmp_path / "missing")


def test_zero_propensity_and_missing_outcomes_are_skipped_and_counted(tmp_path):
    with TraceLog(tmp_path, run_id="r") as log:
        arms = ("noop", "resample_n2_t1")
        log.log_decision(gate_record(0, "r", "group_rescue", 0.0, arms, "resample_n2_t1"))
        log.log_outcome(0, 0.1, 10)
        log.log_decision(gate_record(1, "r", "group_rescue", 0.5, arms, "noop"))  # no outcome: group still open
        log.log_decision(gate_record(2, "r", "token", 0.5, arms, "resample_n2_t1"))
        log.log_outcome(2, -0.02, 200)
    logged = load_logged(tmp_path)
    assert (logged.skipped_zero_propensity, logged.skipped_no_outcome) == (1, 1)
    [rec] = logged.records
    assert rec.decision_id == 2 and rec.reward == -0.02 and rec.tokens == 200 and rec.context.point == "token"
    assert rec.context.costs[1] == pytest.approx(200.0)  # recomputed from length_estimate


def test_nothing_usable_is_a_clear_error(tmp_path):
    with TraceLog(tmp_path, run_id="r") as log:
        log.log_decision(gate_record(0, "r"))
    logged = load_logged(tmp_path)
    with pytest.raises(ReplayError, match="no usable RAIL decisions"):
        replay(logged, CFG)


def test_unknown_arm_names_are_rejected(tmp_path):
    with TraceLog(tmp_path, run_id="r") as log:
        log.log_decision(gate_record(0, "r", "token", 0.5, ("noop", "teleport"), "noop"))
        log.log_outcome(0, 0.0, 0)
    with pytest.raises(ValueError, match="teleport"):
        load_logged(tmp_path)


def test_snips_of_a_policy_that_never_matches_is_nan(tmp_path):
    with TraceLog(tmp_path, run_id="r") as log:
        for i in range(5):
            log.log_decision(gate_record(i, "r", "group_rescue", 0.5, ("noop", "resample_n2_t1"), "resample_n2_t1"))
            log.log_outcome(i, 0.1, 10)
    report = replay(load_logged(tmp_path), CFG)
    assert math.isnan(report.policy("noop").snips.value)  # the no-op never takes a logged action
