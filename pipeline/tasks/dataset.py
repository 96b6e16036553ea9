"""Tasks from local files: JSONL or Parquet rows in the common prompt/answer layout.

Field names are configurable (``prompt_field="problem", answer_field="solution"`` reads the
MATH layout). A prompt is text, or a list of chat messages (``{"role", "content"}`` dicts,
rendered with the model's chat template). An answer may have any JSON type: the built-in
rewards grade its text (a string as is, anything else as JSON: ``42`` -> ``"42"``), and a
user's reward function (``reward="module:function"``, ``pipeline.tasks.rewards.user``) gets the value
itself, with every other field of the row. A row is *bad* when a needed field is missing,
empty or of the wrong kind, holds text that is not valid Unicode (a lone surrogate such as
``"\\ud800"``), or when its prompt is longer than ``max_prompt_chars`` or than the model's
context can hold (``context_chars``, which railgate derives from the model: one 10 MB line is
a bad row at once, not minutes of tokenizing).
``on_bad_row="skip"`` skips and counts bad rows (``task.load_report``); ``"error"`` raises at
the first one, naming the file, the row and the fix. A file whose columns lack a needed field
always raises. With a user's reward function the answer field is optional.

Splits: with ``eval_path`` the eval file is the eval split (and any of its prompts found in
the train file are dropped from training); without it, the stable hash of each prompt puts
a share ``eval_share`` of the rows in the eval split.
"""

from __future__ import annotations

import json
import logging
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pipeline.datafiles import (
    DatasetError,
    Invalid,
    LoadReport,
    not_unicode,
    read_records,
)
from pipeline.tasks.base import Problem, Split, Task, is_messages
from pipeline.tasks.rewards.base import TextReward
from pipeline.tasks.rewards.isolation import IsolatedScore
from pipeline.tasks.rewards.user import DatasetRow, UserReward, is_user_reward
from pipeline.types import Prompt

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RowOptions:
    """How ``load_rows`` reads a file's rows: the field names, and what makes a row bad.

    The SFT target is ``solution_field`` when given, else the answer; ``difficulty_field``
    (optional) is a numeric field; ``max_prompt_chars=0`` means no limit; ``context_chars`` > 0:
    prompts longer than the model's context can hold are bad rows; with
    ``answer_required=False`` (a user's reward function) the answer field is optional.

    >>> RowOptions(prompt_field="problem", answer_field="solution").on_bad_row
    'skip'
    >>> RowOptions(on_bad_row="warn")
    Traceback (most recent call last):
    ...
    ValueError: on_bad_row='warn' must be 'skip' or 'error'
    """

    prompt_field: str = "prompt"
    answer_field: str = "answer"
    solution_field: str = ""
    difficulty_field: str = ""
    on_bad_row: Literal["skip", "error"] = "skip"
    max_prompt_chars: int = 0
    answer_required: bool = True
    context_chars: int = 0

    def __post_init__(self) -> None:
        if self.on_bad_row not in ("skip", "error"):
            raise ValueError(f"on_bad_row={self.on_bad_row!r} must be 'skip' or 'error'")


def load_problems(path: str | Path, **options: Any) -> tuple[list[Problem], LoadReport]:
    """The problems of one file and a report of what was skipped (``load_rows`` also returns the rows).

    ``options`` are ``RowOptions``'s fields by name (``on_bad_row="error"``, ``context_chars=48``).
    """
    problems, _, report = load_rows(path, RowOptions(**options))
    return problems, report


