"""The environments of a run's episodes, for the async shell: ``EnvService``.

The group tracker runs episodes turn by turn (``pipeline.core.episodes``) and asks for three things,
which the shell carries out through this service (``pipeline.protocols.EpisodeService``):

* ``step(request, finished)`` -- a turn finished: step its episode's environment with it, in
  a worker thread (a session call returns within ``task.env.step_timeout_s`` plus a grace, and
  never raises for the environment's faults), and answer with a ``TurnDone``: the observation
  rendered as the tokens that join the context, the turn's reward, done, or the error. The
  episode's session opens on its first step: a fresh instance for the prompt's dataset row,
  ``init`` with the row's messages -- whose rendering must be the first turn's prompt, since
  that turn was generated from it -- or, for a branch, a fork of its source;
* ``fork(source, turns, key)`` -- remembered, and made when the branch steps first (from the
  source's recorded actions or snapshots, which outlive the source's close);
* ``close(key)`` -- the episode ended: its instance is released in the background.

A turn that did not complete (aborted, failed in the engine) is answered ``done`` without a
step: the episode ends there.
"""

from __future__ import annotations

import threading
from typing import Any

import anyio
import anyio.to_thread

from pipeline.config.sections import EpisodeSettings
from pipeline.core.episodes import episode_key
from pipeline.core.messages import TurnDone
from pipeline.envs.session import EnvSession
from pipeline.types import SampleFinished, SampleRequest


class EnvService:
    """Episode key -> its ``EnvSession``; see the module docstring. ``task`` is the run's
    ``EnvTask`` (its rows and its runner), ``renderer`` the model's (``pipeline.envs.render``).

    >>> from pipeline.config.sections import EpisodeSettings
    >>> service = EnvService(task=None, renderer=None, settings=EpisodeSettings(3, 64, 8))
    >>> service.fork("g0-s0", 1, "g0-s2"); service.pending_forks
    {'g0-s2': ('g0-s0', 1)}
    """

    def __init__(self, task: Any, renderer: Any, settings: EpisodeSettings, threads: int = 2):
        self.task, self.renderer, self.settings = task, renderer, settings
        self._sessions: dict[str, EnvSession] = {}
        self._forks: dict[str, tuple[str, int]] = {}  # branch key -> (source key, turns), made at its first step
        self._closed_sources: set[str] = set()  # closed, kept for a branch still to be made
        self._lock = threading.Lock()  # sessions are opened and forked in worker threads
        self._limiter = anyio.CapacityLimiter(threads)

    @property
    def pending_forks(self) -> dict[str, tuple[str, int]]:
        return dict(self._forks)

    async def step(self, request: SampleRequest, finished: SampleFinished) -> TurnDone:
        if not finished.finish_reason.is_success:
            return TurnDone(request, finished, done=True)
        return await anyio.to_thread.run_sync(self._step, request, finished, limiter=self._limiter)

    def fork(self, source: str, turns: int, key: str) -> None:
        with self._lock:
            self._forks[key] = (source, turns)

    def close(self, key: str) -> None:
        with self._lock:
            if self._is_source(key):
                session = self._sessions.get(key)
                self._closed_sources.add(key)
            else:
                session = self._sessions.pop(key, None)
        if session is not None:
            threading.Thread(target=session.close, name=f"close-{key}", daemon=True).start()

    def close_all(self) -> None:
        """The run is over: release every instance still held."""
        with self._lock:
            sessions, self._sessions, self._forks = list(self._sessions.values()), {}, {}
        for session in sessions:
            session.close()

    # -- in a worker thread -----------------------------------------------------------------

    def _step(self, request: SampleRequest, finished: SampleFinished) -> TurnDone:
        session, error = self._session(request)
        if error:
            return TurnDone(request, finished, done=True, error=error)
        result = session.step(self.renderer.action_text(finished.token_ids))
        if result.error or result.done:
            return TurnDone(request, finished, reward=result.reward, done=True, error=result.error)
        observation = tuple(self.renderer.observation_ids(result.observations))
        if finished.token_ids[-1:] not in [(stop,) for stop in self.renderer.stop_ids]:
            # A turn cut at its token limit is closed by its stop token, an observation token (in
            # the context, out of the loss), so the next turn sees a well-formed conversation.
            observation = (self.renderer.stop_ids[0], *observation)
        return TurnDone(request, finished, observation, result.reward, False)

    def _session(self, request: SampleRequest) -> tuple[EnvSession, str]:
        key = episode_key(request)
        with self._lock:
            session = self._sessions.get(key)
            fork = self._forks.pop(key, None)
            source = self._sessions.get(fork[0]) if fork else None
        if session is not None:
            return session, ""
        if fork is not None:
            if source is None:
                return None, f"branch {key}: its source episode {fork[0]} has no environment to fork"
            session = source.fork(fork[1])
            with self._lock:
                if fork[0] in self._closed_sources and not self._is_source(fork[0]):
                    self._closed_sources.discard(fork[0])
                    self._sessions.pop(fork[0], None)
        else:
            row = self.task.row(request.prompt.prompt_id)
            session = self.task.runner.session(row.extras)
            started = session.start(row.prompt)
            if not started.error and tuple(self.renderer.prompt_ids(started.conversation)) != request.prompt.token_ids:
                session.close()
                return None, (
                    f"{session.runner.name} init changed the conversation of prompt {request.prompt.prompt_id}; "
                    "railgate renders the dataset row's prompt for the first turn: let init return the "
                    "prompt it was given"
                )
        with self._lock:
            self._sessions[key] = session
        return session, session.error

    def _is_source(self, key: str) -> bool:
        """A branch still to be made forks from ``key``: keep its session (closed, its history kept)."""
        return any(source == key for source, _ in self._forks.values())
