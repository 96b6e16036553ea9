"""Checkpoints: written atomically at step boundaries, read back for ``train --resume`` and ``eval``.

A checkpoint is one file, ``checkpoints/step-NNNNNN.ckpt``, holding the orchestrator's state --
step, group-id cursor, budget, evaluations, committed groups not yet trained, the ids of groups
that were still open -- and the gate's, controller's and learner's state dicts (the learner's
with model, optimizer and RNG states). ``checkpoints/latest`` names the newest. Both are
written to a temporary name and renamed, so a crash mid-write leaves the previous checkpoint
intact.

The file is data only: nothing in it can run code when it is read (run directories are
shared, and resuming or evaluating one must be safe). Layout::

    RAILGATE-CHECKPOINT\\n          magic line (20 bytes)
    <64 hex digits>\\n              SHA-256 of everything after this line
    u64 length, JSON               {"format": 1, "state": <tree>} (railgate.state_codec)
    u64 length, safetensors        the numpy arrays the tree refers to
    u64 length, safetensors        the torch tensors the tree refers to (empty without torch)

(u64: 8-byte little-endian unsigned.) The checksum is verified before anything is parsed, so a
flipped bit or a partial copy is reported as such. A simulator run's checkpoint has no torch
tensors and is read without importing torch.

Checkpoints of older releases (``step-NNNNNN.pt``, pickled) are refused: unpickling a file can
run any code in it. ``railgate convert-checkpoint RUN_DIR`` converts them, for files whose
origin you trust (``railgate.checkpoint_convert``).

>>> import tempfile
>>> run_dir = tempfile.mkdtemp()
>>> CheckpointWriter(run_dir)({"step": 4, "pending": [(1, 2)]})
>>> path = latest_checkpoint(run_dir)
>>> path.name, load_checkpoint(path)
('step-000004.ckpt', {'step': 4, 'pending': [(1, 2)]})
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from pathlib import Path
from typing import Any

from pipeline.config.build import ConfigError
from pipeline.store.atomic import atomic_write
from railgate.state_codec import StateFormatError, decode_state, encode_state

MAGIC = b"RAILGATE-CHECKPOINT\n"
FORMAT_VERSION = 1
SUFFIX = ".ckpt"
LEGACY_SUFFIX = ".pt"
_NAME = re.compile(r"step-(\d{6,})" + re.escape(SUFFIX))
_LEGACY_NAME = re.compile(r"step-(\d{6,})" + re.escape(LEGACY_SUFFIX))
_DIGEST_LINE = 65  # 64 hex digits and a newline
_LENGTH = struct.Struct("<Q")
_PICKLE_MAGIC, _ZIP_MAGIC = b"\x80", b"PK\x03\x04"  # pickle streams; torch.save's zip archives


class CheckpointError(RuntimeError):
    """A checkpoint is missing or cannot be read; the message names the file and the fix."""


class LegacyCheckpointError(CheckpointError):
    """A checkpoint in the pickle format of older releases, which is not opened."""


class CheckpointWriter:
    """Called by the orchestrator with its state at checkpoint steps."""

    def __init__(self, run_dir: str | Path, keep: int = 2, run_id: str | None = None):
        self.directory = Path(run_dir) / "checkpoints"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        self.run_id = run_id  # stamped into every checkpoint: a resume refuses another run's (railgate.runid)
        self.written: list[Path] = []

    def __call__(self, state: dict[str, Any]) -> None:
        if self.run_id is not None:
            state = {**state, "run_id": self.run_id}
        # Serialised now: the state holds live references that the pipeline keeps mutating.
        data = dump_checkpoint(state)
        path = self.directory / f"step-{int(state['step']):06d}{SUFFIX}"
        atomic_write(path, data)
        atomic_write(self.directory / "latest", path.name.encode())
        self.written.append(path)
        existing = sorted(p for p in self.directory.glob(f"step-*{SUFFIX}") if _NAME.fullmatch(p.name))
        for old in existing[: max(0, len(existing) - self.keep)]:
            old.unlink(missing_ok=True)


def dump_checkpoint(state: dict[str, Any]) -> bytes:
    """The bytes of a checkpoint file holding ``state``."""
    tree, tensors, arrays = encode_state(state)
    document = json.dumps({"format": FORMAT_VERSION, "state": tree}, separators=(",", ":")).encode()
    import safetensors.numpy

    array_blob = safetensors.numpy.save(arrays) if arrays else b""
    tensor_blob = b""
    if tensors:
        import safetensors.torch

        tensor_blob = safetensors.torch.save(tensors)
    body = b"".join(_LENGTH.pack(len(part)) + part for part in (document, array_blob, tensor_blob))
    return MAGIC + hashlib.sha256(body).hexdigest().encode() + b"\n" + body


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """The state in checkpoint ``path``; ``CheckpointError`` for a damaged, foreign or old file."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"checkpoint {path} cannot be read ({exc.strerror or exc}); check the path") from None
    if not data.startswith(MAGIC):
        if data.startswith(_PICKLE_MAGIC) or data.startswith(_ZIP_MAGIC):
            raise LegacyCheckpointError(
                f"checkpoint {path} is in the pickle format of older railgate releases, which can run code when "
                f"it is read, so it is not opened; if you trust where it came from, convert it once with "
                f"'railgate convert-checkpoint {path.parent.parent} --trust-pickle' and run the command again"
            )
        raise CheckpointError(
            f"{path} is not a railgate checkpoint (it does not start with {MAGIC[:-1].decode()}); "
            "delete it to resume from the one before"
        )
    digest, body = data[len(MAGIC) : len(MAGIC) + _DIGEST_LINE], data[len(MAGIC) + _DIGEST_LINE :]
    if digest[-1:] != b"\n" or hashlib.sha256(body).hexdigest().encode() != digest[:-1]:
        raise CheckpointError(
            f"checkpoint {path} is damaged (its SHA-256 checksum does not match: a truncated or altered copy); "
            "delete it to resume from the one before"
        )
    try:
        document, array_blob, tensor_blob = _split(body)
        header = json.loads(document.decode("utf-8"))
        if not isinstance(header, dict) or header.get("format") != FORMAT_VERSION or "state" not in header:
            found = header.get("format") if isinstance(header, dict) else None
            raise StateFormatError(
                f"format {str(found)[:20]} is not {FORMAT_VERSION}; read it with the release that wrote it"
            )
        arrays = _load_arrays(array_blob)
        tensors = _load_tensors(tensor_blob)
        state = decode_state(header["state"], tensors, arrays)
    except CheckpointError:
        raise
    except Exception as exc:  # malformed content behind a valid checksum: hand-made, or another writer
        raise CheckpointError(
            f"checkpoint {path} cannot be read ({type(exc).__name__}: {str(exc)[:200]}); "
            "delete it to resume from the one before"
        ) from None
    if not isinstance(state, dict) or "step" not in state:
        raise CheckpointError(f"checkpoint {path} holds no run state; delete it to resume from the one before")
    return state


