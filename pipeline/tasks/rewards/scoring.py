"""Rewards for finished samples, computed off the event loop with a timeout.

A reward function that raises, or runs past ``timeout_s``, gives reward 0 and is counted; the
run goes on. Scorers that declare ``runs_in_process = True`` (math-verify, users' rewards) run
in worker processes (``pipeline.tasks.rewards.workers``): a call past the timeout has its worker
killed, so the timeout fires even when the call holds the GIL (a huge power inside sympy).
Other scorers run in worker threads; Python cannot kill a thread, so a hung reward keeps its
thread until it returns by itself: the limiter slot is freed at the timeout
(``abandon_on_cancel``), so the pipeline keeps going, but a reward that hangs on every call
will pile up threads -- the ``pipeline/reward_timeouts`` counter tells you to fix it.

A scorer may return None for "no reward": the sample gets ``NO_REWARD`` (NaN), is counted in
``no_reward`` and is not trained on (``ScoredSample.is_valid``).

Every outcome is counted as it happens in ``health`` (``pipeline.tasks.rewards.health``): with
``check_first`` N > 0 the service raises ``RewardsFailing`` -- the run stops with the function's
name and its first failure -- when each of the first N rewards raised, timed out or returned None.

Scorers that declare ``runs_inline = True`` (the simulator's one-token check) are called on
the event loop directly: a thread hop would cost more than the reward.

>>> import anyio
>>> from pipeline.types import Prompt
>>> class Boom:
...     runs_inline = False
...     def __call__(self, prompt, token_ids):
...         raise ValueError("bad answer format")
>>> service = ScoringService(Boom(), timeout_s=1.0, threads=1)
>>> anyio.run(service.score, Prompt(0, "", ()), (1, 2))
(0.0, 'reward raised ValueError: bad answer format')
>>> service.errors
1
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import anyio
import anyio.to_thread

from pipeline.config.sections import MAX_TIMEOUT_S
from pipeline.protocols import Scorer
from pipeline.tasks.rewards.health import RewardHealth, RewardsFailing, scorer_name
from pipeline.tasks.rewards.workers import RewardFailed, RewardTimeout, RewardWorkers
from pipeline.types import NO_REWARD, Prompt


class ScoringService:
    """Runs a ``Scorer`` with a timeout and error capture; counts errors and timeouts."""

    def __init__(
        self, scorer: Scorer, timeout_s: float, threads: int, check_first: int = 0, inline: bool | None = None
    ):
        if not 0 < timeout_s <= MAX_TIMEOUT_S:
            raise ValueError(f"reward timeout_s={timeout_s} must be in (0, {MAX_TIMEOUT_S:g}] seconds")
        self.scorer = scorer
        self.timeout_s = timeout_s
        self._limiter = anyio.CapacityLimiter(threads)
        # inline=True: on the event loop whatever the scorer declares (a deterministic run): a scorer
        # in worker processes is still timed out there, the loop waiting for it; one in threads is not
        declared_inline = bool(getattr(scorer, "runs_inline", False))
        self._inline = declared_inline if inline is None else inline
        self._workers: RewardWorkers | None = None
        if not declared_inline and getattr(scorer, "runs_in_process", False):
            try:
                self._workers = RewardWorkers(scorer, threads)
            except TypeError as exc:  # cannot be pickled: threads, whose timeout a GIL-holding call outlasts
                warnings.warn(f"{exc}; it runs in threads instead", RuntimeWarning, stacklevel=2)
        self.health = RewardHealth(scorer_name(scorer), check_first)

    @property
    def errors(self) -> int:
        """Rewards that raised, over the run (a resumed run's earlier ones included)."""
        return self.health.totals()["errors"]

    @property
    def timeouts(self) -> int:
        return self.health.totals()["timeouts"]

    @property
    def no_reward(self) -> int:
        """The scorer returned None: counted, not trained on (``NO_REWARD``)."""
        return self.health.totals()["none"]

    @property
    def runs_inline(self) -> bool:
        """True when ``score`` calls the scorer on the event loop (it never suspends)."""
        return self._inline

    async def score(self, prompt: Prompt, token_ids: Sequence[int]) -> tuple[float, str]:
        """``(reward, error)``; ``error`` is empty on success."""
        if self._workers is not None and self._inline:  # a deterministic run: in order, timed out
            return self._checked(lambda: self._workers.call(prompt, token_ids, self.timeout_s))
        if self._inline:
            return self._checked(lambda: self.scorer(prompt, token_ids))
        if self._workers is not None:  # the worker enforces the timeout; a thread only waits for it
            return await anyio.to_thread.run_sync(
                self._checked,
                lambda: self._workers.call(prompt, token_ids, self.timeout_s),
                limiter=self._limiter,
                abandon_on_cancel=True,
            )
        result: tuple[float, str] | None = None
        with anyio.move_on_after(self.timeout_s):
            result = await anyio.to_thread.run_sync(
                self._checked,
                lambda: self.scorer(prompt, token_ids),
                limiter=self._limiter,
                abandon_on_cancel=True,
            )
        if result is None:
            message = f"reward timed out after {self.timeout_s}s"
            self.health.failed("timeout", message)
            return 0.0, message
        return result

    def _checked(self, call) -> tuple[float, str]:
        health = self.health
        try:
            value = call()
            if value is None:  # "no reward for this sample"
                health.failed("none")
                return NO_REWARD, "no reward"
            value = float(value)
        except RewardsFailing:
            raise
        except RewardTimeout as exc:
            health.failed("timeout", str(exc))
            return 0.0, str(exc)
        except RewardFailed as exc:
            message = f"reward raised {exc.kind}: {exc}"
            health.failed("error", f"{exc.kind}: {exc}")
            return 0.0, message
        except Exception as exc:  # a user's reward function: any failure is that sample's
            health.failed("error", f"{type(exc).__name__}: {exc}")
            return 0.0, f"reward raised {type(exc).__name__}: {exc}"
        if not math.isfinite(value):
            health.failed("error", f"returned a non-finite value {value!r}")
            return 0.0, f"reward returned a non-finite value {value!r}"
        health.succeeded()
        return value, ""

    def close(self) -> None:
        """Stop the reward worker processes, if any (they also end with the process)."""
        if self._workers is not None:
            self._workers.close()
