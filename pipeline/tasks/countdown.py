"""Countdown-lite: reach the target from 2-4 numbers with + - * (and optionally /).

Prompt ``3 7 12 to 22:``; a correct response is any expression that equals the target and
uses each given number at most once, e.g. ``3+7+12`` or ``12+7+3``. The checker is the safe
parser of ``pipeline.tasks.rewards.countdown`` (no ``eval``).

How problems are made: draw the numbers, then fold them left to right with random
operators into a reference solution, keeping intermediate values positive (and divisions
exact); the target is its value, redrawn until it lies in ``[1, max_target]``. The prompt
lists the numbers in the order the reference solution uses them, so every problem is
solvable with all of them in order; other solutions are accepted too. Difficulty is the
count of numbers.

With ``scratchpad=True`` the reference response writes one equation per operation of the
fold, then ``>`` and the expression, e.g. ``3+7=10,10+12=22>3+7+12``
(``pipeline.tasks.scratchpad``); the reward grades the expression only.
"""

from __future__ import annotations

import random

from pipeline.tasks.base import Problem, Task
from pipeline.tasks.rewards.countdown import check_countdown, format_spec
from pipeline.tasks.scratchpad import SCRATCHPAD_CHARS, join_steps

_PLUS_MINUS = 1  # precedence of a top-level + or - (needs parentheses under * or /)


class CountdownTask(Task):
    """Countdown with ``min_numbers``..``max_numbers`` numbers in ``[1, max_number]``.

    Parameters
    ----------
    min_numbers, max_numbers
        Range of the count of numbers (the difficulty knob), at least 2.
    max_number
        Largest number drawn.
    max_target
        Largest target; problems whose reference value falls outside ``[1, max_target]``
        are redrawn.
    ops
        Operators of reference solutions, a subset of ``"+-*/"`` (responses may use all four).
    scratchpad
        Reference responses write one equation per step, then ``>`` and the expression;
        the reward grades the expression only.
    eval_share
        Share of the problem space held out for evaluation.

    Examples
    --------
    >>> task = CountdownTask(min_numbers=2, max_numbers=3)
    >>> problem = task.train_problems(1, seed=0)[0]
    >>> prompt_text, solution = task.sft_example(problem)
    >>> p = task.to_prompt(problem)
    >>> task.score(p, solution), task.score(p, "0")
    (1.0, 0.0)
    >>> task.format_prompt(task.make_problem([3, 7, 12], 22, "3+7+12"))
    '3 7 12 to 22:'
    >>> CountdownTask(scratchpad=True).make_problem([3, 7, 12], 22, "3+7+12", ["3+7=10", "10+12=22"]).solution
    '3+7=10,10+12=22>3+7+12'
    """

    name = "countdown"
    reward = "countdown"

    def __init__(
        self,
        min_numbers: int = 2,
        max_numbers: int = 4,
        max_number: int = 20,
        max_target: int = 200,
        ops: str = "+-*",
        scratchpad: bool = False,
        eval_share: float = 0.1,
    ) -> None:
        super().__init__(eval_share)
        if not 2 <= min_numbers <= max_numbers:
            raise ValueError(
                f"min_numbers={min_numbers}, max_numbers={max_numbers}: need 2 <= min_numbers <= max_numbers"
            )
        if max_number < 2:
            raise ValueError(f"max_number={max_number} must be >= 2")
        if max_target < 1:
            raise ValueError(f"max_target={max_target} must be >= 1")
        bad = sorted(set(ops) - set("+-*/"))
        if "+" not in ops or bad:
            raise ValueError(f"ops={ops!r} must be a subset of '+-*/' that contains '+' (unknown: {bad})")
        self.min_numbers, self.max_numbers = min_numbers, max_numbers
        self.max_number, self.max_target = max_number, max_target
        self.ops = "".join(sorted(set(ops), key="+-*/".index))
        self.scratchpad = scratchpad
        if scratchpad:
            self.sample_tokens = 96

    @property
    def alphabet(self) -> str:
        # responses may use any operator and parentheses, whatever the reference solutions use
        return "0123456789+-*/() to:" + (SCRATCHPAD_CHARS if self.scratchpad else "")

    def make_problem(self, numbers: list[int], target: int, solution: str, steps: list[str] | None = None) -> Problem:
        """The problem of reaching ``target`` from ``numbers`` (``solution`` must be correct;
        a scratchpad task writes ``steps``, its equations, before it)."""
        if not check_countdown(solution, numbers, target):
            raise ValueError(f"solution {solution!r} does not reach {target} from {numbers}")
        text = " ".join(str(n) for n in numbers) + f" to {target}"
        if self.scratchpad:
            solution = join_steps(steps or [], solution)
        return Problem(
            key=text, text=text, answer=format_spec(numbers, target), solution=solution, difficulty=float(len(numbers))
        )

    def sample_problem(self, rng: random.Random) -> Problem:
        k = rng.randint(self.min_numbers, self.max_numbers)
        while True:
            numbers = [rng.randint(1, self.max_number) for _ in range(k)]
            solution, value, steps = self._fold(rng, numbers)
            if 1 <= value <= self.max_target:
                return self.make_problem(numbers, value, solution, steps)

    def _fold(self, rng: random.Random, numbers: list[int]) -> tuple[str, int, list[str]]:
        expr, value, prec = str(numbers[0]), numbers[0], 3
        steps: list[str] = []
        for x in numbers[1:]:
            before = value
            op = rng.choice(self.ops)
            # keep every intermediate value a positive integer: fall back to '+' otherwise
            if (op == "-" and value <= x) or (op == "/" and (x == 1 or value % x)):
                op = "+"
            if op in "+-":
                expr, value, prec = f"{expr}{op}{x}", value + x if op == "+" else value - x, _PLUS_MINUS
            else:
                left = f"({expr})" if prec == _PLUS_MINUS else expr
                expr, value, prec = f"{left}{op}{x}", value * x if op == "*" else value // x, 2
            steps.append(f"{before}{op}{x}={value}")
        return expr, value, steps

    def format_prompt(self, problem: Problem) -> str:
        return problem.text + ":"

    def __repr__(self) -> str:
        return (
            f"CountdownTask(min_numbers={self.min_numbers}, max_numbers={self.max_numbers}, "
            f"max_number={self.max_number}, max_target={self.max_target}, ops={self.ops!r}"
            + (", scratchpad=True)" if self.scratchpad else ")")
        )
