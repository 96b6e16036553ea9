"""Nothing written is lost or made unreadable by the run's own writes (issue 31): small files
are written whole or not at all, a resume that fails records nothing it did not run, the steps
a resume redoes are marked in metrics.jsonl, runs are told apart by their ids in replay, and
neither replay nor export writes over what another run or an earlier export left."""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
from pathlib import Path

import pytest
import yaml
from hf_models import save_tiny_llama
from run_helpers import cli, sim_args, sim_run, tree_digest

import pipeline.store.atomic
from pipeline.config.build import ConfigError
from pipeline.metrics import read_metrics
from pipeline.store.atomic import atomic_write
from railgate.checkpoint import CheckpointError, CheckpointWriter
from railgate.config import load_config
from railgate.export import export_model


def _file_size_limit(limit: int):
    def set_limit() -> None:  # as `ulimit -f`: a write past it fails with EFBIG (Python ignores SIGXFSZ)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return set_limit


def test_a_failed_write_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    path.write_text('{"steps": 3}')

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pipeline.store.atomic.os, "fsync", full)
    with pytest.raises(OSError, match="No space left") as info:
        atomic_write(path, '{"steps": 4}' * 1000)
    assert info.value.filename == str(path)  # named, so the one-line error can say which file
    assert path.read_text() == '{"steps": 3}' and sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    return sim_run(tmp_path_factory.mktemp("writes") / "run", 3)


def test_a_full_disk_during_resume_leaves_config_yaml_whole_and_records_nothing_that_never_ran(finished, tmp_path):
    """Once, a full disk here truncated config.yaml at the limit and the run could never be resumed."""
    run = shutil.copytree(finished, tmp_path / "run")
    config = (run / "config.yaml").read_bytes()
    assert len(config) > 4000
    failed = cli(
        "train",
        "--resume",
        str(run),
        "--no-progress",
        "--set",
        "orchestrator.steps=6",
        preexec_fn=_file_size_limit(4000),
    )
    lines = failed.stderr.strip().splitlines()
    assert failed.returncode == 2 and len(lines) == 1 and "file-size limit" in lines[0], failed.stderr[-2000:]
    assert (run / "config.yaml").read_bytes() == config  # whole, and still the settings that ran (steps: 3)
    assert not [p for p in run.rglob("*") if p.name.endswith(".tmp")]
    resumed = cli("train", "--resume", str(run), "--no-progress", "--set", "orchestrator.steps=6")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert yaml.safe_load((run / "config.yaml").read_text())["orchestrator"]["steps"] == 6
    assert [m["step"] for m in read_metrics(run / "metrics.jsonl")] == [
        0,
        1,
        2,
        3,
        4,
        5,
        6,
    ]  # step 0: the evaluation before training


def test_the_steps_a_resume_redoes_are_marked_superseded(finished, tmp_path):
    run = shutil.copytree(finished, tmp_path / "run")
    (run / "checkpoints" / "step-000003.ckpt").unlink()  # killed after step 3, before its checkpoint
    (run / "checkpoints" / "latest").write_text("step-000002.ckpt")
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "pipeline/rollo')  # and mid-way through a line
    resumed = cli("train", "--resume", str(run), "--no-progress")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]  # every line parses
    assert [(m["step"], m.get("superseded", False)) for m in lines] == [
        (0, False),
        (1, False),
        (2, False),
        (3, True),
        (3, False),
    ]
    kept = read_metrics(run / "metrics.jsonl")
    assert [m["step"] for m in kept] == [0, 1, 2, 3] and kept[-1] == lines[-1]


