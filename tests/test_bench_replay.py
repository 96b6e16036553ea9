"""``bench replay``: the direct driver replays real gates on recorded groups, exactly and paired,
and the report counts what the test computes by hand on small crafted logs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.replay.order import NotReplayable, ReplayOrder
from pipeline.store.grouplog import GroupLog, GroupLogWriter, RecordedGroup, RecordedSample
from railgate.cli import main
from railgate.replay.bench import ReplaySpec, gate_config, replay_log
from railgate.replay.driver import replay, replay_gate
from railgate.replay.figures import fill_cost, in_replay_order, prompt_figures
from railgate.replay.report import log_report


def make_log(rewards: list[tuple[float, ...]], prompt_ids: list[int] | None = None) -> GroupLog:
    ids = prompt_ids or list(range(len(rewards)))
    return GroupLog(tuple(RecordedGroup.of(g, ids[g], r) for g, r in enumerate(rewards)), ("test",))


def random_rewards(n: int, k: int, seed: int) -> list[tuple[float, ...]]:
    rng = np.random.default_rng(seed)
    rates = rng.choice([0.0, 0.1, 0.5, 0.9, 1.0], size=n)
    return [tuple(float(x) for x in (rng.random(k) < p)) for p in rates]


def test_uniform_trains_exactly_the_mixed_groups():
    rewards = random_rewards(60, 8, seed=1)
    mixed = sum(0 < sum(r) < 8 for r in rewards)
    log = make_log(rewards)
    for seed in (0, 1):
        order = ReplayOrder(log, seed)
        outcomes = replay_gate(gate_config("uniform", 8, 4, ()), order, group_size=8, batch_groups=4)
        assert [o.verdict for o in outcomes] == ["committed"] * 60
        assert all(o.samples == 8 and o.tokens == 64 for o in outcomes)
        figures = prompt_figures(order, outcomes, group_size=8)
        assert figures["informative"].sum() == mixed
        assert figures["served_same"].sum() == 60 - mixed


def test_ds_rollouts_to_fill_a_step_match_the_hand_count():
    # K = G = 4, B = 2, rounds of 3 x 2 = 6 prompts. Step 0: round 1 (p0-5) has one mixed group
    # (p1); round 2 (p6-11) has p6, which fills the step, and p7, a surplus DS abandons. Step 1:
    # round 1 (p12-17) has p12 and p13, which fill it. Step 2: p18-23 are all-same; the pool ends.
    mixed = {1, 6, 7, 12, 13}
    rewards = [(1.0, 0.0, 1.0, 0.0) if p in mixed else (0.0,) * 4 for p in range(24)]
    order = ReplayOrder(make_log(rewards))
    run = replay(gate_config("ds", 4, 2, ()), order, group_size=4, batch_groups=2)
    verdicts = {o.prompt_id: o.verdict for o in run.outcomes}
    assert [p for p, v in verdicts.items() if v == "committed"] == [1, 6, 12, 13]
    assert verdicts[7] == "abandoned" and all(o.samples == 4 for o in run.outcomes)
    assert run.opened_order == list(range(24))
    figures = prompt_figures(order, run.outcomes, group_size=4)
    # Walked in opening order: step 0 fills at p6 (7 groups), step 1 at p13 (14 groups): 56
    # rollouts for two steps, 28 each, of 8 tokens.
    got = fill_cost(run.outcomes, in_replay_order(figures, order, "informative"), 2, run.opened_order)
    assert got == (28.0, 224.0, 2)
    assert figures["wrong_abandon"].sum() == 1  # the surplus p7
    assert run.steps == 2


def test_replays_are_deterministic_and_paired_across_gates():
    log = make_log(random_rewards(80, 8, seed=2), prompt_ids=[i // 2 for i in range(80)])
    order = ReplayOrder(log, seed=3)
    gates = ("uniform", "ds", "sara", "pilot_commit", "oracle", "hora")
    first = {g: replay_gate(gate_config(g, 8, 4, ()), order, 8, 4) for g in gates}
    again = {g: replay_gate(gate_config(g, 8, 4, ()), ReplayOrder(log, seed=3), 8, 4) for g in gates}
    assert first == again
    for g in gates:
        assert [o.prompt_id for o in first[g]] == list(range(80))
    # Every gate sees the same sample at the same request of the same prompt: its trained groups
    # hold exactly the order's samples, so informative groups are a subset of the uniform's.
    uniform = prompt_figures(order, first["uniform"], 8)["informative"]
    for g in gates:
        informative = prompt_figures(order, first[g], 8)["informative"]
        assert np.all(informative <= uniform), g


def test_sara_abandoning_a_mixed_group_is_a_wrong_abandon():
    rewards = [
        (0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0),  # probe all wrong, full group mixed: a wrong abandon
        (0.0,) * 8,  # all wrong: a right abandon
        (1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0),  # mixed probe: committed
    ]
    orders = [ReplayOrder(make_log(rewards), 0)]
    cfg = gate_config("sara", 8, 1, ())
    run = replay(cfg, orders[0], 8, 1)
    assert [(o.verdict, o.samples, o.decided_at) for o in run.outcomes] == [
        ("abandoned", 4, 4),
        ("abandoned", 4, 4),
        ("committed", 8, 4),
    ]
    report = log_report(orders, {"sara": [run]}, {"sara": cfg}, group_size=8, batch=1, resamples=50)["sara"]
    assert report["wrong_abandons"] == 1
    assert report["wrong_abandon_share"] == 0.5
    assert report["informative"] == 1 and report["wasted_commits_served"] == 0.0
    assert report["decided_histogram"] == {4: 3}


def test_group_size_above_k_is_a_clear_error():
    order = ReplayOrder(make_log([(1.0, 0.0, 1.0, 0.0)] * 3))
    with pytest.raises(NotReplayable, match="--group-size 4 or less"):
        replay(gate_config("uniform", 8, 1, ()), order, group_size=8, batch_groups=1)
    with pytest.raises(NotReplayable, match="above the log's 4"):
        replay_log(order.log, ReplaySpec(gates=("uniform",), group_size=6, orders=1), progress=False)


def test_gates_that_need_new_text_are_listed_not_crashed():
    log = make_log(random_rewards(20, 4, seed=4))
    report = replay_log(
        log, ReplaySpec(gates=("uniform", "sara_guide", "sara_rail"), batch=2, orders=1), progress=False
    )
    assert list(report["gates"]) == ["uniform"]
    assert "guidance" in report["not_replayable"]["sara_guide"]
    assert "controller.kind=rail" in report["not_replayable"]["sara_rail"]


def test_cli_end_to_end_writes_json_csv_and_png(tmp_path, capsys):
    rewards = random_rewards(40, 4, seed=5)
    log_dir = tmp_path / "log"
    with GroupLogWriter(log_dir, run_id="test", fsync=False) as w:
        w.write([RecordedGroup.of(g, g, r, reference_logprob=-0.7) for g, r in enumerate(rewards)])
    out = tmp_path / "out"
    argv = ["bench", "replay", str(log_dir), "--gates", "uniform,ds,sara,sara_ref_skip,sara_guide"]
    assert main(argv + ["--batch", "2", "--orders", "2", "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "| uniform |" in printed and "not replayable: sara_guide" in printed
    data = json.loads((out / "replay.json").read_text())
    [report] = data["logs"]
    assert set(report["gates"]) == {"uniform", "ds", "sara", "sara_ref_skip"}
    assert report["gates"]["uniform"]["informative"] == sum(0 < sum(r) < 4 for r in rewards)
    assert len((out / "replay.csv").read_text().strip().splitlines()) == 1 + 4
    assert (out / "replay.png").stat().st_size > 0
    assert main(["bench", "replay", str(log_dir), "--group-size", "5", "--no-progress"]) == 2


def test_an_abort_pays_the_tokens_out_by_then():
    # Eager SARA launches all 8 at once; the four short samples (8 tokens) end the all-wrong probe
    # at t = 8 / rate, and the four long ones (80 tokens) are aborted then, having 8 tokens out.
    samples = tuple(RecordedSample(i, 0.0, 8 if i < 4 else 80, i) for i in range(8))
    log = GroupLog((RecordedGroup(0, 0, samples), RecordedGroup.of(1, 1, (1.0, 0.0) * 4)), ("test",))
    run = replay(gate_config("sara_eager", 8, 1, ()), ReplayOrder(log), 8, 1, rate=1000.0)
    first = run.outcomes[0]
    assert (first.verdict, first.samples, first.decided_at) == ("abandoned", 8, 4)
    assert first.tokens == 4 * 8 + 4 * 8
    assert run.budget["pipeline/tokens_generated"] == first.tokens + 8 * 8


def test_cli_replays_a_synthetic_log_and_refuses_both_or_neither(tmp_path, capsys):
    assert (
        main(["bench", "replay", "--synthetic", "60x4", "--gates", "uniform,sara", "--orders", "1", "--no-progress"])
        == 0
    )
    out = capsys.readouterr().out
    assert "## synthetic 60x4" in out and "| sara |" in out
    assert main(["bench", "replay", "--no-progress"]) == 2
    assert "--synthetic" in capsys.readouterr().err
    assert main(["bench", "replay", str(tmp_path), "--synthetic", "60x4", "--no-progress"]) == 2
    assert main(["bench", "replay", "--synthetic", "60by4", "--no-progress"]) == 2
    assert "PROMPTSxSAMPLES" in capsys.readouterr().err
