"""The interfaces the orchestrator drives; implementations live in controller/ and learner/.

The orchestrator (``pipeline.shells.orchestrator``) and its group tracker (``pipeline.core.tracker``) know
these Protocols only, so pipeline/ imports nothing of controller/ or learner/;
``railgate.build`` wires concrete classes in.

Group lifecycle, as the tracker runs it
---------------------------------------
1. ``gate.admit(group_ids, step)`` returns up to ``len(group_ids)`` ``GroupPlan``\\ s, the
   i-th carrying ``group_ids[i]``: a group's id is chosen at admission and names it in every
   snapshot and action after. Each plan opens a group and launches ``plan.initial`` samples at
   once (``initial`` may be 0: a group opened to be filled later by a LAUNCH action).
2. Every time one of the group's samples ends (completed, failed, or aborted by the engine),
   the tracker scores it and calls ``gate.update(snapshot, groups)``; the gate's proposed
   actions go through ``controller.on_group(snapshot, proposed)``, which returns the actions
   executed, in order (the no-op controller returns them unchanged; RAIL may replace an
   ABANDON by an intervention that tries to recover the group):

   * ``LAUNCH n``   start n more samples (``params``/``branch`` optional);
   * ``COMMIT``     seal the group: no more launches; once its in-flight samples end it is
     shipped to the learner as a ``CommittedGroup``;
   * ``ABANDON``    abort its in-flight samples and drop it (its cost stays counted);
   * ``HOLD``       nothing to do now; the group stays open with nothing running.

   Actions may name any open group (HORA decides a whole batch when its last probe ends);
   ``groups`` (``OpenGroups``) holds every open group's snapshot as it stands, which the gate
   reads such a group's counts from: a gate keeps no copy of a group's counts.
   A gate may not LAUNCH on a group it committed; a controller's intervention may (its
   samples join the group until it ships). An action's ``origin`` is the controller decision
   that made it; the samples it launches carry that origin, visible in ``snapshot.origins``.
   A group whose samples all ended with no pending COMMIT/ABANDON and nothing in flight is
   asked again at its next update; the gate must eventually commit or abandon every group it
   opened, or ``HOLD`` it (the orchestrator counts held groups).
3. ``gate.on_step(step, batch, groups)`` after each learner step, with the batch it trained on
   and the open groups' snapshots; it may return actions too (a buffered group committed at the
   start of a new step, topped up to its size, say).
4. Batches: shipped groups join the learner's next batch in the order they ship; every
   ``batch_groups`` of them make one ``TrainBatch``. A gate that wants a batch to hold
   exactly its chosen groups commits exactly ``batch_groups`` per step.

Every random choice of a gate or controller uses a generator seeded at construction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pipeline.types import (
    CommittedGroup,
    DecisionRecord,
    GroupAction,
    GroupPlan,
    GroupSnapshot,
    Prompt,
    SampleFinished,
    SampleRequest,
    StepResult,
    TokenDelta,
    TrainBatch,
    TurnPoint,
)

if TYPE_CHECKING:
    from pipeline.core.messages import TurnDone


OpenGroups = Mapping[int, GroupSnapshot]
"""The tracker's open groups by id, each read as its snapshot now (read-only; built on demand,
so a gate pays only for the groups it reads): what ``Gate.update`` and ``Gate.on_step`` read a
group's counts from when they decide on a group other than the one just reported."""


class GateProtocolError(RuntimeError):
    """A gate or controller broke the group lifecycle above."""

    @classmethod
    def not_open(cls, source: str, actor: object, group_id: int) -> GateProtocolError:
        return cls(
            f"{source} ({type(actor).__name__}) acted on group {group_id}, which is not open; a gate may only "
            "act on groups it opened and has not committed or abandoned"
        )

    @classmethod
    def launch_after_commit(cls, source: str, n: int, group_id: int) -> GateProtocolError:
        return cls(f"{source} launched {n} samples on sealed group {group_id}; emit LAUNCH before COMMIT")


