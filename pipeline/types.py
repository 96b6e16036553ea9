"""Named, frozen messages that cross stage boundaries.

Every stage of the pipeline talks through these types and nothing else (the controller's
feature dict is the one exception, by design: it is the bandit's input).

    PromptSource -> Prompt
    Orchestrator -> SampleRequest -> Engine
    Engine       -> TokenDelta* then SampleFinished        (a RolloutEvent stream per sample)
    Tracker      -> ScoredSample -> GroupSnapshot -> Gate  -> GroupAction
    Tracker      -> CommittedGroup -> TrainBatch -> Learner -> StepResult

State that can be derived is derived: whether a sample is finished comes from its
``FinishReason``; whether a group is *effective* comes from its rewards.

>>> s = SampleFinished(request_id="g0.s0", token_ids=(5, 6), logprobs=(-0.1, -0.2),
...                    finish_reason=FinishReason.STOP, policy_version=3)
>>> s.finish_reason.is_success, s.num_tokens
(True, 2)
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

NO_REWARD = math.nan
"""The reward of a sample whose reward function returned None ("no reward"): the sample is
counted, and left out of its group's statistics and of training (``ScoredSample.is_valid``)."""


class FinishReason(enum.IntEnum):
    """Why a sample stopped. Ordered: everything from ABORTED up did not complete normally."""

    STOP = 0  # the model emitted its end-of-sequence token
    LENGTH = 1  # max_tokens reached
    ABORTED = 2  # cancelled by the pipeline (abandoned group, shutdown)
    ERROR = 3  # the engine failed on this sample

    @property
    def is_success(self) -> bool:
        """True when the sample completed and can be rewarded (STOP or LENGTH)."""
        return self <= FinishReason.LENGTH


@dataclass(frozen=True)
class Prompt:
    """One task instance: the text, its tokens, and what the reward function needs to grade it.

    ``success_threshold``: a reward above it is a success (``task.success_threshold``); gates,
    controllers and evaluation count successes so, so shaped or summed rewards are not misread.
    """

    prompt_id: int
    text: str
    token_ids: tuple[int, ...]
    answer: str = ""
    difficulty: float = 0.0  # task-defined knob (digits, sim latent difficulty); only for reports
    success_threshold: float = 0.5


@dataclass(frozen=True)
class SamplingParams:
    """Per-sample sampling settings. ``seed`` makes a sample reproducible on engines that allow it."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise ValueError(f"temperature={self.temperature} must be > 0; use a small value like 0.01 for near-greedy")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1]")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens={self.max_tokens} must be >= 1")


@dataclass(frozen=True)
class BranchSpec:
    """Continue from the first ``prefix_len`` response tokens of an earlier sample.

    The prefix tokens travel with the request, so an engine that cannot reuse the source's
    cache simply prefills prompt + prefix again.
    """

    source_request_id: str
    prefix_len: int
    prefix_token_ids: tuple[int, ...] = ()
    prefix_logprobs: tuple[float, ...] = ()
    turns: int = 0
    """A multi-turn branch: a new episode that continues episode ``source_request_id`` after its
    first ``turns`` turns and the environment's answer to the last of them (its environment
    rebuilt in that state); 0: a branch inside a single response."""
    guide_level: float = 0.0
    """A guided branch (``controller.guidance``): the prefix is the first ``ceil(level x n)`` tokens
    of the prompt's reference response of ``n`` tokens, written by the task, not sampled by the
    policy, so it stays out of the loss (``Rollout.guide_len``); ``source_request_id`` then names
    the reference (``reference-<prompt_id>``), not a sample. 0: the prefix is an earlier sample's."""

    @property
    def guided(self) -> bool:
        """The prefix is a reference's (guidance), not the policy's."""
        return self.guide_level > 0


