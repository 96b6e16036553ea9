"""What every reward shares: decode the response's token ids, then grade the text.

A reward is a ``pipeline.protocols.Scorer``: ``reward(prompt, token_ids) -> float``. The
text-level grading (``score_text``) is a pure function of the prompt's ``answer`` and the
response text, so tasks and tests can call it without a tokenizer.

Rewards run in the pipeline's worker threads (``runs_inline = False``), or in its worker
processes when they declare ``runs_in_process = True`` (those that can hold the GIL for long:
``pipeline.tasks.rewards.workers``); either way the pipeline enforces the timeout, and a reward itself
never sets alarms or signals.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pipeline.types import Prompt

Decode = Callable[[Sequence[int]], str]


class TextReward:
    """Base class: ``__call__`` decodes with ``decode`` and calls ``score_text``.

    Parameters
    ----------
    decode
        Token ids -> text, e.g. ``CharTokenizer.decode`` (which drops ``<eos>``).

    Examples
    --------
    >>> class Echo(TextReward):
    ...     def score_text(self, prompt, text):
    ...         return float(text == prompt.answer)
    >>> reward = Echo(decode=lambda ids: "".join(map(str, ids)))
    >>> reward(Prompt(prompt_id=0, text="", token_ids=(), answer="12"), [1, 2])
    1.0
    """

    runs_inline = False
    runs_in_process = False

    def __init__(self, decode: Decode) -> None:
        if not callable(decode):
            raise TypeError(
                f"decode={decode!r} is not callable; pass a function from token ids to text, e.g. tokenizer.decode"
            )
        self.decode = decode

    def __call__(self, prompt: Prompt, token_ids: Sequence[int]) -> float:
        return self.score_text(prompt, self.decode(token_ids))

    def score_text(self, prompt: Prompt, text: str) -> float:
        """The reward of response ``text`` for ``prompt`` (in [0, 1] for the built-in rewards)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
