"""Latency of the tracker's decision hooks, for ``bench overhead``.

One timing covers what a finished sample costs in decisions: the group's snapshot, the gate's
``update`` and the controller's ``on_group``. The last ``capacity`` timings are kept in a ring.

>>> timer = HookTimer(capacity=2)
>>> for ns in (1000, 3000, 2000):
...     timer.record(ns)
>>> timer.calls, sorted(timer.samples), timer.percentile_us(50)
(3, [2000, 3000], 3.0)
"""

from __future__ import annotations

import math


class HookTimer:
    """Decision-hook latencies in nanoseconds, in a bounded ring of the last ``capacity`` calls."""

    def __init__(self, capacity: int = 200_000):
        self.capacity = capacity
        self.samples: list[int] = []
        self.calls = 0

    def record(self, ns: int) -> None:
        if len(self.samples) < self.capacity:
            self.samples.append(ns)
        else:
            self.samples[self.calls % self.capacity] = ns
        self.calls += 1

    def percentile_us(self, q: float) -> float:
        """The ``q``-th percentile of the kept timings, in microseconds (nan when none)."""
        if not self.samples:
            return math.nan
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))] / 1000.0
