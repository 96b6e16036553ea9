"""What the importers share: rows in the native columns with where each came from, the
importer-level problems (counted like the reader's own in skip mode), prompt ids by text, and
reading JSONL and chat messages.

Every importer collects its rows in ``ImportedRows`` and ends in ``ImportedRows.log``, which
calls ``pipeline.store.grouplog.groups_from_table``: one set of checks for every format.

>>> rows = ImportedRows(fmt="demo")
>>> f = rows.file("a.jsonl")
>>> for i, r in enumerate([1.0, 0.0]):
...     rows.add(f, i + 1, group_id=0, step=3, prompt="2+2?", completion="4", num_tokens=1, reward=r, sample_index=i)
>>> log = rows.log(Problems("error"))
>>> log.format, log.groups[0].rewards, log.groups[0].step, log.groups[0].prompt_id
('demo', (1.0, 0.0), 3, 0)
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.store.grouplog import GroupLog, GroupLogError, OnBadRow, RowOrigin, groups_from_table

Tokenize = Callable[[str], Sequence[int]]
"""Text -> its token ids (only the count is used): how an importer measures a completion whose
log kept no length."""

TOKENIZER_FIX = (
    "pass a tokenizer (read_log(..., tokenize=...); on the command line --tokenizer DIR with the model's "
    "tokenizer directory, or --tokenizer chars to count characters)"
)

_TYPES = {
    "group_id": pa.int64(),
    "step": pa.int64(),
    "prompt_id": pa.int64(),
    "prompt_text": pa.string(),
    "answer": pa.string(),
    "sample_index": pa.int32(),
    "completion_text": pa.string(),
    "num_tokens": pa.int32(),
    "policy_version": pa.int64(),
}


class Problems:
    """Problems an importer finds before the common checks (a row that is not JSON, a block of
    TRL rows whose prompts differ): raised as ``GroupLogError`` (where, what, fix), or counted
    in skip mode and added to the log's ``skipped_rows`` / ``skipped_groups``."""

    def __init__(self, on_bad_row: OnBadRow) -> None:
        if on_bad_row not in ("error", "skip"):
            raise GroupLogError(f"on_bad_row={on_bad_row!r} must be 'error' or 'skip'")
        self.on_bad_row = on_bad_row
        self.rows = 0
        self.groups = 0

    def report(self, where: str, what: str, fix: str, rows: int = 1, groups: int = 0) -> None:
        if self.on_bad_row == "error":
            raise GroupLogError(f"{where}: {what}; {fix}, or pass --on-bad-row skip to leave such groups out")
        self.rows += rows
        self.groups += groups


class PromptIds:
    """A prompt id per distinct prompt text, in first-seen order (the foreign logs keep no
    data-set index, so one prompt sampled at two steps shares its id)."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        return self._ids.setdefault(text, len(self._ids))


class ImportedRows:
    """One row per sample in the native columns, each with its file and row (or line)."""

    def __init__(self, fmt: str, unit: str = "row") -> None:
        self.fmt = fmt
        self.unit = unit
        self.files: list[str] = []
        self._file_index: dict[str, int] = {}
        self.columns: dict[str, list[Any]] = {name: [] for name in (*_TYPES, "reward")}
        self.file_of: list[int] = []
        self.row_of: list[int] = []
        self.prompt_ids = PromptIds()

    def file(self, path: str | os.PathLike) -> int:
        """The index of ``path`` among the files rows come from (added on first use)."""
        name = str(path)
        if name not in self._file_index:
            self._file_index[name] = len(self.files)
            self.files.append(name)
        return self._file_index[name]

    def add(
        self,
        file: int,
        row: int,
        *,
        group_id: int,
        step: int,
        prompt: str,
        completion: str,
        num_tokens: int,
        reward: Any,
        sample_index: int,
        policy_version: int | None = None,
        answer: str = "",
    ) -> None:
        """One sample; ``reward`` as the log has it (a number, None, or whatever else: the common
        checks name a value that is not a number)."""
        values = {
            "group_id": group_id,
            "step": step,
            "prompt_id": self.prompt_ids(prompt),
            "prompt_text": prompt,
            "answer": answer,
            "sample_index": sample_index,
            "completion_text": completion,
            "num_tokens": num_tokens,
            "policy_version": step if policy_version is None else policy_version,
            "reward": reward,
        }
        for name, value in values.items():
            self.columns[name].append(value)
        self.file_of.append(file)
        self.row_of.append(row)

    def __len__(self) -> int:
        return len(self.file_of)

    def table(self) -> pa.Table:
        arrays = {name: pa.array(self.columns[name], type=kind) for name, kind in _TYPES.items()}
        arrays["reward"] = reward_array(self.columns["reward"])
        return pa.table(arrays)

    def origin(self) -> RowOrigin:
        return RowOrigin(
            tuple(self.files),
            np.asarray(self.file_of, dtype=np.int64),
            np.asarray(self.row_of, dtype=np.int64),
            self.unit,
        )

    def log(self, problems: Problems, notes: Sequence[str] = (), duplicate_rows: int = 0) -> GroupLog:
        """The checked groups (``groups_from_table``), with the importer's own skips added."""
        log = groups_from_table(self.table(), self.origin(), problems.on_bad_row, fmt=self.fmt, notes=notes)
        return replace(
            log,
            skipped_rows=log.skipped_rows + problems.rows,
            skipped_groups=log.skipped_groups + problems.groups,
            duplicate_rows=duplicate_rows,
        )


