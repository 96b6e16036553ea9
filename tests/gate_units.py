"""Helpers for unit tests of one gate decision, without the harness: admitting from a gate,
hand-made snapshots, a prompt pool with the harness's ids, a checkpoint round trip, compact
action lists, and ``update`` / ``on_step`` called as the tracker calls them (with the open
groups' latest snapshots)."""

from __future__ import annotations

import dataclasses
import json
import weakref
from collections.abc import Callable
from types import MappingProxyType

from pipeline.protocols import Gate
from pipeline.types import GroupAction, GroupPlan, GroupSnapshot, Prompt, TrainBatch

_next_ids: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def admit(gate: Gate, slots: int, step: int = 0) -> list[GroupPlan]:
    """``gate.admit`` offered the next ``slots`` group ids, numbered from 0 per gate as the
    tracker numbers them, for unit tests of one gate decision."""
    first = _next_ids.get(gate, 0)
    plans = gate.admit(range(first, first + slots), step)
    _next_ids[gate] = first + len(plans)
    return plans


def checkpoint_roundtrip(gate: Gate, make_gate: Callable[[], Gate]) -> Gate:
    """A fresh gate restored from ``gate``'s checkpoint, passed through JSON on the way."""
    state = json.loads(json.dumps(gate.state_dict()))
    restored = make_gate()
    restored.load_state_dict(state)
    return restored


def snap(
    group_id: int,
    prompt: Prompt | int,
    rewards: tuple[float, ...],
    in_flight: int = 0,
    failed: int = 0,
    target: int = 8,
) -> GroupSnapshot:
    """A hand-made snapshot for unit tests of one gate decision."""
    if isinstance(prompt, int):
        prompt = Prompt(prompt, f"p{prompt}", (prompt,))
    rewards = tuple(float(r) for r in rewards)
    return GroupSnapshot(
        group_id, prompt, target, rewards, in_flight, len(rewards) + in_flight + failed, failed, 10 * len(rewards), 0
    )


def closing(last: GroupSnapshot | int, committed: bool = False) -> GroupSnapshot:
    """The snapshot ``on_closed`` hands a gate: of a group whose latest snapshot was ``last``,
    committed at that snapshot or not; of a group id alone, a group that reported nothing."""
    if isinstance(last, int):
        return GroupSnapshot(last, Prompt(-1, "", ()), 0, (), 0, 0, 0, 0, 0)
    return dataclasses.replace(last, in_flight=0, committed_at=len(last.rewards) if committed else -1)


def pool_of(n: int, seed: int = 0):
    """A PromptPool of prompts 0..n-1 with the ids the harness uses."""
    from controller.prompts import PromptPool

    return PromptPool([Prompt(i, f"p{i}", (i,)) for i in range(n)], seed=seed)


def kinds(actions: list[GroupAction]) -> list[tuple[str, int, int]]:
    """(kind, group_id, n) of each action, for compact assertions."""
    return [(a.kind.value, a.group_id, a.n) for a in actions]


_open_groups: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def update(gate: Gate, snapshot: GroupSnapshot) -> list[GroupAction]:
    """``gate.update`` as the tracker calls it: with ``snapshot`` and the latest snapshot of every
    other group the test reported to this gate (the tracker's open groups, ``OpenGroups``)."""
    groups = _open_groups.setdefault(gate, {})
    groups[snapshot.group_id] = snapshot
    return gate.update(snapshot, MappingProxyType(groups))


def on_step(gate: Gate, step: int, batch: TrainBatch) -> list[GroupAction]:
    """``gate.on_step`` as the tracker calls it: with the latest snapshot of every group the test
    reported to this gate."""
    return gate.on_step(step, batch, MappingProxyType(_open_groups.setdefault(gate, {})))
