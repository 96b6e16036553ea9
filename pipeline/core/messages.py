"""What the group tracker is told: one named message per kind of event, in to ``GroupTracker.handle``.

Two places send them. Where an engine stream is read (a task per sample, or the one stream
task of a multiplexing engine) the engine's own events go in as they are -- a ``TokenDelta``
("tokens arrived") and a ``SampleFinished`` ("the rollout finished") -- or several at once as
``EngineEvents``; ``StreamFailed`` and ``StreamCut`` say how a stream ended other than by its
final event. Everything else reaches the tracking loop through its inbox, in order:
``SampleDone`` ("the reward was scored"), ``StepDone`` ("the learner finished a step"),
``Evaluated``, ``ControllerActions`` and ``DecideQueued`` (posted by the tracker itself, from
the stream side), ``Started``, ``StopRequested`` and a round driver's ``CutStep``. After each of them the loop sends a
``Tick``: the tracker's turn to ship, train, launch, admit and see whether the run is over.

A rollout is one sample, or, with an environment, one episode of turns: each turn's
``SampleFinished`` is answered by the environment in a ``TurnDone``, and the tracker makes the
episode's sample itself when it ends (``pipeline.core.episodes``).

>>> StepDone(batch=None, result=None, policy_version=1).learner_state is None
True
>>> RewardCounts(errors=1, timeouts=0, no_reward=2).failed
3
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.types import GroupAction, SampleFinished, SampleRequest, ScoredSample, StepResult, TokenDelta, TrainBatch


@dataclass(frozen=True)
class Started:
    """The run begins (or resumes): evaluate the starting policy if the run has none yet, then admit."""


@dataclass(frozen=True)
class Tick:
    """The tracking loop handled a message (and carried out its actions): ship committed groups,
    hand batches to the learner, launch, admit, check the end. ``backlog``: messages waiting in
    the inbox (queued decision points wait for them, within a bound)."""

    backlog: int = 0


@dataclass(frozen=True)
class EngineEvents:
    """Events a multiplexing engine returned at once, ``(request id, event)`` in order; an event
    may be the exception the engine failed that request with. The decision points they queue
    wake the tracking loop once, after the last of them."""

    events: Sequence[tuple[str, TokenDelta | SampleFinished | BaseException]]


@dataclass(frozen=True)
class StreamFailed:
    """The engine raised on a sample's stream. ``tokens_after`` were drained while aborting it."""

    request_id: str
    error: str
    tokens_after: int = 0
    final_after: SampleFinished | None = None


@dataclass(frozen=True)
class StreamCut:
    """A cancelled sample's stream is over: it produced ``tokens`` more tokens while being
    aborted, and ended with ``final`` (None: the engine never confirmed the abort)."""

    request_id: str
    tokens: int = 0
    final: SampleFinished | None = None


@dataclass(frozen=True)
class StreamsClosed:
    """The run is over: the engine closed these samples, still running (their final events)."""

    finals: Sequence[SampleFinished]


@dataclass(frozen=True)
class TurnDone:
    """The environment answered an episode's turn (``pipeline.core.episodes``): its observation
    rendered as the tokens that join the context, the turn's reward, whether the episode is
    done, and ``error`` when the environment failed (the episode then ends as a failed sample)."""

    request: SampleRequest
    finished: SampleFinished
    observation: tuple[int, ...] = ()
    reward: float = 0.0
    done: bool = True
    error: str = ""


@dataclass(frozen=True)
class SampleDone:
    """A sample ended and was scored."""

    scored: ScoredSample


@dataclass(frozen=True)
class RewardCounts:
    """The scoring service's counters, cumulative over the run."""

    errors: int = 0
    timeouts: int = 0
    no_reward: int = 0

    @property
    def failed(self) -> int:
        return self.errors + self.timeouts + self.no_reward


@dataclass(frozen=True)
class RewardsCounted:
    """The scoring service's counts as they stand (``RewardHealth.report``), handed to the
    tracker at the run's end so that its budget holds them even when no learner step ran: the
    tracker writes them, as it does a ``StepDone``'s."""

    rewards: RewardCounts


@dataclass(frozen=True)
class StepDone:
    """The learner finished a step on ``batch``: what it consumed and what came of it. The
    tracker alone accounts for it (budget, evaluations, the stop at a target accuracy)."""

    batch: TrainBatch
    result: StepResult
    policy_version: int
    """The engine's version with the step's weights in."""
    rewards: RewardCounts = field(default_factory=RewardCounts)
    timing: Mapping[str, float] = field(default_factory=dict)
    """Wall-clock figures of the step and the run so far (``pipeline/step_wall_s``,
    ``pipeline/wall_s``, ``eval/wall_s_total``): metrics only, never decisions."""
    evaluation: Mapping[str, float] | None = None
    """The held-out evaluation after the step, when ``Train.evaluate`` asked for one."""
    learner_state: dict[str, Any] | None = None
    """Taken right after the step, when ``Train.keep_state`` asked for it (a checkpoint is due)."""


@dataclass(frozen=True)
class Evaluated:
    """The held-out evaluation an ``Evaluate`` action asked for."""

    step: int
    evaluation: Mapping[str, float]
    timing: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ControllerActions:
    """Actions the controller chose at a token-level decision point."""

    actions: tuple[GroupAction, ...]


@dataclass(frozen=True)
class DecideQueued:
    """The controller queued decision points: a wake-up for the tracking loop, which decides
    everything queued as one batch once the messages already waiting are handled."""


@dataclass(frozen=True)
class StopRequested:
    """Stop at the next point where the learner is idle, with a checkpoint (Ctrl-C)."""


@dataclass(frozen=True)
class CutStep:
    """End the step being filled now (a round driver's step cap was reached and nothing of the
    step runs): the committed groups so far are its batch, handed out as a ``Train`` even when
    they do not fill one."""


Message = (
    TokenDelta
    | SampleFinished
    | EngineEvents
    | StreamFailed
    | StreamCut
    | StreamsClosed
    | SampleDone
    | StepDone
    | Evaluated
    | ControllerActions
    | DecideQueued
    | Started
    | StopRequested
    | CutStep
    | RewardsCounted
    | Tick
    | TurnDone
)
