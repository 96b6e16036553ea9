"""Checkpoints: written atomically at step boundaries, read back for ``train --resume``.

A checkpoint is one file, ``checkpoints/step-NNNNNN.pt`` (a pickled dict: the
orchestrator's state -- step, group-id cursor, budget, evaluations, committed groups not yet
trained, the ids of groups that were still open -- and the gate's, controller's and learner's
state dicts, the learner's including model, optimizer and RNG states). ``checkpoints/latest``
names the newest. Both are written to a temporary name and renamed, so a crash mid-write
leaves the previous checkpoint intact.

The dict is written with ``torch.save`` when torch is loaded (it may hold tensors then) and
with plain ``pickle`` otherwise: a simulator run never needs torch, and importing it would
double the run's start-up time. ``load_checkpoint`` tells them apart by the first bytes
(``torch.save`` writes a zip archive).
"""

from __future__ import annotations

import io
import os
import pickle
import sys
from pathlib import Path
from typing import Any

from pipeline.configuration import ConfigError

_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's archives start with it; pickle streams start with b"\x80"


class CheckpointError(RuntimeError):
    """A checkpoint is missing or cannot be read; the message names the file and the fix."""


class CheckpointWriter:
    """Called by the orchestrator with its state at checkpoint steps."""

    def __init__(self, run_dir: str | Path, keep: int = 2):
        self.directory = Path(run_dir) / "checkpoints"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        self.written: list[Path] = []

    def __call__(self, state: dict[str, Any]) -> None:
        # Serialise now: the state holds live references that the pipeline keeps mutating.
        data = io.BytesIO()
        if "torch" in sys.modules:  # no tensors can exist before torch is imported
            import torch

            torch.save(state, data)
        else:
            pickle.dump(state, data, protocol=pickle.HIGHEST_PROTOCOL)
        path = self.directory / f"step-{int(state['step']):06d}.pt"
        _atomic_write(path, data.getvalue())
        _atomic_write(self.directory / "latest", path.name.encode())
        self.written.append(path)
        existing = sorted(self.directory.glob("step-*.pt"))
        for old in existing[: max(0, len(existing) - self.keep)]:
            old.unlink(missing_ok=True)


def latest_checkpoint(run_dir: str | Path) -> Path:
    """The newest checkpoint of ``run_dir``; a clear error when there is none."""
    directory = Path(run_dir) / "checkpoints"
    pointer = directory / "latest"
    if not Path(run_dir).is_dir():
        raise ConfigError(f"--resume {run_dir}: no such run directory; pass the run_dir of an earlier train run")
    if not pointer.is_file():
        raise ConfigError(
            f"--resume {run_dir}: no checkpoint in {directory} (the run stopped before its first checkpoint, "
            "or log.checkpoint_every was 0); start it again without --resume"
        )
    path = directory / pointer.read_text().strip()
    if not path.is_file():
        candidates = sorted(directory.glob("step-*.pt"))
        if not candidates:
            raise CheckpointError(f"{pointer} names {path.name}, which is missing, and no other checkpoint exists")
        path = candidates[-1]
    return path


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            if f.read(len(_ZIP_MAGIC)) != _ZIP_MAGIC:
                f.seek(0)
                return pickle.load(f)
        import torch

        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # a truncated or foreign file
        raise CheckpointError(
            f"checkpoint {path} cannot be read ({type(exc).__name__}: {exc}); delete it to resume from the one before"
        ) from exc


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
