"""``bench overhead``'s throughput comparison: the raw engine replays exactly the pipeline's work."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from railgate.bench import overhead, raw
from railgate.config import load_config

ROOT = Path(__file__).resolve().parents[1]


def small_config(gate: str = "uniform", multiplex: bool = True):
    cfg = load_config(ROOT / "configs" / "bench_overhead.yaml")
    orch = dataclasses.replace(
        cfg.orchestrator,
        batch_groups=8,
        steps=3,
        max_concurrent_samples=32,
        max_open_groups=16,
        multiplex_streams=multiplex,
    )
    return dataclasses.replace(cfg, orchestrator=orch, gate=dataclasses.replace(cfg.gate, kind=gate))


@pytest.mark.parametrize("multiplex", [True, False], ids=["multiplexed", "task per sample"])
def test_the_raw_pass_stops_each_request_where_the_pipeline_did(tmp_path, monkeypatch, multiplex):
    cfg = small_config("sara", multiplex)  # SARA abandons groups: their samples are cut mid-stream
    _, n, recorder = overhead._pipeline_pass(cfg, tmp_path / "work", record=True)
    cuts = recorder.cut_after()[:n]
    assert any(c is not None for c in cuts) and any(c is None for c in cuts)

    replayed = []
    build = raw.build_components

    def recording_build(c):
        comps = build(c)
        replayed.append(raw.Recorder(comps.engine))
        return dataclasses.replace(comps, engine=replayed[-1])

    monkeypatch.setattr(raw, "build_components", recording_build)
    raw.raw_pass(cfg, recorder.requests[:n], cuts)
    replayed_spans = replayed[0].spans
    assert len(replayed_spans) == n
    for mine, theirs in zip(recorder.spans[:n], replayed_spans):
        assert theirs.tokens == mine.tokens
        assert theirs.finished == mine.finished


def test_mean_in_flight_is_the_time_average_of_open_streams():
    rec = raw.Recorder.__new__(raw.Recorder)
    rec.spans = [raw.Span(0.0, 2.0), raw.Span(0.0, 1.0), raw.Span(1.0, 2.0), raw.Span(1.5)]
    # 2 + 1 + 1 + 0.5 (the unclosed stream counts until the last close) over 2 seconds
    assert rec.mean_in_flight() == pytest.approx(2.25)


def test_throughput_rows_name_their_step_ahead_limit_and_concurrency(tmp_path):
    passes = (("virtual", False, None, True), ("virtual", False, 2, True), ("virtual", False, None, False))
    rows = overhead.throughput(small_config(), tmp_path, repeats=1, passes=passes)
    assert [r["max_async_steps"] for r in rows] == [1, 2, 1]
    assert [r["driver"] for r in rows] == ["multiplexed", "multiplexed", "task per sample"]
    for r in rows:
        assert 0 < r["pipeline samples in flight"] <= r["concurrency limit"] == 32
        assert r["ratio"] > 0 and r["rollouts"] >= 3 * 8 * 8


def test_the_long_run_reads_its_trace_from_another_process_while_it_is_written(tmp_path):
    result = overhead.long_run(small_config(), tmp_path, steps=10)
    counts = [n for _, n in result["trace_reads"]]
    assert len(counts) == 10 and counts == sorted(counts)  # segments not yet flushed are not visible yet
    assert result["trace_decisions_final"] >= max(counts[-1], 1)
    assert result["rss_start_step"] == 1 and result["rss_end_mb"] > 0 and result["trace_torn_files"] == 0


@pytest.mark.slow
def test_the_hook_rows_time_every_rail_decision_of_the_run(monkeypatch):
    """RAIL's decision percentiles are over the whole run, not the controller's metric window
    (at 4096 groups the window held the last quarter of the decisions)."""
    from controller.rail.controller import RailController

    monkeypatch.setattr(RailController, "LATENCY_WINDOW", 1000)
    cfg = load_config(ROOT / "configs" / "bench_overhead.yaml")
    (row,) = overhead.hook_latency(cfg, levels=(64,), variants=(("sara", "rail", True),))
    assert row["controller"].startswith("RAIL") and row["decisions timed"] == row["RAIL decisions"] > 1000
    assert 0 < row["decision p50 us"] <= row["decision p99 us"]
    assert row["raw engine CPU us/rollout"] > 0 and row["rollouts"] > 0
