"""Every optimiser step of a ``bench trl`` run, from TRL's own logs (``logging_steps=1``).

``Steps`` is the ``TrainerCallback`` that turns each step's log into a ``StepLog``: where the run
was (rollouts and tokens generated so far, read from the run as ``Curve`` reads them), TRL's
``grad_norm``, ``frac_reward_zero_std``, ``loss`` and ``reward``, the gradient noise estimates both
trainers log (``railgate.trl.noise``), and the step's mixed groups (a
function of the log, since the trainers know them differently: ``grpo_mixed_groups`` and
``gated_mixed_groups``). The summary log TRL writes at the end of training (no ``grad_norm``)
is not a step and is left out.

>>> mixed = gated_mixed_groups()
>>> mixed({"railgate/groups_mixed_trained": 3.0}), mixed({"railgate/groups_mixed_trained": 5.0})
(3, 2)
>>> grpo_mixed_groups(8)({"frac_reward_zero_std": 0.75}), grpo_mixed_groups(8)({})
(2, None)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from transformers import TrainerCallback

from railgate.bench.trl_report import StepLog

MixedGroups = Callable[[dict[str, Any]], "int | None"]
"""A step's log -> the mixed groups it trained (None: not known)."""


def grpo_mixed_groups(prompts: int) -> MixedGroups:
    """GRPO's mixed groups of a step: every group is full and has rewards, so TRL's share of
    rows in zero-std groups is the share of such groups."""

    def mixed(logs: dict[str, Any]) -> int | None:
        frac = _number(logs.get("frac_reward_zero_std"))
        return None if frac is None else round(prompts * (1.0 - frac))

    return mixed


def gated_mixed_groups() -> MixedGroups:
    """The gated trainer's mixed groups of a step: the change in its cumulative
    ``railgate/groups_mixed_trained`` since the previous step's log."""
    seen = [0.0]

    def mixed(logs: dict[str, Any]) -> int | None:
        total = _number(logs.get("railgate/groups_mixed_trained"))
        if total is None:
            return None
        step, seen[0] = total - seen[0], total
        return round(step)

    return mixed


@dataclass
class Steps(TrainerCallback):
    """Records a ``StepLog`` at each step's log; see the module docstring."""

    generated: Callable[[], tuple[int, int]]
    mixed_groups: MixedGroups = lambda logs: None
    logs: list[StepLog] = field(default_factory=list)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        if not logs or "grad_norm" not in logs or any(k.startswith("eval_") for k in logs):
            return control
        rollouts, tokens = self.generated()
        self.logs.append(
            StepLog(
                int(state.global_step),
                rollouts,
                tokens,
                _number(logs.get("grad_norm")),
                _number(logs.get("frac_reward_zero_std")),
                self.mixed_groups(logs),
                _number(logs.get("loss")),
                _number(logs.get("reward")),
                _number(logs.get("railgate/trace_sigma")),
                _number(logs.get("railgate/grad_dot_prev")),
                _number(logs.get("railgate/rows_trained")),
            )
        )
        return control


def _number(x: Any) -> float | None:
    """A logged value as a float; None when it is absent or not finite (JSON has no nan)."""
    try:
        value = float(x)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None
