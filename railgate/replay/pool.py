"""The replayed prompts as a gate's prompt source: in order, each offered once.

A replay presents ``ReplayOrder.prompts`` to the gate in their order and never again: a
recorded group answers one group of its prompt, so a second pass would replay the same samples
as if they were fresh. ``OnePassPool`` is a ``PromptPool`` whose cursor walks the prompts once
(no epoch reshuffle) and counts every prompt it hands out as used (``active`` falls to 0 when
the pass is over, which is how gates and the tracker see the end of the pool).
``OncePerReplay`` wraps a selector that picks prompts itself (DPS) so that a prompt it picked
is never picked again.

>>> from pipeline.types import Prompt
>>> pool = OnePassPool([Prompt(i, "", ()) for i in range(3)])
>>> [p.prompt_id for p in pool.peek(5)], [p.prompt_id for p in pool.take(2)], pool.active
([0, 1, 2], [0, 1], 1)
>>> [p.prompt_id for p in pool.take(2)], pool.take(1), pool.active
([2], [], 0)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from controller.prompts import PromptPool
from controller.selectors import PromptSelector
from pipeline.types import Prompt


class OnePassPool(PromptPool):
    """``prompts`` in the given order, each handed out at most once (see the module docstring)."""

    def __init__(self, prompts: Sequence[Prompt]):
        super().__init__(prompts, seed=0)

    def _permutation(self, epoch: int) -> Any:
        return range(len(self.prompts))

    def take(self, n: int) -> list[Prompt]:
        """The next ``n`` prompts not used yet (fewer once the pass is over); each is used from now on."""
        out: list[Prompt] = []
        prompts, evicted = self.prompts, self._evicted
        while len(out) < n and self._cursor < len(prompts):
            prompt = prompts[self._cursor]
            self._cursor += 1
            if prompt.prompt_id not in evicted:
                evicted.add(prompt.prompt_id)
                out.append(prompt)
        return out

    def peek(self, n: int) -> list[Prompt]:
        out: list[Prompt] = []
        cursor = self._cursor
        while len(out) < n and cursor < len(self.prompts):
            prompt = self.prompts[cursor]
            cursor += 1
            if prompt.prompt_id not in self._evicted:
                out.append(prompt)
        return out


class OncePerReplay(PromptSelector):
    """A selector that picks prompts itself (DPS), each pick then evicted: offered once.

    >>> from controller.selectors.dps import DpsSelector
    >>> from pipeline.types import Prompt
    >>> selector = OncePerReplay(DpsSelector(OnePassPool([Prompt(i, "", ()) for i in range(3)]), seed=0))
    >>> picked = {p.prompt_id for p in selector.take(2)}
    >>> for pid in picked:
    ...     selector.release(pid)
    >>> [p.prompt_id for p in selector.take(3)] == sorted({0, 1, 2} - picked), selector.active
    (True, 0)
    """

    def __init__(self, inner: PromptSelector):
        self.inner = inner

    @property
    def active(self) -> int:
        return self.inner.active

    def take(self, n: int) -> list[Prompt]:
        got = self.inner.take(n)
        for prompt in got:
            self.inner.evict(prompt.prompt_id)
        return got

    def evict(self, prompt_id: int) -> None:
        self.inner.evict(prompt_id)

    def peek(self, n: int) -> list[Prompt]:
        return self.inner.peek(n)

    def observe(self, prompt_id: int, successes: int, samples: int) -> None:
        self.inner.observe(prompt_id, successes, samples)

    def release(self, prompt_id: int) -> None:
        self.inner.release(prompt_id)

    def advance(self, step: int) -> None:
        self.inner.advance(step)

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)
