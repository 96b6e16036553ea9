"""Mistakes the config alone decides stop the run before anything is warm-started, loaded or
written: cross-section sizes at load time, engine packages and paths in ``preflight``."""

from __future__ import annotations

import importlib.util

import pytest

from pipeline.config.build import ConfigError
from railgate import preflight as preflight_module
from railgate.cli import main
from railgate.config import load_config


def _fails_fast(tmp_path, capsys, *overrides: str) -> str:
    run_dir = tmp_path / "run"
    code = main(["train", "--no-progress", "--run-dir", str(run_dir), *[a for o in overrides for a in ("--set", o)]])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert not run_dir.exists(), "a config mistake must not create the run directory"
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


def test_probe_larger_than_group_stops_at_load(tmp_path, capsys):
    err = _fails_fast(tmp_path, capsys, "gate.kind=sara", "gate.sara.probe_size=12", "orchestrator.group_size=8")
    assert "gate.sara.probe_size=12" in err and "orchestrator.group_size=8" in err


def test_hora_budget_below_a_probe_round_stops_at_load(tmp_path, capsys):
    err = _fails_fast(tmp_path, capsys, "gate.kind=hora", "gate.hora.budget=8", "orchestrator.batch_groups=8")
    assert "gate.hora.budget=8" in err


def test_answer_longer_than_the_context_stops_at_load(tmp_path, capsys):
    err = _fails_fast(tmp_path, capsys, "orchestrator.max_tokens=64", "model.max_len=64")
    assert "orchestrator.max_tokens=64" in err and "model.max_len=64" in err


def test_missing_engine_package_stops_before_the_warm_start(tmp_path, capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        preflight_module.importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    err = _fails_fast(tmp_path, capsys, "engine.kind=vllm")
    assert "engine.kind=vllm" in err and "pip install" in err


def test_missing_ray_inner_vllm_names_the_inner_key(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        preflight_module.importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    with pytest.raises(ConfigError, match="engine.ray.inner=vllm"):
        preflight_module.preflight(
            load_config(None, ["engine.kind=ray", "engine.ray.inner=vllm", "orchestrator.max_tokens=16"])
        )


def test_model_path_without_config_json(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    err = _fails_fast(tmp_path, capsys, f"model.path={tmp_path / 'model'}")
    assert "config.json" in err


def test_missing_dataset_file(tmp_path, capsys):
    err = _fails_fast(tmp_path, capsys, "task.name=dataset", f"task.dataset.train_path={tmp_path / 'none.jsonl'}")
    assert "task.dataset.train_path" in err
