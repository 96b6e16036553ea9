"""The tasks of ``python run.py bench trl``: TRL datasets, a TRL reward and a grader for each.

* ``arithmetic``: the project's own task (``pipeline.tasks``, the CPU default's settings) as a TRL
  dataset for the project's CPU model exported as a Hugging Face directory: prompts such as
  ``00037+00415=``, the answer written backwards, reward 1 for the exact answer. The answer
  column is the reference completion, and it is the only text that earns the reward (one
  character a token), so the reference likelihood is the pass rate (``reference_exact``), as in
  railgate's own CPU default.
* ``word``: GSM8K-style word problems generated here from templates (no download): one or two
  operations on one-digit numbers, a chat prompt asking for the final number only, reward 1 when
  the last number of the completion is the answer. Sized to SmolLM2-135M-Instruct (imported from
  a Q4_1 GGUF): on two-digit, two-step problems and asked to reason it was right about 3% of
  the time, its answers past 64 tokens two times in three; asked for the number of a one-step
  problem with one-digit numbers, about 20%. The reference (the number) is one of many
  completions that earn it: a lower bound.
* ``questions``: one-operation arithmetic questions in a chat prompt (``arithmetic_questions``).
* ``mixed``: one-, two- and three-operation questions together (``mixed_questions``).

The chat tasks take a ``reward`` (``railgate.bench.trl_rewards``): ``last`` (the last number, the
default) or ``marker`` (the number after ``Answer:``, which the prompt asks for; restating the
prompt earns nothing).

>>> task = word_problems(4, 2, seed=0)
>>> row = task.train_rows[0]
>>> sorted(row), task.reward([row["prompt"]], [f"It is {row['answer']}."], answer=[row["answer"]])
(['answer', 'prompt', 'reference'], [1.0])
>>> word_problems(4, 2, seed=0).train_rows == task.train_rows    # seeded
True
>>> marked = word_problems(4, 2, seed=0, reward="marker")
>>> marked.train_rows[0]["prompt"][0]["content"].endswith('Reply with "Answer:" followed by the number.')
True
>>> marked.reward([], [f"It is {row['answer']}."], answer=[row["answer"]]), marked.train_rows[0]["reference"][:8]
([0.0], 'Answer: ')
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from railgate.bench.trl_rewards import REWARDS, Reward, last_number, last_number_reward

__all__ = [
    "TrlTask",
    "arithmetic_questions",
    "arithmetic_task",
    "last_number",
    "last_number_reward",
    "mixed_questions",
    "word_problems",
]


@dataclass(frozen=True)
class TrlTask:
    """A benchmark task: train rows (``prompt``, ``answer``, ``reference``), held-out rows, the
    TRL reward function, the completion length, and what the reference prior may assume."""

    name: str
    train_rows: list[dict[str, Any]]
    eval_rows: list[dict[str, Any]]
    reward: Callable[..., list[float]]
    """TRL's reward-function signature: ``reward(prompts, completions, answer, **kwargs)``."""
    max_completion_length: int
    reference_exact: bool
    """The reference is the only completion that earns the reward (its likelihood is the pass rate)."""
    reference_skip: float
    """``gate_reference_skip`` for this task (railgate's CPU default uses 0.8 with an exact reference)."""
    extract_answer: Callable[[str], str | None] = str.strip
    """The answer a completion gives, as the reward compares it (trl-cgrpo's ``answer_extractor``)."""


