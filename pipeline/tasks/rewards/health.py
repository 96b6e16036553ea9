"""Live accounting of a reward function's failures, and the stop when it never works.

A reward that raises, times out or returns None costs its sample, and the run goes on: one
bad sample should not end a long run. But a reward function that fails on *every* sample
(a typo in a field name, a missing import, a timeout far below its run time) would otherwise
burn the whole budget on samples that can never train -- with a gate that skips groups it
cannot score, without a single learner step. ``RewardHealth`` counts every outcome as it
happens (the scoring service reports each one) and, when each of the first ``check_first``
rewards failed, raises ``RewardsFailing``: a named error whose message gives the function, the
counts and its first failure, so the run stops with the reason.

The counts are live: ``report`` gives them to whoever asks -- every learner step's ``StepDone``
and, at the run's end, a ``RewardsCounted`` message -- and the group tracker writes them into
the run's budget (it is the budget's one writer), so the summary's "reward errors / timeouts /
none" holds even when no step ran.

>>> health = RewardHealth("my_rewards:score", check_first=3)
>>> health.failed("error", "ValueError: bad format")
>>> health.failed("none")
>>> health.failed("timeout", "reward timed out after 5.0s")
Traceback (most recent call last):
...
pipeline.tasks.rewards.health.RewardsFailing: reward my_rewards:score failed on each of its first 3 samples (1 raised, 1 timed out, 1 returned None); the first: ValueError: bad format; fix the function (call it on a few dataset rows to see), or set orchestrator.reward_check_first=0 to train on regardless
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Literal

from pipeline.core.messages import RewardCounts

Failure = Literal["error", "timeout", "none"]


class RewardsFailing(RuntimeError):
    """Every one of a reward function's first rewards failed; the message names the function,
    the counts and its first failure."""


class RewardHealth:
    """Counts of a reward function's outcomes; see the module docstring.

    Parameters
    ----------
    name
        How messages name the function (``module:function``, or the built-in reward's class).
    check_first
        Stop (``RewardsFailing``) when each of the first this many rewards failed; 0: never.
    """

    def __init__(self, name: str, check_first: int = 0) -> None:
        if check_first < 0:
            raise ValueError(f"check_first={check_first} must be >= 0 (0: never stop)")
        self.name = name
        self.check_first = check_first
        self.ok = 0
        self.errors = 0
        self.timeouts = 0
        self.none = 0
        self.first_failure = ""
        self._carried = (0, 0, 0)  # a resumed run's counts before this process (``carry``)
        self.listeners: list[Callable[[RewardHealth], None]] = []  # e.g. a progress line, told of each failure
        self._tripped = False
        self._lock = threading.Lock()  # rewards are scored in worker threads

    @property
    def failures(self) -> int:
        return self.errors + self.timeouts + self.none

    @property
    def calls(self) -> int:
        return self.ok + self.failures

    def succeeded(self) -> None:
        with self._lock:
            self.ok += 1

    def failed(self, kind: Failure, detail: str = "") -> None:
        """Count one failure; ``RewardsFailing`` (raised once) when it makes the first
        ``check_first`` rewards all failures."""
        with self._lock:
            if kind == "error":
                self.errors += 1
            elif kind == "timeout":
                self.timeouts += 1
            else:
                self.none += 1
            if not self.first_failure:
                self.first_failure = detail or "returned None"
            trip = self.check_first and not self._tripped and self.ok == 0 and self.failures >= self.check_first
            self._tripped = self._tripped or bool(trip)
        for listener in self.listeners:
            listener(self)
        if trip:
            raise RewardsFailing(self.message(self.check_first))

    def message(
        self, n: int, counts: dict[str, int] | None = None, which: str = "its first", regardless: bool = True
    ) -> str:
        """Why ``n`` failed rewards stop the work (``counts``: of those, default all so far), and the fix."""
        c = counts or self.counts()
        fix = self._fix(c)
        if regardless:
            fix += ", or set orchestrator.reward_check_first=0 to train on regardless"
        return (
            f"reward {self.name} failed on each of {which} {n} samples ({c['errors']} raised, {c['timeouts']} timed "
            f"out, {c['none']} returned None); the first: {self.first_failure[:300]}; {fix}"
        )

    @staticmethod
    def _fix(c: dict[str, int]) -> str:
        failures = sum(c.values())
        if c["none"] == failures:
            return "return a number for the samples it can grade (None means no reward: not trained on)"
        if c["timeouts"] == failures:
            return "make it faster, or raise orchestrator.reward_timeout_s (a call past it scores 0)"
        return "fix the function (call it on a few dataset rows to see)"

    def counts(self) -> dict[str, int]:
        """``errors``, ``timeouts`` and ``none`` so far."""
        return {"errors": self.errors, "timeouts": self.timeouts, "none": self.none}

    def carry(self, counts: RewardCounts) -> None:
        """A resumed run: the counts its checkpoint holds are added to this process's in
        ``totals`` and ``report`` (the stop rule looks at this process's rewards only)."""
        self._carried = (counts.errors, counts.timeouts, counts.no_reward)

    def totals(self) -> dict[str, int]:
        """The run's counts: this process's plus those a resumed run carried (``carry``)."""
        errors, timeouts, none = self._carried
        return {"errors": errors + self.errors, "timeouts": timeouts + self.timeouts, "none": none + self.none}

    def report(self) -> RewardCounts:
        """The run's counts (``totals``), as the tracker books them into the budget.

        >>> health = RewardHealth("r"); health.carry(RewardCounts(errors=2)); health.failed("none")
        >>> health.report()
        RewardCounts(errors=2, timeouts=0, no_reward=1)
        """
        t = self.totals()
        return RewardCounts(t["errors"], t["timeouts"], t["none"])

    def since(self, before: dict[str, int]) -> dict[str, int]:
        """The counts added since ``before`` (a ``counts()``), e.g. one evaluation's."""
        now = self.counts()
        return {k: now[k] - before.get(k, 0) for k in now}


def scorer_name(scorer: Any) -> str:
    """How messages name a scorer: a user's ``module:function``, else the class name.

    >>> class ExactMatchReward: ...
    >>> scorer_name(ExactMatchReward())
    'ExactMatchReward'
    """
    name = getattr(scorer, "name", None)
    return name if isinstance(name, str) and name else type(scorer).__name__
