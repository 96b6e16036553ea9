"""HORA's budget split: how many extra rollouts each probed prompt of a batch gets.

Every prompt i was probed with ``G0_i`` rollouts and had ``s_i`` successes, so its success
probability has the posterior Beta(a_i, b_i) = Beta(a0 + s_i, b0 + G0_i - s_i). Giving it m more
rollouts buys the hit utility ``U_i(m) = 1 - B(a_i, b_i + m) / B(a_i, b_i)`` (the chance that at
least one of them succeeds), and HORA maximises ``sum_i U_i(m_i)`` subject to ``sum_i m_i = R``.

The (l+1)-th extra rollout of prompt i adds

    D_i(l) = U_i(l + 1) - U_i(l) = B(a_i + 1, b_i + l) / B(a_i, b_i)
           = a_i / (a_i + b_i) * prod_{j < l} (b_i + j) / (a_i + b_i + 1 + j),

which never grows with l: every U_i is concave, so handing out rollouts one at a time to the
largest current D_i (a heap, O(R log n)) reaches the optimum. Ties go to the lowest prompt index.
With a cap on each prompt's extra rollouts (a trainer whose groups have a fixed number of slots)
the same greedy stays optimal: a prompt at its cap leaves the heap, and what no prompt can take
is left unspent.
D_i is kept in log space and advanced by one factor per rollout, which costs O(1) and keeps full
precision for any count.

>>> hora_allocate([0, 0, 1, 2, 2, 3, 4, 4], probes=4, budget=96)
[25, 24, 15, 9, 9, 6, 4, 4]
"""

from __future__ import annotations

import heapq
import math
import numbers
from collections.abc import Sequence
from typing import Any

from controller.posterior import UNIFORM_PRIOR, _count, _prior, hit_utility

__all__ = ["hora_allocate", "hora_posteriors", "total_hit_utility"]


def hora_posteriors(
    successes: Sequence[int],
    probes: int | Sequence[int],
    prior: tuple[float, float] = UNIFORM_PRIOR,
) -> list[tuple[float, float]]:
    """Beta posteriors ``(a0 + s_i, b0 + G0_i - s_i)`` of a probed batch, validated.

    ``probes`` is one probe size for every prompt or one per prompt.

    >>> hora_posteriors([0, 3], probes=4)
    [(1.0, 5.0), (4.0, 2.0)]
    >>> hora_posteriors([1, 2], probes=[2, 8], prior=(0.5, 0.5))
    [(1.5, 1.5), (2.5, 6.5)]
    """
    a0, b0 = _prior(prior)
    counts = list(successes)
    if not counts:
        raise ValueError(
            "successes is empty; HORA allocates over a batch of probed prompts, pass one success count per prompt"
        )
    if isinstance(probes, (int, numbers.Real)):  # one size for every prompt (numpy integers too)
        sizes = [probes] * len(counts)
    else:
        sizes = list(probes)
        if len(sizes) != len(counts):
            raise ValueError(
                f"probes has {len(sizes)} entries but successes has {len(counts)}; pass one "
                f"probe size per prompt, or a single int for all of them"
            )
    posteriors = []
    for i, (given_s, given_g) in enumerate(zip(counts, sizes)):
        s = _count(f"successes[{i}]", given_s)
        g = _count(f"probes[{i}]", given_g)
        if s > g:
            raise ValueError(
                f"successes[{i}]={s} exceeds its probe size {g}; a probe of {g} rollouts has at most {g} successes"
            )
        posteriors.append((a0 + s, b0 + (g - s)))
    return posteriors


def _log_first_gain(a: float, b: float) -> float:
    """log D(0) = log(a / (a + b)): the posterior mean, the value of a single extra rollout."""
    return math.log(a / (a + b))


def _log_gain_step(a: float, b: float, level: int) -> float:
    """log D(level + 1) - log D(level) = log((b + level) / (a + b + 1 + level)), < 0."""
    total = a + b + 1.0 + level
    factor = (b + level) / total
    # log1p near 1 and log away from it: neither loses digits to cancellation.
    return math.log1p(-(a + 1.0) / total) if factor > 0.5 else math.log(factor)