def arithmetic_task(cfg: Any, eval_prompts: int) -> TrlTask:
    """The project's task of ``cfg`` (a ``RunConfig``): its training problems and ``eval_prompts``
    held-out ones, graded by the task's own reward."""
    from pipeline.tasks import build_task
    from pipeline.types import Prompt

    task = build_task(cfg.task)
    train = task.train_problems(cfg.data.num_train_prompts, cfg.data.seed)
    held_out = task.eval_problems(eval_prompts, cfg.data.seed)

    def rows(problems):
        return [{"prompt": task.format_prompt(p), "answer": p.solution, "reference": p.solution} for p in problems]

    def exact_answer(prompts, completions, answer, **kwargs):
        return [task.score(Prompt(0, "", (), answer=a), c) for c, a in zip(completions, answer)]

    return TrlTask(
        "arithmetic",
        rows(train),
        rows(held_out),
        exact_answer,
        cfg.orchestrator.max_tokens,
        reference_exact=True,
        reference_skip=0.8,
    )


NAMES = ("Ava", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Juno", "Kofi", "Lena")
ITEMS = ("apples", "marbles", "stickers", "pencils", "cookies", "coins", "books", "shells")
TEMPLATES = (
    ("{n} has {a} {x}. {n} gets {b} more {x}. How many {x} does {n} have now?", lambda a, b, c: a + b),
    ("{n} has {a} {x} and gives {b} of them to a friend. How many {x} does {n} have left?", lambda a, b, c: a - b),
    ("A bag holds {a} {x}. How many {x} are in {b} bags?", lambda a, b, c: a * b),
    ("{n} has {a} {x}, gets {b} more, then gives away {c}. How many {x} does {n} have now?", lambda a, b, c: a + b - c),
)


def word_problems(n_train: int, n_eval: int, seed: int, reward: str = "last") -> TrlTask:
    """``n_train`` and ``n_eval`` distinct synthetic word problems (seeded; see the module
    docstring), graded by ``reward``."""
    grade = _reward(reward)
    rng = random.Random(f"word-problems:{seed}")
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    while len(out) < n_train + n_eval:
        template, solve = TEMPLATES[rng.randrange(len(TEMPLATES))]
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        c = rng.randint(1, a)
        if "gives {b}" in template:
            a, b = max(a, b) + 1, min(a, b)
        text = template.format(n=rng.choice(NAMES), x=rng.choice(ITEMS), a=a, b=b, c=c)
        answer = solve(a, b, c)
        if text in seen or answer < 0:
            continue
        seen.add(text)
        out.append(_chat_row(text, "Reply with only the final number.", answer, grade))
    return _chat_task("word", out[:n_train], out[n_train:], grade)


OPERATIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def arithmetic_questions(n_train: int, n_eval: int, seed: int, reward: str = "last") -> TrlTask:
    """``n_eval`` held-out and up to ``n_train`` training questions of one operation in a chat
    prompt ("What is 7 - 3? Reply with only the number."; sums and differences of numbers 2-15,
    products of one-digit numbers, 351 distinct questions), graded like ``word_problems``: the
    easier SmolLM2 task (about 15% right at the start, against 3-5% on the word problems).

    >>> task = arithmetic_questions(4096, 64, seed=0)
    >>> len(task.train_rows), len(task.eval_rows), task.eval_rows[0]["prompt"][0]["content"], task.eval_rows[0]["answer"]
    (287, 64, 'What is 14 - 11? Reply with only the number.', '3')
    """
    grade = _reward(reward)
    rng = random.Random(f"arithmetic-questions:{seed}")
    pairs = [(a, op, b) for op in OPERATIONS for a in range(2, 16) for b in range(2, 16)]
    pairs = [(a, op, b) for a, op, b in pairs if (op != "-" or a > b) and (op != "*" or max(a, b) < 10)]
    if n_eval >= len(pairs):
        raise ValueError(f"--eval-prompts={n_eval} leaves no training question of {len(pairs)}; ask for fewer")
    rng.shuffle(pairs)
    out = [
        _chat_row(f"What is {a} {op} {b}?", "Reply with only the number.", OPERATIONS[op](a, b), grade)
        for a, op, b in pairs
    ]
    return _chat_task("questions", out[n_eval : n_eval + n_train], out[:n_eval], grade)


MIXED_MAX_ANSWER = 100
"""``mixed_questions``' answers lie in 0..this."""


def mixed_questions(n_train: int, n_eval: int, seed: int, reward: str = "last") -> TrlTask:
    """``n_eval`` held-out and up to ``n_train`` training questions of one, two and three
    operations on the numbers 2-9 ("What is 7 + 3 * 2? Reply with only the number.", with the
    usual precedence; answers 0-100), distinct, seeded, graded like ``arithmetic_questions``:
    a task whose questions are meant to range from easy to hard, so that pass rates spread over
    prompts as a real dataset's do (not measured on SmolLM2 yet). The levels take turns, so the
    held-out questions are a third of each; once the 164 one-operation questions are used up the
    other two levels share the rest. Each row's ``operations`` column gives its level.

    >>> task = mixed_questions(30, 6, seed=0)
    >>> [r["operations"] for r in task.eval_rows], len(task.train_rows)
    ([1, 2, 3, 1, 2, 3], 30)
    >>> row = task.eval_rows[1]
    >>> row["prompt"][0]["content"], row["answer"]
    ('What is 7 * 2 * 4? Reply with only the number.', '56')
    """
    grade = _reward(reward)
    rng = random.Random(f"mixed-questions:{seed}")
    seen: set[str] = set()
    rows: list[dict[str, Any]] = []
    open_levels = [1, 2, 3]
    while len(rows) < n_eval + n_train and open_levels:
        level = open_levels[len(rows) % len(open_levels)]
        for _ in range(1000):  # draws before a level counts as used up
            numbers = [rng.randint(2, 9) for _ in range(level + 1)]
            ops = [rng.choice(tuple(OPERATIONS)) for _ in range(level)]
            text = " ".join(x for pair in zip(map(str, numbers), [*ops, ""]) for x in pair).strip()
            answer = _evaluate(numbers, ops)
            if text not in seen and 0 <= answer <= MIXED_MAX_ANSWER:
                break
        else:
            open_levels.remove(level)
            continue
        seen.add(text)
        row = _chat_row(f"What is {text}?", "Reply with only the number.", answer, grade)
        rows.append({**row, "operations": level})
    if len(rows) <= n_eval:
        raise ValueError(f"--eval-prompts={n_eval} leaves no training question of {len(rows)}; ask for fewer")
    return _chat_task("mixed", rows[n_eval:], rows[:n_eval], grade)


def _evaluate(numbers: list[int], ops: list[str]) -> int:
    """``numbers`` joined by ``ops`` with the usual precedence (products first, then left to right).

    >>> _evaluate([7, 3, 2], ["+", "*"]), _evaluate([9, 2, 3, 4], ["-", "-", "*"])
    (13, -5)
    """
    terms, signs = [numbers[0]], [1]
    for op, x in zip(ops, numbers[1:]):
        if op == "*":
            terms[-1] *= x
        else:
            terms.append(x)
            signs.append(1 if op == "+" else -1)
    return sum(s * t for s, t in zip(signs, terms))


def _reward(name: str) -> Reward:
    if name not in REWARDS:
        raise ValueError(f"--reward={name!r} is not one of {', '.join(REWARDS)}; pick one of them")
    return REWARDS[name]


def _chat_row(question: str, instruction: str, answer: int, reward: Reward) -> dict[str, Any]:
    """A chat row: the question and how to answer (``instruction``, or the reward's own)."""
    content = f"{question} {reward.instruction or instruction}"
    return {
        "prompt": [{"role": "user", "content": content}],
        "answer": str(answer),
        "reference": reward.reference(str(answer)),
    }


def _chat_task(name: str, train: list[dict[str, Any]], held_out: list[dict[str, Any]], reward: Reward) -> TrlTask:
    """A chat task of ``train`` and ``held_out`` rows graded by ``reward``."""
    return TrlTask(
        name,
        train,
        held_out,
        reward.score,
        max_completion_length=12,
        reference_exact=False,
        reference_skip=0.45,
        extract_answer=reward.extract,
    )
