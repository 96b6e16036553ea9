"""Prompt selectors: which prompts a gate opens groups for.

A gate asks its selector for prompts (``take``) and tells it what the groups of those prompts
showed (``observe``) and when the policy moved (``advance``). ``CursorSelector`` is the plain
epoch-shuffled ``PromptPool`` cursor with no opinion (a null object: ``observe`` and
``advance`` do nothing); ``controller.selectors.dps.DpsSelector`` prefers the prompts most
likely to be partly solved.

>>> from pipeline.types import Prompt
>>> from controller.prompts import PromptPool
>>> selector = as_selector(PromptPool([Prompt(i, "", (i,)) for i in range(3)], seed=0))
>>> len(selector.take(2)), selector.active
(2, 3)
>>> selector.observe(0, successes=1, samples=4)   # the cursor has no opinion: no effect
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from controller.prompts import PromptPool
from pipeline.types import Prompt

__all__ = ["CursorSelector", "PromptSelector", "as_selector"]


@runtime_checkable
class PromptSelector(Protocol):
    """What gates need of a prompt source. ``observe``, ``release`` and ``advance`` default to
    doing nothing, which a selector with no opinion inherits by subclassing ``PromptSelector``."""

    @property
    def active(self) -> int:
        """Prompts that can still be selected (not evicted)."""
        ...

    def take(self, n: int) -> list[Prompt]:
        """Up to ``n`` prompts to open groups for (fewer only when the pool is used up)."""
        ...

    def evict(self, prompt_id: int) -> None:
        """Never select ``prompt_id`` again."""
        ...

    def peek(self, n: int) -> list[Prompt]:
        """Up to ``n`` prompts ``take`` is likely to return next, without taking them; a
        selector that cannot tell (it decides at ``take``) returns none."""
        return []

    def observe(self, prompt_id: int, successes: int, samples: int) -> None:
        """A group of ``prompt_id`` showed ``successes`` of ``samples`` valid rewards."""
        return None

    def release(self, prompt_id: int) -> None:
        """The group opened for ``prompt_id`` closed; it may be selected again."""
        return None

    def advance(self, step: int) -> None:
        """Learner step ``step`` finished: the policy moved."""
        return None

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class CursorSelector(PromptSelector):
    """``PromptPool`` order, nothing learned: the selector of every gate without DPS."""

    def __init__(self, pool: PromptPool):
        self.pool = pool

    @property
    def active(self) -> int:
        return self.pool.active

    def take(self, n: int) -> list[Prompt]:
        return self.pool.take(n)

    def peek(self, n: int) -> list[Prompt]:
        return self.pool.peek(n)

    def evict(self, prompt_id: int) -> None:
        self.pool.evict(prompt_id)

    def state_dict(self) -> dict[str, Any]:
        return {"pool": self.pool.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pool.load_state_dict(state["pool"])


def as_selector(source: PromptPool | PromptSelector) -> PromptSelector:
    """A ``PromptPool`` wrapped in a ``CursorSelector``; a selector as it is."""
    if isinstance(source, PromptPool):
        return CursorSelector(source)
    if isinstance(source, PromptSelector):
        return source
    raise TypeError(
        f"a gate's prompt source must be a PromptPool or a PromptSelector, got {type(source).__name__}; "
        "build one with controller.prompts.PromptPool(prompts, seed)"
    )
