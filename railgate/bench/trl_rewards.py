"""The rewards of ``bench trl``'s chat tasks: how a completion's answer is read and graded.

* ``last``: 1 when the last number of the completion is the answer. Easy to game: a completion
  that restates a prompt whose last number is the answer ("What is 4 - 2?") earns it.
* ``marker``: 1 when the first ``Answer:`` followed by a number (any case; markdown bold
  allowed: ``**Answer:** 2``) gives the answer. The prompt tells the model the format
  (``MARKER_INSTRUCTION``) without a number in it, so restating the prompt earns 0, and only the
  first marked number counts, so listing guesses earns no more than the first guess.

>>> question = "What is 4 - 2?"
>>> REWARDS["last"].score([question], [question], answer=["2"]), REWARDS["marker"].score([question], [question], answer=["2"])
([1.0], [0.0])
>>> REWARDS["marker"].score([], ["Answer: 3 Answer: 2", "4 - 2 = 2. Answer: 2"], answer=["2", "2"])
[0.0, 1.0]
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_MARKED = re.compile(r"answer\s*:\s*\**\s*(-?\d[\d,]*(?:\.\d+)?)", re.IGNORECASE)

MARKER_INSTRUCTION = 'Reply with "Answer:" followed by the number.'
"""How a ``marker`` prompt asks for the answer (no number in it: restating it earns nothing)."""


@dataclass(frozen=True)
class Reward:
    """A grading rule of the chat tasks: the TRL reward, the answer it reads, how the prompt asks
    for it, and the reference completion that earns it (the gate's reference prior)."""

    name: str
    score: Callable[..., list[float]]
    """TRL's reward-function signature: ``score(prompts, completions, answer, **kwargs)``."""
    extract: Callable[[str], str | None]
    """The answer a completion gives, as ``score`` reads it (trl-cgrpo's ``answer_extractor``)."""
    instruction: str | None
    """What the prompt says after the question; None: the task's own wording."""
    reference: Callable[[str], str]
    """The answer -> a completion that earns the reward."""


def last_number(text: str) -> str | None:
    """The last number of ``text`` (commas dropped), as ``last_number_reward`` reads it; None when there is none.

    >>> last_number("3 bags of 4 make 12."), last_number("none")
    ('12', None)
    """
    numbers = _NUMBER.findall(text.replace(",", ""))
    return numbers[-1] if numbers else None


def marked_number(text: str) -> str | None:
    """The number after the first ``Answer:`` that has one (commas dropped); None when none has.

    >>> marked_number("**Answer:** 1,200 apples"), marked_number('Reply with "Answer:" then 5'), marked_number("7")
    ('1200', None, None)
    """
    match = _MARKED.search(text)
    return match.group(1).replace(",", "") if match else None


def _grader(extract: Callable[[str], str | None]) -> Callable[..., list[float]]:
    def score(prompts: list, completions: list, answer: list, **kwargs: Any) -> list[float]:
        out = []
        for completion, expected in zip(completions, answer):
            text = completion[-1]["content"] if isinstance(completion, list) else completion
            number = extract(text)
            out.append(float(number is not None and float(number) == float(expected)))
        return out

    return score


last_number_reward = _grader(last_number)
"""1 when the completion's last number equals ``answer`` (a chat completion: its text)."""
marker_reward = _grader(marked_number)
"""1 when the completion's first marked number (``Answer: N``) equals ``answer``."""

REWARDS = {
    "last": Reward("last", last_number_reward, last_number, None, str),
    "marker": Reward("marker", marker_reward, marked_number, MARKER_INSTRUCTION, lambda answer: f"Answer: {answer}"),
}
"""The chat tasks' rewards by ``--reward`` name, the default first."""
