"""Environment instances in worker processes (``isolation: process``), killed at a timeout.

A worker is a fresh interpreter (``python -m pipeline.envs.worker FD SPEC``) talking over a
socket pair, so nothing of the parent's main module is re-imported and the env's own prints
cannot garble the replies. It imports the class ``SPEC`` once, at start-up, then hosts one
instance at a time: ``create``, calls, ``drop`` (the instance's ``close()``), and the next
episode's ``create``. ``WorkerPool`` keeps idle workers for reuse, so start-up (a fresh
interpreter importing the env's packages; bounded by ``START_TIMEOUT_S``, not by the step
timeout) is paid once per concurrent episode. A call that overruns its timeout kills its
worker: the deadline holds even for a call stuck in C code (``pipeline.envs.hosts``).

Arguments and results cross the socket pickled: env_config, extras, actions, step outputs and
(``state: snapshot``) snapshots must be picklable, which JSON-like values always are.

>>> pool = WorkerPool("pipeline.envs.chain:ChainEnv")
>>> host = pool.host()
>>> host.create({}, {"reward_spec": {"ground_truth": "3+4"}}, timeout_s=60)
>>> host.call("init", ([{"role": "user", "content": "3+4="}],), timeout_s=60)[0]
[{'role': 'user', 'content': '3+4='}]
>>> host.call("step", ("7",), timeout_s=60)["reward"]
1.0
>>> host.close(); pool.close()
"""

from __future__ import annotations

import os
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any

from pipeline.envs.hosts import CLOSE_TIMEOUT_S, CallFailed, one_line
from pipeline.processes import IdleWorkers, WorkerProcess, serve_requests

START_TIMEOUT_S = 120.0
"""Seconds a worker may take to start: a fresh interpreter importing the env's module."""
MAX_IDLE = 64
"""Idle workers kept for reuse; more are stopped when their episode closes."""


class WorkerPool(IdleWorkers["_Worker"]):
    """Worker processes for the env class ``spec``; ``host()`` hands one to an episode."""

    def __init__(self, spec: str, max_idle: int = MAX_IDLE) -> None:
        super().__init__()
        self.spec = spec
        self.max_idle = max_idle
        self.started = 0  # workers started
        self.killed = 0  # workers killed at a timeout

    def host(self) -> ProcessHost:
        """A host for one episode (its worker is taken or started at ``create``)."""
        return ProcessHost(self)

    def take(self) -> _Worker:
        with self._lock:
            if self._idle:
                return self._idle.pop()
            self.started += 1
        return _Worker(self.spec)

    def give_back(self, worker: _Worker) -> None:
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append(worker)
                return
        worker.kill()


class ProcessHost:
    """One episode's instance in a pool worker (the ``Host`` of ``pipeline.envs.hosts``)."""

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool
        self.alive = True
        self._worker: _Worker | None = None

    def prepare(self) -> None:
        if self._worker is None and self.alive:
            try:
                self._worker = self.pool.take()
            except CallFailed:
                self.alive = False
                raise

    def create(self, env_config: dict, extras: dict, timeout_s: float) -> None:
        self.prepare()
        self._request(("create", (env_config, extras)), timeout_s)

    def call(self, method: str, args: tuple, timeout_s: float) -> Any:
        return self._request(("call", (method, args)), timeout_s)

    def get(self, name: str, timeout_s: float) -> Any:
        return self._request(("get", name), timeout_s)

    def close(self, wait: bool = True) -> None:
        if not self.alive or self._worker is None:
            self.alive = False
            return
        worker, self._worker = self._worker, None
        self.alive = False
        if wait:
            self._drop(worker)
        else:  # the worker goes back to the pool once its instance is closed
            threading.Thread(target=self._drop, args=(worker,), name="env-worker-drop", daemon=True).start()

    def _drop(self, worker: _Worker) -> None:
        try:
            worker.request(("drop", None), CLOSE_TIMEOUT_S)
        except CallFailed:
            worker.kill()
            return
        self.pool.give_back(worker)

    def _request(self, message: tuple, timeout_s: float) -> Any:
        if not self.alive or self._worker is None:
            raise CallFailed("its host is gone (an earlier call timed out or the episode was closed)")
        try:
            return self._worker.request(message, timeout_s)
        except CallFailed as exc:
            if exc.timed_out or not self._worker.running:
                self.pool.killed += exc.timed_out
                self._worker.kill()
                self._worker = None
                self.alive = False
            raise


class _Worker(WorkerProcess):
    """One worker process hosting the env class ``spec``, ready once it has imported it."""

    def __init__(self, spec: str) -> None:
        super().__init__("pipeline.envs.worker", spec)
        try:
            ready = (
                self.conn.recv()
                if self.conn.poll(START_TIMEOUT_S)
                else ("error", f"no answer in {START_TIMEOUT_S:g} s")
            )
        except (EOFError, OSError):
            ready = ("error", "it exited")
        if ready != ("ready", None):
            self.kill()
            detail = ready[1] if isinstance(ready, tuple) and len(ready) == 2 else "it did not start"
            raise CallFailed(f"its worker process failed to start: {detail}")

    def request(self, message: tuple, timeout_s: float) -> Any:
        try:
            self.conn.send(message)
            if not self.conn.poll(timeout_s):
                raise CallFailed(f"timed out after {timeout_s:.3g} s (its worker process was stopped)", timed_out=True)
            ok, value = self.conn.recv()
        except (EOFError, OSError) as exc:
            raise CallFailed(f"its worker process ended ({type(exc).__name__})") from None
        if not ok:
            raise CallFailed(value)
        return value


def _serve(conn: Connection, spec: str) -> None:
    """A worker's loop: import the class, then answer requests until the connection closes."""
    from pipeline.envs.loading import load_env_class

    try:
        cls = load_env_class(spec)
    except Exception as exc:
        conn.send(("error", one_line(exc)))
        return
    conn.send(("ready", None))
    env: Any = None

    def answer(request: tuple[str, Any]) -> tuple[bool, Any]:
        nonlocal env
        op, arg = request
        try:
            if op == "create":
                env = cls(*arg)
                value = None
            elif op == "call":
                method, args = arg
                value = getattr(env, method)(*args)
            elif op == "get":
                value = getattr(env, arg, None)
            else:  # drop: close the instance, keep the worker for the next episode
                if env is not None and callable(getattr(env, "close", None)):
                    env.close()
                env, value = None, None
            return (True, value)
        except BaseException as exc:  # the env's fault: reported, the worker goes on
            return (False, f"raised {type(exc).__name__}: {one_line(exc)}")

    def unsendable(exc: Exception) -> tuple[bool, str]:
        return (
            False,
            f"returned a value that cannot be sent between processes ({one_line(exc, 120)}); "
            "return plain data (str, numbers, lists, dicts)",
        )

    serve_requests(conn, answer, unsendable)


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1])), sys.argv[2])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
