"""Per-group state in the tracker: what was launched, what finished, what it cost.

A ``GroupRun`` changes only through its own methods (``tests/test_single_writers.py`` checks
that no other module assigns its fields), called by the tracker and its stream-side ledger;
everything else sees immutable ``GroupSnapshot``\\ s and ``CommittedGroup``\\ s derived from
it (a gate reads the open groups through ``SnapshotView``). Which of its samples are queued
or running is not kept here: ``pipeline.core.samples`` holds one record per sample, and a
snapshot is handed the group's count from there.

>>> from pipeline.types import Prompt
>>> group = GroupRun(0, Prompt(0, "", (1,)), target_size=4, opened_step=0)
>>> group.launch(), group.launch(), group.seal(), group.seal()
(0, 1, True, False)
>>> group.snapshot(policy_version=0, in_flight=2).launched
2
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from pipeline.protocols import GateProtocolError
from pipeline.types import (
    ActionKind,
    CommittedGroup,
    FinishReason,
    GroupAction,
    GroupSnapshot,
    Prompt,
    Rollout,
    ScoredSample,
)


@dataclass
class GroupRun:
    group_id: int
    prompt: Prompt
    target_size: int
    opened_step: int
    launched: int = 0
    failed: int = 0
    aborted: int = 0
    tokens: int = 0
    sealed: bool = False
    committed_at: int = -1  # valid rewards it held when it was sealed (-1: not sealed)
    closed: bool = False
    samples: list[ScoredSample] = field(default_factory=list)  # every ended sample, in finishing order
    decision_ids: list[int] = field(default_factory=list)
    # Kept as samples end, so that a snapshot does not re-scan them: the valid ones, their
    # rewards and origins, and the completed samples that got no reward.
    _valid: list[ScoredSample] = field(default_factory=list)
    _rewards: list[float] = field(default_factory=list)
    _origins: list[int] = field(default_factory=list)
    _logprob_sums: list[float] = field(default_factory=list)
    _unrewarded: int = 0

    def launch(self) -> int:
        """One more sample starts: its sample index."""
        self.launched += 1
        return self.launched - 1

    def seal(self) -> bool:
        """Committed: the gate launches no more (True the first time)."""
        first, self.sealed = not self.sealed, True
        if first:
            self.committed_at = len(self._rewards)
        return first

    def close(self) -> None:
        self.closed = True

    def count_tokens(self, n: int) -> None:
        """Its samples generated ``n`` more tokens."""
        self.tokens += n

    def count_abort(self) -> None:
        """One of its samples ended as an abort."""
        self.aborted += 1

    def count_end(self, reason: FinishReason) -> None:
        """One of its samples ended for ``reason`` and was seen by the tracker (failed, aborted)."""
        if reason is FinishReason.ERROR:
            self.failed += 1
        elif reason is FinishReason.ABORTED:
            self.aborted += 1

    def note_decision(self, decision_id: int) -> None:
        """A gate decision on the group went into the trace (its outcome follows at the close)."""
        self.decision_ids.append(decision_id)

    def add(self, scored: ScoredSample) -> None:
        """One more ended sample of the group (any finish reason)."""
        self.samples.append(scored)
        if scored.is_valid:
            self._valid.append(scored)
            self._rewards.append(scored.reward)
            self._origins.append(scored.request.origin)
            logprobs = scored.result.logprobs
            self._logprob_sums.append(sum(logprobs) if logprobs else math.nan)
        elif scored.result.finish_reason.is_success:
            self._unrewarded += 1

    @property
    def rewards(self) -> tuple[float, ...]:
        return tuple(self._rewards)

    @property
    def origins(self) -> tuple[int, ...]:
        return tuple(self._origins)

    def snapshot(self, policy_version: int, in_flight: int) -> GroupSnapshot:
        """The group as gates see it; ``in_flight``: its samples started or queued and not done
        (``pipeline.core.samples.Samples.in_flight``)."""
        return GroupSnapshot(
            group_id=self.group_id,
            prompt=self.prompt,
            target_size=self.target_size,
            rewards=self.rewards,
            in_flight=in_flight,
            launched=self.launched,
            # a sample with no reward counts as failed: gates stop paying for a group that gets none
            failed=self.failed + self._unrewarded,
            tokens=self.tokens,
            policy_version=policy_version,
            origins=self.origins,
            logprob_sums=tuple(self._logprob_sums),
            committed_at=self.committed_at,
        )

    def committed(self) -> CommittedGroup:
        rollouts = tuple(
            Rollout(
                request_id=s.request.request_id,
                sample_index=s.request.sample_index,
                prompt_token_ids=s.request.prompt.token_ids,
                token_ids=s.result.token_ids,
                logprobs=s.result.logprobs,
                reward=s.reward,
                finish_reason=s.result.finish_reason,
                policy_version=s.result.policy_version,
                turns=s.turns,
                guide_len=s.request.guide_len,
                guide_level=s.request.guide_level,
            )
            for s in sorted(self._valid, key=lambda s: s.request.sample_index)
        )
        valid = self._valid
        return CommittedGroup(
            group_id=self.group_id,
            prompt_id=self.prompt.prompt_id,
            rollouts=rollouts,
            launched=self.launched,
            tokens=self.tokens,
            trained_tokens=sum(s.new_tokens for s in valid),
            success_threshold=self.prompt.success_threshold,
        )


class SnapshotView(Mapping[int, GroupSnapshot]):
    """A driver's open groups (the tracker's; ``controller.driver``'s), each read as its snapshot
    when asked: the ``OpenGroups`` a gate is handed, a read-only view that builds only the
    snapshots the gate reads, from the group records themselves.

    >>> from pipeline.types import Prompt
    >>> group = GroupRun(4, Prompt(0, "", (1,)), target_size=2, opened_step=0)
    >>> view = SnapshotView({4: group}, lambda g: g.snapshot(0, in_flight=0))
    >>> list(view), view[4].finished, 5 in view
    ([4], 0, False)
    """

    def __init__(self, groups: Mapping[int, GroupRun], snapshot: Callable[[GroupRun], GroupSnapshot]):
        self._groups, self._snapshot = groups, snapshot

    def __getitem__(self, group_id: int) -> GroupSnapshot:
        return self._snapshot(self._groups[group_id])

    def __iter__(self) -> Iterator[int]:
        return iter(self._groups)

    def __len__(self) -> int:
        return len(self._groups)

    def __contains__(self, group_id: object) -> bool:
        return group_id in self._groups


def checked(group: GroupRun | None, action: GroupAction, source: str, actor: object) -> GroupRun:
    """The open group ``action`` names, once the group lifecycle (``pipeline.protocols``) allows
    the action on it; ``GateProtocolError`` for an action on a group that is not open, or a
    gate's LAUNCH on a committed one (a controller's intervention, ``origin >= 0``, may). Every
    driver of gates goes through here: the tracker, and ``controller.driver``.

    >>> from pipeline.types import ActionKind, GroupAction, Prompt
    >>> group = GroupRun(0, Prompt(0, "", (1,)), target_size=4, opened_step=0); _ = group.seal()
    >>> checked(group, GroupAction(ActionKind.LAUNCH, 0, n=2), "gate", object())  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    pipeline.protocols.GateProtocolError: gate launched 2 samples on sealed group 0; emit LAUNCH before COMMIT
    """
    if group is None or group.closed:
        raise GateProtocolError.not_open(source, actor, action.group_id)
    if action.kind is ActionKind.LAUNCH and group.sealed and action.origin < 0:
        raise GateProtocolError.launch_after_commit(source, action.n, group.group_id)
    return group


def closing_state(snapshot: GroupSnapshot) -> dict:
    """A group's snapshot as a checkpoint keeps it (JSON-able): what a gate reads of a group a
    resumed run closes -- its id, its prompt's id, level and success threshold, its counts and
    rewards; the prompt's text and tokens are left out.

    >>> from pipeline.types import Prompt
    >>> snap = GroupSnapshot(4, Prompt(9, "x", (1,)), 8, (1.0, 0.0), 2, 4, 0, 30, 1, committed_at=1)
    >>> back = closing_from_state(closing_state(snap))
    >>> back.verdict_counts, back.prompt.prompt_id, back.launched
    ((1, 1), 9, 4)
    """
    prompt = snapshot.prompt
    return {
        "group_id": snapshot.group_id,
        "prompt": [prompt.prompt_id, prompt.difficulty, prompt.success_threshold],
        "target_size": snapshot.target_size,
        "rewards": list(snapshot.rewards),
        "launched": snapshot.launched,
        "failed": snapshot.failed,
        "tokens": snapshot.tokens,
        "committed_at": snapshot.committed_at,
    }


def closing_from_state(state: dict) -> GroupSnapshot:
    """The snapshot ``closing_state`` kept (of a checkpoint from an earlier release, which kept
    only the id: a group with no rewards, of an unknown prompt, -1)."""
    prompt_id, difficulty, threshold = state.get("prompt", (-1, 0.0, 0.5))
    return GroupSnapshot(
        group_id=int(state["group_id"]),
        prompt=Prompt(int(prompt_id), "", (), difficulty=float(difficulty), success_threshold=float(threshold)),
        target_size=int(state.get("target_size", 0)),
        rewards=tuple(float(r) for r in state.get("rewards", ())),
        in_flight=0,
        launched=int(state.get("launched", 0)),
        failed=int(state.get("failed", 0)),
        tokens=int(state.get("tokens", 0)),
        policy_version=0,
        committed_at=int(state.get("committed_at", -1)),
    )
