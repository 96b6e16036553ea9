"""A gate's decisions as trace records, and the sink that keeps none.

The tracker logs every action a gate proposes as one ``DecisionRecord`` (decision point
``"gate"``, propensity 1: gates are deterministic given their state) and, when the group
closes, one outcome per decision: 1 if the group shipped effective, else 0, with the tokens
the group cost. ``NullSink`` stands in where no trace is written; its ids still increase, so
the controller can key its pending decisions by them.

>>> from pipeline.types import ActionKind, GroupAction, Prompt
>>> sink = NullSink()
>>> record = gate_decision(sink.next_decision_id(), GroupAction(ActionKind.COMMIT, 3), prompt=Prompt(5, "", ()),
...                        rewards=(1.0, 0.0), in_flight=0, launched=2, target_size=8, executed=True,
...                        time=1.5, run_id="r", policy_version=2)
>>> record.decision_id, record.chosen, record.features["successes"], sink.watermark()
(0, 'commit', 1.0, 1)
"""

from __future__ import annotations

from pipeline.types import DecisionRecord, GroupAction, Prompt

GATE_ACTIONS = ("launch", "commit", "abandon", "hold")


def gate_decision(
    decision_id: int,
    action: GroupAction,
    *,
    prompt: Prompt,
    rewards: tuple[float, ...],
    in_flight: int,
    launched: int,
    target_size: int,
    executed: bool,
    time: float,
    run_id: str,
    policy_version: int,
) -> DecisionRecord:
    """The trace record of one gate action on a group in this state."""
    successes = sum(1 for r in rewards if r > prompt.success_threshold)
    return DecisionRecord(
        decision_id=decision_id,
        time=time,
        run_id=run_id,
        mode="live",
        decision_point="gate",
        prompt_id=prompt.prompt_id,
        group_id=action.group_id,
        sample_index=-1,
        token_position=-1,
        features={
            "successes": float(successes),
            "failures": float(len(rewards) - successes),
            "in_flight": float(in_flight),
            "launched": float(launched),
            "target_size": float(target_size),
            "executed": float(executed),
            **guide_features(action),
        },
        actions=GATE_ACTIONS,
        chosen=action.kind.value,
        propensity=1.0,
        behaviour_propensity=1.0,
        predicted_gain=float("nan"),
        policy_version=policy_version,
    )


def guide_features(action: GroupAction) -> dict[str, float]:
    """A guided launch's trace features (none for any other action): its level, the reference
    tokens of its prefix and how many rollouts it launched, so replay and off-policy estimates
    see the guided rollouts as their own arm.

    >>> from pipeline.types import ActionKind, BranchSpec
    >>> guide_features(GroupAction(ActionKind.LAUNCH, 3, n=4, branch=BranchSpec("reference-5", 2, (7, 8), guide_level=0.5)))
    {'guide_level': 0.5, 'guide_tokens': 2.0, 'guided_rollouts': 4.0}
    """
    b = action.branch
    if b is None or not b.guided:
        return {}
    return {"guide_level": b.guide_level, "guide_tokens": float(b.prefix_len), "guided_rollouts": float(action.n)}


class NullSink:
    """A ``DecisionSink`` that keeps nothing (decision ids still increase)."""

    def __init__(self) -> None:
        self._next = 0

    def next_decision_id(self) -> int:
        self._next += 1
        return self._next - 1

    def log_decision(self, record: DecisionRecord) -> None:
        return None

    def log_outcome(self, decision_id: int, reward: float, tokens: int) -> None:
        return None

    def watermark(self) -> int:
        return self._next

    def flush(self) -> None:
        return None