def load_rows(
    path: str | Path, options: RowOptions | None = None
) -> tuple[list[Problem], list[dict[str, Any]], LoadReport]:
    """``load_problems`` plus each kept problem's whole row (same order), read as ``options`` say
    (default ``RowOptions()``)."""
    f = options or RowOptions()
    p = Path(path)
    needed = (
        [f.prompt_field]
        + ([f.answer_field] if f.answer_required else [])
        + ([f.solution_field] if f.solution_field else [])
    )
    problems: list[Problem] = []
    rows: list[dict[str, Any]] = []
    reasons: Counter[str] = Counter()
    first: dict[str, str] = {}
    for where, record in read_records(p, needed + ([f.difficulty_field] if f.difficulty_field else [])):
        problem, reason = _problem_of(record, f)
        if problem is not None:
            problems.append(problem)
            rows.append(record)
            continue
        if f.on_bad_row == "error":
            raise DatasetError(f"{p}, {where}: {reason}; fix the row, or set on_bad_row='skip' to skip such rows")
        reasons[reason.split(" (")[0]] += 1
        first.setdefault(reason.split(" (")[0], where)
    report = LoadReport(path=str(p), rows=len(problems), skipped=sum(reasons.values()), reasons=dict(reasons))
    if not problems:
        detail = "; ".join(f"{n} x {r}" for r, n in reasons.most_common(3)) or "the file is empty"
        raise DatasetError(f"{p}: no usable rows ({detail}); check the field names and the file")
    if report.skipped:
        where = "; ".join(f"{n} x {r} (first: {first[r]})" for r, n in reasons.most_common())
        log.warning("%s: skipped %d bad rows of %d: %s", p, report.skipped, report.skipped + report.rows, where)
    return problems, rows, report


def prompt_key(prompt: str | list) -> str:
    """The key of a prompt (its split hash and id): the text, or the chat messages as JSON.

    >>> prompt_key("2+2?"), prompt_key([{"role": "user", "content": "2+2?"}])
    ('2+2?', '[{"role": "user", "content": "2+2?"}]')
    """
    return prompt if isinstance(prompt, str) else json.dumps(prompt, ensure_ascii=False)


def answer_text(value: Any) -> str:
    """What the built-in rewards grade: a string as is, any other JSON value as JSON.

    >>> answer_text("12"), answer_text(12), answer_text(2.5), answer_text([1, 2])
    ('12', '12', '2.5', '[1, 2]')
    """
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _problem_of(record: Any, f: RowOptions) -> tuple[Problem | None, str]:
    if isinstance(record, Invalid):
        return None, record.reason
    if not isinstance(record, dict):
        return None, f"row is a JSON {type(record).__name__}, not an object"
    keys = ", ".join(map(str, record)) or "none"
    prompt = record.get(f.prompt_field)
    if prompt is None:
        return None, f"field {f.prompt_field!r} is missing (keys: {keys})"
    if not isinstance(prompt, str) and not is_messages(prompt):
        return None, (
            f"field {f.prompt_field!r} is neither text nor a list of chat messages ({type(prompt).__name__} "
            f"{prompt!r:.40}); write it as a string or as [{{'role': ..., 'content': ...}}]"
        )
    if isinstance(prompt, str) and not prompt.strip():
        return None, f"field {f.prompt_field!r} is empty"
    texts = {}
    for name, required in ((f.answer_field, f.answer_required), (f.solution_field, bool(f.solution_field))):
        if not name:
            continue
        value = record.get(name)
        if value is None:
            if required:
                return None, f"field {name!r} is missing (keys: {keys})"
            continue
        if isinstance(value, str) and not value.strip():
            return None, f"field {name!r} is empty"
        texts[name] = answer_text(value)
    length = len(prompt) if isinstance(prompt, str) else sum(len(str(m["content"])) for m in prompt)
    if f.context_chars and length > f.context_chars:
        return None, (
            f"prompt is longer than the model's context can hold ({length} characters; at most {f.context_chars} fit)"
        )
    if f.max_prompt_chars and length > f.max_prompt_chars:
        return (
            None,
            f"prompt is longer than max_prompt_chars={f.max_prompt_chars} ({length} characters); raise the limit",
        )
    bad = not_unicode(record, (f.prompt_field, f.answer_field, f.solution_field))
    if bad:
        return None, bad
    difficulty = 0.0
    if f.difficulty_field:
        d = record.get(f.difficulty_field)
        if isinstance(d, bool) or not isinstance(d, (int, float)):
            return None, f"field {f.difficulty_field!r} is not a number ({d!r:.40})"
        difficulty = float(d)
    answer = texts.get(f.answer_field, "")
    key = prompt_key(prompt)
    return Problem(
        key=key, text=key, answer=answer, solution=texts.get(f.solution_field, answer), difficulty=difficulty
    ), ""


