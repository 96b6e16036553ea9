"""``export`` writes buffer.parquet and trace.parquet that pandas, polars and DuckDB read with
no project code: resume rules applied (each step and decision once), steps numbered as in
metrics.jsonl, finish reasons as strings, decisions and outcomes on one time base."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from run_helpers import run_outside, sets

from railgate.cli import main

STEPS, GROUPS, G = 4, 4, 4
SIM = [
    "--config",
    "configs/sim.yaml",
    "--no-progress",
    *sets(
        f"orchestrator.batch_groups={GROUPS}",
        f"orchestrator.group_size={G}",
        "gate.kind=uniform",
        "sim.num_prompts=256",
        "sim.num_eval_prompts=32",
        "log.checkpoint_every=2",
        "log.tensorboard=false",
        "orchestrator.eval_every=2",
        "log.trace_flush_every=4",
    ),
]


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory):
    """A sim run of 4 steps rewound to its step-2 checkpoint, as if killed there, then resumed."""
    run = tmp_path_factory.mktemp("tables") / "run"
    assert main(["train", "--run-dir", str(run), "--set", f"orchestrator.steps={STEPS}", *SIM]) == 0
    step2 = next((run / "checkpoints").glob("step-000002.*"))
    (run / "checkpoints" / "latest").write_text(step2.name)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text(
        "\n".join(lines[:3]) + "\n"
    )  # what a run killed after step 2 had logged (0, 1, 2)
    assert main(["train", "--resume", str(run), "--no-progress"]) == 0
    return run


def _raw_steps(run: Path) -> list[int]:
    """Buffer steps as a reader of the raw Arrow streams sees them (no resume rules)."""
    steps = []
    for path in sorted((run / "buffer").glob("steps-*.arrows")):
        with pa.OSFile(str(path)) as f:
            steps += ipc.open_stream(f).read_all().column("step").to_pylist()
    return steps


READ = """
    import json, sys
    import duckdb, pandas, polars
    buffer, trace = sys.argv[1], sys.argv[2]
    pdf = pandas.read_parquet(buffer)
    pl_trace = polars.read_parquet(trace)
    counts = duckdb.sql(f"SELECT step, count(*) AS n FROM read_parquet('{buffer}') GROUP BY step ORDER BY step").fetchall()
    decisions = duckdb.sql(f"SELECT count(*), count(DISTINCT decision_id) FROM read_parquet('{trace}')").fetchall()[0]
    timed = pl_trace.filter(polars.col("outcome_time").is_not_null())
    print(json.dumps({
        "counts": counts,
        "pandas_steps": sorted(set(pdf["step"].tolist())),
        "finish": sorted(set(polars.read_parquet(buffer)["finish_reason"].to_list())),
        "groups_twice": int(pdf.groupby("group_id")["step"].nunique().gt(1).sum()),
        "decisions": list(decisions),
        "max_time": max(pl_trace["time"].max(), timed["outcome_time"].max()),
        "outcome_before_decision": int((timed["outcome_time"] < timed["time"] - 1e-9).sum()),
        "feature_columns": [c for c in pl_trace.columns if c.startswith("feature_")],
        "actions": pl_trace["actions"].to_list()[0],
    }))
"""


def test_pandas_polars_and_duckdb_read_the_export_with_resume_rules_applied(resumed_run, tmp_path, capsys):
    raw = _raw_steps(resumed_run)
    assert raw.count(2) == 2 * GROUPS * G  # the raw streams hold the redone step twice
    out = tmp_path / "export"
    assert main(["export", str(resumed_run), "--out", str(out)]) == 0
    assert "a simulator run: no model" in capsys.readouterr().out and not (out / "model").exists()
    metric_steps = [json.loads(line)["step"] for line in (resumed_run / "metrics.jsonl").read_text().splitlines()]
    got = run_outside(READ, tmp_path, str(out / "buffer.parquet"), str(out / "trace.parquet"), timeout=300)
    assert got["counts"] == [[s, GROUPS * G] for s in range(1, STEPS + 1)]  # each step once
    assert metric_steps[0] == 0  # the evaluation before training
    assert got["pandas_steps"] == sorted(set(metric_steps) - {0}) == list(range(1, STEPS + 1))  # metrics' numbering
    assert set(got["finish"]) <= {"stop", "length"} and got["finish"]
    assert got["groups_twice"] == 0
    assert got["decisions"][0] == got["decisions"][1] > 0  # each decision once
    assert got["max_time"] < 1e6 and got["outcome_before_decision"] == 0  # run-clock seconds, not Unix time
    assert "feature_successes" in got["feature_columns"] and "commit" in got["actions"]


def test_trace_times_continue_across_a_resume(resumed_run):
    from railgate.tables import trace_table

    with pa.OSFile(str(resumed_run / "trace" / "decisions-00001.arrows")) as f:
        resumed_ids = set(ipc.open_stream(f).read_all().column("decision_id").to_pylist())
    table = trace_table(resumed_run / "trace")
    ids, times = table.column("decision_id").to_pylist(), table.column("time").to_pylist()
    before = [t for d, t in zip(ids, times) if d not in resumed_ids]
    after = [t for d, t in zip(ids, times) if d in resumed_ids]
    assert before and after and min(after) >= max(before)  # the resumed process's clock restarted at 0
