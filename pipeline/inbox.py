"""What the orchestrator's tracking loop receives, one named message per kind of event.

Sample tasks send ``SampleDone`` (and ``ControllerActions`` from the controller's token hook, or
``DecideQueued`` to wake the loop when it queued token-level decision points to decide as one batch);
the learner task sends ``StepDone``. The loop hands each to ``pipeline.tracker.GroupTracker``.

>>> StepDone(batch=None, result=None).learner_state is None
True
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.types import GroupAction, ScoredSample, StepResult, TrainBatch


@dataclass(frozen=True)
class SampleDone:
    """A sample ended and was scored."""

    scored: ScoredSample


@dataclass(frozen=True)
class StepDone:
    """The learner finished a step on ``batch``."""

    batch: TrainBatch
    result: StepResult
    learner_state: dict | None = None  # taken between steps, when a checkpoint is due


@dataclass(frozen=True)
class ControllerActions:
    """Actions the controller chose at a token-level decision point."""

    actions: tuple[GroupAction, ...]


@dataclass(frozen=True)
class DecideQueued:
    """The controller queued token-level decision points: a wake-up for the tracking loop, which
    decides everything queued as one batch once the events already waiting are handled
    (``GroupTracker.decide_due``)."""
