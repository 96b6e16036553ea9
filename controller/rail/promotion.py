"""Shadow-to-live promotion (and demotion) of the learned controller, on off-policy evidence.

Every decision whose outcome is known adds one ``WindowEntry`` to a window of the most recent
``window`` decisions of the current mode: the reward, the acting policy's probability of the
arm taken (``logged_prob``), the other policy's probability of it (``other_prob``), and the
learned reward model's predictions (``q_logged`` for the arm taken, ``q_other`` = the other
policy's expected prediction ``sum_a other(a) q(a)``). Every ``evaluate_every`` entries:

* **shadow** (the behaviour policy acts): the learned policy's value is the doubly-robust
  estimate ``controller.ope.doubly_robust`` with the behaviour's propensities; the behaviour's
  value is its on-policy mean reward. Promote when ``DR lower bound > behaviour value`` over at
  least ``min_decisions`` entries.
* **live** (the learned policy acts): the live value is its on-policy mean reward; the
  behaviour's is the DR estimate with the live propensities. Demote when ``live upper bound <
  behaviour DR value``, i.e. when the live estimate has clearly fallen back.

The two rules mirror each other (the new mode must win with its confidence bound against the
old one's point value), so the promoter does not flip-flop on noise. A switch clears the window.

>>> p = Promoter(evaluate_every=4, min_decisions=4, window=10)
>>> for i in range(4):  # the behaviour takes arm 0 (reward 0) or arm 1 (reward 1) at random;
...     best = float(i % 2)  # the learned policy always takes arm 1 and its model knows it
...     _ = p.record(WindowEntry(reward=best, logged_prob=0.5, other_prob=best, q_logged=best, q_other=1.0))
>>> p.mode, p.promotions, p.last.other.value, p.last.acting.value
('live', 1, 1.0, 0.5)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from controller.ope import Estimate, doubly_robust, ips

FIELDS = ("reward", "logged_prob", "other_prob", "q_logged", "q_other")
"""A window entry's numbers, in the order the promoter keeps them."""


@dataclass(frozen=True)
class WindowEntry:
    """One decision with its outcome, as the promotion estimates need it."""

    reward: float
    logged_prob: float  # the acting policy's probability of the arm taken
    other_prob: float  # the other policy's probability of that arm
    q_logged: float  # the learned reward model's prediction for the arm taken
    q_other: float  # sum over arms of other(a) * q(a)


@dataclass(frozen=True)
class Evidence:
    """The estimates of one promotion check, and what it concluded."""

    mode: str  # mode during the window
    n: int
    acting: Estimate  # on-policy value of the acting policy
    other: Estimate  # DR value of the other policy
    switch: bool

    def features(self) -> dict[str, float]:
        """Flat numbers for a ``DecisionRecord``'s features."""
        return {
            "n": float(self.n),
            "acting_value": self.acting.value,
            "acting_lower": self.acting.lower,
            "acting_upper": self.acting.upper,
            "other_value": self.other.value,
            "other_lower": self.other.lower,
            "other_upper": self.other.upper,
            "was_live": float(self.mode == "live"),
        }


class Promoter:
    """Keeps the window and applies the rules of the module docstring."""

    def __init__(
        self,
        evaluate_every: int = 200,
        min_decisions: int = 500,
        window: int = 5000,
        confidence: float = 0.95,
        weight_clip: float = 0.0,
        mode: str = "shadow",
        auto: bool = True,
    ):
        if mode not in ("live", "shadow"):
            raise ValueError(f"mode={mode!r} must be 'live' or 'shadow'")
        self.evaluate_every = evaluate_every
        self.min_decisions = min_decisions
        self.window = window
        self.confidence = confidence
        self.weight_clip = weight_clip
        self.auto = auto
        self.mode = mode
        self.promotions = 0
        self.demotions = 0
        self.last: Evidence | None = None
        # The window as rows of (reward, logged_prob, other_prob, q_logged, q_other) in a ring:
        # a check reads columns of it instead of walking ``window`` entries five times.
        self._ring = np.empty((max(window, 1), len(FIELDS)))
        self._next = 0  # the row the next entry goes to
        self._size = 0
        self._since_check = 0

    def __len__(self) -> int:
        return self._size

    def _window(self) -> np.ndarray:
        """The window's rows, oldest first."""
        if self._size < len(self._ring):
            return self._ring[: self._size]
        return np.concatenate([self._ring[self._next :], self._ring[: self._next]])

    def _append(self, row: tuple[float, ...]) -> None:
        self._ring[self._next] = row
        self._next = (self._next + 1) % len(self._ring)
        self._size = min(self._size + 1, len(self._ring))

    def _clear(self) -> None:
        self._next = self._size = 0

    def record(self, entry: WindowEntry) -> Evidence | None:
        """Add an entry; returns the evidence when a check switched the mode, else None."""
        if not (0.0 < entry.logged_prob <= 1.0) or not math.isfinite(entry.reward):
            return None  # unusable for importance weighting (counted by the caller's logs)
        self._append((entry.reward, entry.logged_prob, entry.other_prob, entry.q_logged, entry.q_other))
        self._since_check += 1
        if self._since_check < self.evaluate_every:
            return None
        self._since_check = 0
        evidence = self.evaluate()
        if evidence is None:
            return None
        self.last = evidence
        if evidence.switch and self.auto:
            self.switch("live" if self.mode == "shadow" else "shadow")
            return evidence
        return None

    def evaluate(self) -> Evidence | None:
        """The estimates over the current window (None before ``min_decisions`` entries)."""
        n = self._size
        if n < max(self.min_decisions, 2):
            return None
        r, mu, pi, q_logged, q_other = np.ascontiguousarray(self._window().T)
        # A reward model that is not finite (a heuristic has none) falls back to IPS's zero model.
        if not (np.all(np.isfinite(q_logged)) and np.all(np.isfinite(q_other))):
            q_logged, q_other = np.zeros(n), np.zeros(n)
        clip = self.weight_clip or None
        acting = ips(r, mu, mu, confidence=self.confidence)  # on-policy: the plain mean
        other = doubly_robust(r, mu, pi, q_logged, q_other, confidence=self.confidence, clip=clip)
        if self.mode == "shadow":
            switch = other.lower > acting.value
        else:
            switch = acting.upper < other.value
        return Evidence(self.mode, n, acting, other, bool(switch))

    def switch(self, mode: str) -> None:
        if mode == self.mode:
            return
        if mode == "live":
            self.promotions += 1
        else:
            self.demotions += 1
        self.mode = mode
        self._clear()
        self._since_check = 0

    def state_dict(self) -> dict:
        return {
            "mode": self.mode,
            "promotions": self.promotions,
            "demotions": self.demotions,
            "since_check": self._since_check,
            "entries": self._window().tolist(),
        }

    def load_state_dict(self, state: dict) -> None:
        mode = state["mode"]
        if mode not in ("live", "shadow"):
            raise ValueError(f"promoter mode={mode!r} must be 'live' or 'shadow'")
        self.mode = mode
        self.promotions = int(state["promotions"])
        self.demotions = int(state["demotions"])
        self._since_check = int(state["since_check"])
        rows = [tuple(map(float, x)) for x in state["entries"]]
        if any(len(row) != len(FIELDS) for row in rows):
            raise ValueError(f"a promoter window entry must hold {len(FIELDS)} numbers ({', '.join(FIELDS)})")
        self._clear()
        for row in rows[-len(self._ring) :]:
            self._append(row)
