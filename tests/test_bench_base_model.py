"""The real-model benchmarks' shared base model is built for the runs' own settings (--set included)."""

import json

import pipeline.policy.models as models
from configs import CONFIG_DIR
from pipeline.policy.models import BASE_DIR_NAME, META_FILE, base_settings
from railgate.bench.allocation import BenchGrid, RunSpec, ensure_shared_base_model, grid

TORCH = CONFIG_DIR / "bench_allocation_torch.yaml"
SCRATCH = ("task.arithmetic.scratchpad=true",)


def _record_warm_starts(monkeypatch):
    calls = []

    def fake(run_dir, task_cfg, model_cfg, progress=True):
        calls.append((run_dir, task_cfg, model_cfg))

    monkeypatch.setattr(models, "ensure_base_model", fake)
    return calls


def test_the_base_model_follows_the_bench_overrides_and_is_cached_per_settings(tmp_path, monkeypatch):
    calls = _record_warm_starts(monkeypatch)
    answer = RunSpec(str(TORCH), "", "", "sara", 0, 100).config()
    scratch = RunSpec(str(TORCH), "", "", "sara", 0, 100, extra=SCRATCH).config()
    a = ensure_shared_base_model(answer, tmp_path, progress=False)
    b = ensure_shared_base_model(scratch, tmp_path, progress=False)
    assert a != b and a.parent.parent == b.parent.parent == tmp_path / "base_models"
    assert a.name == b.name == BASE_DIR_NAME
    (_, task_a, model_a), (_, task_b, model_b) = calls
    assert not task_a.arithmetic.scratchpad and model_a.max_len == 64
    assert task_b.arithmetic.scratchpad and model_b.max_len == 96  # the scratchpad's lengths, not the file's
    assert ensure_shared_base_model(scratch, tmp_path, progress=False) == b  # same settings, same place


def test_a_base_model_of_an_older_output_is_reused_when_its_settings_match(tmp_path, monkeypatch):
    calls = _record_warm_starts(monkeypatch)
    cfg = RunSpec(str(TORCH), "", "", "sara", 0, 100).config()
    legacy = tmp_path / BASE_DIR_NAME
    legacy.mkdir()
    (legacy / META_FILE).write_text(json.dumps({**base_settings(cfg.task, cfg.model), "warm_start": {}}))
    assert ensure_shared_base_model(cfg, tmp_path, progress=False) == legacy and not calls
    scratch = RunSpec(str(TORCH), "", "", "sara", 0, 100, extra=SCRATCH).config()
    assert ensure_shared_base_model(scratch, tmp_path, progress=False) != legacy and len(calls) == 1


def test_grid_passes_the_runs_settings_to_the_warm_start(tmp_path, monkeypatch):
    calls = _record_warm_starts(monkeypatch)
    bench = BenchGrid(TORCH, [""], ["sara", "sara_rail"], 1, 64, [""], extra=SCRATCH + ("orchestrator.batch_groups=8",))
    specs = grid(bench, tmp_path, progress=False)
    ((_, task_cfg, model_cfg),) = calls
    assert task_cfg.arithmetic.scratchpad and model_cfg.max_len == 96
    cfg = specs[1].config()
    assert cfg.model.path == str(tmp_path / "base_models" / specs[0].base_model.split("/")[-2] / BASE_DIR_NAME)
    assert (cfg.orchestrator.max_tokens, cfg.model.max_len) == (64, 96)
