"""What an environment returns, checked against the contract (``pipeline.envs.protocol``).

Each check returns the value in the form the session keeps (plain lists and dicts, a float
reward, a bool ``done``) or raises ``BadOutput`` with one line saying what was wrong. Lenient
where SkyRL-Gym's own environments are (an ``int`` reward such as GSM8K's ``0``, numpy
scalars, a missing or ``None`` metadata), strict where a wrong value would be trained on.

>>> check_step({"observations": [], "reward": 0, "done": True}, max_chars=100)
([], 0.0, True, {})
>>> check_step({"observations": "no", "reward": 1.0, "done": False, "metadata": {}}, max_chars=100)
Traceback (most recent call last):
...
pipeline.envs.checks.BadOutput: observations is a str ('no'), not a list of {'role', 'content'} messages
>>> check_step({"observations": [], "reward": "1", "done": True}, max_chars=100)
Traceback (most recent call last):
...
pipeline.envs.checks.BadOutput: reward is a str ('1'), not a number
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

from pipeline.envs.protocol import content_chars, message_problem

STEP_KEYS = ("observations", "reward", "done")


class BadOutput(ValueError):
    """An environment returned something outside the contract; the message is one line."""


def check_init(value: Any, max_chars: int) -> tuple[list[dict], dict]:
    """``init``'s ``(conversation, metadata)``: a non-empty message list and a dict (or None)."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise BadOutput(f"init returned {_short(value)}, not a (conversation, metadata) pair")
    conversation, metadata = value
    problem = message_problem(conversation, "the conversation")
    if problem:
        raise BadOutput(problem)
    if not conversation:
        raise BadOutput("the conversation is empty; init must return at least the prompt's messages")
    chars = content_chars(conversation)
    if chars > max_chars:
        raise BadOutput(f"the conversation holds {chars} characters, over {max_chars}")
    return [dict(m) for m in conversation], _metadata(metadata)


def check_step(value: Any, max_chars: int) -> tuple[list[dict], float, bool, dict]:
    """``step``'s output as ``(observations, reward, done, metadata)``."""
    if not isinstance(value, Mapping):
        raise BadOutput(
            f"returned a {type(value).__name__} ({_short(value)}), not a mapping with "
            "observations, reward, done and metadata"
        )
    missing = [k for k in STEP_KEYS if k not in value]
    if missing:
        raise BadOutput(f"returned no {', '.join(missing)} (keys: {', '.join(map(str, value)) or 'none'})")
    observations, reward, done = value["observations"], value["reward"], value["done"]
    problem = message_problem(observations, "observations")
    if problem:
        raise BadOutput(problem)
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real):
        raise BadOutput(f"reward is a {type(reward).__name__} ({_short(reward)}), not a number")
    reward = float(reward)
    if not math.isfinite(reward):
        raise BadOutput(f"reward is {reward}, not a finite number")
    if not _is_bool(done):
        raise BadOutput(f"done is a {type(done).__name__} ({_short(done)}), not a bool")
    chars = content_chars(observations)
    if chars > max_chars:
        raise BadOutput(f"observations hold {chars} characters, over max_observation_chars={max_chars}")
    return [dict(m) for m in observations], reward, bool(done), _metadata(value.get("metadata"))


def _metadata(value: Any) -> dict:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise BadOutput(f"metadata is a {type(value).__name__} ({_short(value)}), not a dict")
    return dict(value)


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool) or type(value).__name__ == "bool_"  # numpy's bool, without importing numpy


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
