"""Reward functions in worker processes, so that their timeout always fires.

A reward that runs Python bytecode can be abandoned by a thread timeout, but one stuck inside a
single C call that holds the GIL cannot: math-verify asked to compare ``9^{9^{9^{9}}}``
computes the power in one long integer operation, and while it does, no other thread of the
process -- the event loop included -- runs at all. Killing a process is the only way to stop
such a call. ``RewardWorkers`` keeps a few worker processes, each holding a copy of the
scorer; a call goes to an idle worker, and a worker that does not answer within the timeout is
killed (a fresh one starts on the next call).

The scorer is pickled once, up front (``TypeError`` if it cannot be), and must be importable
by name in the workers (classes and functions of a module, not of ``__main__``, nor lambdas).
Start-up -- a fresh interpreter importing the scorer's packages, and the scorer's
``warm_up()`` if it has one -- is not counted against the reward timeout.
Scorers ask for this by declaring ``runs_in_process = True`` (math-verify and users'
``module:function`` rewards do); ``pipeline.tasks.rewards.scoring.ScoringService`` then routes their calls
here. A worker ends when its connection closes: when the pool is closed or collected, or when
the run's process ends, however it ends.

>>> from pipeline.sim.world import CORRECT_TOKEN, SimAnswerScorer
>>> from pipeline.types import Prompt
>>> workers = RewardWorkers(SimAnswerScorer(), workers=1)
>>> workers.call(Prompt(0, "", ()), (7, CORRECT_TOKEN), timeout_s=60.0)
1.0
>>> workers.close()
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

from pipeline.processes import IdleWorkers, WorkerProcess, serve_requests

_START_TIMEOUT_S = 300.0  # a fresh interpreter importing math-verify, on a loaded machine


class RewardTimeout(Exception):
    """A reward call did not answer within its timeout; its worker was killed."""


class RewardFailed(Exception):
    """The reward function raised in its worker; ``kind`` is the exception's type name."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class RewardWorkers(IdleWorkers["_Worker"]):
    """Up to ``workers`` processes running ``scorer(prompt, token_ids)``; see the module docstring."""

    def __init__(self, scorer: Any, workers: int) -> None:
        super().__init__()
        if workers < 1:
            raise ValueError(f"workers={workers} must be >= 1")
        self.scorer = scorer
        self.workers = workers
        try:
            self._payload = pickle.dumps(scorer)
        except Exception as exc:
            raise TypeError(
                f"the reward {scorer!r} cannot be sent to a worker process ({str(exc)[:200]}); define its "
                "functions in a module (not in __main__, a notebook or a lambda)"
            ) from None
        self._slots = threading.BoundedSemaphore(workers)
        self.killed = 0  # workers killed at a timeout

    def call(self, prompt: Any, token_ids: Sequence[int], timeout_s: float) -> float | None:
        """The scorer's value (a float, or None for "no reward"); ``RewardTimeout`` after
        ``timeout_s``, ``RewardFailed`` when it raised. Blocks: call it from a thread."""
        with self._slots:
            worker = self._take()
            try:
                worker.conn.send((prompt, tuple(token_ids)))
                if not worker.conn.poll(timeout_s):
                    worker.kill()
                    self.killed += 1
                    worker = None
                    raise RewardTimeout(f"reward timed out after {timeout_s}s (its worker process was stopped)")
                ok, value = worker.conn.recv()
            except (EOFError, OSError, BrokenPipeError) as exc:
                ended = ""
                if worker is not None:
                    ended = worker.exit_text()
                    worker.kill()
                    worker = None
                raise RewardFailed(
                    "WorkerDied",
                    f"the reward's worker process ended{ended} during the call "
                    f"({type(exc).__name__}): os._exit, a crash or a kill in the reward code",
                ) from None
            finally:
                if worker is not None:
                    with self._lock:
                        self._idle.append(worker)
        if not ok:
            raise RewardFailed(*value)
        return value

    def _take(self) -> _Worker:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return _Worker(self._payload)


class _Worker(WorkerProcess):
    """One worker (``python -m pipeline.tasks.rewards.workers FD``, ``pipeline.processes``),
    ready once it has unpickled the scorer."""

    def __init__(self, payload: bytes) -> None:
        super().__init__("pipeline.tasks.rewards.workers")
        try:
            self.conn.send_bytes(payload)
            ready = self.conn.recv() if self.conn.poll(_START_TIMEOUT_S) else None
        except (EOFError, OSError):
            ready = None
        if ready != ("ready", None):
            detail = ready[1] if isinstance(ready, tuple) and len(ready) == 2 else f"it did not start{self.exit_text()}"
            self.kill()
            raise RewardFailed("WorkerStartError", f"the reward's worker process failed to start: {detail}")


def _serve(conn: Connection) -> None:
    """A worker's loop: unpickle the scorer, then answer calls until the connection closes."""
    try:
        scorer = pickle.loads(conn.recv_bytes())
    except Exception as exc:
        conn.send(("error", f"{type(exc).__name__}: {str(exc)[:300]}"))
        return
    warm_up = getattr(scorer, "warm_up", None)
    if callable(warm_up):  # first-call costs (imports, parser tables) are start-up, not the first reward's time
        try:
            warm_up()
        except Exception:
            pass  # a real call will report it
    conn.send(("ready", None))

    def score(request: tuple[Any, Sequence[int]]) -> tuple[bool, Any]:
        prompt, token_ids = request
        try:
            value = scorer(prompt, token_ids)
            return (True, None if value is None else float(value))
        except Exception as exc:  # the user's reward: reported, the worker goes on
            return (False, (type(exc).__name__, str(exc)[:500]))

    serve_requests(conn, score)


if __name__ == "__main__":
    # Its own session (start_new_session): a terminal's Ctrl-C reaches the run, which ends the workers.
    _serve(Connection(int(sys.argv[1])))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no interpreter teardown: extension modules' shutdown chatter is not the user's concern