@dataclass(frozen=True)
class SampleRequest:
    """One rollout to generate: a member of a group, abortable on its own."""

    request_id: str
    group_id: int
    sample_index: int
    prompt: Prompt
    params: SamplingParams
    branch: BranchSpec | None = None
    launch_time: float = 0.0  # engine time (seconds) at which the request was issued
    origin: int = -1  # decision id of the intervention that launched it (-1: the gate's own)

    @property
    def prefix_len(self) -> int:
        """Tokens at the start of the response that its branch's source generated (and paid
        for); 0 without a branch. Everything beyond them this request generates itself."""
        return self.branch.prefix_len if self.branch is not None else 0

    @property
    def guide_len(self) -> int:
        """Tokens at the start of the response that a guidance reference wrote (``BranchSpec.guided``):
        in the context, never in the loss; 0 for a fresh sample or a branch of the policy's own prefix.

        >>> p = Prompt(0, "", (1,))
        >>> SampleRequest("g0-s4", 0, 4, p, SamplingParams(), branch=BranchSpec("reference-0", 2, (5, 6), guide_level=0.5)).guide_len
        2
        """
        b = self.branch
        return b.prefix_len if b is not None and b.guided else 0

    @property
    def guide_level(self) -> float:
        """The guidance level of a guided request (its share of the reference), else 0."""
        return self.branch.guide_level if self.branch is not None else 0.0

    def beyond_prefix(self, response_tokens: int) -> int:
        """Of a response of ``response_tokens`` tokens, the ones this request generated itself:
        those beyond its branch prefix (the one rule, wherever a sample's own tokens are counted).

        >>> SampleRequest("g0-s1", 0, 1, Prompt(0, "", (1,)), SamplingParams(),
        ...               branch=BranchSpec("g0-s0", 2, (5, 6), (-0.1, -0.2))).beyond_prefix(3)
        1
        """
        return response_tokens - self.prefix_len


@dataclass(frozen=True)
class TokenDelta:
    """New tokens of a running sample, with per-token log-probs (and entropies where known)."""

    request_id: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    entropies: tuple[float, ...] | None = None
    position: int = 0  # index of the first token of this delta within the response


@dataclass(frozen=True)
class SampleFinished:
    """The whole response of a sample, sent once at its end (also on abort or error)."""

    request_id: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    policy_version: int
    error: str = ""
    engine_time: float = 0.0  # engine time (seconds) at which the sample finished

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


RolloutEvent = TokenDelta | SampleFinished


@dataclass(frozen=True)
class Turns:
    """How a multi-turn episode's response is made: the policy's turns with the environment's
    observations between them (``pipeline.core.episodes``). ``policy_mask`` has one entry per
    response token, True where the policy generated it (observations are masked out of the
    loss); ``ends[t]`` is the response offset just past turn t's last token; ``rewards[t]`` is
    what the environment gave for turn t. ``truncated``: the episode ended because its next turn
    could not fit the model's context (the environment had not said done).

    >>> t = Turns(ends=(2, 5), rewards=(0.0, 1.0), policy_mask=(True, True, False, True, True))
    >>> t.count, t.observation_tokens, t.truncated
    (2, 1, False)
    """

    ends: tuple[int, ...]
    rewards: tuple[float, ...]
    policy_mask: tuple[bool, ...]
    truncated: bool = False

    @property
    def count(self) -> int:
        return len(self.ends)

    @property
    def observation_tokens(self) -> int:
        return len(self.policy_mask) - sum(self.policy_mask)


@dataclass(frozen=True)
class TurnPoint:
    """A turn boundary of an episode: the environment answered its ``turns``-th turn and the
    next is about to start. A controller may branch from here (``BranchSpec(key, prefix_len,
    turns=turns)``): new episodes that continue this context in a copy of the environment."""

    key: str
    """The episode (``g<group>-s<sample>``)."""
    turns: int
    prefix_len: int
    """Response tokens so far, the last observation included."""
    reward: float
    """The environment's reward for the turn just answered."""
    observation_tokens: int
    """Tokens of the environment's answer."""
    rewards: tuple[float, ...] = ()
    """Every turn's reward so far."""


