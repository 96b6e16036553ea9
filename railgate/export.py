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
written. ``DIR`` must be new or empty: an earlier export there is replaced only with ``force``
(``--force``), and a directory holding a run is never written into.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.config.build import ConfigError
from pipeline.store.atomic import atomic_write
from railgate.checkpoint import CheckpointError
from railgate.config import RunConfig

MODEL_DIR = "model"


@dataclass(frozen=True)
class ExportReport:
    """What ``export_run`` wrote: the step of the exported policy (None: no model) and the files."""

    out: Path
    step: int | None
    files: dict[str, int] = field(default_factory=dict)  # path relative to out -> bytes


def export_run(
    cfg: RunConfig, run_dir: str | Path, out: str | Path, step: int | None = None, force: bool = False
) -> ExportReport:
    """Export ``run_dir`` (whose resolved configuration is ``cfg``) into ``out``; see the module docstring."""
    from railgate.tables import export_tables

    run, target = Path(run_dir), Path(out)
    if not run.is_dir():
        raise ConfigError(f"export {run}: no such run directory; pass the run_dir of an earlier train run")
    check_out(target, force)
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file on the way, a read-only place
        raise ConfigError(
            f"export --out {target}: cannot create it ({exc.strerror}); pass a directory you can write to"
        ) from None
    exported_step, tokenizer = None, None  # the simulator's tokens are not text
    if cfg.engine.kind != "sim":
        exported_step, tokenizer = export_model(cfg, run, target / MODEL_DIR, step)
    elif step is not None:
        raise ConfigError(
            f"--step {step}: {run} is a simulator run (engine.kind=sim), which has no model; leave --step out"
        )
    export_tables(run, target, tokenizer=tokenizer)
    files = {
        str(p.relative_to(target)): p.stat().st_size
        for p in sorted(target.rglob("*"))
        if p.is_file() and p.name != "export.json"
    }
    record = {"run_dir": str(run), "run_id": _run_id(run, cfg.name), "step": exported_step, "files": files}
    atomic_write(target / "export.json", json.dumps(record, indent=1) + "\n")
    return ExportReport(target, exported_step, files)


EXPORT_FILES = (MODEL_DIR, "buffer.parquet", "trace.parquet", "export.json")
"""What an export writes into its directory (``--force`` replaces these)."""


def check_out(out: Path, force: bool) -> None:
    """``ConfigError`` unless ``out`` may take an export: new or empty, or (``force``) holding
    only an earlier export's files -- never a file, nor a directory holding a run."""
    from railgate.rundir import run_entries

    if out.exists() and not out.is_dir():
        raise ConfigError(f"export --out {out}: it is a file; pass a directory (a new one is created)")
    if not out.is_dir():
        return
    entries = sorted(p.name + ("/" if p.is_dir() else "") for p in out.iterdir())
    if not entries:
        return
    run = [p.name for p in run_entries(out)]
    if run:
        raise ConfigError(
            f"export --out {out}: it holds a run ({', '.join(run[:4])}), which an export would mix "
            "with; pass a new directory"
        )
    if not force:
        shown = ", ".join(entries[:4]) + (f" and {len(entries) - 4} more" if len(entries) > 4 else "")
        raise ConfigError(
            f"export --out {out}: it is not empty ({shown}); pass a new or empty directory, or --force to "
            f"replace an earlier export's {', '.join(EXPORT_FILES)} there"
        )


def _run_id(run: Path, name: str) -> str:
    from railgate.runid import RunIdError, read_run_id

    try:
        return read_run_id(run) or name
    except RunIdError:
        return name


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
    state, checkpoint = _checkpoint_state(run_dir, step) if step != 0 else (None, None)  # a wrong --step fails first
    weights = _model_weights(state, checkpoint) if state is not None else None
    base = load_model(base_dir, chat_template=cfg.task.chat_template)
    exported = 0
    if weights is not None:
        try:
            base.model.load_state_dict(weights)
        except (RuntimeError, KeyError, TypeError, ValueError) as exc:
            first = str(exc).strip().splitlines()[-1].strip() if str(exc).strip() else type(exc).__name__
            raise CheckpointError(
                f"checkpoint {checkpoint} does not fit the model in {base_dir} ({first[:160]}): the run trained another "
                "model; export with the run's own model settings (leave out --set model.*)"
            ) from None
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
        if out.is_symlink() or out.is_file():
            out.unlink()  # a link is replaced, never followed
        elif out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return exported, tok


def _model_weights(state: dict[str, Any], checkpoint: Path | None) -> Any:
    learner = state.get("learner")
    if not isinstance(learner, dict) or "model" not in learner:
        raise CheckpointError(
            f"checkpoint {checkpoint} holds no model weights: it is a simulator run's (engine.kind=sim has no model); "
            "export it with its own config (leave out --set engine.kind and model.*): only its tables are written"
        )
    return learner["model"]


def _checkpoint_state(run_dir: Path, step: int | None) -> tuple[dict[str, Any], Path]:
    from railgate.checkpoint import latest_checkpoint, load_checkpoint

    if step is None:
        path = latest_checkpoint(run_dir)
        return load_checkpoint(path), path
    directory = run_dir / "checkpoints"
    found = sorted(
        (p for p in directory.glob(f"step-{step:06d}.*") if not p.name.endswith(".tmp")),
        key=lambda p: p.suffix == ".ckpt",
    )  # a converted .pt's .ckpt, when both are there
    if not found:
        steps = sorted(
            {int(m.group(1)) for p in directory.glob("step-*") if (m := re.fullmatch(r"step-(\d+)\.\w+", p.name))}
        )
        kept = ", ".join(map(str, steps)) or "none"
        raise ConfigError(
            f"--step {step}: {run_dir} has no checkpoint of learner step {step} (kept: {kept}; log.keep_checkpoints "
            "bounds how many are kept); choose one of those, 0 for the base policy, or leave --step out for the newest"
        )
    return load_checkpoint(found[-1]), found[-1]
