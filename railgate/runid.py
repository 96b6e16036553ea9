"""A run's identity: a run id, unique, written once when the run is created.

The run id is the run's name (``RunConfig.name``: ``run_id`` or the run directory's name)
followed by twelve random hex digits, e.g. ``sara-3f9a1c2e7b40``. It is written once, into
``RUN_DIR/run_id``, when a training run starts in a fresh (or ``--overwrite``-n) directory, and
never rewritten. Everything the run writes carries it: every trace and buffer segment (the
``railgate.run_id`` metadata and the decisions' ``run_id`` column), every checkpoint
(``state["run_id"]``), ``summary.json`` and ``export.json``. It is what tells two runs apart
where names do not: ``replay`` keys traces by it (two runs in ``a/run`` and ``b/run`` no longer
mix), ``train --resume`` refuses a checkpoint of another run, and ``replay --out`` refuses a
directory holding another run.

Run directories of releases before run ids have no ``run_id`` file; their traces carry the
run's name. Such a run keeps its name as its id: ``resolve_run_id`` returns it, and a resume
writes it into ``run_id``.

>>> import pathlib, tempfile
>>> run = pathlib.Path(tempfile.mkdtemp()) / "sara"
>>> run.mkdir()
>>> rid = create_run_id(run, "sara")
>>> rid.startswith("sara-") and len(rid) == len("sara-") + 12, read_run_id(run) == rid
(True, True)
>>> create_run_id(run, "sara")
Traceback (most recent call last):
...
railgate.runid.RunIdError: ...run_id exists already (run sara-...); a run id is written once, when its run starts
"""

from __future__ import annotations

import re
import secrets
from pathlib import Path

from pipeline.store.atomic import create_once

RUN_ID_FILE = "run_id"
_VALID = re.compile(r"[^\x00-\x1f\x7f]{1,200}")


class RunIdError(RuntimeError):
    """A run id file that cannot be used; the message names the file and the fix."""


def new_run_id(name: str) -> str:
    """``name`` (control characters dropped, at most 80 characters) and 12 random hex digits."""
    clean = re.sub(r"[\x00-\x1f\x7f]", "", name)[:80] or "run"
    return f"{clean}-{secrets.token_hex(6)}"


def read_run_id(run_dir: str | Path) -> str | None:
    """The id in ``run_dir/run_id``; None when the file is missing (a run of an older release)."""
    path = Path(run_dir) / RUN_ID_FILE
    try:
        text = path.read_bytes()[:1000].decode("utf-8").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise RunIdError(f"{path} cannot be read ({exc}); it should hold one line, the run's id") from None
    if not _VALID.fullmatch(text):
        raise RunIdError(
            f"{path} holds {text[:60]!r}, which is not a run id (one line of up to 200 printable "
            "characters); restore it from a copy of the run"
        )
    return text


def create_run_id(run_dir: str | Path, name: str) -> str:
    """Write a new run id into ``run_dir/run_id``; ``RunIdError`` if there is one already."""
    run_id = new_run_id(name)
    return write_run_id(run_dir, run_id)


def write_run_id(run_dir: str | Path, run_id: str) -> str:
    """Write ``run_id`` (once) into ``run_dir/run_id``; ``RunIdError`` if the file exists."""
    path = Path(run_dir) / RUN_ID_FILE
    if not create_once(path, run_id + "\n"):
        raise RunIdError(
            f"{path} exists already (run {read_run_id(run_dir)}); a run id is written once, when its run starts"
        )
    return run_id


def resolve_run_id(run_dir: str | Path, legacy_name: str) -> tuple[str, bool]:
    """The run id of an existing run: its ``run_id`` file, or for a run of an older release
    (no file) ``legacy_name``, the name its trace carries. The flag says the file is missing."""
    found = read_run_id(run_dir)
    return (found, False) if found is not None else (legacy_name, True)
