"""SARA's two-threshold sequential test on one group, in the shape of river's drift detectors:
``update(reward)``, a read-only ``verdict``, ``reset()``.

``SaraGate`` applies the same rule (``sara_verdict``) to the orchestrator's group snapshots;
this class is the standalone form for anyone testing the rule on a stream of rewards.

>>> test = SequentialTest(group_size=8, probe_size=4)
>>> for r in (0.0, 0.0, 0.0):
...     _ = test.update(r)
>>> test.verdict
<Verdict.CONTINUE: 'continue'>
>>> test.update(0.0).verdict, round(test.p_effective, 3)   # all-same probe of 4: 4/9 <= 0.45
(<Verdict.ABANDON: 'abandon'>, 0.444)
>>> test.reset().update(1.0).update(0.0).verdict           # mixed is mixed, whatever comes next
<Verdict.CONTINUE: 'continue'>
"""

from __future__ import annotations

import enum

from controller.posterior import effective_probability


class Verdict(enum.Enum):
    CONTINUE = "continue"
    COMMIT = "commit"
    ABANDON = "abandon"


def sara_verdict(
    successes: int,
    failures: int,
    group_size: int,
    probe_size: int,
    tau_commit: float,
    tau_abandon: float,
    prior: tuple[float, float] = (1.0, 1.0),
) -> tuple[Verdict, float]:
    """The verdict on a partial group and its ``P_eff``; no verdict before the probe is in."""
    seen = successes + failures
    p_eff = effective_probability(successes, failures, max(group_size, seen), prior)
    if seen < probe_size:
        return Verdict.CONTINUE, p_eff
    if p_eff >= tau_commit:
        return Verdict.COMMIT, p_eff
    if p_eff <= tau_abandon:
        return Verdict.ABANDON, p_eff
    return Verdict.CONTINUE, p_eff


class SequentialTest:
    """Commit / abandon / continue one group from its rewards, one at a time."""

    def __init__(
        self,
        group_size: int,
        probe_size: int = 4,
        tau_commit: float = 0.5,
        tau_abandon: float = 0.45,
        prior: tuple[float, float] = (1.0, 1.0),
    ):
        if not 1 <= probe_size <= group_size:
            raise ValueError(f"probe_size={probe_size} must be between 1 and group_size={group_size}")
        if not 0.0 <= tau_abandon < tau_commit <= 1.0:
            raise ValueError(f"need 0 <= tau_abandon < tau_commit <= 1, got {tau_abandon}, {tau_commit}")
        self.group_size = group_size
        self.probe_size = probe_size
        self.tau_commit = tau_commit
        self.tau_abandon = tau_abandon
        self.prior = prior
        self.reset()

    def reset(self) -> "SequentialTest":
        self._successes = 0
        self._failures = 0
        self._verdict = Verdict.CONTINUE
        self._p_eff = effective_probability(0, 0, self.group_size, self.prior)
        return self

    def update(self, reward: float) -> "SequentialTest":
        """Add one finished rollout's reward (> 0.5 counts as a success)."""
        if reward > 0.5:
            self._successes += 1
        else:
            self._failures += 1
        self._verdict, self._p_eff = sara_verdict(
            self._successes, self._failures, self.group_size, self.probe_size,
            self.tau_commit, self.tau_abandon, self.prior,
        )
        return self

    @property
    def verdict(self) -> Verdict:
        return self._verdict

    @property
    def p_effective(self) -> float:
        return self._p_eff
