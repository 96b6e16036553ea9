"""Ctrl-C stops a run cleanly: a checkpoint at the last finished step, trace and buffer flushed,
one line on stderr, exit status 130, and ``--resume`` continues with nothing lost or repeated.

Both learner paths: the simulator trains inline (virtual clock), ``sim.realtime`` trains in the
learner thread, where the step being trained must finish before the checkpoint."""

from __future__ import annotations

import signal
import time
import warnings
from collections import Counter

import pytest
from run_helpers import cli, cli_popen, sim_args

from pipeline.store.buffer import read_all
from pipeline.store.tracelog import read_trace
from railgate.checkpoint import latest_checkpoint, load_checkpoint


@pytest.mark.parametrize("learner", ["inline", "thread"])
def test_ctrl_c_checkpoints_the_last_finished_step_and_resume_continues(tmp_path, learner):
    run_dir = tmp_path / "run"
    extra = ["--set", "sim.realtime=true", "--set", "sim.decode_tokens_per_s=2000"] if learner == "thread" else []
    proc = cli_popen(*sim_args("train", run_dir, 400, "--set", "log.checkpoint_every=100", *extra), text=True)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().count("\n") >= 4):  # step 0's evaluation, then 3 steps
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)

    assert proc.returncode == 130, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and "--resume" in lines[0], err
    step = load_checkpoint(latest_checkpoint(run_dir))["step"]
    assert 3 <= step < 400 and f"after step {step}:" in lines[0]
    assert metrics.read_text().count("\n") == step + 1  # step 0's evaluation and every finished step, none after
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert sorted(set(read_all(run_dir / "buffer").column("step").to_pylist())) == list(range(step))

    resumed = cli("train", "--resume", str(run_dir), "--set", f"orchestrator.steps={step + 3}", "--no-progress")
    assert resumed.returncode == 0, resumed.stderr
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        per_step = Counter(read_all(run_dir / "buffer").column("step").to_pylist())
    assert sorted(per_step) == list(range(step + 3)) and set(per_step.values()) == {32}
    ids = read_trace(run_dir / "trace").decisions.column("decision_id").to_pylist()
    assert len(ids) == len(set(ids))
