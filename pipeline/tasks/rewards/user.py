"""A user's reward function, named ``"module:function"`` (``task.dataset.reward``), with TRL's
reward-function signature::

    def reward(prompts: list, completions: list, **columns) -> list[float | None]: ...

* ``prompts``: each sample's prompt as the dataset row gives it (the templated text, or the
  row's list of chat messages);
* ``completions``: the decoded responses (special tokens dropped); for a chat-message prompt,
  ``[{"role": "assistant", "content": text}]``, as TRL passes conversational completions;
* ``columns``: every other field of each sample's dataset row, one list per field (the answer
  field included, with its JSON type: int, list, dict, ...);
* the result: one value per sample; ``None`` means "no reward for this sample": it is counted
  (``pipeline/rewards_none``) and not trained on.

The function may be called with any batch size (the pipeline scores each sample as it ends,
so mostly one at a time). It runs in reward worker processes with the run's timeout
(``pipeline.tasks.rewards.workers``): one that raises, returns the wrong number of values,
hangs or ends its process (``os._exit``, a crash) costs that sample's reward (counted as
``pipeline/reward_errors`` / ``reward_timeouts``), and the run goes on -- unless every one of
the first rewards fails (``pipeline.tasks.rewards.health``). Given as ``"module:function"``, the
module is imported only in those worker processes, never in the run's own
(``pipeline.tasks.rewards.isolation``): reward code is the user's code, trusted to be what they
chose, but a failure of it, at import or in a call, cannot take the run down.

The module is imported from ``sys.path`` with the working directory first, so a ``my_rewards.py``
next to the config works.

>>> from pipeline.types import Prompt
>>> def longer_is_better(prompts, completions, answer, **kw):
...     return [None if a is None else float(len(c) >= a) for c, a in zip(completions, answer)]
>>> rows = {7: DatasetRow(prompt="Say 3 letters", columns={"answer": 3, "topic": "x"})}
>>> reward = UserReward(longer_is_better, decode=lambda ids: "abc"[: len(ids)], rows=rows)
>>> reward(Prompt(7, "Say 3 letters", (1,)), [1, 2, 3]), reward(Prompt(7, "Say 3 letters", (1,)), [1])
(1.0, 0.0)
"""

from __future__ import annotations

import importlib
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.config.build import ConfigError
from pipeline.tasks.config import USER_REWARD
from pipeline.tasks.rewards.base import Decode
from pipeline.types import Prompt


def is_user_reward(name: str) -> bool:
    """True when ``name`` has the ``module:function`` form.

    >>> is_user_reward("my_rewards:format_reward"), is_user_reward("exact")
    (True, False)
    """
    return bool(USER_REWARD.fullmatch(name))


def load_reward_function(spec: str, key: str = "task.dataset.reward") -> Callable[..., Sequence[Any]]:
    """Import ``module:function``; ``ConfigError`` names ``key``, the value and the fix."""
    if not is_user_reward(spec):
        raise ConfigError(f"{key}={spec!r} is not of the form 'module:function' (e.g. my_rewards:accuracy)")
    module_name, function_name = spec.split(":")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module: any import failure is reported alike
        raise ConfigError(
            f"{key}={spec!r}: module {module_name!r} cannot be imported ({type(exc).__name__}: {str(exc)[:200]}); "
            f"put {module_name.replace('.', '/')}.py in the working directory ({cwd}) or on PYTHONPATH"
        ) from None
    function = getattr(module, function_name, None)
    if not callable(function):
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ConfigError(
            f"{key}={spec!r}: module {module_name!r} has no function {function_name!r} "
            f"(it has: {', '.join(public[:12]) or 'none'}); name one of them"
        )
    return function


@dataclass(frozen=True)
class DatasetRow:
    """A dataset row as a reward function sees it: the prompt and every other field."""

    prompt: Any  # text, or a list of chat messages
    columns: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_chat(self) -> bool:
        return isinstance(self.prompt, list)


class UserReward:
    """A ``Scorer`` around a TRL-style reward function (see the module docstring).

    Parameters
    ----------
    function
        ``f(prompts, completions, **columns) -> list[float | None]``, or its ``"module:function"``
        name: then it is imported on first use, in the process that calls it, and a pickled
        copy carries the name only.
    decode
        Token ids -> text.
    rows
        The dataset rows by prompt id (``Prompt.prompt_id``).
    name
        How errors name the function.
    """

    runs_inline = False
    runs_in_process = True  # user code may hold the GIL past any timeout: pipeline.tasks.rewards.workers

    def __init__(
        self,
        function: Callable[..., Sequence[Any]] | str,
        decode: Decode,
        rows: Mapping[int, DatasetRow],
        name: str = "",
    ) -> None:
        if isinstance(function, str):
            if not is_user_reward(function):
                raise ValueError(f"reward function {function!r} is not of the form 'module:function'")
            self.spec, self._function = function, None
        elif callable(function):
            self.spec, self._function = "", function
        else:
            raise TypeError(f"reward function {function!r} is not callable")
        self.decode = decode
        self.rows = rows
        self.name = name or self.spec or getattr(function, "__name__", repr(function))

    @property
    def function(self) -> Callable[..., Sequence[Any]]:
        """The function; a ``"module:function"`` is imported here, on first use."""
        if self._function is None:
            self._function = load_reward_function(self.spec)
        return self._function

    def warm_up(self) -> None:
        """Import the function now (a reward worker calls this before its first reward)."""
        self.function  # noqa: B018 - the property imports it

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if self.spec:
            state["_function"] = None  # the worker imports it itself: nothing of it crosses by pickle
        return state

    def __call__(self, prompt: Prompt, token_ids: Sequence[int]) -> float | None:
        return self.score_batch([prompt], [token_ids])[0]

    def score_text(self, prompt: Prompt, text: str) -> float | None:
        """The reward of response ``text`` for ``prompt``."""
        return self.score_texts([prompt], [text])[0]

    def score_batch(self, prompts: Sequence[Prompt], token_ids: Sequence[Sequence[int]]) -> list[float | None]:
        """Rewards of a batch of samples in one call of the function."""
        return self.score_texts(prompts, [self.decode(ids) for ids in token_ids])

    def score_texts(self, prompts: Sequence[Prompt], texts: Sequence[str]) -> list[float | None]:
        """Rewards of a batch of decoded responses in one call of the function."""
        rows = [self._row(p) for p in prompts]
        completions = [[{"role": "assistant", "content": t}] if r.is_chat else t for r, t in zip(rows, texts)]
        names = list(dict.fromkeys(k for r in rows for k in r.columns))
        columns = {k: [r.columns.get(k) for r in rows] for k in names}
        values = self.function(prompts=[r.prompt for r in rows], completions=completions, **columns)
        try:
            values = list(values)
        except TypeError:
            raise TypeError(
                f"reward function {self.name} returned {type(values).__name__}, not a list of "
                "floats or None (one per completion)"
            ) from None
        if len(values) != len(rows):
            raise ValueError(
                f"reward function {self.name} returned {len(values)} values for {len(rows)} completions; "
                "return one per completion (None for no reward)"
            )
        return [None if v is None else _finite(v, self.name) for v in values]

    def _row(self, prompt: Prompt) -> DatasetRow:
        row = self.rows.get(prompt.prompt_id)
        return row if row is not None else DatasetRow(prompt=prompt.text)

    def __repr__(self) -> str:
        return f"UserReward({self.name})"


def _finite(value: Any, name: str) -> float:
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"reward function {name} returned {out!r}; return a finite number or None")
    return out
