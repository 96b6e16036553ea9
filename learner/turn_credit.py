"""Turn-level credit for multi-turn episodes: each turn's tokens also learn from that turn's reward.

An episode's advantage (``learner.algorithm`` over the group's episode rewards) says how the
whole episode did. In an environment that checks every step, that single number credits a
wrong first attempt inside an episode that later succeeded, and blames a right step inside an
episode that failed further on. With ``learner.turn_credit = w > 0`` a token of turn ``t``
trains on

    A_token = A_episode + w * (r_t - mean) / (std + eps)

where ``r_t`` is the environment's reward for turn ``t`` and mean and std are taken over every
turn of every episode of the group: GRPO's group-relative advantage (``pipeline.advantages``,
the run's one advantage function) over the group's turns, as it is over whole episodes.
Observation tokens stay out of the loss (their value is never read); rollouts without turns
(single-turn tasks) keep their one advantage, so ``w = 0`` and single-turn runs are unchanged.

>>> from pipeline.types import Turns
>>> right_then_wrong = Turns(ends=(2, 5), rewards=(1.0, 0.0), policy_mask=(True, True, False, True, True))
>>> wrong_then_right = Turns(ends=(2, 5), rewards=(0.0, 1.0), policy_mask=(True, True, False, True, True))
>>> per_turn = turn_advantages([right_then_wrong, wrong_then_right])
>>> [tuple(round(a, 3) for a in t) for t in per_turn]
[(0.866, -0.866), (-0.866, 0.866)]
>>> [round(float(a), 3) for a in token_advantages(0.5, wrong_then_right, per_turn[1], weight=1.0)]
[-0.366, -0.366, 0.5, 1.366, 1.366]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipeline.advantages import grpo_advantages
from pipeline.types import Turns


def turn_advantages(
    episodes: Sequence[Turns | None], eps: float = 1e-6, ddof: int = 1
) -> list[tuple[float, ...] | None]:
    """Per episode, per turn: the turn's reward standardised over all turns of the group (None
    for a rollout without turns; all zeros when every turn of the group earned the same). The
    run's advantage function does the standardising: ``pipeline.advantages.grpo_advantages``
    over one group, the group's turns pooled, split back into episodes."""
    (pooled,) = grpo_advantages([[r for t in episodes if t is not None for r in t.rewards]], eps=eps, ddof=ddof)
    out: list[tuple[float, ...] | None] = []
    start = 0
    for turns in episodes:
        if turns is None:
            out.append(None)
            continue
        out.append(pooled[start : start + len(turns.rewards)])
        start += len(turns.rewards)
    return out


def token_advantages(episode: float, turns: Turns, per_turn: Sequence[float], weight: float) -> np.ndarray:
    """One advantage per response token: the episode's, plus ``weight`` times its turn's
    (observation tokens get the episode's alone; the loss never reads them)."""
    out = np.full(len(turns.policy_mask), episode, dtype=np.float32)
    start = 0
    for end, adv in zip(turns.ends, per_turn):
        out[start:end] += weight * adv
        start = end
    mask = np.asarray(turns.policy_mask, dtype=bool)
    out[~mask] = episode
    return out
