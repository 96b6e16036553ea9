"""RAIL's decision points and what the controller keeps per group while it is open.

The decision points (docs/methods.md, RAIL; the hooks are in ``pipeline/protocols.py``):

1. **rescue** -- ``on_group`` sees the gate propose ABANDON of a saturated group: the controller
   may replace the abandon by an intervention (branch the most promising prefix of the group's
   buffered samples -- highest prefix mean log-prob when all failed, lowest when all
   succeeded; at a probe-first probe's end every buffered sample has ended -- or resample, at
   a temperature). The group stays open and the gate decides again on the new samples;
   ``max_rescues_per_group`` bounds how often.
2. **extend** -- the gate proposes COMMIT: the controller may add samples to the group.
3. **token** -- ``on_tokens`` sees a token whose entropy reaches ``entropy_threshold``: the
   controller may branch the running sample's prefix there (rate-limited per group and sample).

Batching (``batch_token_decisions``, ``batch_group_decisions``, both default): a decision point is
queued with its context (``QueuedPoint``), and ``flush_decisions`` decides every queued point in
one scoring call when the orchestrator's tracking loop has drained the events that were waiting
for it (the points of one event-loop tick share a batch). A group-level point is queued only
when nothing of its group is running: ``on_group`` then returns HOLD in place of the gate's
proposal, and the flush returns that proposal (no-op chosen) or the intervention that replaces
(rescue) or joins (extend) it.

``Point`` is where a point stands: the prefix it would branch from, the arms on offer, the
buffered sample and the position. ``GroupState`` is the controller's record of an open group:
its decisions, how often it intervened and rescued, and so which points it may still have.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from controller.rail.arms import Arm
from controller.rail.buffers import PrefixBuffers, RequestBuffer
from controller.rail.config import RailConfig
from controller.rail.features import ALL_POINTS, Context, PrefixInfo
from controller.rail.outcomes import PendingDecision
from pipeline.types import GroupAction, GroupSnapshot

QUEUED = "rail: decision queued"
"""The reason of the HOLD that ``on_group`` returns while a group-level point waits for its batch."""
DECISIONS_AT = {point: f"decisions_{point}" for point in ALL_POINTS}
INTERVENTIONS_OF = {kind: f"interventions_{kind}" for kind in ("branch", "resample", "guide")}
"""The counters of decisions per point and of interventions per arm kind, named once."""


@dataclass
class GroupState:
    """The controller's record of one open group."""

    first_version: int
    decisions: list[PendingDecision] = field(default_factory=list)
    token_decisions: int = 0
    turn_decisions: int = 0
    interventions: int = 0
    rescues: int = 0
    rescued_from: str = ""  # "fail" / "pass": the saturated probe a rescue intervention acted on

    def may_rescue(self, snapshot: GroupSnapshot, cfg: RailConfig) -> bool:
        """A rescue point: rescues are on and left, and the group's ended samples all failed or
        all passed (mostly not by failing)."""
        return (
            cfg.rescue_on_abandon
            and self.rescues < cfg.max_rescues_per_group
            and snapshot.finished >= 1
            and not snapshot.is_mixed
            and snapshot.failed <= snapshot.finished
        )

    def may_extend(self, cfg: RailConfig) -> bool:
        """An extend point: extending is on and the group has interventions left."""
        return cfg.extend_on_commit and self.interventions < cfg.max_interventions_per_group

    def may_decide_token(self, cfg: RailConfig) -> bool:
        """The group has token decisions and interventions left."""
        return (
            self.token_decisions < cfg.max_token_decisions_per_group
            and self.interventions < cfg.max_interventions_per_group
        )

    def rescued(
        self,
        snapshot: GroupSnapshot,
        actions: list[GroupAction],
        held: tuple[GroupAction, ...],
        counts: Counter[str],
    ) -> list[GroupAction]:
        """A rescue decision's outcome: its intervention in place of the held abandon, or the
        abandon when it chose the no-op (``counts``: the controller's, ``rescued_*`` counted)."""
        if not actions:
            return list(held)
        self.rescues += 1
        if not self.rescued_from:
            self.rescued_from = "fail" if snapshot.successes == 0 else "pass"
            counts[f"rescued_{self.rescued_from}"] += 1
        return actions

    def outstanding(self, snapshot: GroupSnapshot) -> bool:
        """Some intervention of this group has samples that have not come back yet."""
        for d in self.decisions:
            if not d.noop and snapshot.origins.count(d.decision_id) < d.n:
                return True
        return False


@dataclass(frozen=True)
class Point:
    """Where a decision point stands: the prefix it would branch from, the arms on offer, and
    the buffered sample and position of a branch (None and -1 without one)."""

    prefix: PrefixInfo
    arms: tuple[Arm, ...]
    source: RequestBuffer | None
    position: int


@dataclass(frozen=True)
class QueuedPoint:
    """A decision point waiting for the batch it is decided in."""

    point: str
    snapshot: GroupSnapshot
    group: GroupState
    context: Context
    source: RequestBuffer | None
    position: int
    cost_ns: int  # what building its context took (added to its share of the batch's cost)
    held: tuple[GroupAction, ...] = ()  # a group-level point: the gate's proposal, held until decided


def group_point(
    snapshot: GroupSnapshot, buffers: PrefixBuffers, arms: tuple[Arm, ...], other_arms: tuple[Arm, ...], max_tokens: int
) -> Point | None:
    """Where a group-level point of ``snapshot`` stands: with a buffered prefix to branch from
    every arm is on offer, without one only ``other_arms`` (those that do not branch); None when
    that leaves only the no-op (nothing to decide)."""
    best = None
    if len(arms) > len(other_arms):  # there are branch arms
        # All failures so far: continue the most promising prefix; all successes: the least.
        best = buffers.best_prefix(snapshot.group_id, snapshot.successes == 0, max_tokens - 1)
    prefix = PrefixInfo()
    if best is not None:
        buf, pos = best
        prefix = PrefixInfo(pos / buf.length, buf.entropy_at(pos), buf.has_entropy, buf.mean_logprob(pos))
    offered = arms if best is not None else other_arms
    if len(offered) < 2:
        return None
    return Point(prefix, offered, best[0] if best else None, best[1] if best else -1)
