"""One run per directory: the writer's lock, the "already holds a run" check, and resume as a
transaction.

``open_run_dir(cfg, resume, overwrite)`` is what ``railgate.train.train`` holds for the whole
run. In order, before anything in the directory changes:

1. **Lock.** An exclusive ``flock`` on ``RUN_DIR/.railgate.lock``, held until the run ends (the
   kernel drops it when the process dies, so a killed run leaves no stale lock). A second
   writer is refused with ``RunDirError`` naming the holder (pid, host, command, start time).
2. **A used directory.** Without ``resume``, a directory that already holds a run (any of
   ``RUN_FILES``) is refused, unless ``overwrite``: then those entries are deleted (caches such
   as ``base_model/`` stay).
3. **Resume.** The newest checkpoint is read (its checksum verified) and the new config is
   checked against the one the run was started with: only ``RESUMABLE_KEYS`` may differ.

``RunDir.commit(components)`` then restores the checkpoint into the built components and only
after that writes the supersede rules (``pipeline.store.arrowio.mark_superseded``, and the
``superseded`` marks of ``metrics.jsonl``): a resume that fails there leaves the directory as it
was. A fresh run writes its run id (``railgate.runid``) and ``config.yaml`` at commit; a resumed
run rewrites ``config.yaml`` only once its new settings have run (``record_config``: at its first
checkpoint, or at its end), so a resume that fails records no settings that never ran. A
checkpoint of another run (its run id differs) is refused, naming both ids.

>>> import tempfile
>>> from railgate.config import load_config
>>> cfg = load_config(None, [f"run_dir={tempfile.mkdtemp()}/run"])
>>> with open_run_dir(cfg) as run:
...     with open_run_dir(cfg) as second:  # doctest: +ELLIPSIS
...         pass
Traceback (most recent call last):
...
railgate.rundir.RunDirError: .../run is in use by another railgate process (pid ...); wait for it to finish, or train into another --run-dir
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from pipeline.config.build import ConfigError, shorten, to_dict
from pipeline.metrics import mark_superseded_steps
from pipeline.store.arrowio import mark_superseded, next_segment_number
from pipeline.store.atomic import atomic_write
from railgate.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint
from railgate.config import RunConfig, dump_config, load_config
from railgate.diskerrors import disk_error
from railgate.runid import RUN_ID_FILE, RunIdError, new_run_id, resolve_run_id, write_run_id

LOCK_FILE = ".railgate.lock"
RUN_FILES = (
    "run_id",
    "config.yaml",
    "checkpoints",
    "trace",
    "buffer",
    "metrics.jsonl",
    "summary.json",
    "report.md",
    "accuracy.png",
    "tensorboard",
    "offpolicy.md",
    "offpolicy.json",
    "offpolicy.png",
)
"""What a run writes into its directory; any of them means the directory holds a run."""
RUN_GLOBS = ("eval_*.json",)

RESUMABLE_KEYS = (
    "orchestrator.steps",
    "orchestrator.eval_every",
    "orchestrator.target_accuracy",
    "orchestrator.max_rollouts",
    "orchestrator.reward_timeout_s",
    "orchestrator.reward_threads",
    "orchestrator.reward_check_first",
    "orchestrator.max_concurrent_samples",
    "orchestrator.max_open_groups",
    "orchestrator.stream_buffer",
    "log.",
    "engine.fail_every",
    "engine.ray.",
    "torch_engine.max_batch",
    "torch_engine.threads",
    "torch_engine.delta_tokens",
    "learner.num_threads",
    "sim.realtime",
)
"""Config keys (a trailing dot: a whole section) that may change when a run is resumed; every
other key is part of what the checkpoint holds or of what the run means, and must stay."""


class RunDirError(RuntimeError):
    """A run directory cannot be used as asked; the message names it, the reason and the fix."""


class RunDir:
    """A locked run directory; ``state`` is the checkpoint to resume from (None: a fresh run)."""

    def __init__(self, cfg: RunConfig, path: Path, state: dict[str, Any] | None, checkpoint: Path | None) -> None:
        self.cfg = cfg
        self.path = path
        self.state = state
        self.checkpoint = checkpoint
        self.committed = False
        self.run_id = new_run_id(cfg.name)  # a resume replaces it with the run's own
        self._write_run_id = True
        self._config_pending = False

    def commit(self, orchestrator: Any) -> None:
        """Restore ``state`` into ``orchestrator`` (resume), then write the run id, ``config.yaml``
        (a fresh run) and the supersede rules. Nothing is written unless the restore succeeded."""
        if self.state is not None:
            restore_run(orchestrator, self.state, self.checkpoint)
        if self._write_run_id:
            write_run_id(self.path, self.run_id)
        if self.state is None:
            write_config(self.path, self.cfg)
        else:
            supersede(self.path, self.state)  # before the trace opens its new segments
            self._config_pending = True
        self.committed = True

    def record_config(self) -> None:
        """Write a resumed run's ``config.yaml`` once its settings have run (no-op otherwise)."""
        if self._config_pending:
            write_config(self.path, self.cfg)
            self._config_pending = False


