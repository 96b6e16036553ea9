"""Chained arithmetic: a multi-turn environment a 0.4M-parameter character model can learn on a
CPU, where feedback makes a corrected next turn possible (recoverability by design).

A problem is a start number and 2-3 operations, done left to right: ``12+7-4*2``. The model
answers one step a turn. A right answer gets the next step, written from the right result; a
wrong one gets ``no`` with a hint and the same step again; the episode succeeds when every
step is right within ``steps + retries`` turns. The whole exchange stays inside the alphabet
``0-9 + - * = n o < > ?`` (the character tokenizer's), one assistant turn per step::

    prompt   12+7=          the first step
    turn     19<eos>        right: the env writes the next step from 19
    obs      19-4=
    turn     16<eos>        wrong: 15 is smaller than 16
    obs      no<19-4=       ('<': the answer is smaller, '>': larger, '?': not a number)
    turn     15<eos>
    obs      15*2=
    turn     30<eos>        done: success

Rewards: 1 for a right step, 0 for a wrong one, except the episode's last turn, whose reward
is the outcome (1 success, 0 failure), so ``reward: final`` trains on success and
``reward: sum`` counts right steps of successful episodes (plus those of failed ones).

Settings (``task.env.config``, ``ChainSettings``): number of operations, operand sizes, the
operators, the largest value, retries and whether the hint is given. The defaults (2-3
operations, operands 1-9, '+-*' with a multiplier of 2 or 3, values up to 99, 2 retries, hints)
are chosen so that the project's CPU model starts in the 0.2-0.5 success band after a short
warm start on ``demo_actions`` episodes (docs/benchmarks/recoverability.md measures what branching from its turns is worth).

>>> env = ChainEnv({}, {"reward_spec": {"ground_truth": "12+7-4*2"}})
>>> env.init([{"role": "user", "content": "12+7="}])[0][0]["content"]
'12+7='
>>> [env.step(a)["observations"][0]["content"] for a in ("19", "16", "15")]
['19-4=', 'no<19-4=', '15*2=']
>>> out = env.step("30"); out["reward"], out["done"], out["metadata"]["success"]
(1.0, True, True)
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from pipeline.config.build import build, require

ALPHABET = "0123456789+-*=no<>?"
_STEP = re.compile(r"([+\-*])(\d+)")
_NUMBER = re.compile(r"-?\d{1,9}")


@dataclass(frozen=True)
class ChainSettings:
    """``task.env.config`` of ``pipeline.envs.chain:ChainEnv``."""

    min_steps: int = 2
    """Fewest operations in a problem (the difficulty is the count)."""
    max_steps: int = 3
    """Most operations in a problem."""
    max_start: int = 20
    """The start number is drawn from 0..max_start."""
    max_operand: int = 9
    """Operands of + and - are drawn from 1..max_operand."""
    multipliers: tuple[int, ...] = (2, 3)
    """What '*' multiplies by."""
    ops: str = "+-*"
    """Operators drawn from, a subset of '+-*'."""
    max_value: int = 99
    """Every intermediate result stays in 0..max_value (draws that leave it are redrawn)."""
    retries: int = 2
    """Wrong answers allowed in an episode: it has steps + retries turns."""
    hint: bool = True
    """Say whether the answer is smaller ('<') or larger ('>') after a wrong turn; off: '?'."""

    def __post_init__(self) -> None:
        require(
            1 <= self.min_steps <= self.max_steps <= 8,
            f"task.env.config min_steps={self.min_steps}, "
            f"max_steps={self.max_steps}: need 1 <= min_steps <= max_steps <= 8",
        )
        require(
            bool(self.ops) and set(self.ops) <= set("+-*"),
            f"task.env.config.ops={self.ops!r} must be a non-empty subset of '+-*'",
        )
        require(self.max_operand >= 1, f"task.env.config.max_operand={self.max_operand} must be >= 1")
        require(
            0 <= self.max_start <= self.max_value,
            f"task.env.config max_start={self.max_start}, max_value={self.max_value}: need 0 <= max_start <= max_value",
        )
        require(
            "*" not in self.ops or (bool(self.multipliers) and min(self.multipliers) >= 2),
            f"task.env.config.multipliers={self.multipliers!r} must hold integers >= 2 when ops has '*'",
        )
        require(0 <= self.retries <= 8, f"task.env.config.retries={self.retries} must be in 0..8")

    @property
    def max_turns(self) -> int:
        return self.max_steps + self.retries


class ChainEnv:
    """The chained-arithmetic environment (see the module docstring); SkyRL's contract.

    Parameters
    ----------
    env_config
        ``ChainSettings`` as a mapping (unknown keys are errors).
    extras
        The row: ``reward_spec.ground_truth`` is the chain, e.g. ``"12+7-4*2"``.
    """

    def __init__(self, env_config: dict[str, Any] | None, extras: dict[str, Any]) -> None:
        self.settings = settings_of(env_config)
        self.chain = str(extras["reward_spec"]["ground_truth"])
        self.start, self.ops = parse_chain(self.chain)
        self.max_turns = len(self.ops) + self.settings.retries
        self.turns = 0
        self.position = 0  # steps done right
        self.value = self.start

    # -- the contract ------------------------------------------------------------------------

    def init(self, prompt: list[dict[str, str]]) -> tuple[list[dict[str, str]], dict[str, Any]]:
        return prompt, {"steps": len(self.ops)}

    def step(self, action: str) -> dict[str, Any]:
        self.turns += 1
        op, operand = self.ops[self.position]
        right = apply(self.value, op, operand)
        answer = _NUMBER.fullmatch(action.strip())
        correct = answer is not None and int(answer.group()) == right
        if correct:
            self.position, self.value = self.position + 1, right
        success = self.position == len(self.ops)
        done = success or self.turns >= self.max_turns
        reward = float(success) if done else float(correct)
        if done:
            text = ""
        elif correct:
            text = self.step_text()
        else:
            text = "no" + self._hint(answer, right) + self.step_text()
        observations = [{"role": "user", "content": text}] if text else []
        metadata = {"step": self.position, "correct": correct, "success": success}
        return {"observations": observations, "reward": reward, "done": done, "metadata": metadata}

    def close(self) -> None:
        pass

    def snapshot(self) -> dict[str, int]:
        return {"turns": self.turns, "position": self.position, "value": self.value}

    def restore(self, state: dict[str, int]) -> None:
        self.turns, self.position, self.value = state["turns"], state["position"], state["value"]

    # -- text --------------------------------------------------------------------------------

    def step_text(self) -> str:
        """The current step as the model reads it, e.g. ``19-4=``."""
        op, operand = self.ops[self.position]
        return f"{self.value}{op}{operand}="

    def _hint(self, answer: re.Match | None, right: int) -> str:
        if answer is None or not self.settings.hint:
            return "?"
        return "<" if right < int(answer.group()) else ">"

    # -- problems and demonstrations (railgate's EnvTask reads these) ---------------------------

    @classmethod
    def alphabet(cls, env_config: dict[str, Any] | None = None) -> str:
        """Every character of its prompts, observations and right answers."""
        return ALPHABET

    @classmethod
    def sample_row(cls, rng: random.Random, env_config: dict[str, Any] | None = None) -> dict[str, Any]:
        """A problem as a dataset row in SkyRL's format."""
        s = settings_of(env_config)
        while True:
            steps = rng.randint(s.min_steps, s.max_steps)
            value = start = rng.randint(0, s.max_start)
            ops = []
            for _ in range(steps):
                op = rng.choice(s.ops)
                operand = rng.choice(s.multipliers) if op == "*" else rng.randint(1, s.max_operand)
                value = apply(value, op, operand)
                ops.append((op, operand))
            if all(0 <= v <= s.max_value for v in values(start, ops)):
                break
        chain = f"{start}" + "".join(f"{op}{operand}" for op, operand in ops)
        return {
            "data_source": "railgate/chain",
            "prompt": [{"role": "user", "content": f"{start}{ops[0][0]}{ops[0][1]}="}],
            "env_class": "pipeline.envs.chain:ChainEnv",
            "reward_spec": {"method": "rule", "ground_truth": chain},
            "extra_info": {"steps": steps},
        }

    @classmethod
    def difficulty(cls, row: dict[str, Any]) -> float:
        """The number of operations."""
        return float(len(parse_chain(row["reward_spec"]["ground_truth"])[1]))

    @classmethod
    def demo_actions(
        cls, row: dict[str, Any], rng: random.Random, mistake: bool, env_config: dict[str, Any] | None = None
    ) -> list[tuple[str, bool]]:
        """A right episode's actions as ``(action, is_target)``; with ``mistake``, one step
        (drawn with ``rng``) is first answered wrong -- a near miss, not a target -- and then right."""
        start, ops = parse_chain(row["reward_spec"]["ground_truth"])
        results = values(start, ops)[1:]
        wrong_at = rng.randrange(len(ops)) if mistake else -1
        out: list[tuple[str, bool]] = []
        for k, right in enumerate(results):
            if k == wrong_at:
                out.append((str(near_miss(right, rng)), False))
            out.append((str(right), True))
        return out


