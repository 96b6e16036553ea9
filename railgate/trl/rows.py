"""One completion as TRL's batch holds it, and a step's batch laid out in TRL's fixed shape.

TRL's ``GRPOTrainer`` trains on ``prompts x num_generations`` rows, a prompt's rows consecutive
(its advantages come from ``rewards.view(-1, num_generations)``), the global rows cut into equal
contiguous shares, one per process. ``layout`` puts a step's committed groups in that shape:
each group's completions in sample order, then, where a group has fewer than
``num_generations`` (HORA's smaller groups, a completion with no reward), *pad rows* -- a
one-token completion with no reward (NaN), which TRL leaves out of the group's mean and
standard deviation and gives advantage 0 -- and, when a step could not fill every group
(``gate_step_rollouts``), whole groups of pad rows. Pad rows are never generated.

>>> rows = {"g0-s0": Row(3, (1, 2), (7, 9), "a", None, (1.0,)), "g0-s1": Row(3, (1, 2), (8, 9), "b", None, (0.0,))}
>>> out = layout([["g0-s0", "g0-s1"]], rows, group_size=3, prompts=2, pad_token=9, blank="")
>>> [(r.index, r.completion_ids, r.rewards) for r in out]
[(3, (7, 9), (1.0,)), (3, (8, 9), (0.0,)), (3, (9,), (nan,)), (3, (9,), (nan,)), (3, (9,), (nan,)), (3, (9,), (nan,))]
>>> sum(r.is_pad for r in out)
4
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

NO_REWARD = math.nan


@dataclass(frozen=True)
class Row:
    """One completion: the dataset row of its prompt, the prompt's and the completion's token
    ids, the decoded completion (text, or an assistant message list), the sampling log-probs
    of its tokens when the backend reports them (vLLM), and each reward function's reward."""

    index: int
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    completion: Any
    logprobs: tuple[float, ...] | None
    rewards: tuple[float, ...]
    is_pad: bool = False
    extras: tuple[tuple[str, Any], ...] = ()  # what the reward functions logged for it (``log_extra``)

    def as_pad(self, pad_token: int, blank: Any) -> Row:
        """A pad row of this row's prompt: one token, no reward, never generated."""
        logprobs = None if self.logprobs is None else (0.0,)
        return replace(
            self,
            completion_ids=(pad_token,),
            completion=blank,
            logprobs=logprobs,
            rewards=(NO_REWARD,) * len(self.rewards),
            is_pad=True,
            extras=(),
        )


def layout(
    groups: Sequence[Sequence[str]],
    rows: Mapping[str, Row],
    group_size: int,
    prompts: int,
    pad_token: int,
    blank: Any,
    filler: Row | None = None,
) -> list[Row]:
    """The step's ``prompts x group_size`` rows: ``groups`` (each a committed group's request ids in
    sample order) padded to ``group_size``, then whole pad groups of ``filler`` (any row of a
    prompt, for the pad groups of a short step); see the module docstring."""
    out: list[Row] = []
    for ids in groups:
        if len(ids) > group_size:
            raise ValueError(
                f"a committed group holds {len(ids)} completions, more than num_generations={group_size} "
                "slots; the gate must not grow a group past num_generations"
            )
        members = [rows[i] for i in ids]
        out += members + [members[0].as_pad(pad_token, blank)] * (group_size - len(members))
    missing = prompts - len(groups)
    if missing < 0:
        raise ValueError(f"{len(groups)} committed groups do not fit a step of {prompts} prompts")
    if missing:
        source = out[0] if out else filler
        if source is None:
            raise ValueError("a step with no committed group needs a filler row for its pad groups")
        out += [source.as_pad(pad_token, blank)] * (missing * group_size)
    return out


def local_share(rows: Sequence[Row], rank: int, processes: int) -> list[Row]:
    """Rank ``rank``'s contiguous share of the global rows (TRL slices advantages the same way)."""
    share, rest = divmod(len(rows), processes)
    if rest:
        raise ValueError(f"{len(rows)} rows do not split into {processes} equal shares")
    return list(rows[rank * share : (rank + 1) * share])


def scalar_reward(rewards: Sequence[float], weights: Sequence[float]) -> float:
    """The reward the gate sees: the weighted sum of the reward functions' rewards, skipping the
    ones that gave none (as TRL sums them); NaN when none gave one.

    >>> scalar_reward([1.0, math.nan], [1.0, 2.0]), scalar_reward([math.nan], [1.0])
    (1.0, nan)
    """
    present = [(r, w) for r, w in zip(rewards, weights) if not math.isnan(r)]
    if not present:
        return NO_REWARD
    return math.fsum(r * w for r, w in present)
