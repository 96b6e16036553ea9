"""DPS as a gate: uniform GRPO groups over the prompts a ``DpsSelector`` picks.

Dynamics-Predictive Sampling (arXiv 2603.10887) changes *which* prompts get rollouts, not how
many: every selected prompt gets a full group of ``group_size`` that is trained on. The
selector learns from every shipped group's rewards (passed in through ``on_step``) and moves
its beliefs one transition per learner step. SARA + DPS (the SARA paper's best configuration)
is ``SaraGate`` built on the same selector (``controller.gates.registry``).
"""

from __future__ import annotations

from controller.gates.base import SealingGate
from controller.gates.common import SealedRecord
from controller.selectors.dps import DpsSelector
from pipeline.types import GroupAction, GroupPlan, GroupSnapshot


class DpsGate(SealingGate[SealedRecord]):
    """Full groups, committed at once, for the prompts DPS predicts to be partly solved.

    Parameters
    ----------
    selector
        The ``DpsSelector`` that picks prompts (it wraps the ``PromptPool``).
    group_size
        G, the size of every group.

    Examples
    --------
    >>> from pipeline.types import Prompt
    >>> from controller.prompts import PromptPool
    >>> from controller.selectors.dps import DpsSelector
    >>> pool = PromptPool([Prompt(i, "", (1,)) for i in range(4)], seed=0)
    >>> gate = DpsGate(DpsSelector(pool, seed=0), group_size=8)
    >>> plans = gate.admit(range(3), step=0)
    >>> len({p.prompt.prompt_id for p in plans}), [(p.target_size, p.initial) for p in plans][0]
    (3, (8, 8))
    """

    name = "dps"
    Record = SealedRecord
    abandons = False  # only groups whose samples failed in the engine: admission plans exactly

    def __init__(self, selector: DpsSelector, group_size: int):
        if not isinstance(selector, DpsSelector):
            raise TypeError(
                f"DpsGate needs a DpsSelector, got {type(selector).__name__}; wrap the pool: DpsSelector(pool, seed)"
            )
        super().__init__(selector, group_size)

    def admit(self, group_ids: range, step: int) -> list[GroupPlan]:
        plans = []
        for group_id, prompt in zip(group_ids, self.source.take(len(group_ids))):
            self._open(group_id, prompt)
            plans.append(GroupPlan(group_id, prompt, self.group_size, self.group_size))
        return plans

    def _judge(self, snapshot: GroupSnapshot, rec: SealedRecord) -> list[GroupAction]:
        return self._seal(snapshot.group_id, rec)