@contextmanager
def open_run_dir(
    cfg: RunConfig, resume: bool = False, overwrite: bool = False, command: str = "train"
) -> Iterator[RunDir]:
    """Lock ``cfg.run_dir`` for one writer and check it (see the module docstring). ``command``
    names the command in messages (``shadow`` has no ``--resume`` to suggest)."""
    path = Path(cfg.run_dir)
    if resume and overwrite:
        raise ConfigError("--resume continues a run and --overwrite deletes it; pass one of them")
    if resume:
        latest_checkpoint(path)  # a missing directory or checkpoint fails before anything is created
    with _Lock(path) as lock:
        directory = RunDir(cfg, path, None, None)
        try:
            if resume:
                refuse_links(path)
                directory.checkpoint = latest_checkpoint(path)
                directory.state = load_checkpoint(directory.checkpoint)
                check_resumable(cfg, path)
                directory.run_id, directory._write_run_id = resume_run_id(
                    cfg, path, directory.state, directory.checkpoint
                )
            else:
                used = run_entries(path)
                if used and not overwrite:
                    names = ", ".join(p.name + ("/" if p.is_dir() else "") for p in used[:4])
                    go_on = f"continue it with railgate train --resume {path}, " if command == "train" else ""
                    raise RunDirError(
                        f"{path} already holds a run ({names}); {go_on}replace it with {command} --overwrite, or "
                        f"{command} into another --run-dir"
                    )
                for entry in used:
                    _remove(entry)
            yield directory
        except BaseException as exc:
            if not directory.committed:
                lock.discard_if_created()  # a refused run leaves no lock file the directory did not have
            message = disk_error(exc, where=path) if isinstance(exc, Exception) else None
            if message is not None:  # a full disk or read-only directory: one line, however deep in the chain
                raise RunDirError(message) from exc
            raise


def run_entries(path: Path) -> list[Path]:
    """The entries of ``path`` that a run wrote (empty for a new or unused directory)."""
    if not path.is_dir():
        return []
    found = [path / name for name in RUN_FILES if (path / name).exists() or (path / name).is_symlink()]
    for pattern in RUN_GLOBS:
        found.extend(sorted(path.glob(pattern)))
    return found


def refuse_links(path: Path) -> None:
    """``RunDirError`` when a file a run reads or writes in ``path`` is a link: a shared run
    directory could otherwise lead ``--resume`` or ``eval`` to append to, or replace, any file the
    link names (the lock file is opened without following links, the small files are replaced
    by a rename, but segments, ``metrics.jsonl`` and the rules beside them are appended to)."""
    entries = run_entries(path) + [path / LOCK_FILE]
    for sub in ("trace", "buffer", "checkpoints"):
        folder = path / sub
        if folder.is_dir() and not folder.is_symlink():
            entries.extend(sorted(folder.iterdir()))
    for entry in entries:
        if entry.is_symlink():
            raise RunDirError(
                f"{entry} is a link (to {os.readlink(entry)}); a run directory's files are plain files "
                "inside it, so railgate writes through no link: replace it with the file it points to"
            )


