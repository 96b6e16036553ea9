"""Reward functions: each is a ``pipeline.protocols.Scorer`` built around a ``decode`` function.

=====================  ==========================================================
``ExactMatchReward``   response == ``prompt.answer`` (arithmetic: reversed digits)
``NumericReward``      the response's number within a tolerance of the answer's
``MathVerifyReward``   math-verify equivalence of the ``\\boxed{}`` answer
``CountdownReward``    a safe-parsed expression reaching the target
=====================  ==========================================================

>>> reward = build_reward("exact", decode=lambda ids: "".join(map(str, ids)))
>>> type(reward).__name__, reward.runs_inline
('ExactMatchReward', False)
"""

from __future__ import annotations

from pipeline.tasks.rewards.base import Decode, TextReward
from pipeline.tasks.rewards.countdown import CountdownReward, check_countdown, evaluate_expression
from pipeline.tasks.rewards.exact import ExactMatchReward, NumericReward, exact_match, numeric_match
from pipeline.tasks.rewards.mathverify import MathVerifyReward, math_verify_match

REWARDS = {
    "exact": ExactMatchReward,
    "numeric": NumericReward,
    "math_verify": MathVerifyReward,
    "countdown": CountdownReward,
}


def build_reward(name: str, decode: Decode, **kwargs) -> TextReward:
    """The reward called ``name`` (a key of ``REWARDS``), decoding with ``decode``."""
    if name not in REWARDS:
        raise ValueError(f"reward {name!r} is unknown; choose one of {', '.join(sorted(REWARDS))}")
    return REWARDS[name](decode, **kwargs)


__all__ = [
    "REWARDS",
    "CountdownReward",
    "Decode",
    "ExactMatchReward",
    "MathVerifyReward",
    "NumericReward",
    "TextReward",
    "build_reward",
    "check_countdown",
    "evaluate_expression",
    "exact_match",
    "math_verify_match",
    "numeric_match",
]
