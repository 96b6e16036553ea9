"""Where an environment instance lives and how a call into it is bounded in time.

Why two hosts, and why a thread by default. A call into an environment is foreign code that
may hang. A thread with a deadline gets control back from a hang in Python code (a loop, a
sleep, a socket wait): the caller returns at the deadline and the stuck thread is abandoned.
It cannot stop one stuck in a single C call that holds the GIL (a catastrophic regular
expression, a huge integer power): no other thread of the process runs until it returns.
Only killing a process stops that, and a process per episode costs an interpreter per
concurrent episode. So:

* ``ThreadHost`` (``isolation: thread``, the default): one daemon thread per episode runs
  every call of that episode's instance, in order (an env that keeps a thread-bound handle,
  such as a sqlite connection, works). At a timeout the host is dead: the thread is left to
  finish on its own and later calls fail at once. Costs microseconds a call.
* ``ProcessHost`` (``isolation: process``, ``pipeline.envs.worker``): the instance lives in a
  worker process; at a timeout the process is killed, so the deadline always holds. Workers
  are reused from episode to episode (``WorkerPool``), so a fresh interpreter's start-up is
  paid once per concurrent episode, not per episode.

Both raise only ``CallFailed`` (with what went wrong in one line) from ``create``, ``call``
and ``get``; ``close`` never raises.

>>> class Slow:
...     def __init__(self, env_config, extras): pass
...     def step(self, action):
...         import time; time.sleep(5)
>>> host = ThreadHost(Slow, "demo")
>>> host.create({}, {}, timeout_s=1.0)
>>> host.call("step", ("x",), timeout_s=0.05)
Traceback (most recent call last):
...
pipeline.envs.hosts.CallFailed: timed out after 0.05 s
>>> host.alive
False
>>> host.close()
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, Protocol

CLOSE_TIMEOUT_S = 5.0
"""Seconds an env's ``close()`` may take before its host is abandoned (thread) or killed (process)."""


class CallFailed(Exception):
    """A call into an environment raised, timed out, or its host is gone; ``str()`` says which."""

    def __init__(self, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class Host(Protocol):
    """One environment instance and the place its calls run."""

    alive: bool

    def prepare(self) -> None:
        """Get ready to host (a worker process's start-up); not counted against a timeout."""
        ...

    def create(self, env_config: dict, extras: dict, timeout_s: float) -> None:
        """Construct the instance: ``Class(env_config, extras)``."""
        ...

    def call(self, method: str, args: tuple, timeout_s: float) -> Any:
        """``instance.method(*args)``."""
        ...

    def get(self, name: str, timeout_s: float) -> Any:
        """``getattr(instance, name, None)``."""
        ...

    def close(self, wait: bool = True) -> None:
        """Call the instance's ``close()`` if it has one, then release the host. Never raises.
        ``wait``: return once done (at most ``CLOSE_TIMEOUT_S``); else at once, closing in the background."""
        ...


class ThreadHost:
    """The instance on a daemon thread of its own; see the module docstring."""

    def __init__(self, cls: type, label: str) -> None:
        self.cls = cls
        self.alive = True
        self._env: Any = None
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=f"env:{label}", daemon=True)
        self._thread.start()

    def prepare(self) -> None:
        pass

    def create(self, env_config: dict, extras: dict, timeout_s: float) -> None:
        def make() -> None:
            self._env = self.cls(env_config, extras)

        self._run(make, timeout_s)

    def call(self, method: str, args: tuple, timeout_s: float) -> Any:
        return self._run(lambda: getattr(self._env, method)(*args), timeout_s)

    def get(self, name: str, timeout_s: float) -> Any:
        return self._run(lambda: getattr(self._env, name, None), timeout_s)

    def close(self, wait: bool = True) -> None:
        if not self.alive:
            return
        closer = getattr(self._env, "close", None) if self._env is not None else None
        try:
            if callable(closer):
                if wait:
                    self._run(closer, CLOSE_TIMEOUT_S)
                else:  # the host's thread runs it after whatever it is doing, and then ends
                    self._jobs.put((closer, [], threading.Event()))
        except CallFailed:
            pass  # a close that fails or hangs loses nothing the episode needs
        finally:
            self.alive = False
            self._env = None
            self._jobs.put(None)  # ends the thread once its current job (if stuck: never) returns

    def _run(self, fn: Callable[[], Any], timeout_s: float) -> Any:
        if not self.alive:
            raise CallFailed("its host is gone (an earlier call timed out or the episode was closed)")
        box: list[tuple[bool, Any]] = []
        done = threading.Event()
        self._jobs.put((fn, box, done))
        if not done.wait(timeout_s):
            self.alive = False  # the thread may still be inside the call: never hand it another
            self._jobs.put(None)
            raise CallFailed(f"timed out after {timeout_s:.3g} s", timed_out=True)
        ok, value = box[0]
        if not ok:
            raise CallFailed(value)
        return value

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, box, done = job
            try:
                box.append((True, fn()))
            except BaseException as exc:  # SystemExit from an env must not end the thread silently
                box.append((False, f"raised {type(exc).__name__}: {one_line(exc)}"))
            done.set()


def one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split()) or "(no message)"
    return text if len(text) <= limit else text[:limit] + "..."
