"""RAIL's decision point at an episode's turn boundary (``task.name: env``): ``turn``.

When the environment has answered turn ``t`` of an episode and turn ``t + 1`` is about to
start, the group tracker hands the controller a ``TurnPoint`` (``RailController.on_turn``).
Which boundaries are decision points is ``controller.rail.turn_decisions``: ``failed`` (the
default) only those after a turn whose reward is at most ``turn_fail_reward`` -- the
environment said wrong, and its feedback is in the context the next turn sees -- ``all`` every
one, ``off`` none; a group has at most ``max_turn_decisions_per_group`` of them and no more once
it made ``max_interventions_per_group`` interventions. Points are decided at once (the tracker
acts on them in the same message; they are not batched like token points).

Every arm is on offer: the no-op; a branch, ``b`` new episodes that continue this episode's
context after turn ``t`` in a copy of its environment (``BranchSpec(key, prefix_len,
turns=t)``: the tracker forks the environment by replay or snapshot, ``pipeline.core.episodes``);
a resample, ``n`` fresh episodes of the prompt. Its expected cost follows the other points'
rule (``features.Context.build``) with ``position_fraction`` the boundary's share of an episode
(its tokens so far over the running mean episode length): a branch writes the rest of an
episode, a resample whole ones. The reward is the extend/token one (``controller.rail.reward``):
the variance the launched episodes add to the group that trains, less their price.

Features: the group's (``features.group_features``, every ``point_*`` of the other points 0;
no prefix log-prob or entropy: a boundary is not a token the engine reported), plus:

=======================  ======================================================================
``point_turn``           1
``turn_index``           turns so far / 10
``turn_reward``          the environment's reward for the turn just answered
``turn_failed``          1 when that reward is at most ``turn_fail_reward``
``turn_reward_mean``     mean reward of the episode's turns so far
``observation_tokens``   log1p(tokens of the environment's answer) / 10
``episode_tokens``       log1p(tokens so far, turns and observations) / 10
=======================  ======================================================================

(The group's running successes and failures are the group features ``successes`` and ``failures``.)

>>> from controller.rail.config import RailConfig
>>> from pipeline.types import TurnPoint
>>> point = TurnPoint("g3-s1", turns=1, prefix_len=6, reward=0.0, observation_tokens=3, rewards=(0.0,))
>>> turn_due(point, None, RailConfig()), turn_due(point, None, RailConfig(turn_decisions="off"))
(True, False)
>>> turn_branch(point)
BranchSpec(source_request_id='g3-s1', prefix_len=6, prefix_token_ids=(), prefix_logprobs=(), turns=1, guide_level=0.0)
"""

from __future__ import annotations

import math

from controller.rail.arms import Arm
from controller.rail.config import RailConfig
from controller.rail.features import TURN, Context, PrefixInfo, group_features
from controller.rail.points import GroupState
from pipeline.types import BranchSpec, GroupSnapshot, TurnPoint

__all__ = ["TURN", "turn_branch", "turn_context", "turn_due", "turn_features"]


def turn_due(point: TurnPoint, group: GroupState | None, cfg: RailConfig) -> bool:
    """``point`` is a decision point (``group``: the controller's record of its group, None
    before its first decision)."""
    if cfg.turn_decisions == "off" or (cfg.turn_decisions == "failed" and point.reward > cfg.turn_fail_reward):
        return False
    if group is None:
        return cfg.max_turn_decisions_per_group > 0 and cfg.max_interventions_per_group > 0
    return (
        group.turn_decisions < cfg.max_turn_decisions_per_group
        and group.interventions < cfg.max_interventions_per_group
    )


def turn_features(point: TurnPoint, fail_reward: float) -> dict[str, float]:
    """The turn point's own features (the module table)."""
    rewards = point.rewards or (point.reward,)
    return {
        "point_turn": 1.0,
        "turn_index": point.turns / 10.0,
        "turn_reward": float(point.reward),
        "turn_failed": float(point.reward <= fail_reward),
        "turn_reward_mean": float(sum(rewards) / len(rewards)),
        "observation_tokens": math.log1p(max(point.observation_tokens, 0)) / 10.0,
        "episode_tokens": math.log1p(max(point.prefix_len, 0)) / 10.0,
    }


def turn_context(
    snapshot: GroupSnapshot,
    group: GroupState,
    point: TurnPoint,
    arms: tuple[Arm, ...],
    length_estimate: float,
    fail_reward: float,
) -> Context:
    """The context of a turn decision: the group's features and the turn's, every arm."""
    fraction = min(point.prefix_len / max(length_estimate, 1.0), 0.95)
    features = group_features(
        snapshot,
        TURN,
        PrefixInfo(position_fraction=fraction),
        length_estimate,
        snapshot.policy_version - group.first_version,
        group.interventions,
    )
    features.update(turn_features(point, fail_reward))
    return Context.build(TURN, features, arms)  # checks the turn's values too


def turn_branch(point: TurnPoint) -> BranchSpec:
    """What a branch arm continues: episode ``point.key`` after its ``point.turns`` turns."""
    return BranchSpec(point.key, point.prefix_len, turns=point.turns)
