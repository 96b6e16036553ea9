"""Guidance: the rest of a hard group continues from a prefix of the prompt's reference response.

When a group's probe comes out all-wrong, the gate may launch the rest of the group from a
*guidance prefix* instead of abandoning it: the first ``ceil(level x n)`` tokens of the prompt's
reference response of ``n`` tokens (its end-of-sequence token not counted), ``level`` one of
``GUIDE_LEVELS``. The request is a branch (``BranchSpec`` with ``guide_level``) whose prefix the
task wrote, not the policy: the engines continue it as they continue any branch, the rollout
carries the prefix's length (``Rollout.guide_len``) and the learner leaves those tokens out of
the loss, training the continuation on-policy given the guided context (docs/methods.md,
"Guidance"). A prompt without a reference is never guided, and counted.

``Guidance`` holds the run's references and its level, makes the guided branches and counts what
it did, as ``gate/guide_*`` metrics. The level is fixed, or lowered one step at a learner step
(``anneal_step``, QuestA's schedule of a long hint first and a shorter one later).

>>> guide = Guidance({7: (4, 5, 6, 9)}, level=0.5)
>>> b = guide.branch(7)
>>> b.source_request_id, b.prefix_token_ids, b.prefix_len, b.guide_level
('reference-7', (4, 5), 2, 0.5)
>>> guide.branch(8) is None, guide.metrics()["gate/guide_no_reference"]   # no reference: never guided
(True, 1.0)
>>> guide_len(4, 0.75), guide_len(5, 0.25), guide_len(3, 0.5)
(3, 2, 2)
>>> annealed = Guidance({7: (4, 5, 6, 9)}, level=0.5, anneal_step=100)
>>> annealed.branch(7, step=99).prefix_token_ids, annealed.branch(7, step=100).prefix_token_ids
((4, 5), (4,))
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.types import BranchSpec

GUIDE_LEVELS = (0.25, 0.5, 0.75)
"""The shares of a reference a guidance prefix may hold."""


def guide_len(n: int, level: float) -> int:
    """Tokens of a guidance prefix at ``level`` of a reference of ``n`` tokens: ``ceil(level x n)``
    (computed so that float rounding cannot add a token: 0.75 x 4 is 3, not 4)."""
    if level not in GUIDE_LEVELS:
        raise ValueError(f"guidance level={level} must be one of {GUIDE_LEVELS}")
    return math.ceil(round(level * n, 9))


def reference_source(prompt_id: int) -> str:
    """The ``source_request_id`` of a guided branch: the prompt's reference, not a sample."""
    return f"reference-{prompt_id}"


class Guidance:
    """The references a gate guides from, at one fixed level, and its counters.

    Parameters
    ----------
    references
        prompt id -> the reference response's token ids *without* the end-of-sequence token (a
        prefix must leave the end to the policy); prompts missing here, or with an empty
        reference, are never guided.
    level
        The share of each reference the prefix holds, one of ``GUIDE_LEVELS``.
    anneal_step
        From this learner step on the level is the next lower one of ``GUIDE_LEVELS`` (the lowest
        stays); 0: the level is fixed.

    Examples
    --------
    >>> guide = Guidance({1: (3, 4, 5, 6)}, level=0.25)
    >>> guide.branch(1).prefix_token_ids
    (3,)
    >>> guide.launched(4); guide.metrics()["gate/guide_rollouts"]
    4.0
    """

    def __init__(self, references: Mapping[int, Sequence[int]], level: float, anneal_step: int = 0):
        if level not in GUIDE_LEVELS:
            raise ValueError(
                f"guidance level={level} must be one of {GUIDE_LEVELS} (the share of the reference the prefix holds)"
            )
        if anneal_step < 0:
            raise ValueError(f"guidance anneal_step={anneal_step} must be >= 0 (0: a fixed level)")
        self.level = float(level)
        self.anneal_step = int(anneal_step)
        self.current = self.level  # the level of the latest guided branch
        self.references = {int(k): tuple(v) for k, v in references.items() if len(v) > 0}
        self.groups = 0  # groups whose rest was launched guided
        self.rollouts = 0  # guided rollouts launched
        self.no_reference = 0  # all-wrong probes of prompts without a reference: not guided

    def level_at(self, step: int) -> float:
        """The level of a branch made at learner step ``step``."""
        if self.anneal_step and step >= self.anneal_step:
            return GUIDE_LEVELS[max(GUIDE_LEVELS.index(self.level) - 1, 0)]
        return self.level

    def has_reference(self, prompt_id: int) -> bool:
        """Whether ``prompt_id`` can be guided (RAIL offers its guidance arms only then)."""
        return prompt_id in self.references

    def branch(self, prompt_id: int, step: int = 0, level: float | None = None) -> BranchSpec | None:
        """The guided branch of ``prompt_id`` at learner step ``step``'s level, or at ``level``
        (a RAIL guidance arm's); None (counted) without a reference."""
        reference = self.references.get(prompt_id)
        if reference is None:
            self.no_reference += 1
            return None
        self.current = level = self.level_at(step) if level is None else level
        k = guide_len(len(reference), level)
        return BranchSpec(reference_source(prompt_id), k, reference[:k], guide_level=level)

    def launched(self, n: int) -> None:
        """A group's rest of ``n`` rollouts was launched guided."""
        self.groups += 1
        self.rollouts += n

    def metrics(self) -> dict[str, float]:
        return {
            "gate/guide_groups": float(self.groups),
            "gate/guide_rollouts": float(self.rollouts),
            "gate/guide_no_reference": float(self.no_reference),
            "gate/guide_level": self.current,
        }

    def state_dict(self) -> dict[str, Any]:
        return {"groups": self.groups, "rollouts": self.rollouts, "no_reference": self.no_reference}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.groups = int(state.get("groups", 0))
        self.rollouts = int(state.get("rollouts", 0))
        self.no_reference = int(state.get("no_reference", 0))