def resume_run_id(cfg: RunConfig, path: Path, state: dict[str, Any], checkpoint: Path) -> tuple[str, bool]:
    """The id of the run being resumed, and whether its ``run_id`` file is still to be written
    (a run of an older release); ``RunDirError`` when the checkpoint belongs to another run."""
    try:
        ours, legacy = resolve_run_id(path, cfg.name)
    except RunIdError as exc:
        raise RunDirError(str(exc)) from None
    theirs = state.get("run_id")
    if theirs is None or theirs == ours:
        return ours, legacy
    if legacy:
        raise RunDirError(
            f"--resume {path}: its checkpoint {checkpoint.name} belongs to run {theirs}, but the directory has no "
            f"{RUN_ID_FILE} file saying it is that run; if it is, write the id into it: echo {theirs} > {path / RUN_ID_FILE}"
        )
    raise RunDirError(
        f"--resume {path}: its newest checkpoint {checkpoint.name} belongs to run {theirs}, not to this directory's run "
        f"{ours} (copied in from another run?); resuming would mix two runs: remove {checkpoint} (the newest "
        f"checkpoint of {ours} is then used)"
    )


def check_resumable(cfg: RunConfig, path: Path) -> None:
    """``ConfigError`` when ``cfg`` changes a key the checkpointed run must keep."""
    stored = path / "config.yaml"
    if not stored.is_file():
        return
    try:
        before = load_config(stored, [f"run_dir={cfg.run_dir}"])
    except ConfigError as exc:
        raise ConfigError(f"--resume {path}: its config.yaml is not valid ({exc}); restore it from a copy") from None
    old, new = _flat(to_dict(before)), _flat(to_dict(cfg))
    changed = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k) and not _resumable(k)]
    if changed:
        key = changed[0]
        more = f" (and {', '.join(changed[1:4])}{', ...' if len(changed) > 4 else ''})" if len(changed) > 1 else ""
        raise ConfigError(
            f"--resume {path}: {key} was {shorten(old.get(key))} and would be {shorten(new.get(key))}{more}; a resumed "
            f"run must keep it (the checkpoint was made with it). Keys that may change on resume: "
            f"{', '.join(k + '*' if k.endswith('.') else k for k in RESUMABLE_KEYS)}; for other changes start a new "
            "run in another --run-dir"
        )


def restore_run(orchestrator: Any, state: dict[str, Any], checkpoint: Path | None = None) -> None:
    """``orchestrator.restore(state)``, with a checkpoint that does not fit what this config
    builds reported as such."""
    try:
        orchestrator.restore(state)
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError, IndexError) as exc:
        raise CheckpointError(
            f"checkpoint {checkpoint or ''} does not fit the components this config builds "
            f"({type(exc).__name__}: {shorten(str(exc), 160)}); resume with the config the run was started with"
        ) from None


def write_config(path: Path, cfg: RunConfig) -> None:
    """``config.yaml``, written whole or not at all (a full disk leaves the previous one)."""
    atomic_write(path / "config.yaml", yaml.safe_dump(dump_config(cfg), sort_keys=False))


def supersede(run_dir: Path, state: dict[str, Any]) -> None:
    """Readers skip what the killed run wrote after the checkpoint; the resumed run redoes it."""
    trace_dir, buffer_dir = run_dir / "trace", run_dir / "buffer"
    if trace_dir.is_dir():
        number = next_segment_number(trace_dir, ("decisions", "outcomes"))
        for prefix in ("decisions", "outcomes"):
            mark_superseded(trace_dir, prefix, number, "decision_id", int(state["decision_watermark"]))
    if buffer_dir.is_dir():
        mark_superseded(buffer_dir, "steps", next_segment_number(buffer_dir, ("steps",)), "step", int(state["step"]))
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        mark_superseded_steps(metrics, int(state["step"]))


