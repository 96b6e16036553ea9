"""The Countdown checker: is the response an arithmetic expression that reaches the target,
using each given number at most once?

The expression is read by a small recursive-descent parser, never by ``eval``: a response is
untrusted model output. Grammar (whitespace allowed between tokens)::

    expr   := term (("+" | "-") term)*
    term   := factor (("*" | "/") factor)*
    factor := INTEGER | "(" expr ")"

No unary minus, no exponent. Arithmetic is exact (``fractions.Fraction``), so ``7/2*2``
reaches 7 and division by zero makes the expression invalid. Length and nesting are capped
so a pathological response costs microseconds, not a stack overflow.

>>> check_countdown("(12+7)*3-20", [3, 7, 12, 20], 37)
True
>>> check_countdown("12+12", [3, 12], 24)   # 12 used twice
False
>>> evaluate_expression("7/2*2")
(Fraction(7, 1), [7, 2, 2])
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from fractions import Fraction

from pipeline.tasks.rewards.base import Decode, TextReward
from pipeline.types import Prompt

MAX_EXPRESSION_CHARS = 200
MAX_DEPTH = 32


class ExpressionError(ValueError):
    """The text is not an expression of the Countdown grammar."""


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.numbers: list[int] = []

    def _peek(self) -> str:
        while self.pos < len(self.text) and self.text[self.pos] in " \t":
            self.pos += 1
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def parse(self) -> Fraction:
        value = self._expr(0)
        if self._peek():
            raise ExpressionError(f"unexpected {self._peek()!r} at {self.pos} in {self.text!r}")
        return value

    def _expr(self, depth: int) -> Fraction:
        value = self._term(depth)
        while self._peek() in ("+", "-"):
            op = self.text[self.pos]
            self.pos += 1
            rhs = self._term(depth)
            value = value + rhs if op == "+" else value - rhs
        return value

    def _term(self, depth: int) -> Fraction:
        value = self._factor(depth)
        while self._peek() in ("*", "/"):
            op = self.text[self.pos]
            self.pos += 1
            rhs = self._factor(depth)
            if op == "*":
                value = value * rhs
            elif rhs == 0:
                raise ExpressionError(f"division by zero in {self.text!r}")
            else:
                value = value / rhs
        return value

    def _factor(self, depth: int) -> Fraction:
        ch = self._peek()
        if ch == "(":
            if depth >= MAX_DEPTH:
                raise ExpressionError(f"parentheses nested deeper than {MAX_DEPTH} in {self.text[:40]!r}...")
            self.pos += 1
            value = self._expr(depth + 1)
            if self._peek() != ")":
                raise ExpressionError(f"missing ')' at {self.pos} in {self.text!r}")
            self.pos += 1
            return value
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos].isascii() and self.text[self.pos].isdigit():
            self.pos += 1
        if start == self.pos:
            raise ExpressionError(f"expected a number or '(' at {self.pos} in {self.text!r}, got {ch!r}")
        number = int(self.text[start : self.pos])
        self.numbers.append(number)
        return Fraction(number)


def evaluate_expression(text: str) -> tuple[Fraction, list[int]]:
    """The exact value of ``text`` and the numbers it uses, in order; ``ExpressionError`` if invalid."""
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"expression of {len(text)} characters is longer than {MAX_EXPRESSION_CHARS}")
    parser = _Parser(text)
    return parser.parse(), parser.numbers


def check_countdown(text: str, numbers: Sequence[int], target: int) -> bool:
    """True when ``text`` evaluates to ``target`` using each of ``numbers`` at most once."""
    try:
        value, used = evaluate_expression(text.strip())
    except ExpressionError:
        return False
    if Counter(used) - Counter(numbers):  # some number used more often than given
        return False
    return value == target


def format_spec(numbers: Sequence[int], target: int) -> str:
    """The ``Prompt.answer`` of a Countdown problem: ``"3,7,12->22"``.

    >>> parse_spec(format_spec([3, 7, 12], 22))
    ([3, 7, 12], 22)
    """
    return ",".join(str(n) for n in numbers) + f"->{target}"


def parse_spec(answer: str) -> tuple[list[int], int]:
    """The numbers and target written by ``format_spec``."""
    try:
        nums, target = answer.split("->")
        return [int(n) for n in nums.split(",")], int(target)
    except ValueError:
        raise ValueError(
            f"Countdown answer {answer!r} is not of the form '3,7,12->22'; build prompts with CountdownTask"
        ) from None


class CountdownReward(TextReward):
    """1.0 when the decoded response reaches the target of ``prompt.answer`` (``"3,7,12->22"``).

    >>> from pipeline.types import Prompt
    >>> reward = CountdownReward(decode=lambda ids: "".join(map(chr, ids)))
    >>> p = Prompt(prompt_id=0, text="3 7 12 to 22:", token_ids=(), answer="3,7,12->22")
    >>> reward(p, [ord(c) for c in "12+7+3"]), reward(p, [ord(c) for c in "12+7"])
    (1.0, 0.0)
    """

    def __init__(self, decode: Decode) -> None:
        super().__init__(decode)

    def score_text(self, prompt: Prompt, text: str) -> float:
        numbers, target = parse_spec(prompt.answer)
        return float(check_countdown(text, numbers, target))
