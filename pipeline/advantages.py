"""Group-relative advantage estimators over variable-size groups: the run's one advantage function.

``compute_advantages`` is the only place advantages are computed: a learner (``learner.torch_learner``)
calls it once per step and reports what it computed in its ``StepResult.advantages``, which
``pipeline.shells.learning`` writes to the buffer as it is. It lives in pipeline/ so that every learner
(of learner/, of pipeline/, of a benchmark) may import it.

Every function takes the groups of one train batch, each either a ``CommittedGroup`` or a
plain sequence of rewards, and returns one tuple of advantages per group, aligned with the
group's rollouts. Groups may differ in size (HORA gives G0 + m_i rollouts to prompt i; SARA
and Pilot-Commit groups vary too); each group is normalised on its own statistics only.
Rewards need not be binary.

A group of one rollout has no baseline to compare against: its advantage is 0 under every
estimator (the same as a saturated group), never NaN.

>>> groups = [(1.0, 0.0, 0.0, 1.0), (1.0, 1.0), (0.5,), (0.0, 1.0, 0.5)]
>>> _round3(grpo_advantages(groups))[0]
(0.866, -0.866, -0.866, 0.866)
>>> drgrpo_advantages(groups)[3], rloo_advantages(groups)[3]
((-0.5, 0.5, 0.0), (-0.75, 0.75, 0.0))
>>> saturated_mask(groups)
(False, True, True, False)

(The doctest outputs are rounded by ``_round3`` below only to keep them short.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from pipeline.types import CommittedGroup

GroupLike = CommittedGroup | Sequence[float]
Advantages = tuple[tuple[float, ...], ...]


def _rewards(group: GroupLike) -> tuple[float, ...]:
    values = group.rewards if isinstance(group, CommittedGroup) else tuple(group)
    out = tuple(float(r) for r in values)
    for r in out:
        if not math.isfinite(r):
            raise ValueError(
                f"reward {r} is not finite; reward functions must return finite numbers (0/1 for verifiable tasks)"
            )
    return out


def _is_saturated(rewards: tuple[float, ...]) -> bool:
    return len(rewards) < 2 or max(rewards) == min(rewards)


def _std(rewards: tuple[float, ...], mean: float, ddof: int) -> float:
    n = len(rewards)
    if n - ddof <= 0:
        return 0.0
    return math.sqrt(sum((r - mean) ** 2 for r in rewards) / (n - ddof))


def _per_group(
    groups: Sequence[GroupLike], advantages_of: Callable[[tuple[float, ...]], tuple[float, ...]]
) -> Advantages:
    """``advantages_of(rewards)`` for each group with a reward spread; a saturated group gets
    exactly 0 (not a rounding residue of ``mean(r) - r`` over eps, and never 0/0)."""
    out = []
    for group in groups:
        rewards = _rewards(group)
        out.append((0.0,) * len(rewards) if _is_saturated(rewards) else advantages_of(rewards))
    return tuple(out)


def grpo_advantages(groups: Sequence[GroupLike], eps: float = 1e-6, ddof: int = 1) -> Advantages:
    """(r - mean) / (std + eps) within each group; ``ddof=1`` is the sample std.

    >>> _round3(grpo_advantages([(1.0, 0.0)], ddof=0))
    ((1.0, -1.0),)
    >>> grpo_advantages([(3.0,), (2.0, 2.0, 2.0)])
    ((0.0,), (0.0, 0.0, 0.0))
    """

    def normalised(rewards: tuple[float, ...]) -> tuple[float, ...]:
        mean = math.fsum(rewards) / len(rewards)
        scale = _std(rewards, mean, ddof) + eps
        return tuple((r - mean) / scale for r in rewards)

    return _per_group(groups, normalised)


def drgrpo_advantages(groups: Sequence[GroupLike]) -> Advantages:
    """r - mean within each group (Dr.GRPO: no division by the std).

    >>> drgrpo_advantages([(1.0, 0.0, 0.0, 0.0)])
    ((0.75, -0.25, -0.25, -0.25),)
    """

    def centred(rewards: tuple[float, ...]) -> tuple[float, ...]:
        mean = math.fsum(rewards) / len(rewards)
        return tuple(r - mean for r in rewards)

    return _per_group(groups, centred)


def rloo_advantages(groups: Sequence[GroupLike]) -> Advantages:
    """r_j minus the mean of the group's *other* n - 1 rewards (leave-one-out baseline).

    Equal to n / (n - 1) times the Dr.GRPO advantage.

    >>> _round3(rloo_advantages([(1.0, 0.0, 0.0, 0.0), (1.0,)]))
    ((1.0, -0.333, -0.333, -0.333), (0.0,))
    """

    def leave_one_out(rewards: tuple[float, ...]) -> tuple[float, ...]:
        total, n = math.fsum(rewards), len(rewards)
        return tuple(r - (total - r) / (n - 1) for r in rewards)

    return _per_group(groups, leave_one_out)


def saturated_mask(groups: Sequence[GroupLike]) -> tuple[bool, ...]:
    """True for each group whose rewards are all equal (size-1 groups included): its
    advantages are 0 under every estimator and it carries no policy gradient.

    >>> saturated_mask([(0.0, 0.0), (0.0, 1.0), (1.0,)])
    (True, False, True)
    """
    return tuple(_is_saturated(_rewards(group)) for group in groups)


ESTIMATORS: dict[str, Callable[..., Advantages]] = {
    "grpo": grpo_advantages,
    "drgrpo": drgrpo_advantages,
    "rloo": rloo_advantages,
}


def compute_advantages(groups: Sequence[GroupLike], algorithm: str, eps: float = 1e-6, ddof: int = 1) -> Advantages:
    """Dispatch on the estimator name of ``LearnerConfig.algorithm``.

    >>> compute_advantages([(1.0, 0.0)], "drgrpo")
    ((0.5, -0.5),)
    """
    if algorithm == "grpo":
        return grpo_advantages(groups, eps=eps, ddof=ddof)
    if algorithm not in ESTIMATORS:
        raise ValueError(
            f"algorithm={algorithm!r} is not one of {', '.join(map(repr, ESTIMATORS))}; set learner.algorithm"
        )
    return ESTIMATORS[algorithm](groups)


def _round3(advantages: Advantages) -> Advantages:
    """Advantages rounded to 3 decimals (for short doctest output)."""
    return tuple(tuple(round(a, 3) for a in group) for group in advantages)
