"""Per-group state in the tracker: what was launched, what finished, what it cost.

Only ``pipeline.tracker.GroupTracker`` mutates a ``GroupRun`` (single writer); everything
else sees immutable ``GroupSnapshot``\\ s and ``CommittedGroup``\\ s derived from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pipeline.types import CommittedGroup, GroupSnapshot, Prompt, Rollout, SampleRequest, ScoredSample


@dataclass
class GroupRun:
    group_id: int
    prompt: Prompt
    target_size: int
    opened_step: int
    launched: int = 0
    queued: int = 0  # launches waiting for engine capacity
    failed: int = 0
    aborted: int = 0
    tokens: int = 0
    sealed: bool = False
    closed: bool = False
    samples: list[ScoredSample] = field(default_factory=list)  # every ended sample, in finishing order
    in_flight: dict[str, SampleRequest] = field(default_factory=dict)  # running samples by request id
    decision_ids: list[int] = field(default_factory=list)
    # Kept as samples end, so that a snapshot does not re-scan them: the valid ones, their
    # rewards and origins, and the completed samples that got no reward.
    _valid: list[ScoredSample] = field(default_factory=list)
    _rewards: list[float] = field(default_factory=list)
    _origins: list[int] = field(default_factory=list)
    _logprob_sums: list[float] = field(default_factory=list)
    _unrewarded: int = 0

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

    def snapshot(self, policy_version: int) -> GroupSnapshot:
        return GroupSnapshot(
            group_id=self.group_id,
            prompt=self.prompt,
            target_size=self.target_size,
            rewards=self.rewards,
            in_flight=len(self.in_flight) + self.queued,  # queued launches are as good as running
            launched=self.launched,
            # a sample with no reward counts as failed: gates stop paying for a group that gets none
            failed=self.failed + self._unrewarded,
            tokens=self.tokens,
            policy_version=policy_version,
            origins=self.origins,
            logprob_sums=tuple(self._logprob_sums),
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