@dataclass(frozen=True)
class ScoredSample:
    """A finished sample with its reward. ``reward_error`` names a reward that raised or timed out;
    ``reward`` is ``NO_REWARD`` (NaN) when the reward function gave none."""

    request: SampleRequest
    result: SampleFinished
    reward: float
    reward_error: str = ""
    turns: Turns | None = None
    """A multi-turn episode's structure (``result.token_ids`` is then all of its turns and
    observations); None for a single response."""

    @classmethod
    def reward_only(cls, group_id: int, index: int, prompt: Prompt, reward: float, policy_version: int) -> ScoredSample:
        """Sample ``index`` of group ``group_id`` known only by its reward, as a caller's own
        sampling loop reports it (it holds the tokens): no tokens, a finished stop.

        >>> s = ScoredSample.reward_only(3, 1, Prompt(0, "", (1,)), 1.0, policy_version=0)
        >>> s.request.request_id, s.is_valid, ScoredSample.reward_only(3, 2, s.request.prompt, NO_REWARD, 0).is_valid
        ('g3-s1', True, False)
        """
        request_id = f"g{group_id}-s{index}"
        return cls(
            SampleRequest(request_id, group_id, index, prompt, SamplingParams()),
            SampleFinished(request_id, (), (), FinishReason.STOP, policy_version),
            reward,
        )

    @property
    def new_tokens(self) -> int:
        """Tokens of the response beyond its branch prefix (``request.prefix_len``): the ones
        this sample generated itself.

        >>> request = SampleRequest("g0-s1", 0, 1, Prompt(0, "", (1,)), SamplingParams(),
        ...                         branch=BranchSpec("g0-s0", 2, (5, 6), (-0.1, -0.2)))
        >>> ScoredSample(request, SampleFinished("g0-s1", (5, 6, 7), (0.0,) * 3, FinishReason.STOP, 0), 1.0).new_tokens
        1
        """
        return self.request.beyond_prefix(len(self.result.token_ids))

    @property
    def is_valid(self) -> bool:
        """Valid samples enter the group's statistics; aborted, failed and unrewarded ones do not."""
        return self.result.finish_reason.is_success and not math.isnan(self.reward)


@dataclass(frozen=True)
class GroupSnapshot:
    """What a gate sees of a partial group after each finished sample."""

    group_id: int
    prompt: Prompt
    target_size: int
    rewards: tuple[float, ...]  # rewards of valid finished samples, in finishing order
    in_flight: int  # samples launched (or queued for engine capacity) and not yet finished
    launched: int  # samples ever launched for this group (including failed and aborted)
    failed: int  # samples that ended with ERROR, or completed with no reward (the reward function gave None)
    tokens: int  # tokens generated so far by this group's samples
    policy_version: int  # the engine's policy version now
    origins: tuple[int, ...] = ()  # per entry of ``rewards``: the intervention that made it (-1: none)
    # Per entry of ``rewards``: the sum of the sample's token log-probs as the engine reported them
    # (the policy at temperature 1), the log of the chance the policy writes that response; nan
    # when the engine reported none.
    logprob_sums: tuple[float, ...] = ()
    committed_at: int = -1
    """How many entries ``rewards`` held when the group was committed (-1: not committed): the
    rewards its gate's verdict saw, which ``verdict_counts`` reads back when the group closes."""

    @property
    def finished(self) -> int:
        return len(self.rewards)

    @property
    def verdict_counts(self) -> tuple[int, int]:
        """(successes, samples) of the rewards the group held when it was committed (every
        reward, while it is not): what the gate decided on, an unbiased draw of the pass rate."""
        rewards = self.rewards if self.committed_at < 0 else self.rewards[: self.committed_at]
        threshold = self.prompt.success_threshold
        return sum(1 for r in rewards if r > threshold), len(rewards)

    @property
    def successes(self) -> int:
        """Rewards above the prompt's ``success_threshold``."""
        threshold = self.prompt.success_threshold
        return sum(1 for r in self.rewards if r > threshold)

    @property
    def failures(self) -> int:
        return self.finished - self.successes

    @property
    def is_mixed(self) -> bool:
        """Holds at least one success and one failure (rewards thresholded at ``prompt.success_threshold``)."""
        return 0 < self.successes < self.finished


class ActionKind(enum.Enum):
    LAUNCH = "launch"  # start ``n`` more samples (optionally branched, at a temperature)
    COMMIT = "commit"  # seal: no more launches; ship to the learner once in-flight samples end
    ABANDON = "abandon"  # cancel in-flight samples, drop the group
    HOLD = "hold"  # keep the group open with nothing running (a buffer of pilots, say)


@dataclass(frozen=True)
class GroupAction:
    """An instruction from a gate or controller to the orchestrator about one group."""

    kind: ActionKind
    group_id: int
    n: int = 0
    params: SamplingParams | None = None
    branch: BranchSpec | None = None
    reason: str = ""
    origin: int = -1  # decision id of the controller decision behind this action (-1: a gate's)


