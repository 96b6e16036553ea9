"""GSM8K-style word problems, generated locally, and a multi-turn environment that grades them.

``make_problem(rng, steps)`` fills one of a few templates (people, items, numbers) with a
worked solution of 1-3 arithmetic steps ending ``#### ANSWER`` and an integer answer. Rows
(``sample_row``, ``write_rows``) are in SkyRL's format, so SkyRL-Gym's own multi-turn GSM8K
environment runs on them unmodified::

    task:
      name: env
      env:
        class: skyrl_gym.envs.gsm8k.multi_turn_env:GSM8kMultiTurnEnv   # pip install 'railgate[skyrl]'
        dataset: runs/wordproblems/train.jsonl    # python -m pipeline.envs.wordproblems runs/wordproblems

``WordProblemEnv`` is railgate's own equivalent, for when skyrl-gym is not installed (and it
generates its own problems, no dataset needed): the model is asked for its reasoning and a
final ``#### ANSWER``; a right answer ends the episode with reward 1; a wrong or missing one
earns a small format score (``format_score / max_turns`` when the ``####`` line is there, else
0) and a request to try again, up to ``max_turns`` turns (5), the last asking for the number
only.

>>> import random
>>> p = make_problem(random.Random(3), steps=2)
>>> p.answer == int(p.solution.rsplit("#### ", 1)[1]), p.steps
(True, 2)
>>> env = WordProblemEnv({}, {"reward_spec": {"ground_truth": "12"}, "extra_info": {}})
>>> out = env.step("5 + 6 = 11\\n#### 11"); out["reward"], out["done"]
(0.04, False)
>>> out = env.step("#### 12"); out["reward"], out["done"]
(1.0, True)
"""

from __future__ import annotations

