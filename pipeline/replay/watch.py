"""The gate of a replay, watched: what each replayed prompt's ``PromptOutcome`` reads from the gate.

Both replay paths (the pipeline over the replay engine and ``bench replay``'s direct driver) wrap
the run's gate in one ``WatchedGate``; every call is the gate's own, and on the way it notes:

* which group the gate opened for each prompt (``opened``; a replay has one group per prompt,
  so a second group of a prompt is an error), in the order they opened (``opened_order``);
* ``decided_at``: how many of the group's samples had ended (rewarded or failed: its snapshot
  in the open groups the gate was handed) when the gate first proposed ``COMMIT`` or
  ``ABANDON`` for it (0: never);
* the verdict: ``committed`` when the group shipped; ``dropped`` when it closed unshipped after
  the gate's last proposal was ``COMMIT`` (fewer than two valid samples); ``abandoned`` when it
  closed otherwise; ``open`` when the replay ended with it open; ``skipped`` when never opened.

The samples and tokens of an outcome are counted by whoever served them (the engine's usage, or
the driver's own count), and handed to ``outcome``.

>>> from pipeline.types import GroupPlan, GroupSnapshot, Prompt
>>> class Gate1:
...     abandons = True; uncounted_rollouts = 0
...     def admit(self, ids, step): return [GroupPlan(ids[0], Prompt(5, "", ()), 2, 2)]
...     def on_closed(self, closing, committed): pass
>>> watched = WatchedGate(Gate1())
>>> [p.group_id for p in watched.admit(range(3, 4), 0)], watched.opened_order
([3], [5])
>>> watched.on_closed(GroupSnapshot(3, Prompt(5, "", ()), 2, (1.0, 0.0), 0, 2, 0, 40, 0, committed_at=2), True)
>>> watched.outcome(5, samples=2, tokens=40), watched.outcome(6, 0, 0).verdict
(PromptOutcome(prompt_id=5, opened=True, verdict='committed', samples=2, tokens=40, decided_at=0), 'skipped')
"""

from __future__ import annotations

from typing import Any

from pipeline.protocols import Gate, OpenGroups
from pipeline.replay.outcome import PromptOutcome, Verdict
from pipeline.types import ActionKind, GroupAction, GroupPlan, GroupSnapshot, TrainBatch

_COMMIT, _ABANDON = ActionKind.COMMIT, ActionKind.ABANDON


class WatchedGate(Gate):
    """``inner``, unchanged, with a replay's outcomes noted on the way (module docstring)."""

    def __init__(self, inner: Gate):
        self.inner = inner
        self.group_of: dict[int, int] = {}  # prompt id -> its group id, in opening order
        self._decided_at: dict[int, int] = {}
        self._last: dict[int, ActionKind] = {}  # group id -> the gate's latest COMMIT or ABANDON
        self._closed: dict[int, bool] = {}  # group id -> shipped

    @property
    def abandons(self) -> bool:  # type: ignore[override]
        return self.inner.abandons

    @property
    def reference_strength(self) -> float | None:  # type: ignore[override]
        return self.inner.reference_strength

    @property
    def uncounted_rollouts(self) -> int:
        return self.inner.uncounted_rollouts

    @property
    def opened_order(self) -> list[int]:
        """The prompts the gate opened a group for, in the order it opened them."""
        return list(self.group_of)

    def admit(self, group_ids: range, step: int) -> list[GroupPlan]:
        plans = self.inner.admit(group_ids, step)
        for plan in plans:
            pid = plan.prompt.prompt_id
            if pid in self.group_of:
                raise RuntimeError(
                    f"the gate opened a second group for replayed prompt {pid}; a replay has one group of samples "
                    "per prompt (its pool is one pass: controller.prompts.OnePassPool)"
                )
            self.group_of[pid] = plan.group_id
        return plans

    def update(self, snapshot: GroupSnapshot, groups: OpenGroups) -> list[GroupAction]:
        return self._saw(self.inner.update(snapshot, groups), groups)

    def on_step(self, step: int, batch: TrainBatch, groups: OpenGroups) -> list[GroupAction]:
        return self._saw(self.inner.on_step(step, batch, groups), groups)

    def on_closed(self, closing: GroupSnapshot, committed: bool) -> None:
        self._closed[closing.group_id] = committed
        self.inner.on_closed(closing, committed)

    def _saw(self, actions: list[GroupAction], groups: OpenGroups) -> list[GroupAction]:
        for a in actions:
            if a.kind is _COMMIT or a.kind is _ABANDON:
                if a.group_id not in self._decided_at and a.group_id in groups:
                    decided = groups[a.group_id]
                    self._decided_at[a.group_id] = len(decided.rewards) + decided.failed
                self._last[a.group_id] = a.kind
        return actions

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)

    def metrics(self) -> dict[str, float]:
        return self.inner.metrics()

    def outcome(self, prompt_id: int, samples: int, tokens: int) -> PromptOutcome:
        """What the replay did with ``prompt_id``, which cost ``samples`` requests and ``tokens`` tokens."""
        gid = self.group_of.get(prompt_id)
        if gid is None:
            return PromptOutcome(prompt_id, False, "skipped", samples, tokens, 0)
        verdict: Verdict
        if gid not in self._closed:
            verdict = "open"
        elif self._closed[gid]:
            verdict = "committed"
        else:
            verdict = "dropped" if self._last.get(gid) is _COMMIT else "abandoned"
        return PromptOutcome(prompt_id, True, verdict, samples, tokens, self._decided_at.get(gid, 0))
