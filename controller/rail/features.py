"""The context RAIL's bandit sees at a decision point, and its sanitisation rule.

A ``Context`` is the shared feature dict (the bandit's ``s`` namespace), the arms available at
this decision point, and each arm's expected token cost (which feeds the arm's own features,
namespace ``a``). Features are scaled to stay O(1) for both backends:

=====================  ===========================================================================
``point_rescue``,      one-hot decision point: the gate proposed ABANDON (rescue), COMMIT
``point_extend``,      (extend), or a high-entropy token of a running sample (token)
``point_token``
``post_a``, ``post_b`` Beta posterior of the prompt's success rate, uniform prior, from the
                       group's rewards so far, divided by the group's target size
``post_mean``          a / (a + b)
``probe_all_fail``,    outcome of the rewards so far (one-hot; all zero before any reward)
``probe_all_success``,
``probe_mixed``
``prompt_len``         log1p(prompt tokens) / 10
``position_fraction``  where the branch would start, as a fraction of the response (0 for none)
``token_entropy``      entropy (nats) at the decision token / cut point
``entropy_known``      1 when the engine reports entropies, else 0 (and ``token_entropy`` is 0)
``prefix_mean_logprob`` mean log-prob of the prefix tokens (0 when there is no prefix)
``successes``,         partial-group statistics, divided by the target size
``failures``,
``in_flight``,
``launched``
``policy_age``         policy versions since the controller first saw the group
``interventions``      interventions the controller already made on this group
``length_estimate``    expected response length, in thousands of tokens
``guide_count``,       guidance points only: the prompt's guidance history and the run's recent
``guide_mixed_rate``,  pass rate (``controller.rail.guide_history``)
``run_success_rate``
=====================  ===========================================================================

Sanitisation (the rule, tested): a log-prob of ``-inf`` (a token the policy gave probability 0)
and an infinite entropy are legitimate extremes, clamped to ``[-LOGPROB_FLOOR, 0]`` and
``[0, ENTROPY_CAP]`` where they enter. After that every feature must be finite: a NaN anywhere,
or an infinity in any other feature, is a bug upstream, and ``check_features`` raises a
``ValueError`` that names the feature rather than feeding garbage to the learner.

>>> from controller.rail.arms import build_arms
>>> from controller.rail.config import RailConfig
>>> arms = build_arms(RailConfig(branch_sizes=(2,), branch_temperatures=(1.0,), resample_sizes=()))
>>> ctx = Context.build("token", {"length_estimate": 0.1, "position_fraction": 0.5}, arms)
>>> [a.name for a in ctx.arms], ctx.costs
(['noop', 'branch_b2_t1'], (0.0, 100.0))
>>> check_features({"token_entropy": float("nan")})
Traceback (most recent call last):
...
ValueError: feature 'token_entropy'=nan is not finite; the controller's inputs must be numbers (a NaN here is a bug upstream: check the engine's log-probs and entropies)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

from controller.rail.arms import Arm, ArmsCache
from pipeline.types import GroupSnapshot

POINTS = ("rescue", "extend", "token")
"""Decision points of single responses; ``DecisionRecord.decision_point`` holds ``DECISION_POINTS[point]``."""
TURN = "turn"
"""The decision point at an episode's turn boundary (``controller.rail.turns``): its features are the
group's, with every ``point_*`` above 0, plus its own (``turn_features``)."""
ALL_POINTS = (*POINTS, TURN)
_POINT_ONE_HOT = {p: tuple(float(p == q) for q in POINTS) for p in ALL_POINTS}
"""The ``point_*`` features of each decision point, in ``POINTS`` order."""
DECISION_POINTS = {"rescue": "group_rescue", "extend": "group_extend", "token": "token", TURN: TURN}
LOGPROB_FLOOR = 30.0
ENTROPY_CAP = 30.0


def clamp_logprob(value: float) -> float:
    """A log-prob in ``[-LOGPROB_FLOOR, 0]`` (``-inf`` becomes the floor; NaN stays NaN)."""
    if math.isnan(value):
        return value
    return min(max(value, -LOGPROB_FLOOR), 0.0)


def clamp_entropy(value: float) -> float:
    """An entropy in ``[0, ENTROPY_CAP]`` (``inf`` becomes the cap; NaN stays NaN)."""
    if math.isnan(value):
        return value
    return min(max(value, 0.0), ENTROPY_CAP)


def check_features(features: Mapping[str, float]) -> dict[str, float]:
    """The features as a plain dict of floats; ``ValueError`` naming the first non-finite one."""
    out = {}
    for name, value in features.items():
        v = float(value)
        if not math.isfinite(v):
            raise ValueError(
                f"feature {name!r}={v!r} is not finite; the controller's inputs must be numbers (a NaN "
                "here is a bug upstream: check the engine's log-probs and entropies)"
            )
        out[name] = v
    return out


@dataclass(frozen=True)
class PrefixInfo:
    """Where a branch would start and what the prefix looks like (all zero when there is none)."""

    position_fraction: float = 0.0
    token_entropy: float = 0.0
    entropy_known: bool = False
    prefix_mean_logprob: float = 0.0