class DatasetTask(Task):
    """A task over the rows of a local JSONL or Parquet file.

    Parameters
    ----------
    train_path
        The file of training rows (and of eval rows too, when ``eval_path`` is empty).
    eval_path
        Optional file of held-out rows.
    prompt_field, answer_field
        Field names of the prompt text and of the graded answer.
    solution_field
        Optional field of a full reference response (the SFT target); else the answer.
    difficulty_field
        Optional numeric field copied into ``Prompt.difficulty``.
    template
        Prompt template; ``{prompt}`` is replaced by the row's prompt (other braces are kept,
        so LaTeX is safe).
    reward
        ``"math_verify"``, ``"exact"`` or ``"numeric"`` (a key of ``pipeline.tasks.rewards.REWARDS``), or
        a user's TRL-style reward function as ``"module:function"`` (``pipeline.tasks.rewards.user``).
    eval_share
        Share of rows held out when there is no ``eval_path``.
    on_bad_row
        ``"skip"`` (count them in ``load_report``) or ``"error"``.
    max_prompt_chars
        Rows whose prompt is longer are bad rows (0: no limit).
    context_chars
        The most prompt characters the model's context can hold (0: unknown); longer rows are
        bad rows, found as the file is read (``railgate.build`` derives it from the model).

    Examples
    --------
    >>> import json, tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> rows = [{"problem": f"What is {i}+{i}?", "solution": str(2 * i)} for i in range(40)] + [{"problem": "x"}]
    >>> _ = (d / "train.jsonl").write_text("\\n".join(json.dumps(r) for r in rows))
    >>> task = DatasetTask(d / "train.jsonl", prompt_field="problem", answer_field="solution", reward="exact")
    >>> task.load_report.rows, task.load_report.skipped
    (40, 1)
    >>> p = task.train_prompts(1, seed=0)[0]
    >>> task.score(p, p.answer)
    1.0

    Chat-message prompts, an integer answer, and the row's other fields for a user's reward:

    >>> row = {"prompt": [{"role": "user", "content": "2+2?"}], "answer": 4, "source": "gsm"}
    >>> _ = (d / "chat.jsonl").write_text(json.dumps(row))
    >>> chat = DatasetTask(d / "chat.jsonl", reward="exact", eval_path=d / "chat.jsonl")
    >>> p = chat.eval_prompts(1, seed=0)[0]
    >>> chat.prompt_source(chat.eval_problems(1, seed=0)[0]), p.answer, chat.row(p.prompt_id).columns
    ([{'role': 'user', 'content': '2+2?'}], '4', {'answer': 4, 'source': 'gsm'})
    """

    reward = "math_verify"
    reward_timeout_s = 5.0
    """``score`` with a user's function: its timeout (``railgate.build`` sets the run's)."""
    reward_check_first = 32
    """``score`` with a user's function: stop when each of its first this many failed (the run's)."""

    def __init__(
        self,
        train_path: str | Path,
        eval_path: str | Path = "",
        prompt_field: str = "prompt",
        answer_field: str = "answer",
        solution_field: str = "",
        difficulty_field: str = "",
        template: str = "{prompt}",
        reward: str = "math_verify",
        eval_share: float = 0.1,
        on_bad_row: Literal["skip", "error"] = "skip",
        max_prompt_chars: int = 0,
        name: str = "dataset",
        context_chars: int = 0,
    ) -> None:
        super().__init__(eval_share)
        if "{prompt}" not in template:
            raise ValueError(f"template={template!r} must contain '{{prompt}}' where the row's prompt goes")
        self.name, self.template, self.reward = name, template, reward
        user = is_user_reward(reward)
        # A user's function is never imported in this process (pipeline.tasks.rewards.isolation);
        # railgate's preflight checks the name before anything is built.
        self._reward_spec = reward if user else None
        self._isolated: IsolatedScore | None = None
        options = RowOptions(
            prompt_field=prompt_field,
            answer_field=answer_field,
            solution_field=solution_field,
            difficulty_field=difficulty_field,
            on_bad_row=on_bad_row,
            max_prompt_chars=max_prompt_chars,
            answer_required=not user,
            context_chars=context_chars,
        )
        train, train_rows, self.load_report = load_rows(train_path, options)
        records = dict(zip((p.key for p in train), train_rows))
        if eval_path:
            held_out, eval_rows, self.eval_load_report = load_rows(eval_path, options)
            records.update(zip((p.key for p in held_out), eval_rows))
            eval_keys = {p.key for p in held_out}
            self._pools = {"train": [p for p in train if p.key not in eval_keys], "eval": held_out}
            self.dropped_overlap = len(train) - len(self._pools["train"])
        else:
            self.eval_load_report = None
            self._pools = {"train": [], "eval": []}
            for p in train:
                self._pools[super().split_of(p)].append(p)
            self.dropped_overlap = 0
        self._eval_keys = {p.key for p in self._pools["eval"]}
        self._sources = {"train": str(train_path), "eval": str(eval_path or train_path)}
        # Each prompt's row as a reward function sees it (a prompt in several rows: the last row).
        self._messages = {key: r[prompt_field] for key, r in records.items() if isinstance(r[prompt_field], list)}
        self._rows = {}
        for pool in self._pools.values():
            for p in pool:
                others = {k: v for k, v in records[p.key].items() if k != prompt_field}
                self._rows[self.prompt_id(p)] = DatasetRow(prompt=self.prompt_source(p), columns=others)

    def row(self, prompt_id: int) -> DatasetRow:
        """The dataset row of ``prompt_id``: its prompt (text or chat messages) and other fields."""
        return self._rows[prompt_id]

    def scorer(self, decode: Callable[[Sequence[int]], str]) -> TextReward | UserReward:
        """The built-in reward, or the user's function with the rows' fields (``pipeline.tasks.rewards.user``)."""
        if self._reward_spec is None:
            return super().scorer(decode)
        return UserReward(self._reward_spec, decode, self._rows, name=self.reward)

    def score(self, prompt: Prompt, response_text: str) -> float | None:
        """The reward of a response; a user's function runs in a worker process (``IsolatedScore``:
        a failure scores 0 and is counted, and every one of the first failing stops the run)."""
        if self._reward_spec is None:
            return super().score(prompt, response_text)
        if self._isolated is None:
            self._isolated = IsolatedScore(
                self._reward_spec, self._rows, timeout_s=self.reward_timeout_s, check_first=self.reward_check_first
            )
        return self._isolated(prompt, response_text)

    def prompt_source(self, problem: Problem) -> str | list[dict[str, Any]]:
        """The row's chat messages as they are, or its text in the template."""
        messages = self._messages.get(problem.key)
        return messages if messages is not None else self.format_prompt(problem)

    @property
    def alphabet(self) -> str:
        chars: set[str] = set()
        for pool in self._pools.values():
            for p in pool:
                chars.update(self.format_prompt(p), p.solution)
        return "".join(sorted(chars))

    def format_prompt(self, problem: Problem) -> str:
        return self.template.replace("{prompt}", problem.text)

    def split_of(self, problem: Problem) -> Split:
        return "eval" if problem.key in self._eval_keys else "train"

    def sample_problem(self, rng: random.Random) -> Problem:
        return rng.choice(self._pools["train"] + self._pools["eval"])

    def problems(self, split: Split, n: int, seed: int, unique: bool = False) -> list[Problem]:
        """``n`` rows of ``split`` in a seeded order, reshuffled after each pass over the pool."""
        if split not in self._pools:
            raise ValueError(f"split={split!r} must be 'train' or 'eval'")
        pool = self._pools[split]
        if not pool and n:
            raise DatasetError(
                f"{self._sources[split]}: the {split} split is empty; pass an eval file (eval_path) or raise eval_share"
            )
        if unique and n > len(pool):
            raise DatasetError(
                f"n={n} distinct {split} rows asked of a pool of {len(pool)}; ask for fewer or pass unique=False"
            )
        return self.from_pool(pool, split, n, seed)

    def __repr__(self) -> str:
        sizes = {k: len(v) for k, v in self._pools.items()}
        return f"DatasetTask(name={self.name!r}, source={self._sources['train']!r}, rows={sizes})"