class TraceSlot:
    """The decision sink components are built with before the trace may be opened: a resume
    must be restored before the run directory changes, and opening a ``TraceLog`` writes a new
    segment pair. ``attach`` plugs the real sink in; every call goes to it from then on.

    >>> import itertools
    >>> class Counter:
    ...     ids = itertools.count()
    ...     def next_decision_id(self):
    ...         return next(self.ids)
    >>> slot = TraceSlot()
    >>> slot.attach(Counter()).next_decision_id(), slot.next_decision_id()
    (0, 1)
    """

    def __init__(self) -> None:
        self._sink: Any = None

    def attach(self, sink: Any) -> Any:
        self._sink = sink
        return sink

    def __getattr__(self, name: str) -> Any:
        sink = self.__dict__.get("_sink")
        if sink is None:
            raise RuntimeError(f"the trace is not open yet (TraceSlot.{name} called before attach)")
        return getattr(sink, name)


def check_writable(path: Path) -> None:
    """``RunDirError`` unless a file can be created in ``path`` (checked before long work whose
    result goes there, such as an evaluation)."""
    import tempfile

    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".railgate-write-check-"):
            pass
    except OSError as exc:
        raise RunDirError(
            f"cannot write into {path}: {exc.strerror}; make it writable or copy the run elsewhere "
            "(its results are written there)"
        ) from None


def _resumable(key: str) -> bool:
    return key == "run_dir" or any(key == k or (k.endswith(".") and key.startswith(k)) for k in RESUMABLE_KEYS)


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for k, v in tree.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: tree}


def _remove(entry: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry)
    else:
        entry.unlink()


class _Lock:
    """``flock`` on ``RUN_DIR/.railgate.lock``; the file holds the holder's description while held."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.path = run_dir / LOCK_FILE
        self._fd: int | None = None
        self._created = False
        self._made_dir = False

    def __enter__(self) -> _Lock:
        import fcntl

        try:
            self._made_dir = not self.run_dir.exists()
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._created = not self.path.exists() and not self.path.is_symlink()
            # O_NOFOLLOW: a lock "file" that is a link (a shared run directory's) must not lead
            # this process to truncate and write whatever file it names.
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise RunDirError(
                    f"{self.path} is a link (to {os.readlink(self.path)}), not the run's lock file; a run "
                    f"directory's files are plain files inside it: delete the link"
                ) from None
            raise RunDirError(
                f"cannot create the run directory's lock file {self.path}: {exc.strerror}; "
                "train into a directory you can write to (--run-dir)"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 500, 0).decode("utf-8", "replace").strip()
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise RunDirError(f"cannot lock {self.path}: {exc.strerror}") from None
            raise RunDirError(
                f"{self.run_dir} is in use by another railgate process ({_describe(holder)}); wait for it to finish, "
                "or train into another --run-dir"
            ) from None
        self._fd = fd
        info = json.dumps(
            {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "command": _command(),
                "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            }
        )
        os.ftruncate(fd, 0)
        os.pwrite(fd, info.encode(), 0)
        return self

    def discard_if_created(self) -> None:
        """A refused run leaves the directory as it found it: no lock file it did not have, and
        no directory at all if it made it and nothing else was written there."""
        if self._created:
            self.path.unlink(missing_ok=True)
            self._created = False
        if self._made_dir:
            try:
                self.run_dir.rmdir()  # only when empty
            except OSError:
                pass
            self._made_dir = False

    def __exit__(self, *exc: object) -> None:
        import fcntl

        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        except OSError:
            pass
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


def _describe(holder: str) -> str:
    try:
        info = json.loads(holder)
        return f"pid {info['pid']} on {info['host']}, started {info['started']}: {shorten(info['command'], 100)}"
    except (ValueError, KeyError, TypeError):
        return "pid unknown"


def _command() -> str:
    return " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv and sys.argv[0] else "python"
