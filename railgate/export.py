"""``python run.py export RUN_DIR --out DIR [--step N]``: a run's policy and records in formats
other tools read without railgate.

============================  =================================================================
``DIR/model/``                the policy after learner step N (the newest checkpoint by default;
                              ``--step 0``: the base policy before training): ``config.json``,
                              ``model.safetensors``, ``generation_config.json`` and the
                              tokenizer files. ``AutoModelForCausalLM.from_pretrained``,
                              ``AutoTokenizer.from_pretrained`` and vLLM load it as it is.
``DIR/buffer.parquet``        the trained rollouts, one row each (``railgate.tables``)
``DIR/trace.parquet``         every decision joined to its outcome (``railgate.tables``)
``DIR/export.json``           what was exported: run, step, files and their sizes
============================  =================================================================

The project's own model keeps its character tokenizer in the standard form: a
``PreTrainedTokenizerFast`` (``tokenizer.json``, one token per character, ``<bos>`` added to
every text) that gives the same ids as ``pipeline.policy.tokenizer.CharTokenizer``. A user's model
(``model.path``) keeps the tokenizer it came with, chat template included.

Each output is written under a temporary name and renamed into place, so an interrupted
export leaves the previous one intact. A simulator run has no model: only the tables are
written.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.config.build import ConfigError
from railgate.config import RunConfig

MODEL_DIR = "model"


@dataclass(frozen=True)
class ExportReport:
    """What ``export_run`` wrote: the step of the exported policy (None: no model) and the files."""

    out: Path
    step: int | None
    files: dict[str, int] = field(default_factory=dict)  # path relative to out -> bytes


def export_run(cfg: RunConfig, run_dir: str | Path, out: str | Path, step: int | None = None) -> ExportReport:
    """Export ``run_dir`` (whose resolved configuration is ``cfg``) into ``out``; see the module docstring."""
    from railgate.tables import export_tables

    run, target = Path(run_dir), Path(out)
    if not run.is_dir():
        raise ConfigError(f"export {run}: no such run directory; pass the run_dir of an earlier train run")
    target.mkdir(parents=True, exist_ok=True)
    exported_step, tokenizer = None, None  # the simulator's tokens are not text
    if cfg.engine.kind != "sim":
        exported_step, tokenizer = export_model(cfg, run, target / MODEL_DIR, step)
    elif step is not None:
        raise ConfigError(f"--step {step}: {run} is a simulator run (engine.kind=sim), which has no model; leave --step out")
    export_tables(run, target, tokenizer=tokenizer)
    files = {str(p.relative_to(target)): p.stat().st_size for p in sorted(target.rglob("*")) if p.is_file()
             and p.name != "export.json"}
    record = {"run_dir": str(run), "run_id": cfg.name, "step": exported_step, "files": files}
    (target / "export.json").write_text(json.dumps(record, indent=1) + "\n")
    return ExportReport(target, exported_step, files)


def export_model(cfg: RunConfig, run_dir: Path, out: Path, step: int | None = None) -> tuple[int, Any]:
    """Write the policy after learner step ``step`` (None: the newest checkpoint; 0: the base
    policy) as a Hugging Face directory ``out``; returns the step exported and the tokenizer."""
    from pipeline.policy.models import BASE_DIR_NAME, load_model

    base_dir = Path(cfg.model.path) if cfg.model.path else run_dir / BASE_DIR_NAME
    if not base_dir.is_dir():
        raise ConfigError(
            f"export: the run's base model {base_dir} is gone (model.path moved, or the run never built it); "
            "restore it, or export with --set model.path=DIR"
        )
    state = _checkpoint_state(run_dir, step) if step != 0 else None  # a wrong --step fails before the load
    base = load_model(base_dir, chat_template=cfg.task.chat_template)
    exported = 0
    if state is not None:
        base.model.load_state_dict(state["learner"]["model"])
        exported = int(state["step"])
    generation = base.model.generation_config
    tok = base.tokenizer
    generation.eos_token_id, generation.pad_token_id = tok.eos_id, tok.pad_id
    if tok.bos_id is not None:
        generation.bos_token_id = tok.bos_id
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")  # a plain directory: the user's umask applies
    shutil.rmtree(tmp, ignore_errors=True)  # left by an interrupted export
    try:
        base.model.save_pretrained(str(tmp))
        tok.save(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return exported, tok


def _checkpoint_state(run_dir: Path, step: int | None) -> dict[str, Any]:
    from railgate.checkpoint import latest_checkpoint, load_checkpoint

    if step is None:
        return load_checkpoint(latest_checkpoint(run_dir))
    directory = run_dir / "checkpoints"
    found = sorted((p for p in directory.glob(f"step-{step:06d}.*") if not p.name.endswith(".tmp")),
                   key=lambda p: p.suffix == ".ckpt")  # a converted .pt's .ckpt, when both are there
    if not found:
        steps = sorted({int(m.group(1)) for p in directory.glob("step-*")
                        if (m := re.fullmatch(r"step-(\d+)\.\w+", p.name))})
        kept = ", ".join(map(str, steps)) or "none"
        raise ConfigError(
            f"--step {step}: {run_dir} has no checkpoint of learner step {step} (kept: {kept}; log.keep_checkpoints "
            "bounds how many are kept); choose one of those, 0 for the base policy, or leave --step out for the newest"
        )
    return load_checkpoint(found[-1])

