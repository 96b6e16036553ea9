"""What a group-log directory was recorded from: ``record.json`` beside its segments.

``run.py record --out DIR`` writes it before its first group, and a later ``record`` into the
same directory resumes only when everything that decides the samples is the same: the model
(its files' digest), the task and its data settings, the prompt and sample counts, the seed,
the engine and the sampling settings. Anything else is refused with ``RecordError``, naming
``--out``, what differs and the fix (a new ``--out``, or the recorded settings).

>>> import tempfile
>>> d = Path(tempfile.mkdtemp())
>>> m = RecordManifest(model="m", model_digest="ab", task={"name": "arithmetic"}, data={"seed": 0},
...                    prompts=4, samples=8, seed=0, engine="torch", sampling={"temperature": 1.0})
>>> _ = write_manifest(d, m); check_manifest(d, m)     # the same settings: resume
>>> check_manifest(d, dataclasses.replace(m, seed=1))  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
railgate.record_manifest.RecordError: --out ... was recorded with seed=0, not seed=1; record into a new --out directory, or resume with the settings it was recorded with (its record.json)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

MANIFEST_NAME = "record.json"
VERSION = 1


class RecordError(ValueError):
    """A recording that cannot go on as asked (a resume into a directory recorded otherwise, a
    sample the engine failed); the message names the directory and the fix."""


@dataclasses.dataclass(frozen=True)
class RecordManifest:
    """The settings a group log was recorded with (``record.json``)."""

    model: str
    """The model directory the engine loaded (for people; a resume compares the digest)."""
    model_digest: str
    """``model_digest`` of that directory: the same files, the same model."""
    task: dict[str, Any]
    """The task section of the config (``task.*``)."""
    data: dict[str, Any]
    """What decides the prompts' order: ``data.seed`` and ``data.num_train_prompts``."""
    prompts: int
    """P: the first P training prompts."""
    samples: int
    """K: samples per prompt."""
    seed: int
    """The run seed the per-sample seeds derive from (``pipeline.seeding.sample_seed``)."""
    engine: str
    """``engine.kind``: torch or vllm."""
    sampling: dict[str, Any]
    """``temperature``, ``top_p``, ``max_tokens`` (the config's orchestrator section)."""
    version: int = VERSION
    """The manifest's format."""

    def as_json(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self)))  # tuples as lists, as read back


def model_digest(directory: str | os.PathLike) -> str:
    """A digest of a model directory's files (names and contents; subdirectories are not read).

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp()); _ = (d / "config.json").write_text("{}")
    >>> model_digest(d) == model_digest(d), len(model_digest(d))
    (True, 32)
    """
    h = hashlib.blake2b(digest_size=16)
    for path in sorted(p for p in Path(directory).iterdir() if p.is_file()):
        h.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


def read_manifest(out: str | os.PathLike) -> dict[str, Any] | None:
    """The manifest in ``out`` as written, or None when there is none."""
    path = Path(out) / MANIFEST_NAME
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RecordError(
            f"{path} is not readable JSON ({exc}); delete it only if you know what the log in --out {out} "
            "was recorded with, or record into a new --out directory"
        ) from exc


def write_manifest(out: str | os.PathLike, manifest: RecordManifest) -> Path:
    """Write ``record.json`` into ``out`` atomically (a temporary file, fsynced, then renamed)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path, tmp = out / MANIFEST_NAME, out / (MANIFEST_NAME + ".tmp")
    with tmp.open("w") as f:
        json.dump(manifest.as_json(), f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def check_manifest(out: str | os.PathLike, wanted: RecordManifest) -> None:
    """Raise ``RecordError`` unless ``out``'s manifest (if any) records what ``wanted`` would;
    the model directory's path may differ where its digest does not."""
    found = read_manifest(out)
    if found is None:
        return
    want = wanted.as_json()
    for key, value in want.items():
        if key == "model" or found.get(key) == value:
            continue
        if key == "model_digest":
            what = f"the model {found.get('model')!r} (digest {found.get(key)}), not {wanted.model!r} (digest {value})"
        elif isinstance(value, dict):
            changed = sorted(
                k for k in set(value) | set(found.get(key) or {}) if (found.get(key) or {}).get(k) != value.get(k)
            )
            what = ", ".join(f"{key}.{k}={(found.get(key) or {}).get(k)!r}, not {value.get(k)!r}" for k in changed)
        else:
            what = f"{key}={found.get(key)!r}, not {key}={value!r}"
        raise RecordError(
            f"--out {out} was recorded with {what}; record into a new --out directory, or resume with the "
            f"settings it was recorded with (its {MANIFEST_NAME})"
        )
