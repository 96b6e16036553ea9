"""Small files written whole or not at all: a temporary file beside the target, flushed and
``fsync``-ed, then renamed over it.

A run rewrites small files as it goes (``config.yaml``, ``checkpoints/latest``, ``summary.json``,
``report.md``, reports and manifests). Writing one in place and failing half-way -- a full disk,
a file-size limit, a kill -- would leave it truncated, and a truncated ``config.yaml`` makes a
run impossible to resume. A rename is atomic on POSIX file systems: readers see the old file or
the new one, never a part. On failure the temporary file is removed and the target is as it was.

>>> import pathlib, tempfile
>>> path = pathlib.Path(tempfile.mkdtemp()) / "summary.json"
>>> atomic_write(path, '{"steps": 3}')
>>> path.read_text()
'{"steps": 3}'
>>> sorted(p.name for p in path.parent.iterdir())  # no temporary file left behind
['summary.json']
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def atomic_write(path: str | os.PathLike, data: bytes | str) -> None:
    """Write ``data`` (text is UTF-8) to ``path`` through a temporary file and a rename; on any
    failure the temporary file is removed and ``path`` is left as it was. A failed write that
    names no file (``write``'s ENOSPC) is re-raised naming ``path``."""
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        _discard(tmp)
        if isinstance(exc, OSError) and exc.filename is None and exc.errno is not None:
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise


def create_once(path: str | os.PathLike, data: bytes | str) -> bool:
    """Write ``path`` whole, only if it does not exist yet (a hard link of a finished temporary
    file, which fails on an existing name): True when this call created it.

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "run_id"
    >>> create_once(path, "a\\n"), create_once(path, "b\\n"), path.read_text()
    (True, False, 'a\\n')
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.new")
    atomic_write(tmp, data)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        _discard(tmp)


def atomic_savefig(figure: Any, path: str | os.PathLike, **kwargs: Any) -> None:
    """``figure.savefig`` through a temporary file and a rename (the format from ``path``'s suffix)."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        figure.savefig(tmp, **kwargs)
        os.replace(tmp, path)
    except BaseException:
        _discard(tmp)
        raise


def _discard(tmp: Path) -> None:
    try:
        tmp.unlink(missing_ok=True)
    except OSError:
        pass
