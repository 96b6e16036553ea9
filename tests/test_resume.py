"""Kill a training run with SIGKILL mid-step, resume it, and check that no committed group and
no trace record was lost or duplicated."""

from __future__ import annotations

import signal
import subprocess
import time
import warnings

import pyarrow.compute as pc
from run_helpers import cli_popen, sets

from pipeline.metrics import read_metrics
from pipeline.store.buffer import read_all
from pipeline.store.tracelog import read_trace

STEPS, GROUPS = 40, 8
SETTINGS = sets(
    "orchestrator.batch_groups=8",
    "orchestrator.group_size=4",
    "gate.kind=sara",
    "gate.sara.probe_size=2",
    "orchestrator.max_concurrent_samples=64",
    "sim.num_prompts=512",
    "sim.num_eval_prompts=64",
    "log.checkpoint_every=3",
    "log.trace_flush_every=8",
    "log.tensorboard=false",
    "orchestrator.eval_every=5",
)


def _run(args, **kw):
    return cli_popen(*args, stderr=subprocess.STDOUT, **kw)


def test_sigkill_mid_run_then_resume_loses_and_duplicates_nothing(tmp_path):
    run_dir = tmp_path / "run"
    proc = _run(
        [
            "train",
            "--config",
            "configs/sim.yaml",
            "--run-dir",
            str(run_dir),
            "--no-progress",
            "--set",
            f"orchestrator.steps={STEPS}",
            *SETTINGS,
        ]
    )
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 14:
            break
        assert proc.poll() is None, proc.stdout.read().decode()
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = len(metrics.read_text().splitlines())
    assert killed_at < STEPS, "the run finished before it could be killed; lower the kill threshold"

    resumed = _run(["train", "--resume", str(run_dir), "--no-progress"])
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out.decode()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the killed segment may be torn; that is the point
        steps = read_all(run_dir / "buffer")
    # Every step exactly once, each with a full batch, and no group trained twice.
    step_ids = steps.column("step").to_pylist()
    group_ids = steps.column("group_id").to_pylist()
    per_step = {}
    for s, g in zip(step_ids, group_ids):
        per_step.setdefault(s, set()).add(g)
    assert sorted(per_step) == list(range(STEPS))
    assert all(len(groups) == GROUPS for groups in per_step.values())
    trained = [g for groups in per_step.values() for g in groups]
    assert len(trained) == len(set(trained))

    trace = read_trace(run_dir / "trace")
    ids = trace.decisions.column("decision_id").to_pylist()
    assert len(ids) == len(set(ids)), "a decision id appears twice"
    commits = trace.decisions.filter(pc.equal(trace.decisions.column("chosen"), "commit"))
    committed_groups = commits.column("group_id").to_pylist()
    assert len(committed_groups) == len(set(committed_groups)), "a group was committed twice in the trace"
    # Every trained group's commit decision is in the trace (nothing lost).
    assert set(trained) <= set(committed_groups)
    outcome_ids = trace.outcomes.column("decision_id").to_pylist()
    assert set(outcome_ids) <= set(ids), "an outcome refers to a decision that is not in the trace"
    # metrics.jsonl: each step once for a reader (the killed run's lines after its checkpoint are marked)
    assert [m["step"] for m in read_metrics(metrics)] == list(
        range(0, STEPS + 1)
    )  # step 0: the evaluation before training


def _batch(step: int):
    from pipeline.types import CommittedGroup, FinishReason, Rollout, TrainBatch

    rollouts = tuple(
        Rollout(f"g{step}-s{i}", i, (1,), (2, 3), (-0.1, -0.2), float(i % 2), FinishReason.STOP, 0) for i in range(2)
    )
    return TrainBatch(step, (CommittedGroup(step, step, rollouts, 2, 4),))


def test_superseded_rows_of_a_killed_run_are_not_read_twice(tmp_path):
    from pipeline.store.arrowio import mark_superseded, next_segment_number
    from pipeline.store.buffer import ArrowBuffer

    with ArrowBuffer(tmp_path) as first:  # the killed run: trained steps 0-5, checkpointed at 3
        for step in range(6):
            first.put(_batch(step))
    mark_superseded(tmp_path, "steps", next_segment_number(tmp_path, ("steps",)), "step", 3)
    with ArrowBuffer(tmp_path) as resumed:  # the resumed run redoes steps 3-5
        for step in range(3, 6):
            resumed.put(_batch(step))
    assert read_all(tmp_path).column("step").to_pylist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
