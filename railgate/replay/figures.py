"""What one replay of a gate did to each recorded group, as numbers per log group.

``prompt_figures`` turns one gate's ``PromptOutcome``\\ s under one ``ReplayOrder`` into arrays
indexed by the group's position in the log (so replays under different orders line up, and
their figures can be averaged per group before prompts are resampled, ``railgate.replay.bootstrap``):

* ``samples``, ``tokens``: what the group cost;
* ``opened``, ``committed``, ``abandoned``;
* ``informative``: committed, and the samples it was trained on (its *served* samples: every
  sample a committed group launched finishes) hold a success and a failure;
* ``served_same``: committed with all-same served samples (a zero-advantage group trained on);
  ``full_same``: committed though its full group (the first ``group_size`` samples of the order,
  what a whole group would have been) is all-same; with ``group_size`` = K both are the same;
* ``full_mixed``: that full group is mixed; ``wrong_abandon``: abandoned though it is;
  ``skipped_mixed``: never opened (a screen or the oracle's draw passed it over) though it is;
* ``decided_at``: samples ended at the gate's first verdict (0: none);
* ``pass_rate``: the recorded group's success fraction over all K samples.

>>> from pipeline.store.grouplog import GroupLog, RecordedGroup
>>> from pipeline.replay.order import ReplayOrder
>>> log = GroupLog((RecordedGroup.of(0, 0, (0, 0, 1, 1)), RecordedGroup.of(1, 1, (1, 1, 1, 1))), ("demo",))
>>> outcomes = [PromptOutcome(0, True, "abandoned", 2, 16, 2), PromptOutcome(1, True, "committed", 4, 32, 4)]
>>> f = prompt_figures(ReplayOrder(log), outcomes, group_size=4)
>>> f["wrong_abandon"].tolist(), f["served_same"].tolist(), f["informative"].tolist()
([1.0, 0.0], [0.0, 1.0], [0.0, 0.0])
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipeline.replay.order import ReplayOrder
from pipeline.replay.outcome import PromptOutcome

FIELDS = (
    "samples",
    "tokens",
    "opened",
    "committed",
    "abandoned",
    "informative",
    "served_same",
    "full_same",
    "full_mixed",
    "wrong_abandon",
    "skipped_mixed",
    "decided_at",
    "pass_rate",
)


def log_index(order: ReplayOrder) -> np.ndarray:
    """For each replayed prompt, its group's position in the log."""
    position = {g.group_id: i for i, g in enumerate(order.log.groups)}
    return np.array([position[order.group(p.prompt_id).group_id] for p in order.prompts], dtype=np.int64)


def prompt_figures(order: ReplayOrder, outcomes: Sequence[PromptOutcome], group_size: int) -> dict[str, np.ndarray]:
    """The module docstring's figures, one entry per log group (in log order)."""
    n = len(order.prompts)
    if len(outcomes) != n or any(o.prompt_id != i for i, o in enumerate(outcomes)):
        raise ValueError(f"expected one outcome per replayed prompt 0 .. {n - 1}, in order; got {len(outcomes)}")
    rows = np.zeros((len(FIELDS), n))
    for o in outcomes:
        group = order.group(o.prompt_id)
        threshold = group.success_threshold
        ordered = order.sample_order(o.prompt_id)
        full = sum(s.reward > threshold for s in ordered[:group_size])
        full_mixed = 0 < full < group_size
        committed = o.verdict == "committed"
        served_same = informative = False
        if committed:
            wins = sum(s.reward > threshold for s in ordered[: o.samples])
            informative = 0 < wins < o.samples
            served_same = not informative
        abandoned = o.verdict == "abandoned"
        rows[:, o.prompt_id] = (
            o.samples,
            o.tokens,
            o.opened,
            committed,
            abandoned,
            informative,
            served_same,
            committed and not full_mixed,
            full_mixed,
            abandoned and full_mixed,
            not o.opened and full_mixed,
            o.decided_at,
            group.successes / group.size,
        )
    at = log_index(order)
    out = {}
    for name, row in zip(FIELDS, rows):
        column = np.empty(n)
        column[at] = row
        out[name] = column
    return out


def fill_cost(
    outcomes: Sequence[PromptOutcome], informative: np.ndarray, batch: int, walk: Sequence[int] | None = None
) -> tuple[float, float, int]:
    """Rollouts and tokens it took to fill a learner step of ``batch`` informative groups, walking
    the outcomes (``informative`` per replayed prompt, in the same order) in the order of ``walk``
    (the prompts in the order their groups opened; default: replay order; a prompt never opened
    costs nothing, wherever it stands): the mean over the steps filled, and how many were (nan,
    nan, 0 when none was).

    >>> outs = [PromptOutcome(i, True, "committed", 4, 40, 4) for i in range(5)]
    >>> fill_cost(outs, np.array([1, 0, 1, 1, 1]), batch=2)
    (10.0, 100.0, 2)
    >>> fill_cost(outs, np.array([1, 0, 1, 1, 1]), batch=2, walk=[0, 2, 1, 3, 4])
    (10.0, 100.0, 2)
    >>> fill_cost(outs, np.array([1, 0, 1, 1, 1]), batch=2, walk=[0, 2, 3, 4, 1])
    (8.0, 80.0, 2)
    """
    rollouts = tokens = 0.0
    found = filled = 0
    at_rollouts = at_tokens = 0.0
    for i in walk if walk is not None else range(len(outcomes)):
        o, good = outcomes[i], informative[i]
        rollouts += o.samples
        tokens += o.tokens
        if good:
            found += 1
            if found % batch == 0:
                filled += 1
                at_rollouts, at_tokens = rollouts, tokens
    if not filled:
        return float("nan"), float("nan"), 0
    return at_rollouts / filled, at_tokens / filled, filled


def in_replay_order(figures: dict[str, np.ndarray], order: ReplayOrder, name: str) -> np.ndarray:
    """A figure (per log group) back in the order's replay order."""
    return figures[name][log_index(order)]
