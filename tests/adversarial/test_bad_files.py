"""Bad files and bad disks: a dataset's encoding errors are named with the row, a byte-order
mark costs no row, and a read-only run directory is refused before any work (``eval`` used to
fail only after the whole evaluation)."""

from __future__ import annotations

import errno
import json
import os

import pytest
from run_helpers import cli, sets, sim_run, tree_digest

import railgate.evaluate
from pipeline.datafiles import DatasetError
from pipeline.tasks.dataset import load_problems
from railgate.cli import main

ROWS = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(5)]


def _jsonl(path, rows, prefix: bytes = b"", bad_line: bytes | None = None):
    lines = [json.dumps(r).encode() for r in rows]
    if bad_line is not None:
        lines.insert(2, bad_line)
    path.write_bytes(prefix + b"\n".join(lines) + b"\n")
    return path


def test_a_byte_order_mark_costs_no_row(tmp_path):
    problems, report = load_problems(_jsonl(tmp_path / "bom.jsonl", ROWS, prefix=b"\xef\xbb\xbf"))
    assert (report.rows, report.skipped) == (5, 0) and problems[0].text == "0+0="


def test_bytes_that_are_not_utf8_are_named_with_the_row(tmp_path):
    path = _jsonl(tmp_path / "latin1.jsonl", ROWS, bad_line='{"prompt": "caf\xe9", "answer": "1"}'.encode("latin-1"))
    with pytest.raises(DatasetError, match=r"line 3: not UTF-8 text \(byte 0xe9 at column 16\)"):
        load_problems(path, on_bad_row="error")
    _, report = load_problems(path)  # skip mode: counted, the rest is used
    assert (report.rows, report.skipped, report.reasons) == (5, 1, {"not UTF-8 text": 1})


def test_json_that_python_refuses_is_a_bad_row(tmp_path):
    _jsonl(tmp_path / "deep.jsonl", ROWS, bad_line=b"[" * 100_000 + b"]" * 100_000)
    _jsonl(tmp_path / "digits.jsonl", ROWS, bad_line=b'{"prompt": "x", "answer": ' + b"9" * 5000 + b"}")
    for name in ("deep.jsonl", "digits.jsonl"):
        _, report = load_problems(tmp_path / name)
        assert report.skipped == 1 and "invalid JSON" in report.reasons, report


def _read_only(run_dir):
    """``os.open`` as on a read-only mount of ``run_dir`` (tests run as root, where chmod does not stop writes)."""
    real_open = os.open

    def fake_open(path, flags, *args, **kwargs):
        if str(path).startswith(str(run_dir)) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *args, **kwargs)

    return fake_open


def test_eval_refuses_a_read_only_run_directory_before_evaluating(tmp_path, monkeypatch, capsys):
    run = sim_run(tmp_path / "run", 3)
    before = tree_digest(run)
    monkeypatch.setattr(os, "open", _read_only(run))
    monkeypatch.setattr(
        railgate.evaluate, "build_components", lambda *a, **k: pytest.fail("evaluated before the check")
    )
    assert main(["eval", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cannot write into {run}: Read-only file system" in err[0], err
    assert tree_digest(run) == before


def test_train_refuses_a_read_only_run_directory_before_writing(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.setattr(os, "open", _read_only(run))
    assert main(["train", "--config", "configs/sim.yaml", "--run-dir", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Read-only file system" in err[0] and str(run) in err[0], err
    assert list(run.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("problem", ["latin-1 row", "1 MB prompt"])
def test_dataset_problems_through_the_cli(tmp_path, problem):
    """The torch path (the dataset task): one line, short, and the new run directory not left behind."""
    if problem == "latin-1 row":
        data = _jsonl(tmp_path / "data.jsonl", ROWS, bad_line=b'{"prompt": "\xff\xfe", "answer": "3"}')
        extra, expect = ["task.dataset.on_bad_row=error"], "line 3: not UTF-8 text (byte 0xff"
    else:
        data = _jsonl(tmp_path / "data.jsonl", ROWS * 4 + [{"prompt": "7" * 1_000_000, "answer": "1"}])
        extra, expect = ["task.dataset.on_bad_row=error"], "line 21: prompt is longer than the model's context can hold"
    run = tmp_path / "fresh"
    result = cli(
        "train",
        "--run-dir",
        str(run),
        "--no-progress",
        *sets("task.name=dataset", f"task.dataset.train_path={data}", "task.dataset.reward=exact"),
        *sets(*extra),
        timeout=600,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert expect in lines[0] and len(lines[0]) < 1000, lines[0][:300]
    assert not run.exists()


def test_a_long_text_is_shortened_in_errors():
    from pipeline.config.build import ConfigError, apply_overrides
    from pipeline.policy.tokenizer import CharTokenizer, TokenizerError

    with pytest.raises(TokenizerError) as info:
        CharTokenizer("ab").encode("a" * 1_000_000 + "c")
    assert len(str(info.value)) < 400 and "of 1000001 characters" in str(info.value)
    with pytest.raises(ConfigError) as info:
        apply_overrides({}, ["x" * 1_000_000])
    assert len(str(info.value)) < 400
