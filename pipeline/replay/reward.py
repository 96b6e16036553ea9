"""A replayed sample's reward is the one the log recorded for it: ``ServedRewards`` and ``RecordedReward``.

A scorer is called with ``(prompt, token_ids)`` (``pipeline.protocols.Scorer``), which cannot
always tell two samples apart: a log imported from text alone streams placeholder tokens
(``pipeline.engines.replay``), and two samples of one group may write the same tokens yet carry
different recorded rewards (an LLM judge, a noisy verifier). So the replay engine notes every
sample it finishes in a ``ServedRewards`` ledger -- the finished event's token tuple, its prompt
and its recorded reward -- and ``RecordedReward`` reads the reward back from it:

* by identity first: the orchestrator hands the scorer the very tuple the engine put in the
  ``SampleFinished`` (``Orchestrator._scored``), so that sample's reward is found exactly,
  even among samples with equal tokens;
* else by value, (prompt id, tokens), first served first: exact whenever the samples of a group
  with those tokens were recorded with one reward, and otherwise the order the engine finished them.

Each entry is taken once. Aborted and failed samples are never scored, so the engine notes only
samples that complete (``STOP``/``LENGTH``).

>>> from pipeline.types import Prompt
>>> served = ServedRewards()
>>> a, b = tuple([5, 6]), tuple([5, 6])           # equal tokens, two samples
>>> served.note(7, a, 1.0); served.note(7, b, 0.0)
>>> scorer = RecordedReward(served)
>>> scorer(Prompt(7, "", ()), b), scorer(Prompt(7, "", ()), a), len(served)
(0.0, 1.0, 0)
>>> scorer(Prompt(7, "", ()), (9,))
Traceback (most recent call last):
...
pipeline.replay.reward.UnservedSample: the replay engine served no unscored sample of prompt 7 with these 1 tokens; RecordedReward scores only samples a ReplayEngine sharing its ServedRewards produced (build both with railgate.build for engine.kind=replay)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from pipeline.types import Prompt


class UnservedSample(LookupError):
    """``RecordedReward`` was asked to score tokens the replay engine did not serve."""


class ServedRewards:
    """Completed replayed samples waiting to be scored: prompt id and tokens -> recorded rewards."""

    def __init__(self) -> None:
        # (prompt id, tokens) -> the served samples with those tokens, oldest first: (token tuple, reward)
        self._waiting: dict[tuple[int, tuple[int, ...]], deque[tuple[tuple[int, ...], float]]] = {}
        self._count = 0

    def __len__(self) -> int:
        """Samples noted and not yet taken."""
        return self._count

    def note(self, prompt_id: int, token_ids: tuple[int, ...], reward: float) -> None:
        """The engine finished a sample of ``prompt_id`` with ``token_ids`` (the tuple in its
        ``SampleFinished``), recorded with ``reward``."""
        self._waiting.setdefault((prompt_id, token_ids), deque()).append((token_ids, reward))
        self._count += 1

    def take(self, prompt_id: int, token_ids: Sequence[int]) -> float:
        """The recorded reward of the served sample ``token_ids`` (the same tuple if it is one,
        else the first served with equal tokens); it is forgotten."""
        key = (prompt_id, tuple(token_ids))
        queue = self._waiting.get(key)
        if not queue:
            raise UnservedSample(
                f"the replay engine served no unscored sample of prompt {prompt_id} with these {len(key[1])} tokens; "
                "RecordedReward scores only samples a ReplayEngine sharing its ServedRewards produced (build both "
                "with railgate.build for engine.kind=replay)"
            )
        for i, (tokens, recorded) in enumerate(queue):
            if tokens is token_ids:  # this very sample
                reward = recorded
                del queue[i]
                break
        else:
            _, reward = queue.popleft()
        if not queue:
            del self._waiting[key]
        self._count -= 1
        return reward


class RecordedReward:
    """The scorer of a replay: each served sample's recorded reward (module docstring). Pure and
    cheap, so it runs inline, on the event loop, as the simulator's scorer does."""

    runs_inline = True

    def __init__(self, served: ServedRewards):
        self.served = served

    def __call__(self, prompt: Prompt, token_ids: Sequence[int]) -> float:
        return self.served.take(prompt.prompt_id, token_ids)
