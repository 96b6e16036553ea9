"""One episode's environment: start, step, fork at a turn boundary, close -- never raising for
the environment's faults.

``EnvRunner(config)`` loads the class once per run; ``runner.session(extras)`` makes an
``EnvSession`` per episode. Every method of a session is blocking and bounded: call it from a
worker thread, off the event loop. What the environment does wrong becomes a result with
``error`` set -- one line naming the class, the step and what was wrong -- and the episode
counts as an environment failure:

==========================  ===============================================================
the env ...                 error (``ChainEnv step 2: ...``)
==========================  ===============================================================
raises                      ``raised ValueError: ...``
hangs                       ``timed out after 10 s`` (``task.env.step_timeout_s``; how:
                            ``pipeline.envs.hosts``)
returns the wrong types     ``reward is a str ('1'), not a number`` (``pipeline.envs.checks``)
returns a huge observation  ``observations hold 90000 characters, over max_observation_chars``
never sets done             ``not done after max_turns=8 ...``; when the env itself allows
                            more turns (its ``max_turns``) the episode is ``truncated``
                            instead, which is not a failure
==========================  ===============================================================

A session method returns within ``task.env.step_timeout_s`` plus a short grace (``fork``
within that per replayed step; ``close`` within ``hosts.CLOSE_TIMEOUT_S``); in process
isolation a worker's start-up comes before it. An episode that ends (done or failed) closes
its instance in the background.
Using a session wrongly (``step`` before ``start`` or after the episode ended, forking at a
turn the episode never reached) is the caller's bug and raises ``RuntimeError`` / ``ValueError``.

``fork(turns)`` gives a new session in the state after the first ``turns`` steps (0: right
after ``init``), for branching from a turn boundary. ``state: replay`` (the default) constructs
a fresh instance and replays the recorded actions, checking that each replayed step gives the
recorded observations, reward and done (a mismatch is an error: the env is not deterministic);
``state: snapshot`` saves ``snapshot()`` after ``init`` and after every step and ``restore``s the
one at ``turns`` into a fresh instance. Replay needs nothing of the env and costs ``turns``
steps per fork; a snapshot costs a copy per step and needs the two methods.

>>> from pipeline.envs.config import EnvConfig
>>> runner = EnvRunner(EnvConfig(cls="pipeline.envs.chain:ChainEnv"))
>>> s = runner.session({"reward_spec": {"ground_truth": "3+4*2"}})
>>> s.start([{"role": "user", "content": "3+4="}]).conversation
({'role': 'user', 'content': '3+4='},)
>>> r = s.step("8"); r.reward, r.done, r.observations
(0.0, False, ({'role': 'user', 'content': 'no<3+4='},))
>>> r = s.step("7"); r.observations
({'role': 'user', 'content': '7*2='},)
>>> branch = s.fork(1)  # after the wrong turn: the env asks 3+4 again
>>> branch.step("7").observations == r.observations, branch.turns
(True, 2)
>>> s.step("14").done, s.episode_reward, s.error
(True, 1.0, '')
>>> s.close(); branch.close(); runner.close()
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.envs.checks import BadOutput, check_init, check_step
from pipeline.envs.config import EnvConfig
from pipeline.envs.hosts import CallFailed, Host, ThreadHost
from pipeline.envs.loading import EnvLoadError, load_env_class
from pipeline.envs.protocol import Conversation, supports_snapshot
from pipeline.envs.worker import WorkerPool

INIT_CHARS = 16
"""The initial conversation may hold this many times ``max_observation_chars`` (it carries the
dataset's prompt, which may be long; the token cap of the core bounds it too)."""


@dataclass(frozen=True)
class Started:
    """What ``start`` gives: the conversation the model begins from, or ``error``."""

    conversation: tuple[dict, ...]
    metadata: dict = field(default_factory=dict)
    error: str = ""


@dataclass(frozen=True)
class TurnResult:
    """The environment's answer to one assistant turn (``step`` counts from 1)."""

    step: int
    observations: tuple[dict, ...]
    reward: float
    done: bool
    metadata: dict = field(default_factory=dict)
    error: str = ""
    """Set when the env failed at this step: the episode is over and an environment failure."""
    truncated: bool = False
    """Ended at ``task.env.max_turns`` while the env allowed more turns (not a failure)."""


@dataclass(frozen=True)
class Turn:
    """One recorded turn: the action and what the env answered."""

    action: str
    result: TurnResult


class EnvRunner:
    """The run's environment class and settings; makes one ``EnvSession`` per episode.

    Parameters
    ----------
    config
        ``task.env``.
    cls
        The class itself (default: loaded from ``config.cls``; process isolation always
        imports ``config.cls`` in its workers).
    """

    def __init__(self, config: EnvConfig, cls: type | None = None) -> None:
        self.config = config
        self.cls = cls if cls is not None else load_env_class(config.cls)
        self.name = getattr(self.cls, "__qualname__", config.cls)
        if config.state == "snapshot" and not supports_snapshot(self.cls):
            raise EnvLoadError(
                f"task.env.state=snapshot, but task.env.class={config.cls!r} has no snapshot() and "
                "restore(); set task.env.state=replay (for a deterministic env) or add both methods"
            )
        self._pool = WorkerPool(config.cls) if config.isolation == "process" else None
        self._lock = threading.Lock()
        self.episodes = 0  # sessions started
        self.failures = 0  # sessions that ended in an environment failure

    def session(self, extras: dict[str, Any]) -> EnvSession:
        """A new, unstarted episode for the dataset row ``extras`` (the row without its prompt)."""
        return EnvSession(self, dict(extras))

    def host(self) -> Host:
        return self._pool.host() if self._pool is not None else ThreadHost(self.cls, self.name)

    def count(self, failed: bool) -> None:
        with self._lock:
            if failed:
                self.failures += 1
            else:
                self.episodes += 1

    def close(self) -> None:
        """Stop idle worker processes (process isolation); sessions still open keep theirs."""
        if self._pool is not None:
            self._pool.close()

    def __repr__(self) -> str:
        return f"EnvRunner({self.config.cls!r}, isolation={self.config.isolation!r}, state={self.config.state!r})"


class EnvSession:
    """One episode's environment instance; made by ``EnvRunner.session`` (see the module docstring)."""

    def __init__(self, runner: EnvRunner, extras: dict[str, Any]) -> None:
        self.runner = runner
        self.extras = extras
        self.prompt: Conversation = []
        self.started: Started | None = None
        self.history: list[Turn] = []
        self.error = ""
        self._snapshots: list[Any] = []  # state: snapshot; index k = after step k
        self._env_max_turns: int | None = None
        self._host: Host | None = None

    # -- the episode -------------------------------------------------------------------------

    def start(self, prompt: Sequence[dict]) -> Started:
        """Construct the instance and ``init`` it with the row's chat messages ``prompt``."""
        if self.started is not None:
            raise RuntimeError("start() was called twice on one session; make a new session per episode")
        self.prompt = [dict(m) for m in prompt]
        self.runner.count(failed=False)
        try:
            deadline = self._open()
            conversation, metadata = check_init(self._call("init", (self.prompt,), deadline), INIT_CHARS * self._cap)
            self._env_max_turns = _positive_int(self._host.get("max_turns", _left(deadline)))
            self._save_snapshot(deadline)
            self.started = Started(tuple(conversation), metadata)
        except (CallFailed, BadOutput) as exc:
            self.started = Started((), {}, self._fail(f"init: {_what(exc)}"))
        return self.started

    def step(self, action: str) -> TurnResult:
        """The env's answer to the assistant's turn ``action`` (text, stop token stripped)."""
        self._check_can_step()
        n = len(self.history) + 1
        try:
            deadline = time.monotonic() + self.config.step_timeout_s
            observations, reward, done, metadata = check_step(self._call("step", (str(action),), deadline), self._cap)
            result = TurnResult(n, tuple(observations), reward, done, metadata)
            if not done and n >= self.config.max_turns:
                result = self._at_turn_limit(result)
            if not result.done:
                self._save_snapshot(deadline)
        except (CallFailed, BadOutput) as exc:
            result = TurnResult(n, (), 0.0, True, {}, self._fail(f"step {n}: {_what(exc)}"))
        self.history.append(Turn(str(action), result))
        if result.done:
            self._release(wait=False)  # within this call's bound: the instance closes in the background
        return result

    def fork(self, turns: int) -> EnvSession:
        """A new session in this one's state after its first ``turns`` steps (0: after init).

        Env faults while rebuilding (a replay that raises, times out or gives other results)
        give a session whose ``error`` is set; check ``failed`` before stepping it.
        """
        if self.started is None or self.started.error:
            raise RuntimeError("fork() needs a session that started without error")
        if not 0 <= turns <= len(self.history) or any(t.result.error for t in self.history[:turns]):
            raise ValueError(
                f"fork(turns={turns}): the episode has {len(self.history)} turns "
                f"({'the last failed' if self.error else 'none failed'}); fork at 0..{self._last_good()}"
            )
        child = EnvSession(self.runner, self.extras)
        child.prompt, child._env_max_turns = self.prompt, self._env_max_turns
        child.history = list(self.history[:turns])
        self.runner.count(failed=False)
        if turns and child.history[-1].result.done:
            child.started = self.started
            return child  # nothing to rebuild: the branch is already over
        try:
            if self.config.state == "snapshot":
                deadline = child._open()
                child._call("restore", (copy.deepcopy(self._snapshots[turns]),), deadline)
                child._snapshots = self._snapshots[: turns + 1]
            else:
                child._replay(turns)
            child.started = self.started
        except (CallFailed, BadOutput) as exc:
            label = "restore" if self.config.state == "snapshot" else "replay"
            child.started = Started((), {}, child._fail(f"{label} to turn {turns}: {_what(exc)}"))
        return child

    def close(self) -> None:
        """Release the instance (its ``close()``, at most ``hosts.CLOSE_TIMEOUT_S``); idempotent, never raises.
        An episode that ended (done or failed) has already released it."""
        self._release()

    # -- what the caller reads ---------------------------------------------------------------

    @property
    def config(self) -> EnvConfig:
        return self.runner.config

    @property
    def turns(self) -> int:
        return len(self.history)

    @property
    def failed(self) -> bool:
        """True once the env failed: the episode is an environment failure."""
        return bool(self.error)

    @property
    def done(self) -> bool:
        return bool(self.history) and self.history[-1].result.done

    @property
    def rewards(self) -> tuple[float, ...]:
        return tuple(t.result.reward for t in self.history)

    @property
    def episode_reward(self) -> float:
        """The reward that trains (``task.env.reward``: the last turn's or the sum)."""
        return self.config.episode_reward(self.rewards)

    def __enter__(self) -> EnvSession:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "failed" if self.error else "done" if self.done else "running"
        return f"EnvSession({self.runner.name}, turns={self.turns}, {state})"

    # -- internals ---------------------------------------------------------------------------

    @property
    def _cap(self) -> int:
        return self.config.max_observation_chars

    def _open(self) -> float:
        """Make the host and construct the instance; returns the deadline of this call."""
        self._host = self.runner.host()
        self._host.prepare()  # a worker process's start-up is not the env's time
        deadline = time.monotonic() + self.config.step_timeout_s
        self._host.create(self.runner.config.config, self.extras, _left(deadline))
        return deadline

    def _call(self, method: str, args: tuple, deadline: float) -> Any:
        assert self._host is not None
        return self._host.call(method, args, _left(deadline))

    def _replay(self, turns: int) -> None:
        deadline = self._open()
        self._call("init", (self.prompt,), deadline)
        for k, turn in enumerate(self.history[:turns], start=1):
            deadline = time.monotonic() + self.config.step_timeout_s
            observations, reward, done, _ = check_step(self._call("step", (turn.action,), deadline), self._cap)
            recorded = turn.result
            if (tuple(observations), reward, done) != (recorded.observations, recorded.reward, recorded.done):
                raise BadOutput(
                    f"step {k} gave other results than the episode it replays (observations "
                    f"{_short(observations)}, reward {reward}, done {done}); the env is not deterministic: "
                    "give it snapshot() and restore() and set task.env.state=snapshot"
                )

    def _save_snapshot(self, deadline: float) -> None:
        if self.config.state == "snapshot":
            self._snapshots.append(copy.deepcopy(self._call("snapshot", (), deadline)))

    def _at_turn_limit(self, result: TurnResult) -> TurnResult:
        limit = self.config.max_turns
        if self._env_max_turns is not None and self._env_max_turns > limit:
            return TurnResult(result.step, result.observations, result.reward, True, result.metadata, truncated=True)
        declared = f"its own max_turns={self._env_max_turns}" if self._env_max_turns else "it declares no max_turns"
        raise BadOutput(
            f"not done after max_turns={limit} (task.env.max_turns; {declared}); the env must set done "
            "by its last turn, or raise task.env.max_turns"
        )

    def _check_can_step(self) -> None:
        if self.started is None:
            raise RuntimeError("step() before start(); call start(prompt) first")
        if self.error:
            raise RuntimeError(f"step() on a failed episode ({self.error}); end the episode")
        if self.done:
            raise RuntimeError(f"step() after the episode ended (done at step {len(self.history)}); end the episode")

    def _fail(self, what: str) -> str:
        self.error = f"{self.runner.name} {what}"
        self.runner.count(failed=True)
        self._release(wait=False)
        return self.error

    def _last_good(self) -> int:
        return next((k for k, t in enumerate(self.history) if t.result.error), len(self.history))

    def _release(self, wait: bool = True) -> None:
        host, self._host = self._host, None
        if host is not None:
            host.close(wait)

    def __del__(self) -> None:
        try:
            self._release(wait=False)  # a session dropped unclosed does not keep its thread or worker
        except Exception:
            pass


def _what(exc: Exception) -> str:
    if isinstance(exc, CallFailed) and exc.timed_out:
        return f"{exc}; raise task.env.step_timeout_s if the env is slow rather than stuck"
    return str(exc)


def _left(deadline: float) -> float:
    """Seconds to the deadline (at least a millisecond, so a spent budget times out at once)."""
    return max(0.001, deadline - time.monotonic())


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
