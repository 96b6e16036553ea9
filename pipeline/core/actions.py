"""What the group tracker asks for: the actions ``GroupTracker.handle`` returns, in the order
they must be carried out.

The async shell (``pipeline.shells.orchestrator``) and the gate harness (``tests/gate_harness.py``) do
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

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, get_args

from pipeline.core.messages import SampleDone
from pipeline.types import SampleFinished, SampleRequest, ScoredSample, TrainBatch


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

    def answer(self, reward: float, error: str | None = "") -> SampleDone:
        """The ``SampleDone`` that reports this sample scored ``reward`` (``error``: why the
        reward function gave none): how every shell answers a ``Score``.

        >>> from pipeline.types import FinishReason, Prompt, SamplingParams
        >>> request = SampleRequest("g0-s1", 0, 1, Prompt(0, "", (1,)), SamplingParams())
        >>> Score(request, SampleFinished("g0-s1", (5,), (), FinishReason.STOP, 0)).answer(1.0).scored.reward
        1.0
        """
        return SampleDone(ScoredSample(self.request, self.finished, reward, error))


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


ACTION_TYPES: tuple[type, ...] = get_args(Action)
"""Every action type the tracker can emit: each shell's handler table names them all
(``pipeline.shells.handlers``)."""


def cannot_carry_out(shell: str, action: object, why: str = "") -> TypeError:
    """The one rule of every shell for an action it does not carry out: it raises this, naming
    the action's type (and why, for a refusal its handler table names), so a new kind of action
    fails where it is first returned, never silently.

    >>> cannot_carry_out("the round driver", Evaluate(3))
    TypeError('the round driver cannot carry out the action Evaluate (Evaluate(step=3)); carry it out there, or set the ShellSettings under which the tracker does not ask for it')
    """
    because = f": {why}" if why else ""
    return TypeError(
        f"{shell} cannot carry out the action {type(action).__name__} ({action!r}){because}; carry it out there, "
        "or set the ShellSettings under which the tracker does not ask for it"
    )


LEARNER_SLOTS = 2
"""Batches in the learner's hands at once (``Train`` actions not yet answered) while it trains
beside generation: the one training and one waiting for it."""


class LearnerTiming(Protocol):
    """When the learner trains the batches the tracker hands out: one of two parts, ``INLINE``
    or ``CONCURRENT``, chosen when the run is built (by its clock:
    ``pipeline.shells.learner_timing.LEARNING_BY_CLOCK``, which holds the shell's side of each). The tracker asks the part what
    to do; it branches on no flag.

    >>> INLINE.slots, CONCURRENT.slots
    (1, 2)
    """

    slots: int
    """Batches in the learner's hands at once (``Train`` actions not yet answered)."""

    def after_train(self, rest_of_tick: Callable[[], None]) -> None:
        """The tick just handed out a ``Train``: run the rest of the tick (launch, admit, see
        whether the run is over) now, or leave it to ``after_step``."""

    def after_step(self, from_batches: Callable[[], None]) -> None:
        """The learner's ``StepDone`` was booked: go on with the tick a ``Train`` ended, or not."""


@dataclass(frozen=True)
class InlineTiming:
    """The shell trains a batch the moment it is handed out and answers with its ``StepDone``
    before anything else happens (a virtual clock: learning takes no engine time; a lockstep
    run), so a ``Train`` ends the tracker's tick and its ``StepDone`` finishes it."""

    slots: int = 1
    """One batch at a time: the one training."""

    def after_train(self, rest_of_tick: Callable[[], None]) -> None:
        return None  # nothing else happens until its StepDone

    def after_step(self, from_batches: Callable[[], None]) -> None:
        from_batches()  # the rest of the tick the batch interrupted


@dataclass(frozen=True)
class ConcurrentTiming:
    """A learner task trains while generation goes on: a ``Train`` leaves the tick running, and
    a ``StepDone`` is followed by the shell's ``Tick`` like any message."""

    slots: int = LEARNER_SLOTS
    """The one training and one waiting for it."""

    def after_train(self, rest_of_tick: Callable[[], None]) -> None:
        rest_of_tick()

    def after_step(self, from_batches: Callable[[], None]) -> None:
        return None  # the Tick that follows the StepDone goes on


INLINE = InlineTiming()
CONCURRENT = ConcurrentTiming()


@dataclass(frozen=True)
class ShellSettings:
    """How the shell around the tracker carries these actions out."""

    learner: LearnerTiming = CONCURRENT
    """When the learner trains a handed-out batch (``INLINE`` or ``CONCURRENT``)."""
    evaluates: bool = False
    """The run has a held-out evaluator: evaluate the start and every ``eval_every`` steps."""
    checkpoint_every: int = 0
    """Steps between checkpoints (and one at the last step and on an interrupt); 0: none."""
