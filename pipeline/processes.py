"""Worker processes on a socket pair, and the idle ones a pool keeps for reuse.

A worker is a fresh interpreter (``python -m MODULE FD ARGS``) talking over its end of a
socket pair, so nothing of the parent's main module is re-imported and the hosted code's own
prints cannot garble the replies. Environment workers (``pipeline.envs.worker``) and reward
workers (``pipeline.tasks.rewards.workers``) are both started this way; each module speaks
its own protocol over ``conn``, one reply per request (``serve_requests``, in the worker).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, Generic, TypeVar


def worker_env() -> dict[str, str]:
    """The environment of a worker process: this one's, with this process's ``sys.path`` on
    ``PYTHONPATH`` (so a worker imports the same packages, and a module of the working directory)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def serve_requests(
    conn: Connection,
    answer: Callable[[Any], Any],
    unsendable: Callable[[Exception], Any] | None = None,
) -> None:
    """A worker's loop: receive a request, send ``answer(request)``, until the connection closes
    (either way). A reply that cannot be sent (not picklable) is replaced by ``unsendable(error)``;
    without ``unsendable`` the error ends the worker."""
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        reply = answer(request)
        try:
            conn.send(reply)
        except (EOFError, OSError):
            return
        except Exception as exc:
            if unsendable is None:
                raise
            conn.send(unsendable(exc))


class WorkerProcess:
    """``python -m MODULE FD ARGS`` in a new session, ``FD`` its end of the socket pair whose
    other end is ``conn``."""

    def __init__(self, module: str, *args: str) -> None:
        parent_sock, child_sock = socket.socketpair()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", module, str(child_sock.fileno()), *args],
                pass_fds=(child_sock.fileno(),),
                env=worker_env(),
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            child_sock.close()
        self.conn = Connection(parent_sock.detach())

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def exit_text(self) -> str:
        """`` with exit status N`` once the process has ended (waiting a moment for it), else ``""``."""
        try:
            status = self.process.wait(timeout=1)
        except subprocess.TimeoutExpired:
            return ""
        return f" with exit status {status}"

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.conn.close()


W = TypeVar("W", bound=WorkerProcess)


class IdleWorkers(Generic[W]):
    """The idle workers of a pool, under a lock; closing (or collecting) the pool stops them."""

    def __init__(self) -> None:
        self._idle: list[W] = []
        self._lock = threading.Lock()

    def close(self) -> None:
        """Stop every idle worker (a busy one stops when its user is done with it, or the run ends)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.kill()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
