"""Prompt selection for gates: a seeded, epoch-shuffled cursor over a prompt pool.

Gates ask a ``PromptPool`` for the next prompts; selectors with opinions (DPS) wrap it.

>>> from pipeline.types import Prompt
>>> pool = PromptPool([Prompt(i, f"p{i}", (i,)) for i in range(3)], seed=0)
>>> sorted(p.prompt_id for p in pool.take(3)), pool.epoch
([0, 1, 2], 0)
>>> len(pool.take(2)), pool.epoch
(2, 1)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline.types import Prompt


class PromptPool:
    """Cycles through ``prompts`` in a fresh seeded permutation each epoch; evicted prompts
    are skipped from then on."""

    def __init__(self, prompts: Sequence[Prompt], seed: int = 0):
        if not prompts:
            raise ValueError("the prompt pool is empty; give the task at least one training prompt")
        self.prompts = list(prompts)
        self.seed = seed
        self._by_id = {p.prompt_id: i for i, p in enumerate(self.prompts)}
        self._evicted: set[int] = set()
        self._epoch = 0
        self._cursor = 0
        self._order = self._permutation(0)

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def active(self) -> int:
        """Prompts not evicted."""
        return len(self.prompts) - len(self._evicted)

    def get(self, prompt_id: int) -> Prompt:
        return self.prompts[self._by_id[prompt_id]]

    def evict(self, prompt_id: int) -> None:
        self._evicted.add(prompt_id)

    def is_evicted(self, prompt_id: int) -> bool:
        return prompt_id in self._evicted

    def take(self, n: int) -> list[Prompt]:
        """The next ``n`` prompts that are not evicted (fewer only if every prompt is evicted)."""
        out: list[Prompt] = []
        if self.active == 0:
            return out
        while len(out) < n:
            if self._cursor >= len(self._order):
                self._epoch += 1
                self._cursor = 0
                self._order = self._permutation(self._epoch)
            prompt = self.prompts[self._order[self._cursor]]
            self._cursor += 1
            if prompt.prompt_id not in self._evicted:
                out.append(prompt)
        return out

    def peek(self, n: int) -> list[Prompt]:
        """The prompts the next ``take`` calls would return, up to ``n`` of them, without moving
        the cursor (a later eviction can still skip one).

        >>> from pipeline.types import Prompt
        >>> pool = PromptPool([Prompt(i, "", (i,)) for i in range(3)], seed=0)
        >>> ahead = [p.prompt_id for p in pool.peek(5)]
        >>> ahead == [p.prompt_id for p in pool.take(5)], len(ahead)
        (True, 5)
        """
        out: list[Prompt] = []
        if self.active == 0:
            return out
        epoch, cursor, order = self._epoch, self._cursor, self._order
        while len(out) < n:
            if cursor >= len(order):
                epoch, cursor = epoch + 1, 0
                order = self._permutation(epoch)
            prompt = self.prompts[order[cursor]]
            cursor += 1
            if prompt.prompt_id not in self._evicted:
                out.append(prompt)
        return out

    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.prompts))

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self._epoch, "cursor": self._cursor, "evicted": sorted(self._evicted)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._epoch = int(state["epoch"])
        self._cursor = int(state["cursor"])
        self._evicted = set(int(i) for i in state["evicted"])
        self._order = self._permutation(self._epoch)


class OnePassPool(PromptPool):
    """The prompts in the order given, each handed out once: no epochs, no reshuffle (a replay
    visits each recorded group at most once, having no samples for a second group of it; both
    replay paths, the pipeline's and ``bench replay``'s driver, use this one pool).
    ``take`` returns fewer than asked at the end and then none; ``remaining`` counts what is
    left, and so does ``active``: a prompt handed out is used up, so the gates and the tracker
    see the pool's end (``BaseGate.exhausted``).

    >>> from pipeline.types import Prompt
    >>> pool = OnePassPool([Prompt(i, "", (i,)) for i in (4, 2, 7)])
    >>> [p.prompt_id for p in pool.peek(5)], [p.prompt_id for p in pool.take(2)], pool.remaining
    ([4, 2, 7], [4, 2], 1)
    >>> pool.evict(7); pool.active
    0
    >>> [p.prompt_id for p in pool.take(2)], pool.take(1), pool.remaining, pool.epoch
    ([], [], 0, 0)
    """

    def __init__(self, prompts: Sequence[Prompt]):
        super().__init__(prompts, seed=0)

    @property
    def remaining(self) -> int:
        """Prompts not handed out yet and not evicted."""
        return sum(1 for i in self._order[self._cursor :] if self.prompts[i].prompt_id not in self._evicted)

    @property
    def active(self) -> int:
        """Prompts that can still be handed out: ``remaining``."""
        return self.remaining

    def take(self, n: int) -> list[Prompt]:
        out, self._cursor = self._scan(self._cursor, n)
        return out

    def peek(self, n: int) -> list[Prompt]:
        return self._scan(self._cursor, n)[0]

    def _scan(self, cursor: int, n: int) -> tuple[list[Prompt], int]:
        """Up to ``n`` prompts not evicted from ``cursor`` on, and the cursor after them."""
        out: list[Prompt] = []
        while len(out) < n and cursor < len(self._order):
            prompt = self.prompts[self._order[cursor]]
            cursor += 1
            if prompt.prompt_id not in self._evicted:
                out.append(prompt)
        return out, cursor

    def _permutation(self, epoch: int) -> np.ndarray:
        return np.arange(len(self.prompts))
