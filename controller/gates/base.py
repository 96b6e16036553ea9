"""The part every gate of this package shares: a prompt selector, its plans, its groups.

``BaseGate`` keeps

* ``source``: the ``PromptSelector`` prompts come from (a ``PromptPool`` is wrapped in the
  plain ``CursorSelector``; DPS plugs in ``DpsSelector``);
* the ``PlanBook`` of groups asked for and not yet reported, and one JSON-able record per open
  group (``_groups``), created at the group's first update from its plan (a group closed
  before it ever reported, as on resume, takes the oldest unreported plan);
* verdict counters, reported by ``metrics()`` as ``gate/<reason>``;
* selector feedback: an abandoned (or dropped) group's last rewards at ``on_closed``, a shipped
  group's full rewards from the batch at ``on_step`` (the orchestrator stops calling
  ``update`` once a group is committed), then ``source.advance``.

Subclasses implement ``admit`` and ``update`` and add their own state through
``_extra_state`` / ``_load_extra_state``. ``state_dict()`` is plain JSON-able data.
"""

from __future__ import annotations

from typing import Any

from controller.gates.common import PlanBook, Verdicts
from controller.prompts import PromptPool
from controller.selectors import PromptSelector, as_selector
from pipeline.protocols import Gate
from pipeline.types import GroupAction, GroupSnapshot, TrainBatch


class BaseGate(Gate):
    """Shared state and lifecycle of the gates in ``controller.gates`` (not a gate by itself)."""

    name = "gate"

    def __init__(self, source: PromptPool | PromptSelector, group_size: int):
        if group_size < 2:
            raise ValueError(f"group_size={group_size} must be >= 2 for a group-relative advantage")
        self.source = as_selector(source)
        self.group_size = group_size
        self._book = PlanBook()
        self._groups: dict[int, dict[str, Any]] = {}
        self._verdicts = Verdicts()

    # --- shared lifecycle ---------------------------------------------------------------

    def _record(self, snapshot: GroupSnapshot) -> dict[str, Any]:
        """The gate's record of the snapshot's group, created from its plan on first sight."""
        rec = self._groups.get(snapshot.group_id)
        if rec is None:
            rec = self._book.claim(snapshot, type(self).__name__)
            self._groups[snapshot.group_id] = rec
        rec["s"] = snapshot.successes
        rec["f"] = snapshot.failures
        return rec

    def on_closed(self, group_id: int, committed: bool) -> None:
        rec = self._groups.pop(group_id, None)
        if rec is None:
            # Closed before its first update (a resumed run drops the groups that were open).
            rec = self._book.pop_oldest()
            if rec is None or committed:
                return
        self.source.release(rec["prompt_id"])
        if not committed:
            self.source.observe(rec["prompt_id"], rec.get("s", 0), rec.get("s", 0) + rec.get("f", 0))
        self._closed(group_id, rec, committed)

    def _closed(self, group_id: int, rec: dict[str, Any], committed: bool) -> None:
        """Subclass hook: the group left (shipped or dropped)."""

    def on_step(self, step: int, batch: TrainBatch) -> list[GroupAction]:
        for group in batch.groups:
            successes = group.successes
            self.source.observe(group.prompt_id, successes, len(group.rewards))
            self._shipped(group.prompt_id, successes, len(group.rewards))
        self.source.advance(step)
        return self._stepped(step, batch)

    def _shipped(self, prompt_id: int, successes: int, samples: int) -> None:
        """Subclass hook: a group of ``prompt_id`` was trained on with these rewards."""

    def _stepped(self, step: int, batch: TrainBatch) -> list[GroupAction]:
        """Subclass hook: actions after a learner step."""
        return []

    # --- reporting ----------------------------------------------------------------------

    @property
    def exhausted(self) -> bool:
        """No prompt can be selected any more (every prompt evicted)."""
        return self.source.active == 0

    @property
    def open_groups(self) -> int:
        """Groups this gate has asked for and not yet seen closed."""
        return len(self._groups) + len(self._book)

    def metrics(self) -> dict[str, float]:
        return self._verdicts.metrics()

    # --- checkpoint ---------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "source": self.source.state_dict(),
            "book": self._book.state_dict(),
            "groups": {str(k): dict(v) for k, v in self._groups.items()},
            "verdicts": self._verdicts.state_dict(),
            **self._extra_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.source.load_state_dict(state["source"])
        self._book.load_state_dict(state["book"])
        self._groups = {int(k): dict(v) for k, v in state["groups"].items()}
        self._verdicts.load_state_dict(state["verdicts"])
        self._load_extra_state(state)

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        return None
