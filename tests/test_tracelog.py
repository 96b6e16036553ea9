"""The trace log: round trips, torn tails, resumed runs, version checks, Parquet, crashes."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from crash_child import kill_after

from pipeline.store.arrowio import SegmentKind, SegmentWriter
from pipeline.store.tracelog import DECISIONS, TraceFormatError, TraceLog, export_parquet, read_trace
from pipeline.types import TRACE_SCHEMA_VERSION, DecisionRecord


def record(i: int, run_id: str = "run-a", features: dict[str, float] | None = None) -> DecisionRecord:
    return DecisionRecord(
        decision_id=i,
        time=1000.0 + i,
        run_id=run_id,
        mode="live" if i % 2 == 0 else "shadow",
        decision_point=("gate", "group", "token")[i % 3],
        prompt_id=10 * i,
        group_id=i // 2,
        sample_index=i % 4,
        token_position=3 * i,
        features={"p_mixed": i / 10, "pilots": float(i % 5)} if features is None else features,
        actions=tuple(["commit", "abandon", "launch"][: 1 + i % 3]),
        chosen="commit",
        propensity=0.5 + i / 1000,
        behaviour_propensity=0.25,
        predicted_gain=-0.1 * i,
        policy_version=i // 7,
    )


def as_record(row: dict) -> DecisionRecord:
    """A decisions row (from ``to_pylist``) back to the record type; the map reads as pairs."""
    return DecisionRecord(**{**row, "features": dict(row["features"]), "actions": tuple(row["actions"])})


def test_decisions_and_outcomes_round_trip_field_for_field(tmp_path):
    records = [record(i) for i in range(10)] + [record(10, features={})]
    with TraceLog(tmp_path, run_id="run-a", flush_every=4) as log:
        for r in records:
            log.log_decision(r)
        log.log_outcome(3, reward=1.0, tokens=120)
        log.log_outcome(5, reward=0.0, tokens=7)
        log.log_outcome(3, reward=0.5, tokens=30)  # a second outcome of decision 3
    trace = read_trace(tmp_path)
    assert [as_record(row) for row in trace.decisions.to_pylist()] == records
    assert trace.outcomes.column("decision_id").to_pylist() == [3, 5, 3]
    assert trace.decisions.schema.field("features").type == pa.map_(pa.string(), pa.float64())
    assert trace.torn == () and trace.run_ids == ("run-a",)

    joined = trace.joined()
    assert joined.num_rows == 12  # 11 decisions, decision 3 twice
    assert joined.column("decision_id").to_pylist() == [0, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9, 10]
    assert joined.column("reward").to_pylist() == [None] * 3 + [1.0, 0.5, None, 0.0] + [None] * 5
    assert joined.column("tokens").to_pylist()[3:5] == [120, 30]
    assert joined.column("chosen").to_pylist() == ["commit"] * 12
    times = joined.column("outcome_time").to_pylist()
    assert times[0] is None and abs(times[3] - times[4]) < 60


def test_joined_with_no_outcomes_gives_null_outcome_columns(tmp_path):
    with TraceLog(tmp_path, run_id="r") as log:
        log.log_decision(record(0))
    joined = read_trace(tmp_path).joined()
    assert joined.num_rows == 1 and joined.column("reward").to_pylist() == [None]


def test_records_are_written_in_batches_of_flush_every(tmp_path):
    log = TraceLog(tmp_path, run_id="r", flush_every=4)
    for i in range(6):
        log.log_decision(record(i))
    assert read_trace(tmp_path).decisions.num_rows == 4  # one full batch; two still buffered
    log.flush()
    assert read_trace(tmp_path).decisions.num_rows == 6
    log.close()
    log.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        log.log_decision(record(6))


def test_empty_record_run_id_takes_the_log_run_id(tmp_path):
    with TraceLog(tmp_path, run_id="the-run") as log:
        log.log_decision(record(0, run_id=""))
        log.log_decision(record(1, run_id="other"))
    assert read_trace(tmp_path).decisions.column("run_id").to_pylist() == ["the-run", "other"]


def test_reopening_appends_a_new_segment_and_ids_continue(tmp_path):
    with TraceLog(tmp_path, run_id="first", flush_every=3) as log:
        ids = [log.next_decision_id() for _ in range(5)]
        for i in ids:
            log.log_decision(record(i, run_id="first"))
    first_bytes = (tmp_path / "decisions-00000.arrows").read_bytes()
    with TraceLog(tmp_path, run_id="second") as log:
        assert log.segment_paths == (tmp_path / "decisions-00001.arrows", tmp_path / "outcomes-00001.arrows")
        more = [log.next_decision_id() for _ in range(3)]
        for i in more:
            log.log_decision(record(i, run_id="second"))
        log.log_outcome(more[0], 1.0, 5)
    assert ids == [0, 1, 2, 3, 4] and more == [5, 6, 7]
    assert (tmp_path / "decisions-00000.arrows").read_bytes() == first_bytes  # old file untouched
    trace = read_trace(tmp_path)
    assert trace.decisions.column("decision_id").to_pylist() == list(range(8))
    assert trace.run_ids == ("first", "second")
    # A single segment file reads on its own.
    assert read_trace(tmp_path / "decisions-00001.arrows").decisions.num_rows == 3
    assert read_trace(tmp_path / "outcomes-00001.arrows").outcomes.num_rows == 1


def test_caller_chosen_ids_keep_next_decision_id_ahead(tmp_path):
    with TraceLog(tmp_path, run_id="r") as log:
        log.log_decision(record(41))
        assert log.next_decision_id() == 42
    with TraceLog(tmp_path, run_id="r") as log:
        assert log.next_decision_id() == 42


def test_torn_tail_keeps_every_complete_batch_and_is_reported(tmp_path):
    log = TraceLog(tmp_path, run_id="r", flush_every=5)
    path = log.segment_paths[0]
    sizes = []
    for i in range(15):
        log.log_decision(record(i))
        if (i + 1) % 5 == 0:
            sizes.append(path.stat().st_size)
    log.close()
    # Cut the file in the middle of its third (last) batch.
    data = path.read_bytes()
    path.write_bytes(data[: (sizes[1] + sizes[2]) // 2])
    trace = read_trace(tmp_path)
    assert trace.torn == (path,)
    assert trace.decisions.column("decision_id").to_pylist() == list(range(10))
    # A writer reopening the directory appends after the tear; the new records are read too.
    with TraceLog(tmp_path, run_id="r") as log:
        assert log.next_decision_id() == 10
        log.log_decision(record(10))
    assert read_trace(tmp_path).decisions.column("decision_id").to_pylist() == list(range(11))


def test_segment_cut_inside_its_schema_reads_as_empty_and_torn(tmp_path):
    with TraceLog(tmp_path, run_id="r") as log:
        path = log.segment_paths[0]
    path.write_bytes(path.read_bytes()[:20])
    trace = read_trace(tmp_path)
    assert trace.torn == (path,) and trace.decisions.num_rows == 0


def test_other_schema_version_raises_naming_file_and_versions(tmp_path):
    future = SegmentKind(DECISIONS.prefix, DECISIONS.schema, TRACE_SCHEMA_VERSION + 1)
    SegmentWriter(tmp_path, future, number=0, run_id="r").close()
    with pytest.raises(TraceFormatError) as err:
        read_trace(tmp_path)
    message = str(err.value)
    assert "decisions-00000.arrows" in message
    assert f"version {TRACE_SCHEMA_VERSION + 1}" in message and f"supports version {TRACE_SCHEMA_VERSION}" in message


def test_missing_path_and_non_arrow_file_raise_trace_format_error(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(TraceFormatError, match="nope"):
        read_trace(missing)
    bogus = tmp_path / "decisions-00000.arrows"
    bogus.write_text("decision_id,time\n1,2\n")
    with pytest.raises(TraceFormatError, match="not an Arrow IPC stream"):
        read_trace(tmp_path)
    with pytest.raises(TraceFormatError, match="decisions-00000.arrows"):
        read_trace(bogus)


def test_foreign_arrow_stream_is_rejected(tmp_path):
    path = tmp_path / "decisions-00000.arrows"
    table = pa.table({"x": [1, 2]})
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
        w.write_table(table)
    with pytest.raises(TraceFormatError, match="not a railgate segment"):
        read_trace(tmp_path)


def test_flush_every_below_one_is_refused(tmp_path):
    with pytest.raises(ValueError, match="flush_every=0"):
        TraceLog(tmp_path, run_id="r", flush_every=0)


def exported(tmp_path: Path) -> tuple[Path, Path]:
    with TraceLog(tmp_path / "trace", run_id="r", flush_every=3) as log:
        for i in range(7):
            log.log_decision(record(i))
        log.log_outcome(2, 1.0, 9)
    return export_parquet(tmp_path / "trace", tmp_path / "out")


def test_parquet_export_reads_back_with_pyarrow(tmp_path):
    decisions_path, outcomes_path = exported(tmp_path)
    trace = read_trace(tmp_path / "trace")
    assert decisions_path.name == "decisions.parquet" and outcomes_path.name == "outcomes.parquet"
    assert pq.read_table(decisions_path).equals(trace.decisions)
    assert pq.read_table(outcomes_path).to_pylist() == trace.outcomes.to_pylist()


def test_parquet_export_reads_back_with_pandas(tmp_path):
    import pandas as pd  # the dev extra installs it: the export is for pandas users

    decisions_path, outcomes_path = exported(tmp_path)
    frame = pd.read_parquet(decisions_path)
    assert list(frame["decision_id"]) == list(range(7))
    assert dict(frame["features"][3]) == {"p_mixed": 0.3, "pilots": 3.0}
    assert list(frame["actions"][2]) == ["commit", "abandon", "launch"]
    assert pd.read_parquet(outcomes_path)["tokens"].tolist() == [9]


CHILD = """
import sys
from pipeline.store.tracelog import TraceLog
from pipeline.types import DecisionRecord
log = TraceLog(sys.argv[1], run_id="crash", flush_every=10)
for i in range(10**7):
    log.log_decision(DecisionRecord(i, 0.0, "", "live", "gate", i, i, 0, 0, {"x": float(i)},
                                    ("commit", "abandon"), "commit", 0.5, 0.5, 0.0, 0))
    if (i + 1) % 10 == 0:  # the batch just went to the OS
        print(i + 1, flush=True)
"""


def test_sigkill_mid_run_keeps_every_flushed_record(tmp_path):
    flushed = kill_after(CHILD, tmp_path, 50)
    trace = read_trace(tmp_path)
    ids = trace.decisions.column("decision_id").to_pylist()
    assert len(ids) >= flushed
    assert ids == list(range(len(ids)))  # whole batches, in order, no gaps
    assert len(ids) % 10 == 0
    assert trace.decisions.column("features").to_pylist()[-1] == [("x", float(ids[-1]))]
    assert math.isclose(trace.decisions.column("propensity").to_pylist()[0], 0.5)