@dataclass(frozen=True)
class GroupPlan:
    """A new group to open: the id ``Gate.admit`` was offered for it (the group's identity in
    every snapshot, action and record from then on), its prompt, target size and how many
    samples to launch now."""

    group_id: int
    prompt: Prompt
    target_size: int
    initial: int
    params: SamplingParams | None = None


@dataclass(frozen=True)
class Rollout:
    """One sample of a committed group, as the learner and the buffer see it."""

    request_id: str
    sample_index: int
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    reward: float
    finish_reason: FinishReason
    policy_version: int
    turns: Turns | None = None
    """A multi-turn episode's structure: which tokens the policy generated; None: all of them."""
    guide_len: int = 0
    """Response tokens at the start that a guidance reference wrote, not the policy
    (``SampleRequest.guide_len``): the learner masks them out of the loss; 0: none."""
    guide_level: float = 0.0
    """The guidance level of those tokens (the share of the reference they are); 0: unguided."""


@dataclass(frozen=True)
class CommittedGroup:
    """A finished group bound for the learner."""

    group_id: int
    prompt_id: int
    rollouts: tuple[Rollout, ...]
    launched: int  # every sample paid for, including aborted and failed ones
    tokens: int  # every token paid for
    trained_tokens: int = 0
    """Tokens of ``rollouts`` this group generated itself: a branched rollout's prefix was
    generated (and paid for) by its source. 0 where unknown (a group rebuilt from the buffer)."""
    success_threshold: float = 0.5
    """The prompt's ``success_threshold``."""

    @property
    def rewards(self) -> tuple[float, ...]:
        return tuple(r.reward for r in self.rollouts)

    @property
    def successes(self) -> int:
        """Rollouts whose reward is above ``success_threshold``."""
        return sum(1 for r in self.rollouts if r.reward > self.success_threshold)

    @property
    def unguided(self) -> tuple[int, int]:
        """``(successes, rollouts)`` among the rollouts with no guidance prefix (``Rollout.guide_len``
        0): what the group says of the prompt's own pass rate; all of them in an unguided group."""
        fresh = [r for r in self.rollouts if r.guide_len == 0]
        return sum(1 for r in fresh if r.reward > self.success_threshold), len(fresh)

    @property
    def is_effective(self) -> bool:
        """Non-zero reward spread, so a group-relative advantage is non-zero somewhere."""
        rs = self.rewards
        return len(rs) > 1 and max(rs) > min(rs)


@dataclass(frozen=True)
class TrainBatch:
    """The groups of one learner step."""

    step: int
    groups: tuple[CommittedGroup, ...]

    @property
    def num_rollouts(self) -> int:
        return sum(len(g.rollouts) for g in self.groups)

    @property
    def min_policy_version(self) -> int:
        return min((r.policy_version for g in self.groups for r in g.rollouts), default=0)


@dataclass(frozen=True)
class StepResult:
    """What a learner step reports back: its new policy version and its metrics."""

    step: int
    policy_version: int
    metrics: dict[str, float] = field(default_factory=dict)
    advantages: tuple[tuple[float, ...], ...] | None = None
    """Per-rollout advantages of the batch, group by group, as the step computed and trained on
    them (``pipeline.advantages``; the buffer records them); None from a learner without them
    (the simulator's)."""


TRACE_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class DecisionRecord:
    """One decision of a gate or controller, as the trace log stores it.

    ``features`` is the context the decider saw (the bandit's input, hence a dict);
    ``actions`` the arms it could choose from; ``propensity`` the probability with which the
    acting policy chose ``chosen``; ``behaviour_propensity`` the same for the logged behaviour
    policy when a controller runs in shadow mode (else equal to ``propensity``).
    """

    decision_id: int
    time: float
    run_id: str
    mode: str  # "live" | "shadow"
    decision_point: str  # "gate", "group", "token", ...
    prompt_id: int
    group_id: int
    sample_index: int
    token_position: int
    features: dict[str, float]
    actions: tuple[str, ...]
    chosen: str
    propensity: float
    behaviour_propensity: float
    predicted_gain: float
    policy_version: int


@dataclass(frozen=True)
class OutcomeRecord:
    """What a decision led to, logged when it is known; joined to decisions by ``decision_id``."""

    decision_id: int
    time: float
    reward: float  # realised reward (or gain) credited to the decision
    tokens: int  # tokens spent because of the decision
