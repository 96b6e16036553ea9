"""One run per directory, and resume as a transaction (railgate/rundir.py).

* a second ``train`` into a directory another one is writing is refused, naming the holder, and
  the first run's buffer keeps exactly its own rows;
* ``train`` into a directory that holds a finished run is refused (nothing changes) unless
  ``--resume`` or ``--overwrite``;
* ``--resume`` with an incompatible ``--set`` is refused with the reason and the keys that may
  change, nothing in the directory changes, and a plain ``--resume`` still works afterwards;
* a full disk while checkpointing is one line naming the file, leaves the previous checkpoint
  as it was, and the run resumes from it once there is room."""

from __future__ import annotations

import errno
import os
import time
import warnings
from collections import Counter

import pyarrow.compute as pc
from run_helpers import cli, cli_popen, sim_args, sim_run, tree_digest

import pipeline.store.atomic
from pipeline.store.buffer import read_all
from pipeline.store.tracelog import read_trace
from railgate.checkpoint import latest_checkpoint, load_checkpoint
from railgate.cli import main

GROUPS, GROUP_SIZE = 8, 4


def _steps(run_dir) -> Counter:
    """Rows per learner step in the run's buffer (each step: GROUPS groups of GROUP_SIZE rollouts)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Counter(read_all(run_dir / "buffer").column("step").to_pylist())


def _one_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_a_second_writer_is_refused_and_rows_are_not_mixed(tmp_path):
    run_dir, steps = tmp_path / "run", 2000  # still running when the second starts (at 150 it could end first: a race)
    first = cli_popen(*sim_args("train", run_dir, steps))
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.05)
    second = cli(*sim_args("train", run_dir, 3, "--set", "seed=7"))
    line = _one_line(second)
    assert f"in use by another railgate process (pid {first.pid}" in line
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0 and first.poll() is not None, err

    per_step = _steps(run_dir)
    assert sorted(per_step) == list(range(steps))
    assert set(per_step.values()) == {GROUPS * GROUP_SIZE}  # no step has twice its rows
    ids = read_trace(run_dir / "trace").decisions.column("decision_id").to_pylist()
    assert len(ids) == len(set(ids))


def test_a_used_directory_needs_resume_or_overwrite(tmp_path):
    run_dir = sim_run(tmp_path / "run", 3)
    before = tree_digest(run_dir)
    again = cli(*sim_args("train", run_dir, 2))
    assert "already holds a run" in _one_line(again) and "--overwrite" in again.stderr
    assert tree_digest(run_dir) == before

    replaced = cli(*sim_args("train", run_dir, 2, "--overwrite"))
    assert replaced.returncode == 0, replaced.stderr
    assert _steps(run_dir) == {0: GROUPS * GROUP_SIZE, 1: GROUPS * GROUP_SIZE}  # the new run's rows only
    assert load_checkpoint(latest_checkpoint(run_dir))["step"] == 2


def test_an_incompatible_resume_changes_nothing(tmp_path):
    run_dir = sim_run(tmp_path / "run", 3)
    before = tree_digest(run_dir)
    refused = cli("train", "--resume", str(run_dir), "--set", "gate.kind=sara", "--no-progress")
    line = _one_line(refused)
    assert "gate.kind was 'uniform' and would be 'sara'" in line and "orchestrator.steps" in line
    assert tree_digest(run_dir) == before

    # A config edited by hand passes the comparison, but its gate cannot take the checkpoint's state.
    config = run_dir / "config.yaml"
    original = config.read_text()
    config.write_text(original.replace("  kind: uniform", "  kind: sara"))
    edited = tree_digest(run_dir)
    unfit = cli("train", "--resume", str(run_dir), "--no-progress")
    assert "does not fit" in _one_line(unfit)
    assert tree_digest(run_dir) == edited
    config.write_text(original)

    resumed = cli("train", "--resume", str(run_dir), "--set", "orchestrator.steps=5", "--no-progress")
    assert resumed.returncode == 0, resumed.stderr
    assert sorted(_steps(run_dir)) == list(range(5))


def test_a_full_disk_keeps_the_last_checkpoint(tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "run"
    real_fsync = os.fsync
    written = []

    def fsync(fd):  # the third checkpoint meets a full disk
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path.endswith(".tmp") and ".ckpt." in path:
            written.append(path)
            if len(written) >= 3:
                raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr(pipeline.store.atomic.os, "fsync", fsync)
    code = main(sim_args("train", run_dir, 6, "--set", "log.checkpoint_every=1"))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "step-000003.ckpt: the disk is full" in err[0] and "--resume" in err[0]
    assert not list((run_dir / "checkpoints").glob("*.tmp")) and not list((run_dir / "checkpoints").glob(".*"))
    assert load_checkpoint(latest_checkpoint(run_dir))["step"] == 2

    monkeypatch.setattr(pipeline.store.atomic.os, "fsync", real_fsync)  # space freed
    assert main(["train", "--resume", str(run_dir), "--no-progress"]) == 0
    assert sorted(_steps(run_dir)) == list(range(6))
    commits = read_trace(run_dir / "trace").decisions
    committed = commits.filter(pc.equal(commits.column("chosen"), "commit")).column("group_id").to_pylist()
    assert len(committed) == len(set(committed))