class GateStalled(RuntimeError):
    """Nothing is running and the gate opens no group: the run cannot make progress."""


@runtime_checkable
class Gate(Protocol):
    """Allocation policy: which prompts get groups, and when a group commits or is abandoned.

    Four members have defaults here, which a gate inherits by subclassing ``Gate`` (every gate
    does: ``tests/test_gate_conformance.py``): ``metrics()`` (``gate/...`` values for the step
    log; none), ``uncounted_rollouts`` (rollouts a benchmark-only gate books outside
    ``orchestrator.max_rollouts``: the oracle's dropped groups; 0) and the capabilities
    ``abandons`` (True) and ``reference_strength`` (None). A gate declares a capability as a
    class attribute (``abandons = False`` in ``UniformGate``, ``DpsGate``) or a property of its
    settings (SARA's ``reference_strength``), a wrapper of a gate forwards it as a property, and
    every reader reads the attribute, ``gate.abandons``, never with a fallback of its own.
    """

    @property
    def uncounted_rollouts(self) -> int:
        """Rollouts this gate booked outside ``orchestrator.max_rollouts`` (read-only)."""
        return 0

    abandons: bool = True
    """False: every group the gate opens ships unless its samples fail in the engine (uniform
    GRPO, DPS), so admission opens no group beyond those the remaining steps train on."""

    reference_strength: float | None = None
    """The gate's prior reads a reference screen's likelihoods (``attach_reference(screen)``,
    ``controller.reference.ReferenceScreen``) at this prior strength; None: it reads none."""

    def admit(self, group_ids: range, step: int) -> list[GroupPlan]:
        """Open up to ``len(group_ids)`` new groups, the i-th plan under ``group_ids[i]``.
        ``step`` is the learner step being produced."""
        ...

    def update(self, snapshot: GroupSnapshot, groups: OpenGroups) -> list[GroupAction]:
        """React to one more ended sample of an open group (``snapshot``, also ``groups[snapshot.group_id]``);
        ``groups``: every open group as it stands now."""
        ...

    def on_closed(self, closing: GroupSnapshot, committed: bool) -> None:
        """The group was shipped (``committed``) or dropped; ``closing`` is its final snapshot
        (the tracker's record as it closed: its rewards, and where it was committed,
        ``committed_at``). A gate reads the group's counts from here and keeps no copy of them;
        it forgets its per-group state."""
        ...

    def on_step(self, step: int, batch: TrainBatch, groups: OpenGroups) -> list[GroupAction]:
        """A learner step finished on ``batch``; may act on open (held) groups, whose counts it
        reads from ``groups``."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def metrics(self) -> dict[str, float]:
        """``gate/...`` values for the step log and the evaluation records."""
        return {}


@runtime_checkable
class Controller(Protocol):
    """Intervention controller (RAIL). ``NoopController`` in ``controller`` does nothing.

    ``wants_tokens``, ``queued_decisions``, ``on_turn``, ``flush_decisions`` and ``metrics()``
    have defaults here (a subclass of ``Controller`` inherits them): no token hooks, nothing
    queued, nothing done at a turn, no metrics. As for a gate's capabilities, readers read the
    member itself, never with a fallback of their own.
    """

    wants_tokens: bool = False
    """False: the tracker skips ``on_tokens`` altogether (no per-delta cost)."""

    def on_group(self, snapshot: GroupSnapshot, proposed: list[GroupAction]) -> list[GroupAction]:
        """Group-level decision point: the gate's ``proposed`` actions for this snapshot in,
        the actions to execute out."""
        ...

    def on_tokens(self, snapshot: GroupSnapshot, sample_index: int, delta: TokenDelta) -> list[GroupAction]:
        """Token-level decision point, for every streamed delta of a running sample."""
        ...

    def on_closed(self, group: CommittedGroup | None, snapshot: GroupSnapshot) -> None:
        """The group shipped (``group``) or was dropped (``None``); ``snapshot`` is its final state."""
        ...

    def on_turn(self, snapshot: GroupSnapshot, sample_index: int, point: TurnPoint) -> list[GroupAction]:
        """Turn-level decision point of a multi-turn episode: the environment answered a turn
        (a branch from here is ``LAUNCH`` with ``BranchSpec(point.key, point.prefix_len,
        turns=point.turns)``). None by default."""
        return []

    queued_decisions: int = 0
    """Token-level decision points ``on_tokens`` queued instead of deciding at once."""

    def flush_decisions(self) -> list[GroupAction]:
        """Decide every queued token-level decision point in one batch; their actions out. The
        orchestrator calls it once the points that arose in the same tick are in."""
        return []

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def metrics(self) -> dict[str, float]:
        """``controller/...`` values for the step log and the run summary."""
        return {}


class Scorer(Protocol):
    """A reward function over one response. ``runs_inline`` marks trivially cheap, pure
    scorers (the simulator's) that skip the worker-thread hop; all others run in threads
    with a timeout."""

    runs_inline: bool

    def __call__(self, prompt: Prompt, token_ids: Sequence[int]) -> float: ...


@runtime_checkable
class Learner(Protocol):
    """Consumes train batches, produces weights for the engine. ``step`` runs in a worker thread;
    its ``StepResult`` carries the advantages it trained on (``pipeline.advantages``), if any."""

    def step(self, batch: TrainBatch) -> StepResult: ...

    def weights(self) -> Any:
        """What ``Engine.update_weights`` takes."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class ReferenceScores(Protocol):
    """Where the learner's likelihoods of reference responses go (``controller.reference.ReferenceScreen``):
    after each step the learner scores the references of the prompts ``wanted`` next."""

    references: Mapping[int, Sequence[int]]
    """prompt id -> the reference response's token ids."""

    def wanted(self) -> list[Prompt]:
        """The prompts to score now."""
        ...

    def update(self, logprobs: Mapping[int, float], tokens: int) -> None:
        """Their summed log-probs under the learner's weights, and the tokens scoring cost."""
        ...


class Buffer(Protocol):
    """Where every trained batch is recorded (``pipeline.store.buffer.ArrowBuffer``: Arrow segments)."""

    def put(self, batch: TrainBatch, advantages: Sequence[Sequence[float]] | None = None) -> Any:
        """Record one step's batch, with the learner's per-rollout advantages when it has them."""
        ...

    def close(self) -> None: ...


class EpisodeService(Protocol):
    """The environments of a run's episodes (``pipeline.core.episodes``), one per episode key; the
    shell carries the tracker's ``EnvStep``, ``ForkEpisode`` and ``CloseEpisode`` out through it.
    Environment faults are answers (a ``TurnDone`` with ``error``), never exceptions."""

    settings: Any
    """The episodes' rules (``pipeline.config.sections.EpisodeSettings``)."""

    async def step(self, request: SampleRequest, finished: SampleFinished) -> TurnDone:
        """Step the episode's environment with the turn ``finished`` (opening it on the first
        turn; a turn that did not complete is answered ``done`` without a step)."""
        ...

    def fork(self, source: str, turns: int, key: str) -> None:
        """Episode ``key`` starts from episode ``source``'s state after ``turns`` turns."""
        ...

    def close(self, key: str) -> None:
        """The episode ended: release its environment."""
        ...


class Evaluator(Protocol):
    """Held-out evaluation of the current policy; returns namespaced metrics (``eval/accuracy``)."""

    async def evaluate(self, step: int) -> dict[str, float]: ...


class DecisionSink(Protocol):
    """Where decisions and their outcomes go (``pipeline.store.tracelog.TraceLog`` or a null sink)."""

    def next_decision_id(self) -> int:
        """A fresh id, unique within the trace (continuing after a resumed run's records)."""
        ...

    def log_decision(self, record: DecisionRecord) -> None: ...

    def log_outcome(self, decision_id: int, reward: float, tokens: int) -> None: ...

    def watermark(self) -> int:
        """Every decision id handed out so far is below this."""
        ...

    def flush(self) -> None:
        """Make everything logged so far durable (called before a checkpoint)."""
        ...
