"""Reading the rows of a user's data file (JSONL or Parquet), for the dataset task and the
environments' problem files alike: ``read_records`` yields each row with where it stands ("line
7"), and a row that cannot be read (not UTF-8, not JSON) as an ``Invalid`` with the reason, so
that the caller skips and counts it or stops, naming the row. ``DatasetError`` is a file that
cannot be used at all; ``LoadReport`` is what loading a file gave.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

JSONL_SUFFIXES = (".jsonl", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")


class DatasetError(ValueError):
    """A dataset file cannot be used as asked; the message names the file, the row and the fix."""


@dataclass(frozen=True)
class LoadReport:
    """What loading one file gave: rows kept, rows skipped and why (reason -> count)."""

    path: str
    rows: int
    skipped: int
    reasons: dict[str, int] = field(default_factory=dict)


def read_records(path: Path, fields: list[str]) -> Iterator[tuple[str, Any]]:
    """``(where, record)`` for each row of a JSONL or Parquet file; ``where`` reads "line 7"."""
    suffix = path.suffix.lower()
    if not path.is_file():
        raise DatasetError(
            f"dataset file {path} does not exist; check the path (relative paths start at the working directory)"
        )
    if suffix in JSONL_SUFFIXES:
        with path.open("rb") as fh:
            for number, raw in enumerate(fh, start=1):
                if number == 1 and raw.startswith(codecs.BOM_UTF8):
                    raw = raw[len(codecs.BOM_UTF8) :]  # a byte-order mark (some editors write one) is not row data
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    yield (
                        f"line {number}",
                        Invalid(
                            f"not UTF-8 text (byte {raw[exc.start]:#04x} at column {exc.start + 1}); "
                            "save the file as UTF-8"
                        ),
                    )
                    continue
                if not line.strip():
                    continue  # blank lines (a trailing newline) are not rows
                try:
                    yield f"line {number}", json.loads(line)
                except json.JSONDecodeError as exc:
                    yield f"line {number}", Invalid(f"invalid JSON ({exc.msg})")
                except (ValueError, RecursionError) as exc:  # a number of 5000 digits, arrays nested 10^5 deep
                    yield f"line {number}", Invalid(f"invalid JSON ({str(exc)[:80]})")
    elif suffix in PARQUET_SUFFIXES:
        import pyarrow.parquet as pq

        try:
            schema = pq.read_schema(path)
        except Exception as exc:  # pyarrow raises several types for unreadable files
            raise DatasetError(f"{path} is not a readable Parquet file ({exc}); re-export it") from None
        missing = [f for f in fields if f not in schema.names]
        if missing:
            raise DatasetError(
                f"{path} has no column {missing[0]!r} (columns: {', '.join(schema.names)}); "
                "set the task's field names to the file's columns"
            )
        table = pq.read_table(path)  # every column: a user's reward function gets the other fields too
        for number, record in enumerate(table.to_pylist(), start=1):
            yield f"row {number}", record
    else:
        raise DatasetError(
            f"{path}: unknown file type {suffix!r}; use JSONL ({', '.join(JSONL_SUFFIXES)}) or Parquet "
            f"({', '.join(PARQUET_SUFFIXES)})"
        )


@dataclass(frozen=True)
class Invalid:
    reason: str


def not_unicode(record: dict[str, Any], names: tuple[str, ...]) -> str:
    """Why a field of ``record`` is not valid Unicode text (a lone surrogate, which JSON's
    ``\\ud800`` escape can spell and no encoder can write), or ``""``."""
    for name in names:
        if not name or name not in record:
            continue
        for text in strings(record[name]):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                return (
                    f"field {name!r} holds a lone surrogate ({text[exc.start]!r} at character {exc.start + 1}), which "
                    "is not valid Unicode text; fix the row's escape (a surrogate pair, or the character itself)"
                )
    return ""


def strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from strings(k)
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)
