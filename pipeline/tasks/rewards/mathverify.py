"""Math answers graded by math-verify: the response's \\boxed{} (or last) answer against the gold.

math-verify guards its parsing and comparison with ``signal.alarm``, which only works in the
main thread, and rewards run in worker threads. So every call here passes
``parsing_timeout=None`` / ``timeout_seconds=None`` (math-verify 0.9's names for switching
the alarm off) and the pipeline enforces the reward timeout itself
(``orchestrator.reward_timeout_s``). The warning math-verify logs once about the disabled
timeout is filtered out for the same reason.

>>> math_verify_match("so the answer is \\\\boxed{0.5}", "\\\\frac{1}{2}")
1.0
>>> math_verify_match("\\\\boxed{2}", "The answer is $\\\\boxed{3}$.")
0.0
"""

from __future__ import annotations

import functools
import logging

from pipeline.tasks.rewards.base import Decode, TextReward
from pipeline.types import Prompt


class _DropDisabledTimeoutWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropDisabledTimeoutWarning())


@functools.lru_cache(maxsize=4096)
def parse_gold(answer: str) -> tuple:
    """The parsed gold answer; a bare answer (no ``\\boxed``) is read as if boxed.

    Cached: a group's samples share one gold answer, and parsing LaTeX costs milliseconds.
    """
    from math_verify import parse  # imported on use: about 1 s that other tasks need not pay

    text = answer if "\\boxed" in answer else f"\\boxed{{{answer}}}"
    return tuple(parse(text, parsing_timeout=None))


def math_verify_match(text: str, answer: str) -> float:
    """1.0 when math-verify finds the answer in ``text`` equivalent to ``answer``."""
    from math_verify import parse, verify

    gold = parse_gold(answer)
    if not gold:
        raise ValueError(f"math-verify cannot parse the gold answer {answer!r}; fix the dataset's answer field")
    pred = parse(text, parsing_timeout=None)
    if not pred:
        return 0.0
    return float(verify(list(gold), pred, timeout_seconds=None))


class MathVerifyReward(TextReward):
    """1.0 when the response's final answer is mathematically equal to ``prompt.answer``.

    ``prompt.answer`` may be a bare answer (``\\frac{1}{2}``) or a solution holding
    ``\\boxed{...}``. Safe in worker threads (see the module docstring).

    >>> from pipeline.types import Prompt
    >>> reward = MathVerifyReward(decode=lambda ids: "".join(map(chr, ids)))
    >>> p = Prompt(prompt_id=0, text="1/4+1/4?", token_ids=(), answer="\\\\frac{1}{2}")
    >>> reward(p, [ord(c) for c in "\\\\boxed{0.5}"])
    1.0
    """

    runs_in_process = True  # sympy can hold the GIL for minutes (9^{9^{9^{9}}}): pipeline.tasks.rewards.workers

    def __init__(self, decode: Decode) -> None:
        super().__init__(decode)
        import math_verify  # noqa: F401  (here, not inside the first timed call in a worker thread)

    def score_text(self, prompt: Prompt, text: str) -> float:
        return math_verify_match(text, prompt.answer)

    def warm_up(self) -> None:
        """One small comparison: a reward worker process's imports and parser set-up happen here."""
        math_verify_match("\\boxed{\\frac{1}{2}}", "0.5")
