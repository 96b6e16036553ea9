"""Exact-match and numeric rewards: the answer as a string, or as a number within a tolerance.

>>> exact_match(" 254\\n", "254")
1.0
>>> numeric_match("so the total is 1,234.0 apples", "1234")
1.0
>>> numeric_match("about 3.3", "3.25", abs_tol=0.1)
1.0
"""

from __future__ import annotations

import math
import re

from pipeline.tasks.rewards.base import Decode, TextReward
from pipeline.types import Prompt

# A signed decimal with optional thousands separators (1,234.5) or an exponent (1e-3).
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?(?:[eE][-+]?\d+)?|[-+]?\.\d+(?:[eE][-+]?\d+)?")


def exact_match(text: str, answer: str, strip: bool = True) -> float:
    """1.0 when ``text`` equals ``answer`` (both stripped of surrounding whitespace by default)."""
    if strip:
        text, answer = text.strip(), answer.strip()
    return float(text == answer)


def parse_number(text: str, which: str = "last") -> float | None:
    """The ``which`` ("first", "last" or "whole") number in ``text``, or None.

    >>> parse_number("3 apples and 12 pears")
    12.0
    >>> parse_number("3 apples", which="whole") is None
    True
    """
    if which == "whole":
        s = text.strip()
        match = _NUMBER.fullmatch(s)
        return float(match.group().replace(",", "")) if match else None
    found = _NUMBER.findall(text)
    if not found:
        return None
    if which not in ("first", "last"):
        raise ValueError(f"which={which!r} must be 'first', 'last' or 'whole'")
    return float((found[0] if which == "first" else found[-1]).replace(",", ""))


def numeric_match(text: str, answer: str, rel_tol: float = 0.0, abs_tol: float = 1e-6, which: str = "last") -> float:
    """1.0 when the number in ``text`` is within tolerance of the number ``answer`` holds."""
    gold = parse_number(answer, which="last")
    if gold is None:
        raise ValueError(f"answer {answer!r} holds no number; use the exact or math_verify reward for this task")
    got = parse_number(text, which=which)
    if got is None or not math.isfinite(got):
        return 0.0
    return float(math.isclose(got, gold, rel_tol=rel_tol, abs_tol=abs_tol))


class ExactMatchReward(TextReward):
    """1.0 when the decoded response equals ``prompt.answer`` (whitespace-stripped), else 0.0.

    >>> from pipeline.types import Prompt
    >>> reward = ExactMatchReward(decode=lambda ids: "".join(chr(48 + i) for i in ids))
    >>> p = Prompt(prompt_id=0, text="37+415=", token_ids=(), answer="254")
    >>> reward(p, [2, 5, 4]), reward(p, [4, 5, 2])
    (1.0, 0.0)
    """

    def __init__(self, decode: Decode, strip: bool = True) -> None:
        super().__init__(decode)
        self.strip = strip

    def score_text(self, prompt: Prompt, text: str) -> float:
        return exact_match(text, prompt.answer, strip=self.strip)


class NumericReward(TextReward):
    """1.0 when the response's number (the last one, by default) is within tolerance of the answer.

    >>> from pipeline.types import Prompt
    >>> reward = NumericReward(decode=lambda ids: "".join(chr(i) for i in ids), abs_tol=0.01)
    >>> reward(Prompt(prompt_id=0, text="", token_ids=(), answer="0.5"), [ord(c) for c in "x = 0.499"])
    1.0
    """

    def __init__(self, decode: Decode, rel_tol: float = 0.0, abs_tol: float = 1e-6, which: str = "last") -> None:
        super().__init__(decode)
        if rel_tol < 0 or abs_tol < 0:
            raise ValueError(f"rel_tol={rel_tol}, abs_tol={abs_tol} must be >= 0")
        if which not in ("first", "last", "whole"):
            raise ValueError(f"which={which!r} must be 'first', 'last' or 'whole'")
        self.rel_tol, self.abs_tol, self.which = rel_tol, abs_tol, which

    def score_text(self, prompt: Prompt, text: str) -> float:
        return numeric_match(text, prompt.answer, self.rel_tol, self.abs_tol, self.which)
