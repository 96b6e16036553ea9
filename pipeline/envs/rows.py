"""Dataset rows in SkyRL's format, from JSONL or Parquet files.

A row is one problem::

    {"data_source": "railgate/wordproblems",                      (optional, kept in extras)
     "prompt": [{"role": "user", "content": "Ada has 3 pens..."}],   chat messages, required
     "env_class": "gsm8k_multi_turn",                             (optional; task.env.class decides)
     "reward_spec": {"method": "rule", "ground_truth": "7"},     (a mapping when present)
     "extra_info": {"max_turns": 5, ...}}                         (a mapping when present)

The environment gets the row without its ``prompt`` as ``extras``, and ``init`` gets the
prompt. Reading (UTF-8 and byte-order marks, bad JSON lines, unreadable Parquet) is
``pipeline.datafiles.read_records``; a bad row is skipped and counted, or stops the load
with its line and the fix (``on_bad_row``).

>>> import json, pathlib, tempfile
>>> path = pathlib.Path(tempfile.mkdtemp()) / "rows.jsonl"
>>> good = {"prompt": [{"role": "user", "content": "3+4="}], "reward_spec": {"ground_truth": "3+4"}}
>>> _ = path.write_text(json.dumps(good) + "\\n" + json.dumps({"prompt": "3+4="}) + "\\n")
>>> rows, report = load_env_rows(path)
>>> rows[0].prompt, rows[0].extras, report.skipped, report.reasons
([{'role': 'user', 'content': '3+4='}], {'reward_spec': {'ground_truth': '3+4'}}, 1, {'prompt is a str': 1})
>>> load_env_rows(path, on_bad_row="error")
Traceback (most recent call last):
...
pipeline.datafiles.DatasetError: ...rows.jsonl, line 2: prompt is a str ('3+4='), not a list of chat messages; write it as [{"role": "user", "content": ...}], or set task.env.on_bad_row=skip to skip such rows
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pipeline.datafiles import DatasetError, LoadReport, read_records
from pipeline.envs.protocol import content_chars, is_message

log = logging.getLogger(__name__)

MAX_PROMPT_CHARS = 1_000_000
"""A row's prompt may hold at most this many characters (a bigger one is a broken file)."""


@dataclass(frozen=True)
class EnvRow:
    """One problem: the prompt messages ``init`` gets and the ``extras`` the class is built with."""

    prompt: list[dict]
    extras: dict[str, Any]

    @property
    def key(self) -> str:
        """What identifies the problem (its split hash and prompt id): prompt and reward_spec as JSON."""
        return json.dumps([self.prompt, self.extras.get("reward_spec")], ensure_ascii=False, sort_keys=True)

    @property
    def ground_truth(self) -> Any:
        spec = self.extras.get("reward_spec")
        return spec.get("ground_truth") if isinstance(spec, dict) else None

    @classmethod
    def of(cls, record: dict[str, Any]) -> EnvRow:
        """The row of a record that passed ``row_problem``."""
        return cls([dict(m) for m in record["prompt"]], {k: v for k, v in record.items() if k != "prompt"})


def row_problem(record: Any, max_chars: int = MAX_PROMPT_CHARS) -> str:
    """Why ``record`` is not a usable row (``""`` when it is), with the fix."""
    if not isinstance(record, dict):
        return f"the row is a JSON {type(record).__name__}, not an object"
    prompt = record.get("prompt")
    if prompt is None:
        return f"field 'prompt' is missing (keys: {', '.join(map(str, record)) or 'none'})"
    if not isinstance(prompt, list):
        return (
            f"prompt is a {type(prompt).__name__} ({prompt!r:.40}), not a list of chat messages; write it as "
            '[{"role": "user", "content": ...}]'
        )
    if not prompt:
        return "prompt is an empty list; give it at least one message"
    for i, m in enumerate(prompt):
        if not is_message(m):
            return f"prompt[{i}] is not a {{'role': str, 'content': str}} message ({m!r:.60})"
    for name in ("reward_spec", "extra_info"):
        if name in record and record[name] is not None and not isinstance(record[name], dict):
            return f"{name} is a {type(record[name]).__name__}, not a mapping; write it as {{...}}"
    if "env_class" in record and record["env_class"] is not None and not isinstance(record["env_class"], str):
        return f"env_class is a {type(record['env_class']).__name__}, not a string"
    chars = content_chars(prompt)
    if chars > max_chars:
        return f"prompt holds {chars} characters, over the limit of {max_chars}; shorten it"
    return ""


def load_env_rows(
    path: str | Path, on_bad_row: Literal["skip", "error"] = "skip", max_chars: int = MAX_PROMPT_CHARS
) -> tuple[list[EnvRow], LoadReport]:
    """The usable rows of one file and a report of those skipped (``DatasetError`` for none)."""
    p = Path(path)
    rows: list[EnvRow] = []
    reasons: Counter[str] = Counter()
    for where, record in read_records(p, ["prompt"]):
        reason = getattr(record, "reason", None) or row_problem(record, max_chars)
        if not reason:
            rows.append(EnvRow.of(record))
            continue
        if on_bad_row == "error":
            raise DatasetError(f"{p}, {where}: {reason}, or set task.env.on_bad_row=skip to skip such rows")
        reasons[reason.split(" (")[0]] += 1
    report = LoadReport(path=str(p), rows=len(rows), skipped=sum(reasons.values()), reasons=dict(reasons))
    if not rows:
        detail = "; ".join(f"{n} x {r}" for r, n in reasons.most_common(3)) or "the file is empty"
        raise DatasetError(f"{p}: no usable rows ({detail}); write rows in SkyRL's format (docs/envs.md)")
    if report.skipped:
        log.warning(
            "%s: skipped %d bad rows of %d: %s", p, report.skipped, report.skipped + report.rows, report.reasons
        )
    return rows, report


def write_rows(path: str | Path, rows: Iterable[dict[str, Any]]) -> Path:
    """Write rows as JSONL (one object a line); returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return p
