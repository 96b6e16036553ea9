"""The allocation benchmark's gate probe: false abandonment, measured exactly on the simulator.

``GateProbe`` wraps a gate and passes every call through. Whenever the gate abandons a group
before it is complete and while it is still all-same, the probe adds the exact probability
(from the simulator's true success rate at that moment) that completing the group would have
made it mixed: the expectation of "complete the abandoned group and look", without noise.

>>> from controller.gates.sara import SaraGate
>>> from pipeline.config.sections import SimConfig
>>> from pipeline.sim.engine import SimEngine
>>> from pipeline.sim.world import SimWorld
>>> from pipeline.types import GroupSnapshot
>>> world = SimWorld(SimConfig(num_prompts=4, num_eval_prompts=2))
>>> engine = SimEngine(world)
>>> from controller.prompts import PromptPool
>>> probe = GateProbe(SaraGate(PromptPool([engine.prompt(i) for i in range(4)], seed=0), 8), world, engine)
>>> (plan,) = probe.admit(range(1), step=0)
>>> probed = GroupSnapshot(0, plan.prompt, 8, (0.0,) * 4, 0, 4, 0, 40, 0)
>>> _ = probe.update(probed, {0: probed})   # an all-wrong probe: abandoned
>>> probe.abandoned_incomplete, 0.0 < probe.false_abandonment_sum < 1.0
(1, True)
"""

from __future__ import annotations

from typing import Any

from pipeline.protocols import Gate, OpenGroups
from pipeline.types import ActionKind, GroupPlan, GroupSnapshot, TrainBatch


class GateProbe(Gate):
    """Wraps a gate to measure false abandonment exactly in the sim (benchmark only)."""

    def __init__(self, gate: Gate, world: Any, engine: Any):
        self._gate = gate
        self._world = world
        self._engine = engine
        self.abandoned_incomplete = 0
        self.false_abandonment_sum = 0.0

    def admit(self, group_ids: range, step: int) -> list[GroupPlan]:
        return self._gate.admit(group_ids, step)

    def update(self, snapshot: GroupSnapshot, groups: OpenGroups):
        actions = self._gate.update(snapshot, groups)
        for action in actions:
            if action.kind is ActionKind.ABANDON:
                self._measure(groups.get(action.group_id))  # the group as the tracker holds it
        return actions

    def _measure(self, snap: GroupSnapshot | None) -> None:
        if snap is None or snap.finished >= snap.target_size or snap.is_mixed or snap.finished == 0:
            return
        p = self._world.success_probability(self._engine.state, snap.prompt.prompt_id)
        m = snap.target_size - snap.finished
        all_success = snap.successes == snap.finished
        self.abandoned_incomplete += 1
        self.false_abandonment_sum += 1.0 - (p**m if all_success else (1.0 - p) ** m)

    def on_closed(self, closing: GroupSnapshot, committed: bool) -> None:
        self._gate.on_closed(closing, committed)

    def on_step(self, step: int, batch: TrainBatch, groups: OpenGroups):
        return self._gate.on_step(step, batch, groups)

    def state_dict(self) -> dict[str, Any]:
        return self._gate.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._gate.load_state_dict(state)

    @property
    def uncounted_rollouts(self) -> int:
        return self._gate.uncounted_rollouts

    @property
    def abandons(self) -> bool:
        return self._gate.abandons

    @property
    def reference_strength(self) -> float | None:  # type: ignore[override]
        return self._gate.reference_strength

    def metrics(self) -> dict[str, float]:
        return self._gate.metrics()
