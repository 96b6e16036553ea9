"""Demonstration episodes for the supervised warm start, played through the environment itself.

A teacher writes an episode's actions as ``(action, is_target)``: the right answers, and in a
share of episodes (``task.env.demo_mistakes``) a wrong turn first, so that the transcript
holds the env's real feedback and a corrected turn after it. The actions are played through
an ``EnvSession``, so every observation is the env's own. ``sft_pairs`` turns a transcript
into ``(context_ids, target_ids)`` pairs with a renderer: one pair per target turn, the
context being everything before it (wrong turns included, never trained on as targets).

Teachers, in order: the class's ``demo_actions(row, rng, mistake, env_config)``
(``pipeline.envs.chain.ChainEnv`` has one), else the row's worked solution
(``extra_info.solution``, which ends with ``#### ANSWER`` for GSM8K-style envs: the wrong turn
is the same solution with a near-miss answer).

>>> from pipeline.envs.config import EnvConfig
>>> from pipeline.envs.session import EnvRunner
>>> from pipeline.envs.rows import EnvRow
>>> row = EnvRow([{"role": "user", "content": "3+4="}], {"reward_spec": {"ground_truth": "3+4*2"}})
>>> demo = play_demo(EnvRunner(EnvConfig()), row, [("8", False), ("7", True), ("14", True)])
>>> [(t.action, t.target, [m["content"] for m in t.observations]) for t in demo.turns], demo.reward
([('8', False, ['no<3+4=']), ('7', True, ['7*2=']), ('14', True, [])], 1.0)
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from pipeline.envs.rows import EnvRow
from pipeline.envs.session import EnvRunner

Action = tuple[str, bool]  # (text, is_target)


@dataclass(frozen=True)
class DemoTurn:
    action: str
    observations: tuple[dict, ...]
    target: bool


@dataclass(frozen=True)
class Demo:
    """A played demonstration: the starting conversation and its turns."""

    conversation: tuple[dict, ...]
    turns: tuple[DemoTurn, ...]
    reward: float  # the episode reward (task.env.reward)


def teacher_actions(
    cls: type, row: EnvRow, rng: random.Random, mistake: bool, env_config: dict[str, Any] | None = None
) -> list[Action]:
    """A teacher's actions for ``row`` (see the module docstring); ``ValueError`` when there is none."""
    own = getattr(cls, "demo_actions", None)
    if callable(own):
        return list(own({"prompt": row.prompt, **row.extras}, rng, mistake, env_config))
    info = row.extras.get("extra_info") or {}
    solution = info.get("solution") if isinstance(info, dict) else None
    if not isinstance(solution, str):
        raise ValueError(
            f"{cls.__qualname__} has no demo_actions(row, rng, mistake, env_config) and the row has no "
            "extra_info.solution; give rows a worked solution (ending '#### ANSWER') or the class a "
            "demo_actions classmethod, or warm-start without demonstrations"
        )
    if not mistake:
        return [(solution, True)]
    return [(_wrong_solution(solution, row.ground_truth, rng), False), (solution, True)]


def play_demo(runner: EnvRunner, row: EnvRow, actions: list[Action]) -> Demo | None:
    """Play ``actions`` through a fresh session; None when the env failed or ended before the last target."""
    session = runner.session(row.extras)
    try:
        started = session.start(row.prompt)
        if started.error:
            return None
        turns = []
        for action, target in actions:
            if session.done:
                break
            result = session.step(action)
            if result.error:
                return None
            turns.append(DemoTurn(action, result.observations, target))
        if len(turns) < len(actions):
            return None  # the env ended early: this transcript is not the teacher's
        return Demo(started.conversation, tuple(turns), session.episode_reward)
    finally:
        session.close()


def sft_pairs(renderer: Any, demo: Demo) -> list[tuple[list[int], list[int]]]:
    """``(context_ids, target_ids)`` for each target turn of ``demo``; targets end with the stop token."""
    context = renderer.prompt_ids(list(demo.conversation))
    pairs = []
    for turn in demo.turns:
        action = renderer.action_ids(turn.action)
        if turn.target:
            pairs.append((list(context), action))
        context = context + action + renderer.observation_ids(list(turn.observations))
    return pairs


def _wrong_solution(solution: str, truth: Any, rng: random.Random) -> str:
    match = re.search(r"####\s*(-?[\d,]+)", solution)
    if match is None:
        return str(_near(truth, rng))
    right = int(match.group(1).replace(",", ""))
    return solution[: match.start(1)] + str(_near(right, rng)) + solution[match.end(1) :]


def _near(value: Any, rng: random.Random) -> int:
    try:
        right = int(str(value).replace(",", ""))
    except ValueError:
        right = 0
    return right + rng.choice((-10, -2, -1, 1, 2, 10))
