"""The base model every run of a real-model benchmark starts from: warm-started once per task and
model settings and shared by all policies and seeds, so they differ only in what they allocate."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def ensure_shared_base_model(cfg, out: Path, progress: bool) -> Path:
    """Warm-start (or reuse) the base model every run of a real-model benchmark starts from,
    for the runs' own task and model settings (``cfg``: a run's config, the bench's ``--set``
    overrides included). Cached per settings: ``OUT/base_model`` when it was built for them
    (benchmark outputs written before the cache was keyed), else
    ``OUT/base_models/DIGEST/base_model``, DIGEST naming the settings."""
    from pipeline.policy.models import BASE_DIR_NAME, META_FILE, base_settings, ensure_base_model

    if cfg.model.path:
        return Path(cfg.model.path)
    wanted = base_settings(cfg.task, cfg.model)
    legacy = out / BASE_DIR_NAME
    try:
        meta = json.loads((legacy / META_FILE).read_text())
        if {"task": meta.get("task"), "model": meta.get("model")} == wanted:
            return legacy
    except (OSError, ValueError, AttributeError):
        pass  # none there, or unreadable: the keyed cache decides
    digest = hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()[:12]
    ensure_base_model(out / "base_models" / digest, cfg.task, cfg.model, progress=progress)
    return out / "base_models" / digest / BASE_DIR_NAME