def reward_array(values: Sequence[Any]) -> pa.Array:
    """Rewards as float64 when every value is a number or missing; else as strings (numbers
    written exactly, ``repr``), so that the common checks name the value that is not a number.

    >>> reward_array([1, None, 0.5]).to_pylist()
    [1.0, None, 0.5]
    >>> reward_array([1.0, "n/a"]).to_pylist()
    ['1.0', 'n/a']
    """
    if all(v is None or isinstance(v, (int, float)) for v in values):  # bool is an int: True -> 1.0
        return pa.array([None if v is None else float(v) for v in values], type=pa.float64())
    out = []
    for v in values:
        if v is None:
            out.append(None)
        elif isinstance(v, (bool, int, float)):
            out.append(repr(float(v)))
        elif isinstance(v, str):
            out.append(v)
        else:
            out.append(json.dumps(v, ensure_ascii=False, default=str))
    return pa.array(out, type=pa.string())


def count_tokens(tokenize: Tokenize, text: str) -> int:
    return len(tokenize(text))


def require_tokenizer(tokenize: Tokenize | None, where: str, fmt: str, why: str) -> Tokenize:
    """``tokenize``, or a ``GroupLogError`` saying the log keeps no lengths and what to pass."""
    if tokenize is None:
        raise GroupLogError(
            f"{where}: {fmt} logs {why}, so completions must be re-tokenised to count their tokens; {TOKENIZER_FIX}"
        )
    return tokenize


def read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any] | None, str]]:
    """``(line number, record, "")`` for each non-blank line of a JSONL file, or ``(line, None,
    why)`` for a line that is not a JSON object (a torn last line, say)."""
    with path.open("rb") as fh:
        for number, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                yield number, None, f"not UTF-8 text (byte {exc.start})"
                continue
            except ValueError as exc:
                yield number, None, f"not JSON ({str(exc)[:80]})"
                continue
            if not isinstance(record, dict):
                yield number, None, f"a JSON {type(record).__name__}, not an object"
                continue
            yield number, record, ""


def checked_jsonl(
    path: Path, problems: Problems, framework: str, required: Sequence[str], fields_fix: str
) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """``(line number, "FILE line N", record)`` for each line of a framework's JSONL dump that is a
    JSON object with every ``required`` field; any other line is reported to ``problems`` (its fix:
    restore the line, or ``fields_fix`` for missing fields) and left out."""
    for line, record, why in read_jsonl(path):
        where = f"{path} line {line}"
        if record is None:
            problems.report(where, why, f"{framework} writes one JSON object a line: restore or delete the line")
            continue
        missing = [f for f in required if f not in record]
        if missing:
            problems.report(where, f"no {', '.join(missing)} (it has {', '.join(record) or 'nothing'})", fields_fix)
            continue
        yield line, where, record


def message_text(value: Any) -> str:
    """The text of a prompt or completion: plain text as is; chat messages (a list of
    ``{"role", "content"}`` dicts, content a string or a list of ``{"type": "text", "text"}``
    blocks) as their contents joined by newlines.

    >>> message_text([{"role": "assistant", "content": [{"type": "text", "text": "4"}]}])
    '4'
    """
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        parts = []
        for message in value:
            content = message.get("content") if isinstance(message, dict) else message
            if isinstance(content, (list, tuple)):
                content = "".join(
                    str(block.get("text", "")) for block in content if isinstance(block, dict) and block.get("text")
                )
            parts.append("" if content is None else str(content))
        return "\n".join(parts)
    return str(value)


def prompt_key(value: Any) -> str:
    """A prompt as one string: plain text as is, chat messages as JSON (role and content kept,
    so two conversations differing in a system message are two prompts).

    >>> prompt_key([{"role": "user", "content": "2+2?"}])
    '[{"role": "user", "content": "2+2?"}]'
    """
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(_plain(value), ensure_ascii=False, default=str)


def _plain(value: Any) -> Any:
    """Chat messages as JSON-ready values: role first, content next, keys with None dropped
    (a Parquet struct column gives every message every key)."""
    if isinstance(value, dict):
        first = [k for k in ("role", "content") if k in value]
        keys = first + sorted(k for k in value if k not in first)
        return {k: _plain(value[k]) for k in keys if value[k] is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def as_int(value: Any) -> int | None:
    """A whole number from a JSON value (3, 3.0, "3"), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None
