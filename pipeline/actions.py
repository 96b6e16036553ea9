"""What the group tracker asks for: the actions ``GroupTracker.handle`` returns, in the order
they must be carried out.

The async shell (``pipeline.orchestrator``) and the gate harness (``tests/gate_harness.py``) do
exactly these and nothing of their own: start a sample on the engine (a branch is a start whose
request carries a ``BranchSpec``), cancel one, score a finished one, post a message to the
tracking loop, evaluate the policy, train on a batch, record a step's metrics, write a
checkpoint, stop. They are named tuples: the hot ones (a start and a score per rollout) cost
next to nothing to make.

>>> Stop("steps")
Stop(reason='steps')
>>> Train(batch=None, evaluate=True, keep_state=False).evaluate
True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from pipeline.types import SampleFinished, SampleRequest, TrainBatch


class Start(NamedTuple):
    """Start this sample now on the engine (its group is ``request.group_id``). A value: the
    shell gets the request, never the tracker's live state of its group."""

    request: SampleRequest


class Cancel(NamedTuple):
    """Abort this running sample (its group was abandoned); its stream's end comes back as a
    ``StreamCut`` (or, on a multiplexer, as its remaining events)."""

    request_id: str


class Score(NamedTuple):
    """Score this finished sample and send the tracking loop its ``SampleDone``, in this order
    among the messages posted."""

    request: SampleRequest
    finished: SampleFinished


class EnvStep(NamedTuple):
    """Step the environment of this turn's episode with the turn (opened on its first turn;
    a turn that did not complete ends the episode without a step); answer with ``TurnDone``."""

    request: SampleRequest
    finished: SampleFinished


class ForkEpisode(NamedTuple):
    """Episode ``key`` branches from episode ``source`` after its first ``turns`` turns: its
    environment starts in that state (replayed, or restored from a snapshot)."""

    source: str
    turns: int
    key: str


class CloseEpisode(NamedTuple):
    """Episode ``key`` ended (or its group was abandoned): close its environment."""

    key: str


class Post(NamedTuple):
    """Send this message to the tracking loop, in order (a token hook's actions, a wake-up)."""

    message: Any


class Evaluate(NamedTuple):
    """Evaluate the current policy on the held-out prompts; answer with ``Evaluated``."""

    step: int


class Train(NamedTuple):
    """Train on ``batch``; then evaluate (``evaluate``) and keep a copy of the learner's state
    (``keep_state``, a checkpoint is due) before the next batch; answer with ``StepDone``."""

    batch: TrainBatch
    evaluate: bool
    keep_state: bool


class Record(NamedTuple):
    """The metrics line of learner step ``step`` (JSONL, TensorBoard, progress)."""

    step: int
    metrics: Mapping[str, float]


class Checkpoint(NamedTuple):
    """Write this checkpoint. ``learner_state`` None: take the learner's state now (it is idle)."""

    state: dict[str, Any]
    learner_state: dict[str, Any] | None


class Stop(NamedTuple):
    """The run is over."""

    reason: str


Action = (
    Start | Cancel | Score | EnvStep | ForkEpisode | CloseEpisode | Post | Evaluate | Train | Record | Checkpoint | Stop
)


def cannot_carry_out(shell: str, action: object) -> TypeError:
    """The one rule of every shell for an action it does not carry out: it raises this, naming
    the action's type, so a new kind of action fails where it is first returned, never silently.
    What a shell deliberately leaves undone it lists by name.

    >>> cannot_carry_out("the round driver", Evaluate(3))
    TypeError('the round driver cannot carry out the action Evaluate (Evaluate(step=3)); carry it out there, or set the ShellSettings under which the tracker does not ask for it')
    """
    return TypeError(
        f"{shell} cannot carry out the action {type(action).__name__} ({action!r}); carry it out there, "
        "or set the ShellSettings under which the tracker does not ask for it"
    )


LEARNER_SLOTS = 2
"""Batches in the learner's hands at once (``Train`` actions not yet answered) while it trains
beside generation: the one training and one waiting for it."""


@dataclass(frozen=True)
class LearnerTiming:
    """When the learner trains the batches the tracker hands out: a part the shell is built with
    (its clock declares it, ``pipeline.clock``), read by the tracker as a value.

    >>> INLINE.slots, CONCURRENT.slots, INLINE.trains_inline
    (1, 2, True)
    """

    slots: int
    """Batches in the learner's hands at once (``Train`` actions not yet answered)."""
    trains_inline: bool
    """The shell trains a batch the moment it is handed out and answers with its ``StepDone``
    before anything else happens (a virtual clock: learning takes no engine time), so a
    ``Train`` ends the tracker's tick and its ``StepDone`` finishes it. Otherwise a learner task
    trains while generation goes on."""


INLINE = LearnerTiming(slots=1, trains_inline=True)
CONCURRENT = LearnerTiming(slots=LEARNER_SLOTS, trains_inline=False)


@dataclass(frozen=True)
class ShellSettings:
    """How the shell around the tracker carries these actions out."""

    learner: LearnerTiming = CONCURRENT
    """When the learner trains a handed-out batch (``INLINE`` or ``CONCURRENT``)."""
    evaluates: bool = False
    """The run has a held-out evaluator: evaluate the start and every ``eval_every`` steps."""
    checkpoint_every: int = 0
    """Steps between checkpoints (and one at the last step and on an interrupt); 0: none."""
