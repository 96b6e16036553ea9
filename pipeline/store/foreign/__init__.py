"""Rollout logs other frameworks write, read as railgate group logs (``GroupLog``).

One module per format, each ending in ``groups_from_table`` so that every log is checked by
the same rules (``pipeline.store.grouplog``); each module's docstring says what its format
holds and what the importer assumes where the format is silent:

* ``native``: railgate's own log (``groups-*.arrows`` segments, or a Parquet file);
* ``trl``: TRL's ``GRPOTrainer(log_completions=True)`` files, ``completions/completions_*.parquet``;
* ``areal``: AReaL's ``dump_to_file`` lines, ``rollout/<version>/<task_id>.jsonl``;
* ``verl``: verl's ``trainer.rollout_data_dir`` lines, ``<step>.jsonl``.

Logs that keep no lengths (TRL, verl) need ``tokenize``: text -> token ids, only counted.

>>> import json, tempfile
>>> from pathlib import Path
>>> d = Path(tempfile.mkdtemp())
>>> lines = [{"input": "2+2?", "output": o, "gts": "4", "score": s, "step": 1} for o, s in [("4", 1.0), ("5", 0.0)]]
>>> _ = (d / "1.jsonl").write_text("".join(json.dumps(x) + "\\n" for x in lines))
>>> detect_format(d)
'verl'
>>> log = read_log(d, tokenize=str.split)
>>> log.format, log.groups[0].rewards, log.groups[0].answer
('verl', (1.0, 0.0), '4')
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from pipeline.store.arrowio import segment_paths
from pipeline.store.foreign.areal import read_areal
from pipeline.store.foreign.common import Tokenize
from pipeline.store.foreign.trl import read_trl
from pipeline.store.foreign.verl import read_verl
from pipeline.store.grouplog import GROUPS, REQUIRED, GroupLog, GroupLogError, OnBadRow, read_group_log

FORMATS = ("native", "trl", "areal", "verl")
"""The log formats ``read_log`` reads (``--format``)."""

_AREAL_KEYS = {"task_id", "sample_idx"}
_VERL_KEYS = {"input", "output", "score"}


def detect_format(path: str | os.PathLike) -> str:
    """The format of the log at ``path``, from its layout and its columns or fields:

    * native: a directory with ``groups-*.arrows`` segments, such a segment, or a ``.parquet``
      file with the native columns (``group_id``, ``sample_index``, ``reward``, ...);
    * trl: a directory named ``completions`` or holding ``completions_*.parquet`` (or a
      ``completions`` directory that does), or such a file (or a Parquet file with ``prompt``
      and ``completion`` columns);
    * areal: a directory with ``rollout/<version>/*.jsonl`` (or ``<version>/*.jsonl``, or
      ``*.jsonl``) whose lines have ``task_id`` and ``sample_idx``, or such a file;
    * verl: ``*.jsonl`` whose lines have ``input``, ``output`` and ``score``, or a directory of them.

    Raises ``GroupLogError`` naming ``--format`` when no format or several fit."""
    path = Path(path)
    if not path.exists():
        raise GroupLogError(f"{path} does not exist; pass a group log directory or file")
    found = [fmt for fmt, test in _TESTS.items() if test(path)]
    if len(found) == 1:
        return found[0]
    if not found:
        raise GroupLogError(
            f"{path} is not a log of any format railgate reads ({', '.join(FORMATS)}); pass --format "
            f"{'|'.join(FORMATS)} to say which it is (the error then says what is missing)"
        )
    raise GroupLogError(f"{path} could be a {' or a '.join(found)} log; pass --format {'|'.join(found)} to say which")


def read_log(
    path: str | os.PathLike,
    fmt: str = "auto",
    tokenize: Tokenize | None = None,
    num_generations: int | None = None,
    on_bad_row: OnBadRow = "error",
    reward_columns: Sequence[str] | None = None,
) -> GroupLog:
    """Read a group log of any format in ``FORMATS`` (``fmt="auto"``: ``detect_format``).

    ``tokenize`` counts the tokens of completions whose log kept no length (TRL, verl; AReaL
    lines without ``seqlen``); ``num_generations`` is the group size K of TRL (and verl) logs;
    ``reward_columns`` picks TRL's reward columns. A bad log raises ``GroupLogError`` naming
    the file, row and fix, unless ``on_bad_row="skip"`` (bad groups left out and counted)."""
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt == "native":
        return read_group_log(path, on_bad_row)
    if fmt == "trl":
        return read_trl(path, tokenize, num_generations, on_bad_row, reward_columns)
    if fmt == "areal":
        return read_areal(path, tokenize, on_bad_row)
    if fmt == "verl":
        return read_verl(path, tokenize, num_generations, on_bad_row)
    raise GroupLogError(f"format {fmt!r} is not one of {', '.join(FORMATS)}; pass --format {'|'.join(FORMATS)} or auto")


def _first_record(path: Path) -> dict[str, Any]:
    """The first JSON object of a JSONL file ({} when there is none or it is not JSON)."""
    try:
        with path.open("rb") as fh:
            for raw in fh:
                if raw.strip():
                    record = json.loads(raw)
                    return record if isinstance(record, dict) else {}
    except (OSError, ValueError):
        pass
    return {}


def _parquet_columns(path: Path) -> set[str]:
    try:
        return set(pq.read_schema(path).names)
    except Exception:  # pyarrow raises several types for an unreadable file
        return set()


def _is_native(path: Path) -> bool:
    if path.is_dir():
        return bool(segment_paths(path, GROUPS.prefix))
    if path.suffix == ".arrows":
        return True
    return path.suffix == ".parquet" and set(REQUIRED) <= _parquet_columns(path)


def _is_trl(path: Path) -> bool:
    if path.is_dir():
        return (
            path.name == "completions"
            or any(path.glob("completions_*.parquet"))
            or any((path / "completions").glob("completions_*.parquet"))
        )
    if path.suffix != ".parquet":
        return False
    return path.name.startswith("completions_") or {"prompt", "completion"} <= _parquet_columns(path)


def _jsonl_with(directory: Path, keys: set[str]) -> bool:
    return any(keys <= _first_record(f).keys() for f in directory.glob("*.jsonl"))


def _is_areal(path: Path) -> bool:
    if path.is_file():
        return path.suffix == ".jsonl" and _AREAL_KEYS <= _first_record(path).keys()
    base = path / "rollout" if (path / "rollout").is_dir() else path
    versions = [d for d in base.iterdir() if d.is_dir() and d.name.isdigit()]
    return any(_jsonl_with(d, _AREAL_KEYS) for d in versions) or _jsonl_with(base, _AREAL_KEYS)


def _is_verl(path: Path) -> bool:
    if path.is_file():
        return path.suffix == ".jsonl" and _VERL_KEYS <= _first_record(path).keys()
    return _jsonl_with(path, _VERL_KEYS)


_TESTS = {"native": _is_native, "trl": _is_trl, "areal": _is_areal, "verl": _is_verl}
