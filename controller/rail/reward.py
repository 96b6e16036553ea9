"""The reward of one RAIL decision: realised variance gain of the group minus its cost.

``reward = gain - cost_lambda * tokens / rollout_tokens``, computed when the group closes.
The cost is priced in the budget's unit, rollout-equivalents: the decision's tokens divided
by the run's mean tokens per rollout (``rollout_tokens``, the controller's running mean of
response lengths). One ``cost_lambda`` then means the same on 5-token answers and on
50-token scratchpads: an intervention pays when its variance gain beats ``cost_lambda`` per
rollout it costs (docs/methods.md, "RAIL's price").

* **no-op**: 0 by construction (nothing launched, nothing changed);
* **rescue** (the intervention replaced the gate's ABANDON): without it the group would have
  been dropped and taught nothing, so the counterfactual variance is 0 and the gain is the
  final group's reward variance if it shipped (0 if it was dropped anyway). Every token the
  group generated after the decision is charged: without the rescue none would exist;
* **extend / token** (samples added to a group the gate kept): the gain is
  ``var(final rewards) - var(final rewards without the samples whose origin is this decision)``
  (0 for a dropped group, which trains nothing), and the cost is the arm's expected tokens,
  capped by what the group actually generated after the decision (samples of a group dropped
  early are aborted, or never start).

Variances are population variances (``np.var``); fewer than two rewards have variance 0.
Samples that failed or were aborted carry no reward and so add no variance.

>>> round(variance_gain((0.0, 0.0, 1.0, 0.0), (-1, -1, 7, 7), decision_id=7), 4)
0.1875
>>> decision_reward("rescue", (0.0, 0.0, 1.0, 0.0), (-1, -1, 7, 7), 7, committed=True,
...                 expected_tokens=300.0, tokens_since=400, cost_lambda=0.02, rollout_tokens=100.0)
(0.1075, 0.1875, 400)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def variance(rewards: Sequence[float]) -> float:
    """Population variance of ``rewards`` (0 for fewer than two)."""
    return float(np.var(np.asarray(rewards, dtype=float))) if len(rewards) >= 2 else 0.0


def variance_gain(rewards: Sequence[float], origins: Sequence[int], decision_id: int) -> float:
    """Variance of all ``rewards`` minus that of the rewards not made by ``decision_id``."""
    if len(origins) != len(rewards):
        raise ValueError(
            f"{len(origins)} origins for {len(rewards)} rewards; GroupSnapshot.origins must have one entry per reward"
        )
    rest = [r for r, o in zip(rewards, origins) if o != decision_id]
    return variance(rewards) - variance(rest)


def decision_reward(
    point: str,
    rewards: Sequence[float],
    origins: Sequence[int],
    decision_id: int,
    committed: bool,
    expected_tokens: float,
    tokens_since: int,
    cost_lambda: float,
    rollout_tokens: float,
    noop: bool = False,
) -> tuple[float, float, int]:
    """``(reward, gain, tokens)`` of a decision; see the module docstring for each case.
    ``rollout_tokens``: mean tokens per rollout (at least 1 is used)."""
    if noop:
        return 0.0, 0.0, 0
    tokens_since = max(int(tokens_since), 0)
    if point == "rescue":
        gain = variance(rewards) if committed else 0.0
        tokens = tokens_since
    else:
        gain = variance_gain(rewards, origins, decision_id) if committed else 0.0
        tokens = int(min(math.ceil(expected_tokens), tokens_since))
    return gain - cost_lambda * tokens / max(float(rollout_tokens), 1.0), gain, tokens
