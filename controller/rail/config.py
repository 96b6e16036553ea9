"""Settings of the RAIL intervention controller (``controller.rail``), one frozen dataclass.

The lead composes ``RailConfig`` into the run config (the messages name keys under
``controller.rail``, ``KEY`` below); ``pipeline.config.build.build`` turns YAML into it and
rejects unknown keys. Every field has a docstring; ``__post_init__`` checks ranges and raises
``ConfigError`` naming the key, the value and the fix.

>>> from pipeline.config.build import build
>>> build(RailConfig, {"backend": "river", "cost_lambda": 0.2}).cost_lambda
0.2
>>> build(RailConfig, {"branch_temperatures": [0.7, -1.0]})
Traceback (most recent call last):
...
pipeline.config.build.ConfigError: controller.rail.branch_temperatures=(0.7, -1.0) must hold temperatures > 0 (e.g. [0.7, 1.0, 1.3])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from controller.rail.vw_args import VWArgsError, check_extra_args
from pipeline.config.build import require

KEY = "controller.rail"


def _positive_ints(values: tuple[int, ...], name: str) -> None:
    require(
        all(int(v) >= 1 for v in values),
        f"{KEY}.{name}={tuple(values)} must hold sample counts >= 1 (e.g. [2, 4]), or be empty to drop those arms",
    )


def _temperatures(values: tuple[float, ...], name: str) -> None:
    require(
        all(math.isfinite(v) and v > 0 for v in values),
        f"{KEY}.{name}={tuple(values)} must hold temperatures > 0 (e.g. [0.7, 1.0, 1.3])",
    )


@dataclass(frozen=True)
class RailConfig:
    """The RAIL controller: arms, decision points, reward, learner, behaviour policy, promotion."""

    mode: Literal["live", "shadow"] = "shadow"
    """Starting mode. shadow: the behaviour policy acts and the learned policy's choices are
    only logged (and it learns from the behaviour's traces); live: the learned policy acts."""
    backend: Literal["vw", "river"] = "vw"
    """Learner: vw (``--cb_explore_adf --squarecb -q sa``) or river (per-arm Huber regressors
    with SquareCB's inverse-gap exploration)."""
    behaviour: Literal["none", "arpo", "guide"] = "arpo"
    """Behaviour policy of shadow mode: none (always no-op), arpo (branch at high-entropy
    tokens and on rescues) or guide (guide every all-failed rescue at the level nearest 0.5)."""
    behaviour_epsilon: float = 0.2
    """Probability with which the behaviour policy picks a uniformly random arm instead of its
    rule, so that every arm has a positive logged propensity (off-policy evaluation needs it)."""

    branch_sizes: tuple[int, ...] = (2, 4)
    """Branch arms: how many samples continue the chosen prefix."""
    branch_temperatures: tuple[float, ...] = (0.7, 1.0, 1.3)
    """Branch arms: sampling temperatures (every size x temperature pair is an arm)."""
    resample_sizes: tuple[int, ...] = (2, 4)
    """Fresh-resample arms: how many new samples from the prompt."""
    resample_temperatures: tuple[float, ...] = (1.0, 1.3)
    """Fresh-resample arms: sampling temperatures."""
    guide_levels: tuple[float, ...] = ()
    """Guidance arms (``controller/guidance.py``), offered at a rescue point whose ended samples all
    failed and whose prompt has a reference: ``guide_size`` samples continue the first
    ``ceil(level x n)`` tokens of the reference response, one arm per level (of 0.25, 0.5, 0.75).
    Empty: no guidance arms. Needs a task with references; refused beside branch arms and token
    decisions, whose prefixes could start inside a reference's tokens."""
    guide_size: int = 4
    """Guidance arms: how many guided samples one launches (the rest of a probe of 4 in a group of 8)."""

    rescue_on_abandon: bool = True
    """Group-level decision when the gate proposes ABANDON of a saturated group: the controller
    may replace the abandon by an intervention that tries to recover it."""
    extend_on_commit: bool = True
    """Group-level decision when the gate proposes COMMIT: the controller may add samples."""
    token_decisions: bool = True
    """Token-level decisions at high-entropy tokens of running samples (ARPO-style)."""
    entropy_threshold: float = 1.5
    """A token is a candidate state when its entropy (nats) is at least this."""
    min_tokens_between_decisions: int = 16
    """Token positions between two token-level decisions on the same sample."""
    batch_token_decisions: bool = True
    """Token-level decision points are queued and decided together once the points of the same
    event-loop tick are in (one scoring call for all of them; their actions reach the tracker
    the same way either way, through the tracking loop). false: each is decided at once."""
    batch_group_decisions: bool = True
    """Group-level decision points (rescue, extend) of a group with nothing running are queued
    like token-level ones and decided in the same batch: the gate's proposal is held (the group
    stays open, nothing runs) until the batch is decided, then executed or replaced. A group
    with samples still running is decided at once (its next sample would ask again).
    false: every group-level point is decided at once."""
    decision_batch_max: int = 256
    """Most decision points decided in one scoring call; more queued are decided in consecutive
    batches of this size (a pause inside a batch, such as a garbage collection, is shared by
    every decision in it)."""
    max_token_decisions_per_group: int = 4
    """Token-level decision points per group (no-ops included): bounds the decision cost."""
    max_interventions_per_group: int = 2
    """Interventions (non-no-op decisions) per group at token and extend points; rescues do
    not count against it (they have their own cap), but they count toward it."""
    max_rescues_per_group: int = 1
    """Replaced abandons per group; each rescue makes the gate decide again, so this bounds it."""
    turn_decisions: Literal["off", "failed", "all"] = "failed"
    """Decision points at an episode's turn boundaries (``task.name: env``; ``controller.rail.turns``):
    after a failed turn (its reward at most ``turn_fail_reward``: the environment said wrong and
    its feedback is in the context), after every turn, or none. Only episodes ask."""
    turn_fail_reward: float = 0.0
    """A turn whose reward is at most this failed (ChainEnv: 0 for a wrong step, 1 for a right one)."""
    max_turn_decisions_per_group: int = 4
    """Turn-level decision points per group (no-ops included); interventions count against
    ``max_interventions_per_group`` as at token points."""

    cost_lambda: float = 0.1
    """Price of one rollout-equivalent: reward = realised variance gain - cost_lambda *
    tokens / (the run's mean tokens per rollout). In the budget's unit, so one value holds on
    5-token answers and 50-token scratchpads; an intervention pays when its variance gain
    beats cost_lambda per rollout it costs (docs/methods.md, "RAIL's price")."""
    gain_threshold: float = 0.0
    """Live rule: the learned policy intervenes freely only when some intervention's predicted
    gain exceeds this; otherwise its intervention mass shrinks by ``below_threshold_explore``."""
    below_threshold_explore: float = 0.1
    """Fraction of the intervention probability kept below the threshold (keeps propensities
    positive so the learner still sees every arm)."""

    learning_rate: float = 0.5
    """vw: ``-l``; river: SGD step size is this x ``river_lr_scale``."""
    power_t: float = 0.0
    """vw ``--power_t``: 0 keeps the learning rate constant, so the regressor tracks a drifting
    policy (recent decisions weigh more); 0.5 is VW's stationary default."""
    gamma_scale: float = 10.0
    """SquareCB exploration: gamma = gamma_scale * t ** gamma_exponent (t = examples learned)."""
    gamma_exponent: float = 0.5
    """SquareCB exploration exponent (VW's default 0.5)."""
    river_lr_scale: float = 0.1
    """river backend: SGD step = learning_rate * river_lr_scale (plain SGD is not normalised
    like VW's updates, so it needs a smaller step)."""
    huber_epsilon: float = 0.1
    """river backend: Huber loss threshold, in reward units (gains are at most 0.25)."""
    vw_extra_args: str = ""
    """Extra vowpalwabbit arguments (e.g. ``--l2 1e-6``): learning options only, from the allow-list
    of ``controller.rail.vw_args`` (none that names a file). Never read from a run directory's
    config.yaml: on ``eval`` and ``train --resume`` pass it again with ``--set`` (docs/reliability.md)."""
    vw_snapshot_every: int = 64
    """vw backend: decisions are scored by a numpy copy of VW's linear model, read out of VW
    anew every this many learned examples (a matrix product instead of a VW parse and predict
    per decision; the logged propensities are the copy's, so they stay exact). 0 asks VW at
    every decision."""
    vw_snapshot_growth: float = 0.05
    """vw backend, with ``vw_snapshot_every`` > 0: a new copy also waits until the examples
    learned since the last reach this share of all learned so far, so copies are read every 64
    examples early in a run and every 5% of its history later (VW's adaptive steps shrink as
    gradients add up). 0 reads one every ``vw_snapshot_every`` examples for the whole run."""

    evaluate_every: int = 200
    """Promotion check every this many decisions with known outcomes."""
    min_decisions: int = 500
    """Decisions with outcomes the window must hold before a promotion or demotion."""
    window: int = 5000
    """Recent decisions the promotion estimates use."""
    confidence: float = 0.95
    """Coverage of the doubly-robust confidence interval used for promotion."""
    weight_clip: float = 0.0
    """Cap on importance weights in the estimates (0 = no cap)."""
    auto_promote: bool = True
    """Switch shadow -> live (and back) on the evidence; false keeps the starting mode."""
    warmup_decisions: int = 500
    """Learned decisions before the frozen copy (the gain-error baseline) is taken."""

    buffer_max_tokens: int = 4096
    """Per-request prefix buffer cap (tokens); positions past it cannot be branched from."""
    buffer_max_requests: int = 4096
    """Requests whose prefixes are buffered at once (oldest dropped first)."""
    length_ema: float = 0.05
    """Weight of each new response length in the running mean used for token-cost estimates."""
    initial_length: float = 0.0
    """Response length (tokens) assumed before any was seen (0 = half of max_tokens)."""

    def __post_init__(self) -> None:
        require(self.mode in ("live", "shadow"), f"{KEY}.mode={self.mode!r} must be 'live' or 'shadow'")
        require(self.backend in ("vw", "river"), f"{KEY}.backend={self.backend!r} must be 'vw' or 'river'")
        require(
            self.behaviour in ("none", "arpo", "guide"),
            f"{KEY}.behaviour={self.behaviour!r} must be 'none', 'arpo' or 'guide'",
        )
        require(
            0.0 <= self.behaviour_epsilon <= 1.0,
            f"{KEY}.behaviour_epsilon={self.behaviour_epsilon} must be in [0, 1]; use > 0 so that IPS is possible",
        )
        _positive_ints(self.branch_sizes, "branch_sizes")
        _positive_ints(self.resample_sizes, "resample_sizes")
        _temperatures(self.branch_temperatures, "branch_temperatures")
        _temperatures(self.resample_temperatures, "resample_temperatures")
        require(
            all(level in (0.25, 0.5, 0.75) for level in self.guide_levels),
            f"{KEY}.guide_levels={tuple(self.guide_levels)} must hold shares of the reference: 0.25, 0.5 or 0.75 "
            "(or be empty: no guidance arms)",
        )
        require(
            self.guide_size >= 1, f"{KEY}.guide_size={self.guide_size} must be >= 1 (guided samples an arm launches)"
        )
        branches = len(self.branch_sizes) * len(self.branch_temperatures)
        require(
            not (self.guide_levels and (branches or self.token_decisions)),
            f"{KEY}.guide_levels={tuple(self.guide_levels)} with branch arms or token decisions: a branch could "
            "continue a guided sample from inside its reference tokens; set branch_sizes=[] and "
            "token_decisions=false, or guide_levels=[]",
        )
        arms = branches + len(self.resample_sizes) * len(self.resample_temperatures) + len(self.guide_levels)
        require(
            arms > 0,
            f"{KEY}: no intervention arms (branch_sizes x branch_temperatures, resample_sizes x "
            "resample_temperatures and guide_levels are all empty); give at least one size and one temperature",
        )
        require(
            self.turn_decisions in ("off", "failed", "all"),
            f"{KEY}.turn_decisions={self.turn_decisions!r} must be 'off', 'failed' or 'all'",
        )
        require(math.isfinite(self.turn_fail_reward), f"{KEY}.turn_fail_reward={self.turn_fail_reward} must be finite")
        require(
            self.entropy_threshold >= 0 and math.isfinite(self.entropy_threshold),
            f"{KEY}.entropy_threshold={self.entropy_threshold} must be a finite entropy >= 0 (nats)",
        )
        for name in (
            "min_tokens_between_decisions",
            "max_token_decisions_per_group",
            "max_interventions_per_group",
            "max_rescues_per_group",
            "max_turn_decisions_per_group",
        ):
            value = getattr(self, name)
            require(value >= 0, f"{KEY}.{name}={value} must be >= 0")
        require(
            self.cost_lambda >= 0 and math.isfinite(self.cost_lambda),
            f"{KEY}.cost_lambda={self.cost_lambda} must be a finite price >= 0 per rollout-equivalent (e.g. 0.1)",
        )
        require(math.isfinite(self.gain_threshold), f"{KEY}.gain_threshold={self.gain_threshold} must be finite")
        require(
            0.0 < self.below_threshold_explore <= 1.0,
            f"{KEY}.below_threshold_explore={self.below_threshold_explore} must be in (0, 1]; "
            "0 would give interventions zero propensity",
        )
        require(self.learning_rate > 0, f"{KEY}.learning_rate={self.learning_rate} must be > 0")
        require(self.power_t >= 0, f"{KEY}.power_t={self.power_t} must be >= 0 (0 = constant rate)")
        require(self.gamma_scale > 0, f"{KEY}.gamma_scale={self.gamma_scale} must be > 0")
        require(self.gamma_exponent >= 0, f"{KEY}.gamma_exponent={self.gamma_exponent} must be >= 0")
        require(
            self.vw_snapshot_every >= 0,
            f"{KEY}.vw_snapshot_every={self.vw_snapshot_every} must be >= 0 (0 = ask VW at every decision)",
        )
        require(
            0 <= self.vw_snapshot_growth <= 1,
            f"{KEY}.vw_snapshot_growth={self.vw_snapshot_growth} must be in [0, 1] (0 = every vw_snapshot_every examples)",
        )
        try:  # options that name files (-f, --readable_model, ...) never reach vowpalwabbit
            check_extra_args(self.vw_extra_args, f"{KEY}.vw_extra_args")
        except VWArgsError as exc:
            require(False, str(exc))
        require(self.river_lr_scale > 0, f"{KEY}.river_lr_scale={self.river_lr_scale} must be > 0")
        require(self.huber_epsilon > 0, f"{KEY}.huber_epsilon={self.huber_epsilon} must be > 0")
        require(self.evaluate_every >= 1, f"{KEY}.evaluate_every={self.evaluate_every} must be >= 1")
        require(
            self.decision_batch_max >= 1,
            f"{KEY}.decision_batch_max={self.decision_batch_max} must be >= 1 (1 decides each point alone)",
        )
        require(self.min_decisions >= 2, f"{KEY}.min_decisions={self.min_decisions} must be >= 2")
        require(
            self.window >= self.min_decisions,
            f"{KEY}.window={self.window} is below {KEY}.min_decisions={self.min_decisions}; raise window",
        )
        require(0 < self.confidence < 1, f"{KEY}.confidence={self.confidence} must be in (0, 1), e.g. 0.95")
        require(self.weight_clip >= 0, f"{KEY}.weight_clip={self.weight_clip} must be >= 0 (0 = no cap)")
        require(self.warmup_decisions >= 0, f"{KEY}.warmup_decisions={self.warmup_decisions} must be >= 0")
        require(self.buffer_max_tokens >= 1, f"{KEY}.buffer_max_tokens={self.buffer_max_tokens} must be >= 1")
        require(self.buffer_max_requests >= 1, f"{KEY}.buffer_max_requests={self.buffer_max_requests} must be >= 1")
        require(0 < self.length_ema <= 1, f"{KEY}.length_ema={self.length_ema} must be in (0, 1]")
        require(
            self.initial_length >= 0, f"{KEY}.initial_length={self.initial_length} must be >= 0 (0 = max_tokens / 2)"
        )
