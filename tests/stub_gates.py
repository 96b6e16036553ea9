"""Small gates that make one lifecycle event happen on cue, for the tracker's and the shells' tests.

>>> from controller.prompts import PromptPool
>>> from pipeline.types import GroupSnapshot, Prompt
>>> gate = AbandonAtFirstEnd(PromptPool([Prompt(0, "", (1,))], seed=0), group_size=4)
>>> first_end = GroupSnapshot(3, Prompt(0, "", (1,)), 4, (1.0,), 3, 4, 0, 5, 0)
>>> [a.kind.value for a in gate.update(first_end, {3: first_end})]
['abandon']
"""

from __future__ import annotations

from controller.gates.uniform import UniformGate
from pipeline.types import ActionKind, GroupAction


class AbandonAtFirstEnd(UniformGate):
    """Opens whole groups as ``UniformGate`` does and abandons each at its first ended sample, so
    its running siblings are cancelled."""

    abandons = True

    def update(self, snapshot, groups):
        return [GroupAction(ActionKind.ABANDON, snapshot.group_id, reason="first end")]
