"""``railgate convert-checkpoint RUN_DIR``: rewrite checkpoints of older releases as data.

Older releases wrote ``checkpoints/step-NNNNNN.pt`` with ``pickle`` (simulator runs) or
``torch.save`` (real models). Reading such a file runs whatever code it names, so railgate no
longer opens them on ``--resume`` or ``eval``. This command is the one place that still does,
and only because the user asks for it, for a run directory whose origin they trust: each
``step-*.pt`` is read once and written again as ``step-*.ckpt`` (``railgate.checkpoint``), and
``checkpoints/latest`` is pointed at the newest. The ``.pt`` files are left in place.

The river controller's models, pickled inside the controller state by older releases, are
converted to their plain-data form on the way.
"""

from __future__ import annotations

import base64
import pickle
from pathlib import Path
from typing import Any

from pipeline.store.atomic import atomic_write
from railgate.checkpoint import (
    _LEGACY_NAME,
    SUFFIX,
    CheckpointError,
    dump_checkpoint,
)


def legacy_sources(target: str | Path) -> tuple[list[Path], Path]:
    """The legacy checkpoints ``convert_checkpoints(target)`` would read, and the directory its
    ``latest`` pointer is in; nothing is opened."""
    target = Path(target)
    if target.is_file():
        return [target], target.parent
    directory = target / "checkpoints"
    sources = (
        sorted(p for p in directory.glob("step-*") if _LEGACY_NAME.fullmatch(p.name)) if directory.is_dir() else []
    )
    if not sources:
        raise CheckpointError(f"{target}: no old-format checkpoint (checkpoints/step-NNNNNN.pt) to convert")
    return sources, directory


def convert_checkpoints(target: str | Path) -> list[Path]:
    """Convert every legacy checkpoint of a run directory (or one ``.pt`` file); the new files.
    Reading them runs any code they hold: call it only for files whose origin you trust (the
    command asks for ``--trust-pickle``)."""
    sources, directory = legacy_sources(target)
    written = []
    for source in sources:
        match = _LEGACY_NAME.fullmatch(source.name)
        if match is None:
            raise CheckpointError(f"{source} is not named step-NNNNNN.pt; rename it or pass its run directory")
        state = _convert_river(_unpickle(source))
        path = source.with_name(f"step-{match.group(1)}{SUFFIX}")
        atomic_write(path, dump_checkpoint(state))
        written.append(path)
    atomic_write(directory / "latest", written[-1].name.encode())
    return written


def _unpickle(path: Path) -> dict:
    """Read a legacy checkpoint: this runs code the file names, hence the explicit command."""
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"PK\x03\x04":
                f.seek(0)
                return pickle.load(f)
        import torch

        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise CheckpointError(
            f"{path} cannot be read as an old-format checkpoint ({type(exc).__name__}: {str(exc)[:200]})"
        ) from None


def _convert_river(node: Any) -> Any:
    """Old river learner states (``models``: a base64 pickle) rewritten in the data form."""
    if isinstance(node, dict):
        node = {k: _convert_river(v) for k, v in node.items()}
        if node.get("kind") == "river" and "models" in node and node.get("format") is None:
            from controller.rail.river_backend import models_state

            node.update(models_state(pickle.loads(base64.b64decode(node["models"]))))
        return node
    if isinstance(node, list):
        return [_convert_river(v) for v in node]
    return node
