"""What a replay did with each replayed prompt: the record both replay paths produce.

``bench replay``'s direct driver and a pipeline run over the replay engine each end with one
``PromptOutcome`` per replayed prompt (``pipeline.replay.order``); two paths that made the same
decisions return equal lists, which is how the tests hold them to each other.

>>> o = PromptOutcome(prompt_id=3, opened=True, verdict="committed", samples=4, tokens=96, decided_at=4)
>>> o.generated, o.verdict
(4, 'committed')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Verdict = Literal["skipped", "committed", "abandoned", "dropped", "open"]
"""``skipped``: never sampled (a screen or a selector passed it over); ``committed``: trained on;
``abandoned``: closed by the gate before it was full; ``dropped``: committed with fewer than two
valid samples; ``open``: still open when the replay ended."""


@dataclass(frozen=True)
class PromptOutcome:
    """One replayed prompt: whether a group was opened, how it ended, what it cost."""

    prompt_id: int
    opened: bool
    verdict: Verdict
    samples: int
    """Samples launched for it (finished or aborted): the rollouts it cost."""
    tokens: int
    """Tokens generated for it, aborted samples' included."""
    decided_at: int
    """Samples ended when the gate first committed or abandoned it (0: never decided by the gate)."""

    @property
    def generated(self) -> int:
        return self.samples
