"""What RAIL's decisions led to, and what the controller learns from it.

A decision is kept (``PendingDecision``) until its group closes. Then ``Outcomes.settle`` gives
each of the group's decisions its reward (``controller.rail.reward``), logs it as an outcome,
teaches the learner, compares the learner's gain prediction with the frozen copy's
(``controller.rail.gain_error``) and adds it to the promotion window
(``controller.rail.promotion``); a switch of mode the window calls for is logged as a
``"promotion"`` decision. The frozen copy is a clone of the learner taken once it has learned
``warmup_decisions`` decisions; it never learns after that.

>>> from collections import Counter
>>> from pipeline.core.decisions import NullSink
>>> from controller.rail.config import RailConfig
>>> from controller.rail.learners import build_learner
>>> cfg = RailConfig(mode="shadow", backend="river")
>>> outcomes = Outcomes(cfg, NullSink(), build_learner(cfg, 0), Counter(), frozen_seed=1, run_id="", clock=lambda: 0.0)
>>> outcomes.mode, outcomes.frozen is None, outcomes.metrics()["controller/live"]
('shadow', True, 0.0)
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from controller.rail.bandit import BanditLearner, Decision
from controller.rail.config import RailConfig
from controller.rail.features import Context
from controller.rail.gain_error import GainErrorTracker
from controller.rail.learners import clone_learner, learner_from_state
from controller.rail.promotion import Evidence, Promoter, WindowEntry
from controller.rail.records import evidence_metrics, switch_record
from controller.rail.reward import decision_reward
from pipeline.protocols import DecisionSink
from pipeline.types import GroupSnapshot


@dataclass(slots=True)
class PendingDecision:
    """A logged decision waiting for its group to close."""

    decision_id: int
    point: str
    context: Context
    acted: Decision
    other_prob: float
    q_other: float
    online_gain: float
    frozen_exists: bool  # the frozen copy existed at decision time (it never changes after)
    expected_tokens: float
    tokens_at: int

    @property
    def noop(self) -> bool:
        return self.context.arms[self.acted.action].is_noop

    @property
    def n(self) -> int:
        return self.context.arms[self.acted.action].n


class Outcomes:
    """Rewards, learning, the frozen copy and promotion of one ``RailController``.

    Parameters
    ----------
    config
        ``RailConfig`` (the reward's ``cost_lambda``, ``warmup_decisions``, the promotion settings).
    sink
        Where outcomes and mode switches are logged.
    learner
        The controller's learner: it learns every settled decision.
    counts
        The controller's counters (``outcomes`` is counted here).
    frozen_seed
        The frozen copy's seed.
    run_id, clock
        Stamped on switch records (``clock``: the controller's, engine time or wall time).
    """

    RECENT = 1000
    """Rewards kept for the ``controller/mean_reward`` metric."""

    def __init__(
        self,
        config: RailConfig,
        sink: DecisionSink,
        learner: BanditLearner,
        counts: Counter[str],
        *,
        frozen_seed: int,
        run_id: str,
        clock: Callable[[], float],
    ):
        self.config, self.sink, self.learner, self.counts = config, sink, learner, counts
        self.frozen_seed, self.run_id, self._clock = frozen_seed, run_id, clock
        self.promoter = Promoter(
            config.evaluate_every,
            config.min_decisions,
            config.window,
            config.confidence,
            config.weight_clip,
            config.mode,
            config.auto_promote,
        )
        self.frozen: BanditLearner | None = None
        self.gain_errors = GainErrorTracker()
        self.recent_rewards: deque[float] = deque(maxlen=self.RECENT)

    @property
    def mode(self) -> str:
        return self.promoter.mode

    def settle(
        self, decisions: list[PendingDecision], snapshot: GroupSnapshot, committed: bool, length_estimate: float
    ) -> None:
        """Reward, log, learn and promote for each decision of a group that closed as ``snapshot``."""
        # The frozen copy never learns, so predicting now equals predicting at decision time, and
        # the group's decisions are scored in one call (one matrix product with VW's snapshot).
        known = [d for d in decisions if d.frozen_exists]  # frozen_exists: self.frozen is set
        frozen = iter(self.frozen.distributions([d.context for d in known]) if known and self.frozen else ())
        for d in decisions:
            frozen_gain = next(frozen)[1][d.acted.action] if d.frozen_exists else math.nan
            self._settle_one(d, snapshot, committed, frozen_gain, length_estimate)

    def _settle_one(
        self, d: PendingDecision, snapshot: GroupSnapshot, committed: bool, frozen_gain: float, length_estimate: float
    ) -> None:
        reward, _gain, tokens = decision_reward(
            d.point,
            snapshot.rewards,
            snapshot.origins,
            d.decision_id,
            committed,
            d.expected_tokens,
            snapshot.tokens - d.tokens_at,
            self.config.cost_lambda,
            length_estimate,
            noop=d.noop,
        )
        self.sink.log_outcome(d.decision_id, reward, tokens)
        self.counts["outcomes"] += 1
        self.recent_rewards.append(reward)
        self.learner.learn_one(d.context, d.acted, reward)
        self.gain_errors.add(d.online_gain, frozen_gain, reward)
        if self.frozen is None and self.learner.learned >= self.config.warmup_decisions:
            self.frozen = clone_learner(self.learner, self.config, self.frozen_seed)
        entry = WindowEntry(reward, d.acted.propensity, d.other_prob, d.online_gain, d.q_other)
        evidence = self.promoter.record(entry)
        if evidence is not None:
            self._log_switch(evidence, snapshot.policy_version)

    def set_mode(self, mode: str, policy_version: int = 0) -> None:
        """Switch by hand; logged like an automatic switch, with the current evidence if any."""
        if mode not in ("live", "shadow"):
            raise ValueError(f"mode={mode!r} must be 'live' or 'shadow'")
        if mode == self.mode:
            return
        evidence = self.promoter.evaluate() or self.promoter.last
        self.promoter.switch(mode)
        self._log_switch(evidence, policy_version, manual=True)

    def _log_switch(self, evidence: Evidence | None, policy_version: int, manual: bool = False) -> None:
        record = switch_record(
            self.sink.next_decision_id(), float(self._clock()), self.run_id, self.mode, evidence, policy_version, manual
        )
        self.sink.log_decision(record)

    # --- reporting and state ---------------------------------------------------------------

    def metrics(self) -> dict[str, float]:
        """The mode and its switches, the mean recent reward, the latest promotion evidence and
        the gain-prediction errors (``controller/...``)."""
        out = {
            "controller/live": float(self.mode == "live"),
            "controller/promotions": float(self.promoter.promotions),
            "controller/demotions": float(self.promoter.demotions),
        }
        if self.recent_rewards:
            out["controller/mean_reward"] = sum(self.recent_rewards) / len(self.recent_rewards)
        out.update(evidence_metrics(self.promoter.last))
        out.update(self.gain_errors.metrics())
        return out

    def frozen_from_state(self, state: dict[str, Any] | None) -> BanditLearner | None:
        """The frozen copy saved as ``state`` (``state_dict()["frozen"]``), not installed yet: a
        controller checks every part of its state before it changes any."""
        return None if state is None else learner_from_state(state, self.config, self.frozen_seed)
