"""How many groups the tracker may open now, and what it says when nothing can run.

Three limits bound admission (``GroupTracker._admit`` applies them):

* step-ahead: groups committed or still open may fill at most ``max_async_steps + 1`` steps
  beyond the learner's, since every open group may still commit;
* work left: groups already on their way to a batch count against ``steps * step_groups``
  (for a gate that never abandons, every open group is on its way);
* room: ``max_open_groups`` and the engine's free sample slots, a whole group each.

>>> from pipeline.config.sections import OrchestratorConfig
>>> cfg = OrchestratorConfig(batch_groups=2, group_size=4, steps=3, max_concurrent_samples=16, max_open_groups=8)
>>> open_slots(cfg, Occupancy(batches_in_learner=0, pending=0, open=0, sealed_open=0, free_samples=16))
4
>>> open_slots(cfg, Occupancy(batches_in_learner=1, pending=1, open=1, sealed_open=0, free_samples=12))  # 2 steps ahead
0
>>> open_slots(cfg, Occupancy(batches_in_learner=0, pending=1, open=1, sealed_open=0, free_samples=12, batches_sent=1))
2
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config.sections import OrchestratorConfig
from pipeline.core.group import GroupRun
from pipeline.protocols import Gate, GateProtocolError, GateStalled
from pipeline.types import GroupPlan


@dataclass(frozen=True)
class Occupancy:
    """Where a run's groups are: counts of groups, except ``batches_in_learner`` (batches sent to
    the learner and not yet trained) and ``batches_sent``."""

    batches_in_learner: int
    pending: int
    open: int
    sealed_open: int
    free_samples: int
    batches_sent: int = 0


def open_slots(cfg: OrchestratorConfig, occ: Occupancy, abandons: bool = True) -> int:
    """How many groups may open now (0: none); the module docstring has the three limits."""
    b = cfg.step_groups
    committed_ahead = occ.batches_in_learner * b + occ.pending + occ.open
    shipping = occ.sealed_open if abandons else occ.open
    still_needed = cfg.steps * b - (occ.batches_sent * b + occ.pending + shipping)
    room = (cfg.max_async_steps + 1) * b - committed_ahead
    if room <= 0 or still_needed <= 0:
        return 0
    slots = min(
        cfg.max_open_groups - occ.open,
        occ.free_samples // cfg.group_size,
        room if abandons else min(room, still_needed),
    )
    return max(0, slots)


def admit(gate: Gate, first_id: int, slots: int, step: int) -> list[tuple[GroupRun, GroupPlan]]:
    """Offer the gate ``slots`` group ids from ``first_id``; the groups it opens, with their plans
    (a gate's plan must take the id offered in its place, or the lifecycle is broken)."""
    offered = range(first_id, first_id + slots)
    plans = gate.admit(offered, step)
    if [plan.group_id for plan in plans] != list(offered[: len(plans)]):
        raise GateProtocolError(
            f"{type(gate).__name__}.admit({offered}) returned plans for groups {[p.group_id for p in plans]}; "
            "the i-th plan must take the i-th offered id"
        )
    return [(GroupRun(plan.group_id, plan.prompt, plan.target_size, step), plan) for plan in plans]


def stall_error(gate: object, open_groups: int, held: int, pending: int, batch: str) -> GateStalled:
    """The error of a run where nothing can produce another message, with what to change."""
    return GateStalled(
        f"the gate ({type(gate).__name__}) opened no group while nothing is running "
        f"({open_groups} open groups, {held} of them held with nothing in flight, "
        f"{pending} committed groups waiting for a batch of {batch}); "
        "the prompt pool may be exhausted or emptied by eviction -- add prompts, relax eviction, "
        "or lower orchestrator.batch_groups"
    )