def settings_of(env_config: dict[str, Any] | None) -> ChainSettings:
    """``ChainSettings`` from a mapping (already one: as is)."""
    if isinstance(env_config, ChainSettings):
        return env_config
    return build(ChainSettings, dict(env_config or {}), "task.env.config")


def parse_chain(chain: str) -> tuple[int, list[tuple[str, int]]]:
    """``"12+7-4"`` -> ``(12, [("+", 7), ("-", 4)])``.

    >>> parse_chain("3*2+10")
    (3, [('*', 2), ('+', 10)])
    """
    head = re.match(r"\d+", chain)
    ops = [(op, int(n)) for op, n in _STEP.findall(chain)]
    if head is None or not ops or f"{head.group()}{''.join(op + str(n) for op, n in ops)}" != chain:
        raise ValueError(
            f"reward_spec.ground_truth={chain!r} is not a chain like '12+7-4*2'; write the start number "
            "and then each operation (+, - or *) with its operand"
        )
    return int(head.group()), ops


def apply(value: int, op: str, operand: int) -> int:
    return value + operand if op == "+" else value - operand if op == "-" else value * operand


def values(start: int, ops: list[tuple[str, int]]) -> list[int]:
    """The start and every intermediate result."""
    out = [start]
    for op, operand in ops:
        out.append(apply(out[-1], op, operand))
    return out


def near_miss(right: int, rng: random.Random) -> int:
    """A plausible wrong answer: off by 1-3, or by ten (a carry), never negative."""
    while True:
        wrong = right + rng.choice((-10, -3, -2, -1, 1, 2, 3, 10))
        if wrong >= 0 and wrong != right:
            return wrong
