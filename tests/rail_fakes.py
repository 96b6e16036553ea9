"""Small fakes for the RAIL controller tests: a sink that keeps records in lists,
snapshot/delta builders, a shadow-mode config, and one scripted rescue round."""

from __future__ import annotations

from typing import Any

from controller.rail.config import RailConfig
from pipeline.types import (
    ActionKind,
    CommittedGroup,
    DecisionRecord,
    FinishReason,
    GroupAction,
    GroupSnapshot,
    Prompt,
    Rollout,
    TokenDelta,
)


def shadow_config(**overrides: Any) -> RailConfig:
    """RAIL in shadow mode on the river backend, on group points only: no behaviour exploration,
    no token decisions, no branch arms; ``overrides`` change any field."""
    settings: dict[str, Any] = dict(
        mode="shadow",
        backend="river",
        behaviour="none",
        behaviour_epsilon=0.5,
        token_decisions=False,
        branch_sizes=(),
    )
    return RailConfig(**{**settings, **overrides})


class ListSink:
    """A ``DecisionSink`` that keeps every decision and outcome in memory."""

    def __init__(self) -> None:
        self.decisions: list[DecisionRecord] = []
        self.outcomes: list[tuple[int, float, int]] = []
        self._next = 0

    def next_decision_id(self) -> int:
        self._next += 1
        return self._next - 1

    def log_decision(self, record: DecisionRecord) -> None:
        self.decisions.append(record)

    def log_outcome(self, decision_id: int, reward: float, tokens: int) -> None:
        self.outcomes.append((decision_id, reward, tokens))

    def watermark(self) -> int:
        return self._next

    def flush(self) -> None:
        return None

    def by_point(self, point: str) -> list[DecisionRecord]:
        return [d for d in self.decisions if d.decision_point == point]


PROMPT = Prompt(5, "p", (1, 2, 3))


def snapshot(
    group_id=1,
    rewards=(0.0, 0.0, 0.0, 0.0),
    origins=None,
    in_flight=0,
    launched=None,
    tokens=400,
    failed=0,
    target_size=8,
    policy_version=0,
) -> GroupSnapshot:
    rewards = tuple(rewards)
    return GroupSnapshot(
        group_id=group_id,
        prompt=PROMPT,
        target_size=target_size,
        rewards=rewards,
        in_flight=in_flight,
        launched=len(rewards) + in_flight if launched is None else launched,
        failed=failed,
        tokens=tokens,
        policy_version=policy_version,
        origins=tuple(origins) if origins is not None else (-1,) * len(rewards),
    )


def delta(group_id, index, position, n=8, spike_at=None, spike=3.0, logprob=-0.5, entropies=True) -> TokenDelta:
    ents = [0.1] * n
    if spike_at is not None:
        ents[spike_at] = spike
    return TokenDelta(
        request_id=f"g{group_id}-s{index}",
        token_ids=tuple(range(10 + position, 10 + position + n)),
        logprobs=(logprob,) * n,
        entropies=tuple(ents) if entropies else None,
        position=position,
    )


def committed(group_id, rewards, length=40) -> CommittedGroup:
    rollouts = tuple(
        Rollout(f"g{group_id}-s{i}", i, PROMPT.token_ids, (7,) * length, (-0.5,) * length, r, FinishReason.STOP, 0)
        for i, r in enumerate(rewards)
    )
    return CommittedGroup(group_id, PROMPT.prompt_id, rollouts, len(rollouts), length * len(rollouts))


def rescue_round(rail, gid, pays):
    """One rescue decision; an intervention recovers the group (variance 0.1875) for 50 tokens
    (1.25 rollouts of 40 tokens) when ``pays``, else it burns 400 tokens (10 rollouts) on a
    group that is dropped anyway."""
    out = rail.on_group(snapshot(group_id=gid, tokens=400), [GroupAction(ActionKind.ABANDON, gid)])
    if [a.kind for a in out] == [ActionKind.HOLD]:  # queued (batch_group_decisions): decided at the flush
        out = rail.flush_decisions()
    launches = [a for a in out if a.kind is ActionKind.LAUNCH]
    if not launches:
        rail.on_closed(None, snapshot(group_id=gid))
        return
    d = launches[0].origin
    if pays:
        rewards = (0.0,) * 4 + (1.0, 0.0, 1.0, 0.0)
        final = snapshot(group_id=gid, rewards=rewards, origins=(-1,) * 4 + (d,) * 2 + (-1,) * 2, tokens=450)
        rail.on_closed(committed(gid, rewards), final)
    else:
        rail.on_closed(None, snapshot(group_id=gid, rewards=(0.0,) * 6, origins=(-1,) * 4 + (d, d), tokens=800))