def test_two_runs_with_one_name_do_not_mix_in_replay(tmp_path):
    a = sim_run(tmp_path / "a" / "run", 2, "--set", "controller.kind=rail")
    b = sim_run(tmp_path / "b" / "run", 2, "--set", "controller.kind=rail", "--set", "seed=1")
    result = cli("replay", str(a / "trace"), str(b / "trace"), "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr[-2000:]
    ids = [(d / "run_id").read_text().strip() for d in (a, b)]
    assert ids[0] != ids[1] and f"Runs: {ids[0]}, {ids[1]}." in (tmp_path / "out" / "offpolicy.md").read_text()

    copy = shutil.copytree(a, tmp_path / "c" / "run")  # a copy of run a, which then went on by itself
    assert cli("train", "--resume", str(copy), "--no-progress", "--set", "orchestrator.steps=3").returncode == 0
    mixed = cli("replay", str(a / "trace"), str(copy / "trace"), "--out", str(tmp_path / "out2"))
    lines = mixed.stderr.strip().splitlines()
    assert mixed.returncode == 2 and len(lines) == 1, mixed.stderr[-2000:]
    assert f"both hold decisions of run '{ids[0]}' but are not the same files" in lines[0]
    assert "replay them one at a time" in lines[0]


def test_replay_takes_what_users_type_and_says_what_to_type(tmp_path):
    run = sim_run(tmp_path / "run", 2, "--set", "controller.kind=rail")
    trace = run / "trace"
    assert cli("replay", str(run), "--out", str(tmp_path / "o1")).returncode == 0  # a run directory: its trace
    pair = cli(
        "replay",
        str(trace / "decisions-00000.arrows"),
        str(trace / "outcomes-00000.arrows"),
        "--out",
        str(tmp_path / "o2"),
    )
    assert pair.returncode == 0, pair.stderr[-2000:]  # the two files of one trace are one trace
    alone = cli("replay", str(trace / "decisions-00000.arrows"), "--out", str(tmp_path / "o3"))
    assert (
        alone.returncode == 2 and f"pass the trace directory, which holds both: railgate replay {trace}" in alone.stderr
    )
    (tmp_path / "empty").mkdir()
    empty = cli("replay", str(tmp_path / "empty"), "--out", str(tmp_path / "o4"))
    assert (
        empty.returncode == 2 and "no trace there" in empty.stderr and "railgate replay runs/NAME/trace" in empty.stderr
    )


def test_replay_out_never_overwrites_a_runs_report(tmp_path):
    shadow = cli(*sim_args("shadow", tmp_path / "shadow", 2))
    assert shadow.returncode == 0, shadow.stderr[-2000:]
    run = tmp_path / "shadow"
    before = tree_digest(run)
    into = cli("replay", str(run / "trace"), "--out", str(run))
    lines = into.stderr.strip().splitlines()
    assert into.returncode == 2 and len(lines) == 1 and "holds run shadow-" in lines[0], into.stderr[-2000:]
    assert "pass another --out" in lines[0] and tree_digest(run) == before
    again = cli("shadow", "--config", "configs/sim.yaml", "--run-dir", str(run), "--no-progress")
    assert again.returncode == 2 and "--resume" not in again.stderr and "shadow --overwrite" in again.stderr


def test_export_refuses_to_replace_or_mix_without_force(finished, tmp_path):
    out = tmp_path / "out"
    assert cli("export", str(finished), "--out", str(out)).returncode == 0
    before = tree_digest(out)
    again = cli("export", str(finished), "--out", str(out))
    assert again.returncode == 2 and "is not empty" in again.stderr and "--force" in again.stderr
    assert tree_digest(out) == before
    assert cli("export", str(finished), "--out", str(out), "--force").returncode == 0
    (tmp_path / "a_file").write_text("mine")
    as_file = cli("export", str(finished), "--out", str(tmp_path / "a_file"), "--force")
    assert as_file.returncode == 2 and "it is a file" in as_file.stderr and "Traceback" not in as_file.stderr
    into_run = cli("export", str(finished), "--out", str(finished), "--force")
    assert into_run.returncode == 2 and "it holds a run" in into_run.stderr


def test_export_names_a_checkpoint_without_or_unlike_the_model(tmp_path):
    small = save_tiny_llama(tmp_path / "small", context=64)
    large = save_tiny_llama(tmp_path / "large", context=64, hidden=128)
    cfg = load_config(None, ["engine.kind=torch", f"model.path={small}", "orchestrator.max_tokens=6"])
    sim = tmp_path / "sim_run"
    CheckpointWriter(sim)({"step": 2, "learner": {"version": 2, "rng": [1, 2]}})  # a simulator learner's state
    with pytest.raises(CheckpointError, match="holds no model weights: it is a simulator run's"):
        export_model(cfg, sim, tmp_path / "out1" / "model")
    from pipeline.policy.models import load_model

    trained = tmp_path / "trained_run"
    CheckpointWriter(trained)({"step": 1, "learner": {"model": load_model(large).model.state_dict()}})
    with pytest.raises(CheckpointError, match="does not fit the model in .*small.*leave out --set model"):
        export_model(cfg, trained, tmp_path / "out2" / "model")
    assert not (tmp_path / "out2" / "model").exists()


def test_an_export_into_a_new_directory_under_a_file_is_one_line(finished, tmp_path):
    (tmp_path / "a_file").write_text("mine")
    result = cli("export", str(finished), "--out", str(tmp_path / "a_file" / "out"))
    assert result.returncode == 2 and "cannot create it (Not a directory)" in result.stderr
    assert "Traceback" not in result.stderr
    with pytest.raises(ConfigError):  # the python API says the same
        from railgate.export import check_out

        check_out(tmp_path / "a_file", force=True)
    assert os.path.isfile(tmp_path / "a_file")
