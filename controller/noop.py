"""The controller that never intervenes: the baseline every intervention policy is compared to."""

from __future__ import annotations

from typing import Any

from pipeline.protocols import Controller
from pipeline.types import CommittedGroup, GroupAction, GroupSnapshot, TokenDelta


class NoopController(Controller):
    """Decides nothing. ``wants_tokens = False`` tells the orchestrator to skip token hooks.

    >>> NoopController().on_group(None, [])
    []
    """

    wants_tokens = False

    def on_group(self, snapshot: GroupSnapshot, proposed: list[GroupAction]) -> list[GroupAction]:
        return proposed

    def on_tokens(self, snapshot: GroupSnapshot, sample_index: int, delta: TokenDelta) -> list[GroupAction]:
        return []

    def on_closed(self, group: CommittedGroup | None, snapshot: GroupSnapshot) -> None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None