def latest_checkpoint(run_dir: str | Path) -> Path:
    """The newest checkpoint of ``run_dir``; a clear error when there is none.

    ``checkpoints/latest`` may only name a checkpoint file inside ``run_dir/checkpoints`` (no
    path, no link leading elsewhere).
    """
    run = Path(run_dir)
    directory = run / "checkpoints"
    pointer = directory / "latest"
    if not run.is_dir():
        raise ConfigError(f"{run_dir}: no such run directory; pass the run_dir of an earlier train run")
    _check_inside(run, directory, "the checkpoints directory")
    if not pointer.is_file():
        legacy = _files(directory, _LEGACY_NAME)
        if legacy:
            load_checkpoint(legacy[-1])  # raises the legacy format's message
        raise ConfigError(
            f"{run_dir}: no checkpoint in {directory} (the run stopped before its first checkpoint, or "
            "log.checkpoint_every was 0); train it again (with --overwrite)"
        )
    _check_inside(run, pointer, "checkpoints/latest")
    name = pointer.read_bytes()[:200].decode("utf-8", "replace").strip()
    if not (_NAME.fullmatch(name) or _LEGACY_NAME.fullmatch(name)):
        raise CheckpointError(
            f"{pointer} names {name[:60]!r}, which is not a checkpoint file name (step-NNNNNN{SUFFIX}); "
            "it may only name a file beside it: delete it and write the newest file's name into it"
        )
    path = directory / name
    if not path.is_file():
        candidates = _files(directory, _NAME)
        if not candidates:
            raise CheckpointError(f"{pointer} names {name}, which is missing, and no other checkpoint exists")
        path = candidates[-1]
    _check_inside(run, path, "the checkpoint")
    return path


def _files(directory: Path, pattern: re.Pattern) -> list[Path]:
    return sorted(p for p in directory.glob("step-*") if pattern.fullmatch(p.name)) if directory.is_dir() else []


def _check_inside(run: Path, path: Path, what: str) -> None:
    """``path`` is no link and, resolved, lies inside the run directory."""
    if path.is_symlink() or not path.resolve().is_relative_to(run.resolve()):
        raise CheckpointError(
            f"{path} ({what}) is a link or leads outside the run directory {run}; checkpoints must be plain files "
            "inside it: replace the link with the file it points to"
        )


def _split(body: bytes) -> list[bytes]:
    parts, offset = [], 0
    for _ in range(3):
        if offset + _LENGTH.size > len(body):
            raise StateFormatError("the file ends inside a length field")
        (length,) = _LENGTH.unpack_from(body, offset)
        offset += _LENGTH.size
        if length > len(body) - offset:
            raise StateFormatError(f"a section claims {length} bytes; only {len(body) - offset} remain")
        parts.append(body[offset : offset + length])
        offset += length
    if offset != len(body):
        raise StateFormatError(f"{len(body) - offset} bytes after the last section")
    return parts


def _load_arrays(blob: bytes) -> dict[str, Any]:
    if not blob:
        return {}
    import safetensors.numpy

    return safetensors.numpy.load(blob)


def _load_tensors(blob: bytes) -> dict[str, Any]:
    if not blob:
        return {}
    import safetensors.torch

    return safetensors.torch.load(blob)
