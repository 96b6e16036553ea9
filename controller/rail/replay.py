"""Offline replay: train RAIL learners from a decision trace and evaluate policies off-policy.

``load_logged(path)`` reads a trace (``pipeline.store.tracelog.read_trace``) and keeps the RAIL
decisions (``group_rescue``, ``group_extend``, ``token``) with their outcomes, as contexts the
learners take. What it does with awkward input, and reports in the returned ``LoggedSet``:

* **several runs in one trace**: an error listing the run ids, unless ``run_id`` picks one
  (a ``run_id`` the trace does not hold is an error listing the ones it does);
* **torn segments** (a crash mid-write): the complete batches are used, the torn files listed;
* **the same segment twice** (named twice, or a copy with the same bytes): read once, listed;
* outcomes join only decisions **of the run that wrote them** (ids of runs sharing a directory
  may coincide);
* **older or foreign schema versions**: ``TraceFormatError`` from the reader, unchanged;
* **logged propensity 0** (or not finite): the record cannot be importance-weighted -- it is
  skipped and counted (``skipped_zero_propensity``), not an error, since one bad record should
  not void a long trace; check the count;
* **no outcome** (the run ended with the group still open): skipped and counted;
* gate decisions and promotion records are not RAIL decisions: left out (counted).

The acting policy's propensity of a record is its ``behaviour_propensity`` (equal to
``propensity`` in live mode, the behaviour policy's in shadow mode; ``controller.rail.decider``).

``replay(logged, config)`` then runs a fresh learner over the records in order with progressive
validation (each record is predicted before it is learned) and estimates, with IPS, SNIPS and
doubly-robust (``controller.ope``) and their confidence intervals, the value of the learned
policy and of fixed candidates (always no-op, the ARPO heuristic); the learner's progressive
gain predictions are the DR reward model.

>>> import tempfile
>>> from pipeline.store.tracelog import TraceLog
>>> d = tempfile.mkdtemp()
>>> with TraceLog(d, run_id="demo") as log:
...     log.log_decision(DecisionRecord(0, 0.0, "", "shadow", "token", 1, 2, 0, 5, {"length_estimate": 0.1},
...                                     ("noop", "branch_b2_t1"), "branch_b2_t1", 0.3, 0.6, 0.0, 0))
...     log.log_outcome(0, reward=0.1, tokens=50)
>>> logged = load_logged(d)
>>> len(logged.records), logged.records[0].context.names, logged.records[0].reward
(1, ('noop', 'branch_b2_t1'), 0.1)
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from controller.ope import Estimate, doubly_robust, ips, snips
from controller.rail.arms import parse_arm
from controller.rail.bandit import BanditLearner, Decision
from controller.rail.behaviour import ArpoBehaviour, BehaviourPolicy, GuideBehaviour, NoneBehaviour
from controller.rail.config import RailConfig
from controller.rail.decider import SHADOW_PREFIX, Decider
from controller.rail.features import DECISION_POINTS, Context
from controller.rail.learners import build_learner
from pipeline.store.tracelog import read_trace
from pipeline.types import DecisionRecord  # noqa: F401  (the doctest's records)

_POINTS = {v: k for k, v in DECISION_POINTS.items()}


class ReplayError(ValueError):
    """A trace cannot be replayed as asked (mixed runs, an unknown run id, nothing usable)."""


class MixedRunsError(ReplayError):
    """A trace holds decisions of several runs and no ``run_id`` picks one (``run_ids`` lists them)."""

    def __init__(self, message: str, run_ids: tuple[str, ...]) -> None:
        super().__init__(message)
        self.run_ids = run_ids


@dataclass(frozen=True)
class LoggedDecision:
    """One RAIL decision with its outcome, ready for a learner."""

    decision_id: int
    run_id: str
    mode: str
    context: Context
    action: int
    behaviour_propensity: float  # the acting policy's probability of ``action``
    propensity: float  # as logged (the learned policy's, in shadow mode)
    reward: float
    tokens: int


@dataclass(frozen=True)
class LoggedSet:
    """The usable records of a trace and what was left out, and why."""

    records: tuple[LoggedDecision, ...]
    run_ids: tuple[str, ...]
    torn: tuple[Path, ...] = ()
    skipped_no_outcome: int = 0
    skipped_zero_propensity: int = 0
    skipped_not_rail: int = 0
    duplicates: tuple[Path, ...] = ()  # segment files given twice (by path or by content), read once


def load_logged(path: str | os.PathLike | Sequence[str | os.PathLike], run_id: str | None = None) -> LoggedSet:
    """The RAIL decisions of the trace at ``path`` (or of several segment files or directories,
    read as one trace); see the module docstring."""
    trace = read_trace(path)  # TraceFormatError (missing, foreign, other version) surfaces as is
    if run_id is None and len(trace.run_ids) > 1:
        raise MixedRunsError(
            f"trace {path} holds decisions of {len(trace.run_ids)} runs ({', '.join(trace.run_ids)}); pass "
            "run_id= one of them",
            trace.run_ids,
        )
    if run_id is not None and run_id not in trace.run_ids:
        raise ReplayError(f"trace {path} holds no run {run_id!r}; its runs are: {', '.join(trace.run_ids) or '(none)'}")
    rows = trace.joined().to_pylist()
    last: dict[int, dict] = {}
    not_rail = 0
    for row in rows:
        if run_id is not None and row["run_id"] != run_id:
            continue
        if row["decision_point"] not in _POINTS:
            not_rail += 1
            continue
        last[row["decision_id"]] = row  # a decision with several outcomes keeps the last one
    records, no_outcome, zero = [], 0, 0
    for row in last.values():
        if row["reward"] is None:
            no_outcome += 1
            continue
        mu = row["behaviour_propensity"]
        if mu is None or not math.isfinite(mu) or mu <= 0.0:
            zero += 1
            continue
        features = {k: v for k, v in row["features"] if not k.startswith(SHADOW_PREFIX)}
        arms = tuple(parse_arm(name) for name in row["actions"])
        context = Context.build(_POINTS[row["decision_point"]], features, arms)
        records.append(
            LoggedDecision(
                decision_id=row["decision_id"],
                run_id=row["run_id"],
                mode=row["mode"],
                context=context,
                action=context.index(row["chosen"]),
                behaviour_propensity=float(mu),
                propensity=float(row["propensity"]),
                reward=float(row["reward"]),
                tokens=int(row["tokens"] or 0),
            )
        )
    records.sort(key=lambda r: r.decision_id)
    return LoggedSet(tuple(records), trace.run_ids, trace.torn, no_outcome, zero, not_rail, trace.duplicates)


def train(learner: BanditLearner, logged: LoggedSet) -> int:
    """Learn every record in order (e.g. to warm-start ``RailController.learner``)."""
    for r in logged.records:
        learner.learn_one(r.context, _as_decision(r), r.reward)
    return len(logged.records)


@dataclass(frozen=True)
class PolicyEstimates:
    """IPS, SNIPS and DR estimates of one policy's mean reward per decision."""

    name: str
    ips: Estimate
    snips: Estimate
    dr: Estimate


