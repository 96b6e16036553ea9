"""The last tracebacks (issue 31): Ctrl-C while the packages are still importing, a file-size
limit, a reader that closes the pipe, a 10 MB dataset line, a lone surrogate in a dataset, and
a damaged model directory -- each is one line saying what is wrong and the fix."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

import pytest
from hf_models import save_tiny_llama
from run_helpers import ROOT, SMALL, cli, sets, sim_run

from pipeline.datafiles import DatasetError
from pipeline.policy.models import ModelDirError, load_model
from pipeline.tasks.dataset import load_problems

INTERRUPT_AT = """
import builtins, runpy, sys
real, target = builtins.__import__, sys.argv[1]
def interrupted(name, *args, **kwargs):
    if name == target:
        raise KeyboardInterrupt  # as a Ctrl-C that lands while this module is being imported
    return real(name, *args, **kwargs)
builtins.__import__ = interrupted
sys.argv = [sys.argv[2], *sys.argv[3:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("module", ["railgate.cli", "railgate.train", "railgate.config"])
def test_ctrl_c_while_imports_load_is_one_line(module, tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            INTERRUPT_AT,
            module,
            str(ROOT / "run.py"),
            "train",
            "--config",
            "configs/sim.yaml",
            "--run-dir",
            str(tmp_path / "run"),
            "--no-progress",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 130 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert lines[0].startswith("interrupted")
    assert not (tmp_path / "run").exists()


def test_ctrl_c_during_startup_is_one_line_whenever_it_lands(tmp_path):
    """A real SIGINT a moment after start, while torch and the rest import."""
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "run.py"), "train", "--run-dir", str(tmp_path / "run"), "--no-progress"],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    time.sleep(1.0)
    process.send_signal(2)
    _, err = process.communicate(timeout=120)
    assert process.returncode in (130, 0) and "Traceback" not in err, err[-2000:]


def test_a_file_size_limit_is_one_line(tmp_path):
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4000, 4000))  # `ulimit -f`: past it a write fails with EFBIG

    result = cli(
        "train",
        "--config",
        "configs/sim.yaml",
        "--run-dir",
        str(tmp_path / "run"),
        *sets("orchestrator.steps=3", "log.checkpoint_every=1"),
        *SMALL,
        preexec_fn=limit,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "file-size limit (ulimit -f)" in lines[0] and "ulimit -f unlimited" in lines[0] and "--resume" in lines[0]


def test_a_reader_that_closes_the_pipe_is_no_traceback(tmp_path):
    run = sim_run(tmp_path / "run", 2, "--set", "controller.kind=rail")
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "run.py"), "replay", str(run), "--out", str(tmp_path / "o")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    process.stdout.readline()  # `| head -1`
    process.stdout.close()
    err = process.stderr.read()
    process.wait(timeout=120)
    assert process.returncode in (0, 141) and "Traceback" not in err, err[-2000:]


ROWS = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(40)]


def _jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_a_lone_surrogate_is_a_bad_row_named_by_its_line(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", ROWS[:3] + [{"prompt": "\ud800 oops", "answer": "1"}] + ROWS[3:6])
    assert "\\ud800" in path.read_text()  # the file holds JSON's escape: valid JSON, invalid text
    with pytest.raises(
        DatasetError, match=r"line 4: field 'prompt' holds a lone surrogate \('\\ud800' at character 1\)"
    ):
        load_problems(path, on_bad_row="error")
    problems, report = load_problems(path)  # skip mode: counted, the rest is used
    assert (report.rows, report.skipped) == (6, 1) and "field 'prompt' holds a lone surrogate" in report.reasons


def test_a_10_mb_prompt_is_a_bad_row_at_once(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", ROWS[:7] + [{"prompt": "7" * 10_000_000, "answer": "1"}] + ROWS[7:])
    started = time.monotonic()
    with pytest.raises(
        DatasetError,
        match="line 8: prompt is longer than the model's context can hold "
        r"\(10000000 characters; at most 48 fit\)",
    ):
        load_problems(path, on_bad_row="error", context_chars=48)
    assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    "row",
    [{"prompt": "7" * 10_000_000, "answer": "1"}, {"prompt": "\ud800", "answer": "1"}],
    ids=["10 MB prompt", "lone surrogate"],
)
def test_bad_dataset_rows_through_the_cli_are_one_line_naming_the_row(row, tmp_path):
    data = _jsonl(tmp_path / "data.jsonl", ROWS[:7] + [row] + ROWS[7:])
    result = cli(
        "train",
        "--run-dir",
        str(tmp_path / "run"),
        "--no-progress",
        *sets(
            "task.name=dataset",
            f"task.dataset.train_path={data}",
            "task.dataset.reward=exact",
            "task.dataset.on_bad_row=error",
        ),
        timeout=300,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "line 8: " in lines[-1] and len(lines[-1]) < 1000 and not (tmp_path / "run").exists()


def test_a_damaged_config_json_is_named_and_a_users_directory_is_not_a_cache(tmp_path):
    model = save_tiny_llama(tmp_path / "mine", context=64)
    (model / "config.json").write_text("{ this is not json")
    with pytest.raises(
        ModelDirError,
        match=r"mine/config.json is not valid JSON .*is your model directory: save the "
        "model into it again",
    ):
        load_model(model)
    model = save_tiny_llama(tmp_path / "mine2", context=64)
    (model / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(ModelDirError) as info:
        load_model(model)
    assert "is your model directory" in str(info.value) and "delete" not in str(info.value)


def test_every_named_user_error_exists():
    """The command line matches input errors by name (importing nothing); the names must stay true."""
    import importlib

    from railgate.cli import USER_ERRORS

    for module, name in USER_ERRORS:
        cls = getattr(importlib.import_module(module), name)
        assert issubclass(cls, Exception) and cls.__module__ == module, (module, name, cls.__module__)
