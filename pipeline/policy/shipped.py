"""The warm-started base model the project ships: the same start on every machine.

The CPU default run (configs/default.yaml) warm-starts the project's 0.4M-parameter GPT-2 on
multi-digit addition before training. That warm start is supervised training on the CPU, and
its result depends on the CPU's matrix kernels (the same seed stopped at a held-out accuracy of
0.394 on one machine and 0.414 on another). So the project ships the model that
``python run.py warm-start --out DIR`` builds with the default settings, as a small safetensors
directory (``SHIPPED_DIR``, about 1.6 MB), with the sha256 digest of each of its files
(``DIGESTS``). A run whose task and model settings are exactly the shipped model's, and that
sets no ``model.path``, starts from it (``pipeline.policy.models.ensure_base_model`` copies it
into the run directory, after checking every digest); any other settings warm-start as before,
and a model directory of the user's own (``model.path``) is used as it is.

Rebuild it (after a change to the warm start, the task or the model settings it records) with
``make shipped-base``, which runs::

    rm -rf pipeline/policy/base_arithmetic
    python run.py warm-start --no-progress --out pipeline/policy/base_arithmetic
    python -m pipeline.policy.shipped --write-digests

(``warm-start`` always warm-starts, with configs/default.yaml's settings); commit both.

>>> sorted(shipped_digests())[:2]
['config.json', 'generation_config.json']
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

SHIPPED_DIR = Path(__file__).resolve().parent / "base_arithmetic"
"""The shipped model directory (a Hugging Face directory with ``railgate_base.json``)."""
DIGESTS = SHIPPED_DIR.with_name("base_arithmetic.sha256")
"""``sha256  name`` per file of ``SHIPPED_DIR`` (``sha256sum``'s format)."""


class ShippedModelError(RuntimeError):
    """The shipped base model's files are not the ones its digests name."""


def shipped_digests() -> dict[str, str]:
    """File name -> expected sha256, from ``DIGESTS``."""
    out = {}
    for line in DIGESTS.read_text().splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            out[name.strip()] = digest
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def shipped_settings() -> dict[str, Any] | None:
    """The task and model settings the shipped model was built with (``base_settings``' form);
    None when no model is shipped (a trimmed install)."""
    meta = SHIPPED_DIR / "railgate_base.json"
    if not meta.is_file() or not DIGESTS.is_file():
        return None
    record = json.loads(meta.read_text())
    return {"task": record.get("task"), "model": record.get("model")}


def verify(directory: Path | None = None) -> None:
    """Raise ``ShippedModelError`` unless ``directory`` (default ``SHIPPED_DIR``) holds exactly
    the files ``DIGESTS`` lists, each with its digest."""
    directory = SHIPPED_DIR if directory is None else directory
    digests = shipped_digests()
    present = {p.name for p in directory.iterdir() if p.is_file()}
    fix = (
        f"restore it (git checkout -- {SHIPPED_DIR.name} {DIGESTS.name} in {SHIPPED_DIR.parent}) or rebuild it "
        "(make shipped-base); or set model.path to a model directory of your own"
    )
    if present != set(digests):
        missing, extra = sorted(set(digests) - present), sorted(present - set(digests))
        raise ShippedModelError(
            f"the shipped base model {directory} has other files than its digests list "
            f"(missing {missing}, unlisted {extra}); {fix}"
        )
    for name, expected in sorted(digests.items()):
        got = _sha256(directory / name)
        if got != expected:
            raise ShippedModelError(
                f"the shipped base model's {directory / name} has sha256 {got}, not {expected} as "
                f"{DIGESTS.name} says: the file was changed or damaged; {fix}"
            )


def copy_shipped(target: Path) -> None:
    """Check the shipped model's digests, then copy it to ``target`` (which appears atomically)."""
    verify()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        for name in shipped_digests():
            shutil.copyfile(SHIPPED_DIR / name, tmp / name)
        verify(tmp)  # what was copied is what was checked
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_digests() -> None:
    """``DIGESTS`` for the files ``SHIPPED_DIR`` holds now."""
    names = sorted(p.name for p in SHIPPED_DIR.iterdir() if p.is_file())
    DIGESTS.write_text("".join(f"{_sha256(SHIPPED_DIR / n)}  {n}\n" for n in names))


if __name__ == "__main__":
    if sys.argv[1:] != ["--write-digests"]:
        print("usage: python -m pipeline.policy.shipped --write-digests  (see the module docstring)", file=sys.stderr)
        sys.exit(2)
    write_digests()
    print(f"written: {DIGESTS} ({len(shipped_digests())} files)", file=sys.stderr)