@dataclass(frozen=True)
class ReplayReport:
    """What ``replay`` found."""

    n: int
    logged_value: Estimate  # on-policy mean reward of whatever acted
    policies: tuple[PolicyEstimates, ...]
    logged: LoggedSet = field(repr=False)

    def policy(self, name: str) -> PolicyEstimates:
        for p in self.policies:
            if p.name == name:
                return p
        raise KeyError(f"no policy {name!r} in this report; it has {', '.join(p.name for p in self.policies)}")


def replay(
    logged: LoggedSet,
    config: RailConfig,
    seed: int = 0,
    learner: BanditLearner | None = None,
    live_rule: bool = True,
    confidence: float = 0.95,
    clip: float | None = None,
) -> ReplayReport:
    """Progressive replay of ``logged`` through ``learner`` (a fresh ``config.backend`` one if
    None) and off-policy estimates of the learned policy (with the live threshold rule when
    ``live_rule``), of always-no-op, of the ARPO heuristic and, when the trace offered guidance
    arms, of the fixed guidance rule (both with ``config.behaviour_epsilon``)."""
    records = logged.records
    if not records:
        raise ReplayError(
            f"no usable RAIL decisions to replay ({logged.skipped_no_outcome} without outcome, "
            f"{logged.skipped_zero_propensity} with zero propensity, {logged.skipped_not_rail} not RAIL's)"
        )
    learner = learner if learner is not None else build_learner(config, seed)
    decider = Decider(config, learner, NoneBehaviour(0.0, seed), seed)
    fixed: dict[str, BehaviourPolicy] = {
        "noop": NoneBehaviour(0.0, seed),
        "arpo": ArpoBehaviour(config.behaviour_epsilon, seed),
    }
    if any(arm.kind == "guide" for x in records for arm in x.context.arms):  # the fixed guidance rule too
        fixed["guide"] = GuideBehaviour(config.behaviour_epsilon, seed)
    n = len(records)
    r = np.fromiter((x.reward for x in records), float, n)
    mu = np.fromiter((x.behaviour_propensity for x in records), float, n)
    q_logged = np.zeros(n)
    pi = {name: np.zeros(n) for name in ("learned", *fixed)}
    q_pi = {name: np.zeros(n) for name in pi}
    for k, rec in enumerate(records):
        probs, gains = learner.distribution(rec.context)
        if live_rule:
            probs = decider.live_distribution(rec.context, probs, gains)
        q_logged[k] = gains[rec.action]
        dists = {"learned": probs, **{name: p.distribution(rec.context)[0] for name, p in fixed.items()}}
        for name, d in dists.items():
            pi[name][k] = d[rec.action]
            q_pi[name][k] = sum(p * g for p, g in zip(d, gains))
        learner.learn_one(rec.context, _as_decision(rec), rec.reward)
    estimates = tuple(
        PolicyEstimates(
            name,
            ips(r, mu, pi[name], confidence=confidence, clip=clip),
            _snips_or_nan(r, mu, pi[name], confidence, clip),
            doubly_robust(r, mu, pi[name], q_logged, q_pi[name], confidence=confidence, clip=clip),
        )
        for name in pi
    )
    return ReplayReport(n, ips(r, mu, mu, confidence=confidence), estimates, logged)


def _snips_or_nan(r: np.ndarray, mu: np.ndarray, pi: np.ndarray, confidence: float, clip: float | None) -> Estimate:
    """SNIPS, or a NaN estimate when the policy never takes a logged action (SNIPS undefined)."""
    if float(np.sum(pi)) <= 0.0:
        return Estimate(math.nan, math.nan, math.nan, len(r), math.nan, "snips", confidence)
    return snips(r, mu, pi, confidence=confidence, clip=clip)


def _as_decision(r: LoggedDecision) -> Decision:
    name = r.context.arms[r.action].name
    return Decision(r.action, name, r.behaviour_propensity, math.nan, (), ())