def hora_allocate(
    successes: Sequence[int],
    probes: int | Sequence[int],
    budget: int,
    prior: tuple[float, float] = UNIFORM_PRIOR,
    cap: int | Sequence[int] | None = None,
) -> list[int]:
    """Split ``budget`` extra rollouts over a probed batch to maximise the total hit utility.

    Parameters
    ----------
    successes
        Probe successes ``s_i`` per prompt.
    probes
        Probe size ``G0_i``: one int for all prompts, or one per prompt.
    budget
        Extra rollouts ``R`` to hand out (compute-matched to GRPO: ``B*G - B*G0``).
    prior
        Beta prior ``(a0, b0)``; uniform by default, as the paper recommends.
    cap
        Most extra rollouts a prompt may get: one int for all prompts, or one per prompt; None:
        no limit (the paper's rule).

    Returns
    -------
    list[int]
        Extra rollouts ``m_i`` per prompt, summing to ``budget`` (less only when the caps cannot
        take it all). Equal prompts differ by at most one rollout, the lower index getting the
        larger share.

    Examples
    --------
    Uncertain prompts (no success yet) get the most; a prompt that already succeeds needs
    few more to produce another success.

    >>> hora_allocate([0, 2, 4], probes=4, budget=12)
    [6, 4, 2]
    >>> hora_allocate([1, 1], probes=[2, 8], budget=0)
    [0, 0]
    >>> hora_allocate([0, 2, 4], probes=4, budget=12, cap=4)    # at most 4 + 4: the first prompt's 6 shrink
    [4, 4, 4]
    >>> hora_allocate([0, 4], probes=4, budget=12, cap=[4, 1])  # the caps leave 7 unspent
    [4, 1]
    """
    posteriors = hora_posteriors(successes, probes, prior)
    if isinstance(budget, numbers.Real) and budget < 0:
        raise ValueError(
            f"budget={budget} is negative; it counts the extra rollouts left after the probes "
            f"(B*G - B*G0 when compute-matched to GRPO), so pass 0 or more"
        )
    budget = _count("budget", budget)
    caps = _caps(cap, len(posteriors))
    extra = [0] * len(posteriors)
    # Max-heap of (-log D_i(current level), i); tuple order breaks gain ties by lowest index.
    heap = [(-_log_first_gain(a, b), i) for i, (a, b) in enumerate(posteriors) if caps[i] > 0]
    heapq.heapify(heap)
    for _ in range(budget):
        if not heap:
            break  # every prompt is at its cap
        neg_log_gain, i = heapq.heappop(heap)
        a, b = posteriors[i]
        level = extra[i]
        extra[i] = level + 1
        if level + 1 < caps[i]:
            heapq.heappush(heap, (neg_log_gain - _log_gain_step(a, b, level), i))
    return extra


def _caps(cap: int | Sequence[int] | None, n: int) -> list[float]:
    """Per-prompt caps on extra rollouts (inf: none), validated."""
    if cap is None:
        return [math.inf] * n
    caps: list[Any] = [cap] * n if isinstance(cap, numbers.Real) else list(cap)  # type: ignore[arg-type]
    if len(caps) != n:
        raise ValueError(f"cap has {len(caps)} entries but successes has {n}; pass one cap per prompt, or a single int")
    return [_count(f"cap[{i}]", c) for i, c in enumerate(caps)]


def total_hit_utility(
    successes: Sequence[int],
    probes: int | Sequence[int],
    extra: Sequence[int],
    prior: tuple[float, float] = UNIFORM_PRIOR,
) -> float:
    """HORA's objective ``sum_i U_i(m_i)`` for an allocation ``extra`` of a probed batch.

    >>> round(total_hit_utility([0, 4], probes=4, extra=[1, 1]), 6)   # 1/6 + 5/6
    1.0
    """
    posteriors = hora_posteriors(successes, probes, prior)
    extra = list(extra)
    if len(extra) != len(posteriors):
        raise ValueError(
            f"extra has {len(extra)} entries but successes has {len(posteriors)}; pass one allocation per prompt"
        )
    return math.fsum(
        hit_utility(a, b, _count(f"extra[{i}]", m)) for i, ((a, b), m) in enumerate(zip(posteriors, extra))
    )
