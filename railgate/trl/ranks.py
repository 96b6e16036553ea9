"""Work split over TRL's processes: equal shares, and every rank seeing every result.

TRL's collectives (``accelerator.gather`` of rewards and lengths, vLLM's server request) need
every process to bring the same number of rows. A round's rows are cut into ``processes``
contiguous shares of equal length; when they do not divide, whole copies of the last run of
identical prompts are appended (*fillers*: generated and paid for, then dropped), so a run of a
prompt's samples stays one run in the gathered order, as vLLM's server mode groups them.
Every rank then gathers every share, so all ranks hold the same results and the gate, which
runs on each rank, makes the same decisions (``digest`` checks that they did).

>>> split = Split.of(runs=3, run_length=1, processes=2)        # 3 rows over 2 ranks: one filler
>>> split.rows, split.fillers, split.local(0), split.local(1)
(4, 1, range(0, 2), range(2, 4))
>>> Split.of(runs=2, run_length=3, processes=2).fillers          # 6 rows divide: none
0
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from accelerate.utils import gather_object


@dataclass(frozen=True)
class Split:
    """``runs`` runs of ``run_length`` rows (plus ``fillers`` filler rows in whole runs) cut into
    ``processes`` equal contiguous shares."""

    runs: int
    run_length: int
    processes: int
    fillers: int

    @classmethod
    def of(cls, runs: int, run_length: int, processes: int) -> Split:
        extra = 0
        while ((runs + extra) * run_length) % processes:
            extra += 1
        return cls(runs, run_length, processes, extra * run_length)

    @property
    def rows(self) -> int:
        """Rows generated, fillers included."""
        return self.runs * self.run_length + self.fillers

    @property
    def share(self) -> int:
        return self.rows // self.processes

    def local(self, rank: int) -> range:
        """The rows rank ``rank`` generates."""
        return range(rank * self.share, (rank + 1) * self.share)


def padded(items: Sequence[Any], processes: int) -> list[Any]:
    """``items`` with copies of the last one appended until their count divides by ``processes``
    (at least one item each); for per-row work with no runs (scoring references)."""
    items = list(items)
    while len(items) % processes or len(items) < processes:
        items.append(items[-1])
    return items


def rank_share(items: Sequence[Any], processes: int, index: int) -> list[Any]:
    """Rank ``index``'s equal share of ``padded(items, processes)``, in order.

    >>> [rank_share([1, 2, 3], 2, i) for i in range(2)]
    [[1, 2], [3, 3]]
    """
    everyone = padded(items, processes)
    share = len(everyone) // processes
    return everyone[index * share : (index + 1) * share]


def gather_all(local: list[Any]) -> list[Any]:
    """Every rank's ``local`` list, concatenated in rank order, on every rank."""
    return list(gather_object(local))


def digest(*parts: object) -> str:
    """A short fingerprint of what a rank decided (compared across ranks)."""
    return hashlib.blake2b(repr(parts).encode(), digest_size=8).hexdigest()
