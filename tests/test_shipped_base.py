"""The warm-started base model the project ships (pipeline/policy/shipped.py): the default run
starts from it on every machine, its files are checked by digest, and a model directory of the
user's own is used as it is (issue 53, item 2)."""

from __future__ import annotations

import shutil

import pytest

import pipeline.policy.models as models
import pipeline.policy.shipped as shipped
from pipeline.policy.models import BASE_DIR_NAME, base_settings, ensure_base_model
from railgate.config import load_config


def _no_warm_start(*args, **kwargs):
    raise AssertionError("warm-started although the shipped model matches")


def test_the_default_config_is_what_the_shipped_model_was_built_for():
    cfg = load_config("configs/default.yaml", [])
    assert shipped.shipped_settings() == base_settings(cfg.task, cfg.model)


def test_a_default_run_starts_from_the_shipped_model_without_warm_starting(tmp_path, monkeypatch):
    monkeypatch.setattr(models, "build_base_model", _no_warm_start)
    cfg = load_config("configs/default.yaml", [f"run_dir={tmp_path}"])
    base = ensure_base_model(cfg.run_dir, cfg.task, cfg.model, progress=False)
    assert base.meta["held_out"]["accuracy"] == pytest.approx(0.3935546875)  # what it scored when it was built
    shipped.verify(tmp_path / BASE_DIR_NAME)  # the run directory holds the checked copy
    assert sum(p.numel() for p in base.model.parameters()) < 500_000


def test_a_tampered_shipped_model_is_refused_with_the_file_and_the_fix(tmp_path, monkeypatch):
    copy = tmp_path / "base_arithmetic"
    shutil.copytree(shipped.SHIPPED_DIR, copy)
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of one weight
    weights.write_bytes(bytes(data))
    monkeypatch.setattr(shipped, "SHIPPED_DIR", copy)
    monkeypatch.setattr(models, "build_base_model", _no_warm_start)
    cfg = load_config("configs/default.yaml", [f"run_dir={tmp_path / 'run'}"])
    with pytest.raises(
        shipped.ShippedModelError, match=r"model\.safetensors has sha256 .* not ad273c.*make shipped-base"
    ):
        ensure_base_model(cfg.run_dir, cfg.task, cfg.model, progress=False)
    assert not (tmp_path / "run" / BASE_DIR_NAME).exists()  # nothing half-copied
    (copy / "extra.bin").write_bytes(b"x")
    weights.write_bytes(shipped.SHIPPED_DIR.joinpath("model.safetensors").read_bytes())
    with pytest.raises(shipped.ShippedModelError, match=r"unlisted \['extra.bin'\]"):
        shipped.verify()


def test_a_users_model_directory_is_used_as_it_is(tmp_path, monkeypatch):
    mine = tmp_path / "mine"
    shutil.copytree(shipped.SHIPPED_DIR, mine)
    weights = mine / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # other weights than the shipped ones: a model the project did not ship
    weights.write_bytes(bytes(data))
    monkeypatch.setattr(shipped, "verify", lambda *a, **k: pytest.fail("checked a user's model against the digests"))
    cfg = load_config("configs/default.yaml", [f"run_dir={tmp_path / 'run'}", f"model.path={mine}"])
    base = ensure_base_model(cfg.run_dir, cfg.task, cfg.model, progress=False)
    assert base.path == mine
    assert not (tmp_path / "run" / BASE_DIR_NAME).exists()


def test_other_settings_warm_start_as_before(tmp_path, monkeypatch):
    built = []
    monkeypatch.setattr(models, "build_base_model", lambda *a, **k: built.append(a) or "built")
    cfg = load_config("configs/default.yaml", [f"run_dir={tmp_path}", "model.warm_start_steps=300"])
    assert ensure_base_model(cfg.run_dir, cfg.task, cfg.model, progress=False) == "built" and len(built) == 1