def group_features(
    snapshot: GroupSnapshot,
    point: str,
    prefix: PrefixInfo,
    length_estimate: float,
    policy_age: int,
    interventions: int,
) -> dict[str, float]:
    """The shared context of a decision on ``snapshot``'s group (see the module table)."""
    one_hot = _POINT_ONE_HOT.get(point)
    if one_hot is None:
        raise ValueError(f"decision point {point!r} is not one of {', '.join(ALL_POINTS)}")
    size = float(max(snapshot.target_size, 1))
    done = len(snapshot.rewards)
    s = snapshot.successes  # counted once: ``failures`` would count them again
    f = done - s  # ``GroupSnapshot.failures``
    a, b = 1.0 + s, 1.0 + f
    rescue, extend, token = one_hot
    features = {
        "point_rescue": rescue,
        "point_extend": extend,
        "point_token": token,
        "post_a": a / size,
        "post_b": b / size,
        "post_mean": a / (a + b),
        "probe_all_fail": float(done > 0 and s == 0),
        "probe_all_success": float(done > 0 and f == 0),
        "probe_mixed": float(0 < s < done),
        "prompt_len": math.log1p(len(snapshot.prompt.token_ids)) / 10.0,
        "position_fraction": float(prefix.position_fraction),
        "token_entropy": float(clamp_entropy(prefix.token_entropy)) if prefix.entropy_known else 0.0,
        "entropy_known": float(prefix.entropy_known),
        "prefix_mean_logprob": float(clamp_logprob(prefix.prefix_mean_logprob)),
        "successes": s / size,
        "failures": f / size,
        "in_flight": snapshot.in_flight / size,
        "launched": snapshot.launched / size,
        "policy_age": float(policy_age),
        "interventions": float(interventions),
        "length_estimate": length_estimate / 1000.0,
    }
    # Every value is a float; their sum is finite exactly when each is (they are far from overflowing),
    # so one sum replaces a check per feature, and check_features names the culprit when it is not.
    return features if math.isfinite(sum(features.values())) else check_features(features)


@dataclass(frozen=True)
class Context:
    """A decision point as the bandit sees it: shared features, available arms, arm costs.

    ``features`` must not be mutated after construction (it is the logged context).
    """

    point: str
    features: dict[str, float]
    arms: tuple[Arm, ...]
    costs: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.arms:
            raise ValueError(
                f"a {self.point!r} decision has no arms; pass at least one (the no-op is always available "
                "through build_arms)"
            )
        if len(self.costs) != len(self.arms):
            raise ValueError(f"{len(self.costs)} costs for {len(self.arms)} arms; give one expected cost per arm")

    @classmethod
    def build(
        cls, point: str, features: Mapping[str, float], arms: tuple[Arm, ...] | list[Arm], checked: bool = False
    ) -> Context:
        """Validate ``features`` and derive every arm's cost from ``length_estimate`` (thousands
        of tokens) and ``position_fraction``, as a replay of a logged record does.
        ``checked=True`` takes ``features`` as it is: pass it only ``check_features``' own
        output (a fresh dict of finite floats, as ``group_features`` returns)."""
        values = cast(dict[str, float], features) if checked else check_features(features)
        length = values.get("length_estimate", 0.0) * 1000.0
        rest = min(max(1.0 - values.get("position_fraction", 0.0), 0.0), 1.0)
        arms = tuple(arms)
        # expected_tokens of every arm, from its samples and the share of a response each writes.
        rules = _COST_RULES.get(arms, _cost_rules)
        return cls(
            point,
            values,
            arms,
            tuple([0.0 if not n else n * length * (rest if branch else share) for n, branch, share in rules]),
        )

    @property
    def names(self) -> tuple[str, ...]:
        """The arms' names, in order (once per arms tuple: a controller passes the same few)."""
        return _ARM_NAMES.get(self.arms, _names_of)

    def index(self, name: str) -> int:
        """Position of the arm called ``name`` in this context's arms."""
        for i, arm in enumerate(self.arms):
            if arm.name == name:
                return i
        raise ValueError(f"arm {name!r} is not available here; available: {', '.join(self.names)}")


def _names_of(arms: tuple[Arm, ...]) -> tuple[str, ...]:
    return tuple(a.name for a in arms)


def _cost_rules(arms: tuple[Arm, ...]) -> tuple[tuple[float, bool, float], ...]:
    """Per arm, its expected samples (0 for the no-op), whether it is a branch (its share is the
    context's ``1 - position_fraction``) and otherwise the share of a response each sample writes
    (``expected_tokens``'s rule, taken apart once per arms tuple)."""
    return tuple(
        (0.0 if a.is_noop else float(a.n), a.kind == "branch", 1.0 if a.kind != "guide" else 1.0 - a.level)
        for a in arms
    )


_ARM_NAMES = ArmsCache()
_COST_RULES = ArmsCache()