import random
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NAMES = ("Ada", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hugo", "Iris", "Jonas", "Kemi", "Leo", "Mina", "Noor")
ITEMS = ("apples", "pencils", "stickers", "marbles", "cookies", "books", "shells", "cards", "stamps", "buttons")
ANSWER = re.compile(r"####\s*(-?[\d,]*\d(?:\.\d+)?)")


@dataclass(frozen=True)
class WordProblem:
    question: str
    solution: str  # worked steps, then '#### ANSWER'
    answer: int
    steps: int


def _one_step(rng: random.Random, name: str, other: str, item: str) -> tuple[str, list[str], int]:
    kind = rng.randrange(3)
    a, b = rng.randint(3, 60), rng.randint(2, 40)
    if kind == 0:
        return (
            f"{name} has {a} {item}. {other} gives {name} {b} more. How many {item} does {name} have now?",
            [f"{a} + {b} = {a + b}"],
            a + b,
        )
    if kind == 1:
        a = a + b
        return (
            f"{name} had {a} {item} and gave {b} of them to {other}. How many {item} does {name} have left?",
            [f"{a} - {b} = {a - b}"],
            a - b,
        )
    a, b = rng.randint(2, 12), rng.randint(2, 12)
    return (
        f"{name} buys {a} bags of {item} with {b} {item} in each bag. How many {item} does {name} buy?",
        [f"{a} * {b} = {a * b}"],
        a * b,
    )


def _two_steps(rng: random.Random, name: str, other: str, item: str) -> tuple[str, list[str], int]:
    kind = rng.randrange(3)
    if kind == 0:
        a, b = rng.randint(5, 50), rng.randint(2, 30)
        c = rng.randint(1, a + b)
        return (
            f"{name} has {a} {item} and buys {b} more. Then {name} gives {c} to {other}. How many {item} does "
            f"{name} have now?",
            [f"{a} + {b} = {a + b}", f"{a + b} - {c} = {a + b - c}"],
            a + b - c,
        )
    if kind == 1:
        price, count = rng.randint(2, 9), rng.randint(2, 9)
        paid = price * count + rng.randint(0, 20)
        paid = -(-paid // 5) * 5
        return (
            f"One of the {item} costs ${price}. {name} buys {count} of them and pays with ${paid}. How many dollars "
            f"of change does {name} get?",
            [f"{price} * {count} = {price * count}", f"{paid} - {price * count} = {paid - price * count}"],
            paid - price * count,
        )
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    extra = rng.randint(1, 20)
    return (
        f"{name} packs {a} boxes with {b} {item} each, and {other} adds {extra} loose {item}. How many {item} are "
        "there in all?",
        [f"{a} * {b} = {a * b}", f"{a * b} + {extra} = {a * b + extra}"],
        a * b + extra,
    )


def _three_steps(rng: random.Random, name: str, other: str, item: str) -> tuple[str, list[str], int]:
    if rng.random() < 0.5:
        a, fewer = rng.randint(5, 30), rng.randint(1, 10)
        tue, wed = 2 * a, 2 * a - fewer
        return (
            f"{name} collects {a} {item} on Monday and twice as many on Tuesday. On Wednesday {name} collects "
            f"{fewer} fewer than on Tuesday. How many {item} does {name} collect in the three days?",
            [f"2 * {a} = {tue}", f"{tue} - {fewer} = {wed}", f"{a} + {tue} + {wed} = {a + tue + wed}"],
            a + tue + wed,
        )
    a, b, people = rng.randint(4, 30), rng.randint(4, 30), rng.choice((2, 3, 4, 5))
    total = a + b
    total += (-total) % people
    b = total - a
    return (
        f"{name} has {a} {item} and {other} has {b}. They put them together and share them equally among "
        f"{people} friends. Each friend then gets 3 more from a teacher. How many {item} does each friend have?",
        [
            f"{a} + {b} = {total}",
            f"{total} / {people} = {total // people}",
            f"{total // people} + 3 = {total // people + 3}",
        ],
        total // people + 3,
    )


_BY_STEPS: dict[int, Callable[[random.Random, str, str, str], tuple[str, list[str], int]]] = {
    1: _one_step,
    2: _two_steps,
    3: _three_steps,
}


def make_problem(rng: random.Random, steps: int | None = None, min_steps: int = 1, max_steps: int = 3) -> WordProblem:
    """A word problem of ``steps`` arithmetic steps (drawn from min..max when None)."""
    steps = rng.randint(min_steps, max_steps) if steps is None else steps
    if steps not in _BY_STEPS:
        raise ValueError(f"steps={steps} must be 1, 2 or 3")
    name, other = rng.sample(NAMES, 2)
    question, work, answer = _BY_STEPS[steps](rng, name, other, rng.choice(ITEMS))
    return WordProblem(question, "\n".join(work) + f"\n#### {answer}", answer, steps)


INSTRUCTION = "Solve the problem step by step. End with the final answer as '#### ANSWER'."


def sample_row(rng: random.Random, env_config: dict[str, Any] | None = None) -> dict[str, Any]:
    """A problem as a row in SkyRL's format (SkyRL-Gym's multi-turn GSM8K env reads it as is)."""
    cfg = dict(env_config or {})
    problem = make_problem(rng, min_steps=int(cfg.get("min_steps", 1)), max_steps=int(cfg.get("max_steps", 3)))
    return {
        "data_source": "railgate/wordproblems",
        "prompt": [{"role": "user", "content": f"{problem.question} {INSTRUCTION}"}],
        "env_class": "gsm8k_multi_turn",
        "reward_spec": {"method": "rule", "ground_truth": str(problem.answer)},
        "extra_info": {
            "question": problem.question,
            "solution": problem.solution,
            "steps": problem.steps,
            "max_turns": int(cfg.get("max_turns", 5)),
        },
    }


class WordProblemEnv:
    """railgate's multi-turn grader of '#### ANSWER' responses (see the module docstring).

    ``env_config``: ``max_turns`` (5), ``format_score`` (0.2), ``min_steps``/``max_steps`` (1, 3:
    problems it generates itself). ``extras``: ``reward_spec.ground_truth`` (the integer
    answer); ``extra_info.max_turns`` overrides the config's.
    """

    def __init__(self, env_config: dict[str, Any] | None, extras: dict[str, Any]) -> None:
        cfg = dict(env_config or {})
        unknown = sorted(set(cfg) - {"max_turns", "format_score", "min_steps", "max_steps"})
        if unknown:
            raise ValueError(
                f"task.env.config has unknown keys {unknown} for WordProblemEnv; valid: max_turns, "
                "format_score, min_steps, max_steps"
            )
        info = extras.get("extra_info") or {}
        self.truth = str(extras["reward_spec"]["ground_truth"]).strip()
        self.max_turns = int(info.get("max_turns", cfg.get("max_turns", 5)))
        self.format_score = float(cfg.get("format_score", 0.2)) / self.max_turns
        self.turns = 0

    def init(self, prompt: list[dict[str, str]]) -> tuple[list[dict[str, str]], dict[str, Any]]:
        return prompt, {}

    def step(self, action: str) -> dict[str, Any]:
        self.turns += 1
        found = ANSWER.findall(action)
        answer = found[-1].replace(",", "") if found else None
        right = answer is not None and _same_number(answer, self.truth)
        reward = 1.0 if right else self.format_score if answer is not None else 0.0
        done = right or self.turns >= self.max_turns
        observations = [] if done else [{"role": "user", "content": self._again(answer)}]
        return {
            "observations": observations,
            "reward": reward,
            "done": done,
            "metadata": {"answer": answer, "correct": right},
        }

    def _again(self, answer: str | None) -> str:
        said = f"{answer} is not right." if answer is not None else "I found no '#### ANSWER' line."
        if self.max_turns - self.turns == 1:
            return f"{said} Last try: give only the final number as '#### ANSWER'."
        return f"{said} Check your steps and give the final answer again as '#### ANSWER'."

    def close(self) -> None:
        pass

    @classmethod
    def sample_row(cls, rng: random.Random, env_config: dict[str, Any] | None = None) -> dict[str, Any]:
        row = sample_row(rng, {k: v for k, v in (env_config or {}).items() if k != "format_score"})
        row["env_class"] = "pipeline.envs.wordproblems:WordProblemEnv"
        return row

    @classmethod
    def difficulty(cls, row: dict[str, Any]) -> float:
        return float((row.get("extra_info") or {}).get("steps", 0))


def _same_number(answer: str, truth: str) -> bool:
    try:
        return float(answer) == float(truth)
    except ValueError:
        return answer == truth


def write_dataset(directory: str | Path, train: int = 2000, eval: int = 200, seed: int = 0) -> tuple[Path, Path]:
    """``train.jsonl`` and ``eval.jsonl`` of generated rows (disjoint questions) in ``directory``."""
    from pipeline.envs.rows import write_rows

    rng = random.Random(f"wordproblems:{seed}")
    seen: set[str] = set()
    rows: list[dict[str, Any]] = []
    while len(rows) < train + eval:
        row = sample_row(rng)
        question = row["extra_info"]["question"]
        if question not in seen:
            seen.add(question)
            rows.append(row)
    d = Path(directory)
    return write_rows(d / "train.jsonl", rows[:train]), write_rows(d / "eval.jsonl", rows[train:])


if __name__ == "__main__":
    out = write_dataset(sys.argv[1] if len(sys.argv) > 1 else "runs/wordproblems")
    print("wrote", *out)
