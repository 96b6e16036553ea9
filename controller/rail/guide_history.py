"""What RAIL's guidance arms see besides the group: the prompt's guidance history and the run's progress.

At a rescue where guidance arms are offered (``controller.rail.guide_levels``), three features
join the group's context (``controller.rail.features``):

======================  =========================================================================
``guide_count``         earlier groups of this prompt that were guided, ``min(n, 8) / 8``
``guide_mixed_rate``    of those, the share that came out mixed, ``(mixed + 1) / (n + 2)``
                        (1/2 before any)
``run_success_rate``    the run's recent pass rate: a moving average (weight ``RATE_WEIGHT``)
                        of the success share of every group the controller saw close, bias-corrected
                        (1/2 before any); how far the run has come
======================  =========================================================================

A prompt guided often whose guided groups still fail is one guidance does not rescue at that
level; a run whose pass rate has risen needs less guidance (QuestA lowers it on a schedule; here
the bandit can learn it from the rate). Only guidance points get these features, so the contexts
of runs without guidance arms are as before.

>>> h = GuideHistory()
>>> h.features(7)
{'guide_count': 0.0, 'guide_mixed_rate': 0.5, 'run_success_rate': 0.5}
>>> h.closed(7, guided=True, mixed=True, success_share=0.25)
>>> h.closed(7, guided=True, mixed=False, success_share=0.0)
>>> f = h.features(7)
>>> f["guide_count"], f["guide_mixed_rate"], round(f["run_success_rate"], 4)   # (1 + 1) / (2 + 2)
(0.25, 0.5, 0.1237)
"""

from __future__ import annotations

from typing import Any

RATE_WEIGHT = 0.02
"""Weight of each closed group in ``run_success_rate`` (about the last 50 groups)."""
COUNT_CAP = 8
"""Guided groups past which ``guide_count`` stays at 1."""


class GuideHistory:
    """Per prompt, how often it was guided and how often that made its group mixed; the run's recent pass rate."""

    def __init__(self) -> None:
        self.guided: dict[int, tuple[int, int]] = {}  # prompt id -> (guided groups, of them mixed)
        self.rate = 0.0  # the moving average, before bias correction
        self.weight = 0.0  # the total weight it holds (1 - (1 - RATE_WEIGHT)^groups)

    def closed(self, prompt_id: int, guided: bool, mixed: bool, success_share: float) -> None:
        """A group of ``prompt_id`` closed; ``guided``: a guidance arm acted on it."""
        if guided:
            n, m = self.guided.get(prompt_id, (0, 0))
            self.guided[prompt_id] = (n + 1, m + int(mixed))
        self.rate = (1 - RATE_WEIGHT) * self.rate + RATE_WEIGHT * float(success_share)
        self.weight = (1 - RATE_WEIGHT) * self.weight + RATE_WEIGHT

    def features(self, prompt_id: int) -> dict[str, float]:
        """The three features of the module table for a decision on ``prompt_id``."""
        n, m = self.guided.get(prompt_id, (0, 0))
        return {
            "guide_count": min(n, COUNT_CAP) / COUNT_CAP,
            "guide_mixed_rate": (m + 1) / (n + 2),
            "run_success_rate": self.rate / self.weight if self.weight > 0 else 0.5,
        }

    def state_dict(self) -> dict[str, Any]:
        return {"guided": [[k, n, m] for k, (n, m) in self.guided.items()], "rate": self.rate, "weight": self.weight}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.guided = {int(k): (int(n), int(m)) for k, n, m in state.get("guided", [])}
        self.rate, self.weight = float(state.get("rate", 0.0)), float(state.get("weight", 0.0))
