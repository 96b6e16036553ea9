"""The reasoning-trace format of the scratchpad tasks: steps, then ``>``, then the answer.

A scratchpad response writes its work as steps separated by ``,`` and ends with ``>`` and
the final answer; the reward grades only what follows the last ``>``:

=============  ========================================  ==============================
task           prompt                                    scratchpad response
=============  ========================================  ==============================
arithmetic     ``00037+00415=``                          ``7+5+0=12,3+1+1=05,0+4+0=04,0+0+0=00,0+0+0=00>254``
countdown      ``3 7 12 to 22:``                         ``3+7=10,10+12=22>3+7+12``
=============  ========================================  ==============================

Arithmetic writes one step per digit position, lowest first: the two operand digits, the
carry in, and the two-digit sum (its tens digit is the next carry). Every step has the same
width, so step k always sits at the same place in the response: the position pattern a
small GPT-2 learns quickly (see ``pipeline.tasks.arithmetic``). Countdown writes one equation
per operation of its reference solution, then the solution as one expression.

Why grade only the answer: intermediate steps are the model's own business. A response
with a wrong step and the right answer scores 1; one without ``>`` scores 0.

>>> final_answer("7+5+0=12,3+1+1=05>254")
'254'
>>> final_answer("7+5+0=12,3+1")  # no answer written
''
>>> decode = FinalAnswerDecode(lambda ids: "".join(map(chr, ids)))
>>> decode([ord(c) for c in "1+2=3>1+2"])
'1+2'
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

ANSWER_MARK = ">"
STEP_SEP = ","
SCRATCHPAD_CHARS = ANSWER_MARK + STEP_SEP + "="


def final_answer(text: str) -> str:
    """What follows the last ``>`` of a scratchpad response (``""`` when there is none)."""
    cut = text.rfind(ANSWER_MARK)
    return text[cut + 1 :] if cut >= 0 else ""


def join_steps(steps: Sequence[str], answer: str) -> str:
    """A scratchpad response: ``steps`` joined by ``,``, then ``>`` and ``answer``.

    >>> join_steps(["3+7=10", "10+12=22"], "3+7+12")
    '3+7=10,10+12=22>3+7+12'
    """
    return STEP_SEP.join(steps) + ANSWER_MARK + answer


class FinalAnswerDecode:
    """A ``decode`` (token ids -> text) that keeps only the final answer of a scratchpad
    response, so a task's reward grades the answer alone. A class, not a lambda, so the
    scorer it is part of can be pickled into a reward worker process."""

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self.decode = decode

    def __call__(self, ids: Sequence[int]) -> str:
        return final_answer(self.decode(ids))

    def __repr__(self) -> str:
        return f"FinalAnswerDecode({self.decode!r})"
