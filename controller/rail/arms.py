"""RAIL's arms: the interventions the controller can choose at a decision point.

* ``noop``                      leave the group to the gate (its reward is 0 by construction);
* ``branch(b, T)``              launch b samples that continue a chosen prefix at temperature T;
* ``resample(n, T)``            launch n fresh samples of the prompt at temperature T;
* ``guide(n, l)``               launch n samples that continue the first ``l`` of the prompt's
  reference response (``controller/guidance.py``): offered where a group's samples all failed.

An arm turns into one ``GroupAction`` (``LAUNCH``) carrying the decision id as its ``origin``,
so the samples it launches show up in ``GroupSnapshot.origins`` and its reward can be computed
when the group closes. Each arm has an expected token cost, derived from two context features
(``length_estimate`` and ``prefix_fraction``) so that an offline replay can recompute it from a
logged record.

>>> from pipeline.types import SamplingParams, BranchSpec
>>> arm = parse_arm("branch_b2_t0.7")
>>> arm.kind, arm.n, arm.temperature
('branch', 2, 0.7)
>>> expected_tokens(arm, length_estimate=100.0, prefix_fraction=0.25)
150.0
>>> spec = BranchSpec("g3-s1", 2, (5, 6), (-0.1, -0.2))
>>> [(a.kind.value, a.n, a.params.temperature, a.branch.prefix_len, a.origin)
...  for a in arm.actions(group_id=3, decision_id=11, default=SamplingParams(max_tokens=64), branch=spec)]
[('launch', 2, 0.7, 2, 11)]
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from controller.rail.config import RailConfig
from pipeline.types import ActionKind, BranchSpec, GroupAction, SamplingParams

ArmKind = Literal["noop", "branch", "resample", "guide"]

_NAME = re.compile(r"^(branch)_b(\d+)_t([0-9.eE+-]+)$|^(resample)_n(\d+)_t([0-9.eE+-]+)$|^(guide)_n(\d+)_l([0-9.]+)$")


@dataclass(frozen=True)
class Arm:
    """One intervention: its kind, how many samples it launches, at which temperature, and (a
    guidance arm) the share of the reference its samples continue from."""

    kind: ArmKind
    n: int = 0
    temperature: float = 1.0
    level: float = 0.0
    _name: str = field(default="", init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in ("noop", "branch", "resample", "guide"):
            raise ValueError(f"arm kind={self.kind!r} must be 'noop', 'branch', 'resample' or 'guide'")
        if (self.kind == "guide") != (self.level > 0):
            raise ValueError(
                f"{self.kind} arm with level={self.level}: a guide arm has a level in (0, 1), no other arm has one"
            )
        if self.kind != "noop" and self.n < 1:
            raise ValueError(f"{self.kind} arm with n={self.n}: an intervention launches at least one sample")
        if not self.temperature > 0:
            raise ValueError(f"arm temperature={self.temperature} must be > 0")
        letter = "b" if self.kind == "branch" else "n"
        name = (
            "noop"
            if self.kind == "noop"
            else f"guide_n{self.n}_l{self.level:g}"
            if self.kind == "guide"
            else f"{self.kind}_{letter}{self.n}_t{self.temperature:g}"
        )
        object.__setattr__(self, "_name", name)  # names are looked up on every decision

    @property
    def name(self) -> str:
        """Stable text id, as logged in ``DecisionRecord.actions`` / ``chosen``."""
        return self._name

    @property
    def is_noop(self) -> bool:
        return self.kind == "noop"

    def features(self, cost_tokens: float) -> dict[str, float]:
        """The arm's features (the bandit's action namespace), given its expected token cost."""
        if self.kind == "noop":
            return {"noop": 1.0}
        if self.kind == "guide":
            return {"guide": 1.0, "n": self.n / 4.0, "level": self.level, "cost_k": cost_tokens / 1000.0}
        return {
            self.kind: 1.0,
            "n": self.n / 4.0,
            "temp": self.temperature,
            "temp_dev": self.temperature - 1.0,
            "cost_k": cost_tokens / 1000.0,
        }

    def actions(
        self, group_id: int, decision_id: int, default: SamplingParams, branch: BranchSpec | None = None
    ) -> list[GroupAction]:
        """The ``GroupAction``\\ s that carry out this arm (none for the no-op).

        ``default`` supplies ``top_p`` and ``max_tokens``; the orchestrator sets the seed. A branch
        arm continues ``branch``, a guide arm ``branch`` as its guidance prefix.
        """
        if self.kind == "noop":
            return []
        if self.kind in ("branch", "guide") and branch is None:
            raise ValueError(f"arm {self.name} needs a BranchSpec (the prefix to continue); none was given")
        params = SamplingParams(temperature=self.temperature, top_p=default.top_p, max_tokens=default.max_tokens)
        return [
            GroupAction(
                kind=ActionKind.LAUNCH,
                group_id=group_id,
                n=self.n,
                params=params,
                branch=branch if self.kind in ("branch", "guide") else None,
                reason=f"rail {self.name}",
                origin=decision_id,
            )
        ]


NOOP = Arm("noop")


def parse_arm(name: str) -> Arm:
    """The arm a logged name stands for (inverse of ``Arm.name``)."""
    if name == "noop":
        return NOOP
    m = _NAME.match(name)
    if m is None:
        raise ValueError(
            f"arm name {name!r} is not 'noop', 'branch_b<n>_t<T>', 'resample_n<n>_t<T>' or 'guide_n<n>_l<level>'; "
            "was the trace written by another controller?"
        )
    if m.group(1):
        return Arm("branch", int(m.group(2)), float(m.group(3)))
    if m.group(7):
        return Arm("guide", int(m.group(8)), level=float(m.group(9)))
    return Arm("resample", int(m.group(5)), float(m.group(6)))


def build_arms(config: RailConfig) -> tuple[Arm, ...]:
    """Every arm the configuration allows, no-op first, then branches, resamples and guidance."""
    arms = [NOOP]
    arms += [Arm("branch", int(b), float(t)) for b in config.branch_sizes for t in config.branch_temperatures]
    arms += [Arm("resample", int(n), float(t)) for n in config.resample_sizes for t in config.resample_temperatures]
    arms += [Arm("guide", int(config.guide_size), level=float(level)) for level in config.guide_levels]
    seen: set[str] = set()
    unique = []
    for arm in arms:
        if arm.name not in seen:  # duplicate sizes or temperatures in the config
            seen.add(arm.name)
            unique.append(arm)
    return tuple(unique)


def expected_tokens(arm: Arm, length_estimate: float, prefix_fraction: float) -> float:
    """Tokens the arm is expected to generate: each branch writes the rest of a response
    (``1 - prefix_fraction`` of it), each guided sample the rest after its share of the reference
    (``1 - level``, the reference taken as long as a response), each fresh sample a whole one."""
    return float(arm.n * length_estimate * written_share(arm, prefix_fraction))


def written_share(arm: Arm, prefix_fraction: float) -> float:
    """The share of a response each of the arm's samples writes (0 for the no-op).

    >>> written_share(Arm("guide", 4, level=0.25), 0.9), written_share(Arm("resample", 2), 0.9)
    (0.75, 1.0)
    """
    if arm.kind == "noop":
        return 0.0
    if arm.kind == "branch":
        return min(max(1.0 - prefix_fraction, 0.0), 1.0)
    return 1.0 - arm.level


def blocks_by_arms(arms_of: Iterable[tuple[Arm, ...]]) -> list[list[int]]:
    """Indices of the same arms tuple (by identity: a controller passes the same few tuples),
    one list per tuple in order of first appearance.

    >>> a, b = (NOOP,), (NOOP, parse_arm("branch_b2_t1"))
    >>> blocks_by_arms([a, b, a])
    [[0, 2], [1]]
    """
    blocks: dict[int, list[int]] = {}
    for i, arms in enumerate(arms_of):
        blocks.setdefault(id(arms), []).append(i)
    return list(blocks.values())


class ArmsCache:
    """Values derived from an arms tuple, cached by the tuple's identity.

    A controller passes the same few tuples at every decision, and hashing a tuple of arms costs
    more than most derivations. Each entry holds its tuple, so no other tuple can take its id
    while it is cached; a replay builds a tuple per logged record, so the cache is emptied when
    it holds ``limit`` entries.

    >>> cache, arms = ArmsCache(), (NOOP, parse_arm("branch_b2_t1"))
    >>> cache.get(arms, len), cache.get(arms, lambda a: 0)  # the second call is served from the cache
    (2, 2)
    """

    def __init__(self, limit: int = 256):
        self.limit = limit
        self._entries: dict[tuple[int, str], tuple[tuple[Arm, ...], object]] = {}

    def get(self, arms: tuple[Arm, ...], compute: Callable[[tuple[Arm, ...]], Any], tag: str = "") -> Any:
        """``compute(arms)``, computed once per arms tuple (and ``tag``)."""
        entry = self._entries.get((id(arms), tag))
        if entry is None:
            if len(self._entries) >= self.limit:
                self._entries.clear()
            entry = self._entries[id(arms), tag] = (arms, compute(arms))
        return entry[1]
