"""The group tracker's checkpoint, both directions: what ``GroupTracker.state_dict`` saves after a
finished step and how ``load_state_dict`` puts it back.

Saved: the step, the trace's watermark (decisions up to it are on disk with the checkpoint), the
next group id, the budget, the ids of groups still open, the committed groups not yet trained
(pending, or in batches sent to the learner; kept whole), the gate's and the controller's state,
the policy version and the evaluations so far. Restored: the gate and controller, the counters,
the untrained groups first in order; the groups that were open are gone, and the gate is told.

>>> from controller.gates.uniform import UniformGate; from controller.noop import NoopController
>>> from controller.prompts import PromptPool; from pipeline.config.sections import OrchestratorConfig
>>> from pipeline.tracker import GroupTracker; from pipeline.types import Prompt
>>> def tracker():
...     pool = PromptPool([Prompt(i, "", (1,)) for i in range(8)], seed=0)
...     return GroupTracker(UniformGate(pool, 2), NoopController(), OrchestratorConfig(batch_groups=1, group_size=2))
>>> first = tracker(); first.budget.groups_opened = 3
>>> second = tracker(); restore_tracker(second, tracker_state(first)); second.budget.groups_opened
3
"""

from __future__ import annotations

from typing import Any

# The tracker is typed loosely: this module is its own, and importing it back would be a cycle.
GroupTracker = Any


def tracker_state(tracker: GroupTracker) -> dict[str, Any]:
    """The tracker's part of a checkpoint (the module docstring lists it)."""
    tracker.trace.flush()  # decisions before the checkpoint must be on disk with it
    return {
        "step": tracker.steps_done,
        "decision_watermark": tracker.trace.watermark(),
        "next_group_id": tracker._next_group_id,
        "budget": tracker.budget.state_dict(),
        "open_group_ids": sorted(tracker.groups),
        **tracker.batches.state_dict(),
        "gate": tracker.gate.state_dict(),
        "controller": tracker.controller.state_dict(),
        "policy_version": tracker.policy_version(),
        "evals": list(tracker.evals),
    }


def restore_tracker(tracker: GroupTracker, state: dict[str, Any]) -> None:
    """Put back what ``tracker_state`` saved (the module docstring says how)."""
    tracker.gate.load_state_dict(state["gate"])
    tracker.controller.load_state_dict(state["controller"])
    tracker._steps_done = int(state["step"])
    tracker._next_group_id = int(state["next_group_id"])
    tracker.budget.load_state_dict(state["budget"])
    tracker.batches.load_state_dict(state, tracker._steps_done)  # untrained groups go first, in order
    tracker.steplog.evals[:] = list(state.get("evals", []))
    for group_id in state["open_group_ids"]:
        tracker.gate.on_closed(group_id, False)
