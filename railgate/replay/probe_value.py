"""``bench replay``'s probe line: what probing would do on a log, measured on its whole groups.

SARA's probe pays only where the pass rates leave many groups all-same *and* an all-same probe
rarely hides a mixed group. Both are facts about the log, with no model of the rates: each
recorded group's first ``group_size`` samples (as recorded) are a whole group, and for each probe
size ``k`` the chance that ``k`` of them drawn at random look all-same is exact
(``controller.probing.empirical_probe``, the figure ``probe_when: pays`` licenses probing by).
Per ``k`` the line gives probing's mixed groups per rollout over whole groups' (one-shot: an
all-same probe is abandoned, any other group finished) and the share of mixed groups it abandons.

>>> from pipeline.store.grouplog import GroupLog, RecordedGroup
>>> from pipeline.replay.order import ReplayOrder
>>> groups = [RecordedGroup.of(g, g, (1,) * (4 * (g % 2)) + (0,) * (8 - 4 * (g % 2))) for g in range(40)]
>>> rows = probe_value(ReplayOrder(GroupLog(tuple(groups), ("demo",))), group_size=8)
>>> [(r["probe_size"], round(r["gain"], 2), round(r["lost"], 3)) for r in rows][:3]
[(2, 1.23, 0.429), (3, 1.33, 0.143), (4, 1.31, 0.029)]
>>> probe_line(rows).startswith("probing, measured on the log's whole groups of 8")
True
"""

from __future__ import annotations

from typing import Any

from controller.probing import empirical_probe
from pipeline.replay.order import ReplayOrder


def probe_value(order: ReplayOrder, group_size: int) -> list[dict[str, Any]]:
    """Per probe size 2 .. ``group_size - 1`` (a probe of one sample is always all-same): ``gain`` (probing's mixed groups per rollout over
    whole groups') and ``lost`` (the share of mixed groups an all-same probe abandons), on the
    first ``group_size`` samples of each of ``order``'s groups."""
    successes = []
    for p in order.prompts:
        threshold = order.group(p.prompt_id).success_threshold
        successes.append(sum(s.reward > threshold for s in order.sample_order(p.prompt_id)[:group_size]))
    rows = []
    for k in range(2, group_size):
        got = empirical_probe(successes, group_size, k)
        rows.append({"probe_size": k, "gain": got.gain, "lost": got.lost})
    return rows


def probe_line(rows: list[dict[str, Any]]) -> str:
    """The report's line, one entry per probe size."""
    parts = [f"k={r['probe_size']}: {r['gain']:.2f}x, {100 * r['lost']:.0f}% lost" for r in rows]
    size = len(rows) + 2
    return (
        f"probing, measured on the log's whole groups of {size} (probe k, abandon an all-same probe; "
        f"mixed groups per rollout x whole groups, share of mixed groups abandoned): " + "; ".join(parts)
    )
