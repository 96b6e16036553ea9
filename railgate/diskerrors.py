"""Errors of the disk a user can fix -- a full disk, a quota, a read-only or forbidden place, a
file-size limit -- found however deep in an exception's chain, and said in one line; and the
closing of several writers where one failing must not keep the others open.

>>> disk_error(RuntimeError("x")) is None
True
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

_DISK_ERRNOS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EFBIG: "the file would pass the file-size limit (ulimit -f)",
}
_RESUME_FIX = "free space (or pass another --run-dir), then continue with --resume"
_FIXES = {
    errno.ENOSPC: _RESUME_FIX,
    errno.EDQUOT: _RESUME_FIX,
    errno.EFBIG: "raise the limit (ulimit -f unlimited), then continue with --resume",
}


def disk_error(exc: BaseException, where: Path | str | None = None) -> str | None:
    """One line for a failed write a user can fix (full disk, read-only or forbidden path),
    found anywhere in ``exc``'s cause/context chain or exception group; None for anything else.
    ``where`` names the place when the error does not (a failed ``write`` has no file name).

    >>> disk_error(RuntimeError("x")) is None
    True
    >>> try:
    ...     try:
    ...         raise OSError(errno.ENOSPC, "No space left on device", "runs/x/trace/decisions-00000.arrows")
    ...     except OSError:
    ...         raise ValueError("closing the trace failed")
    ... except ValueError as e:
    ...     disk_error(e)
    'cannot write runs/x/trace/decisions-00000.arrows: the disk is full; free space (or pass another --run-dir), then continue with --resume'
    """
    seen: set[int] = set()
    stack = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _DISK_ERRNOS:
            place = e.filename or where or "the run directory"
            fix = _FIXES.get(e.errno, "make it writable or pass another --run-dir")
            return f"cannot write {place}: {_DISK_ERRNOS[e.errno]}; {fix}"
        if isinstance(e, BaseExceptionGroup):
            stack.extend(e.exceptions)
        stack.extend([e.__context__, e.__cause__])
    return None


def close_all(*closables: Any) -> None:
    """``close()`` every one that has it, even when one fails (a full disk fails them all); then
    raise the first failure."""
    first: BaseException | None = None
    for closable in closables:
        close = getattr(closable, "close", None)
        if close is None:
            continue
        try:
            close()
        except BaseException as exc:
            first = first or exc
    if first is not None:
        raise first
