"""Which recorded sample serves which request: the seeded orders a replay runs in.

A replay visits the log's groups in a *prompt order* and serves a group's k-th request the
recorded sample at position k of its *sample order*. Order seed 0 keeps the log as recorded
(groups in log order, each group's samples in the order they finished); any other seed draws
both permutations from the seed alone (``pipeline.seeding``), so two gates replayed under one
seed see the same prompts and the same samples: a paired comparison.

Each recorded group becomes one replayed prompt whose ``prompt_id`` is its position in the log
(a log may hold one prompt at several steps, each its own group); ``source_prompt_id`` maps it
back to the log's prompt id for reports.

>>> from pipeline.store.grouplog import GroupLog, RecordedGroup
>>> log = GroupLog(tuple(RecordedGroup.of(g, prompt_id=10 + g, rewards=[1, 0, 0, 1]) for g in range(3)), ("demo",))
>>> order = ReplayOrder(log, seed=0)
>>> [p.prompt_id for p in order.prompts], order.sample(2, 1).index
([0, 1, 2], 1)
>>> shuffled = ReplayOrder(log, seed=1)
>>> [shuffled.source_prompt_id(p.prompt_id) for p in shuffled.prompts]
[10, 12, 11]
>>> shuffled.sample(2, 4)
Traceback (most recent call last):
...
pipeline.replay.order.NotReplayable: replayed prompt 2 (log group 1) was asked for sample 4, past the 4 recorded; record more samples per prompt (run.py record --samples) or cap the gate's group at 4
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.seeding import derive_seed
from pipeline.store.grouplog import GroupLog, RecordedGroup, RecordedSample
from pipeline.types import Prompt


class NotReplayable(RuntimeError):
    """A request the log cannot answer without inventing a sample: past a group's recorded K,
    or an intervention that needs new text (a branch, guidance)."""


@dataclass(frozen=True)
class ReplayOrder:
    """The prompt order and each group's sample order of one replay (see the module docstring)."""

    log: GroupLog
    seed: int = 0
    _groups: tuple[RecordedGroup, ...] = field(init=False, repr=False)
    _prompts: tuple[Prompt, ...] = field(init=False, repr=False)
    _orders: dict[int, tuple[RecordedSample, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        groups = self.log.groups
        if self.seed:
            rng = np.random.default_rng(derive_seed(self.seed, "replay", "prompts"))
            groups = tuple(groups[i] for i in rng.permutation(len(groups)))
        object.__setattr__(self, "_groups", groups)
        prompts = tuple(
            Prompt(
                prompt_id=i,
                text=g.prompt_text,
                token_ids=(),
                answer=g.answer,
                difficulty=g.difficulty if g.difficulty is not None else 0.0,
                success_threshold=g.success_threshold,
            )
            for i, g in enumerate(groups)
        )
        object.__setattr__(self, "_prompts", prompts)
        object.__setattr__(self, "_orders", {})

    @property
    def prompts(self) -> tuple[Prompt, ...]:
        """The replayed prompts, in the order a gate's prompt pool is given them."""
        return self._prompts

    def group(self, prompt_id: int) -> RecordedGroup:
        """The recorded group behind a replayed prompt."""
        return self._groups[prompt_id]

    def source_prompt_id(self, prompt_id: int) -> int:
        """The log's prompt id of a replayed prompt."""
        return self._groups[prompt_id].prompt_id

    def reference_logprob(self, prompt_id: int) -> float | None:
        return self._groups[prompt_id].reference_logprob

    def sample_order(self, prompt_id: int) -> tuple[RecordedSample, ...]:
        """The group's samples in the order its requests are served."""
        cached = self._orders.get(prompt_id)
        if cached is not None:
            return cached
        group = self._groups[prompt_id]
        samples = group.in_finish_order()
        if self.seed:
            rng = np.random.default_rng(derive_seed(self.seed, "replay", "samples", group.group_id))
            samples = tuple(samples[i] for i in rng.permutation(len(samples)))
        self._orders[prompt_id] = samples
        return samples

    def sample(self, prompt_id: int, k: int) -> RecordedSample:
        """The recorded sample that answers the group's k-th request (0-based)."""
        samples = self.sample_order(prompt_id)
        if not 0 <= k < len(samples):
            group = self._groups[prompt_id]
            raise NotReplayable(
                f"replayed prompt {prompt_id} (log group {group.group_id}) was asked for sample {k}, past the "
                f"{len(samples)} recorded; record more samples per prompt (run.py record --samples) or cap the "
                f"gate's group at {len(samples)}"
            )
        return samples[k]
