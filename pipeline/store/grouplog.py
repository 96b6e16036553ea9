"""Group logs: full groups of samples recorded once from a real model, for exact replay.

A gate's choices (which prompts it opens, how many samples it reads, what it commits or
abandons) are a function of the samples it sees. A log of *full* groups, every sample a
prompt's group would have had, lets any gate be replayed on exactly those samples: a probe
reads a group's first k samples, an abandon truncates it, a skip never reads it.

One row per sample. The columns (``GROUPS.schema``, version 1)::

    group_id int64            a group's id, unique in the log (a prompt sampled at two policy
                              versions is two groups)
    step int64                the learner step (or generation batch) the group was sampled at
    prompt_id int64           the prompt's id in its task or data set
    prompt_text string        the prompt as the model saw it
    answer string             the reference answer ("" when the task has none)
    difficulty float64        the task's difficulty label (digits, level), null if none
    reference_logprob float64 the policy's log-likelihood of the reference response, what
                              SARA's reference prior reads before sampling; null if not scored
    success_threshold float64 a reward above it is a success
    sample_index int32        the sample's index in its group, 0 .. K-1
    finish_order int32        the order it finished in within its group, 0 .. K-1
    completion_ids list<int32>  its tokens (empty when the log kept only text)
    completion_text string    its decoded text
    num_tokens int32          its length in tokens
    reward float64            its reward (the sum of the reward functions' where several)
    finish_reason string      "stop" or "length"
    policy_version int64      the weights' version that sampled it

On disk a log is either a directory of Arrow IPC stream segments ``groups-NNNNN.arrows``
(what ``run.py record`` and shadow runs write; one record batch per write, so a crash loses
at most the groups being written, ``pipeline.store.arrowio``), or one Parquet file with the
same columns (``write_parquet``; a hand-made Parquet file needs only ``group_id``,
``prompt_id``, ``sample_index`` and ``reward``; the rest take the defaults in ``OPTIONAL``).

Reading checks what replay relies on and names the file, row and fix when a log breaks it:
a missing column, a non-numeric or NaN reward, an id that is not a whole number, a duplicate
sample index, a group whose indices (or finish orders) are not 0 .. K-1, a negative length,
groups of different sizes, a group split across files. A torn last segment (a writer killed
mid-batch) is not an error: its complete batches are read, with a ``TornSegmentWarning``. With
``on_bad_row="skip"`` each bad group is left out and counted instead (a group of a size other
than the log's most common one, too).

>>> import tempfile
>>> groups = [RecordedGroup.of(g, prompt_id=g, rewards=r) for g, r in enumerate([(1, 0, 1, 1), (0, 0, 0, 0)])]
>>> d = tempfile.mkdtemp()
>>> with GroupLogWriter(d, run_id="demo") as w:
...     w.write(groups)
>>> log = read_group_log(d)
>>> log.group_size, [g.is_mixed for g in log.groups], log.groups[0].successes
(4, [True, False], 3)
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.store.arrowio import (
    SegmentFormatError,
    SegmentKind,
    SegmentWriter,
    next_segment_number,
    read_segments,
    segment_paths,
    warn_torn,
)
from pipeline.types import FinishReason

OnBadRow = Literal["error", "skip"]

GROUPS = SegmentKind(
    "groups",
    pa.schema(
        [
            ("group_id", pa.int64()),
            ("step", pa.int64()),
            ("prompt_id", pa.int64()),
            ("prompt_text", pa.string()),
            ("answer", pa.string()),
            ("difficulty", pa.float64()),
            ("reference_logprob", pa.float64()),
            ("success_threshold", pa.float64()),
            ("sample_index", pa.int32()),
            ("finish_order", pa.int32()),
            ("completion_ids", pa.list_(pa.int32())),
            ("completion_text", pa.string()),
            ("num_tokens", pa.int32()),
            ("reward", pa.float64()),
            ("finish_reason", pa.string()),
            ("policy_version", pa.int64()),
        ]
    ),
    version=1,
)

REQUIRED = ("group_id", "prompt_id", "sample_index", "reward")
"""Columns a Parquet group log must have; every other column of ``GROUPS`` is optional."""

OPTIONAL: Mapping[str, Any] = {
    "step": 0,
    "prompt_text": "",
    "answer": "",
    "difficulty": None,
    "reference_logprob": None,
    "success_threshold": 0.5,
    "finish_order": None,  # the sample index: samples finished in index order
    "completion_ids": None,  # empty
    "completion_text": "",
    "num_tokens": None,  # the number of completion ids
    "finish_reason": "stop",
    "policy_version": 0,
}
"""The value an optional column takes in a log that lacks it."""

_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}


class GroupLogError(ValueError):
    """A group log that replay cannot trust; the message names the file, the row and the fix."""


@dataclass(frozen=True)
class RecordedSample:
    """One recorded sample of a group."""

    index: int
    reward: float
    num_tokens: int
    finish_order: int
    token_ids: tuple[int, ...] = ()
    text: str = ""
    finish_reason: FinishReason = FinishReason.STOP
    policy_version: int = 0


@dataclass(frozen=True)
class RecordedGroup:
    """A prompt's full recorded group; ``samples`` are in sample-index order."""

    group_id: int
    prompt_id: int
    samples: tuple[RecordedSample, ...]
    step: int = 0
    prompt_text: str = ""
    answer: str = ""
    difficulty: float | None = None
    reference_logprob: float | None = None
    success_threshold: float = 0.5

    @classmethod
    def of(
        cls, group_id: int, prompt_id: int, rewards: Sequence[float], num_tokens: int = 8, **fields: Any
    ) -> RecordedGroup:
        """A group from its rewards alone (tests, synthetic worlds), samples finishing in index order.

        >>> RecordedGroup.of(0, prompt_id=7, rewards=[1, 0]).successes
        1
        """
        samples = tuple(RecordedSample(i, float(r), num_tokens, i) for i, r in enumerate(rewards))
        return cls(group_id, prompt_id, samples, **fields)

    @property
    def size(self) -> int:
        return len(self.samples)

    @property
    def rewards(self) -> tuple[float, ...]:
        """Rewards in sample-index order."""
        return tuple(s.reward for s in self.samples)

    @property
    def successes(self) -> int:
        return sum(s.reward > self.success_threshold for s in self.samples)

    @property
    def is_mixed(self) -> bool:
        """The full group has both a success and a failure: an informative (effective) group."""
        return 0 < self.successes < self.size

    @property
    def tokens(self) -> int:
        return sum(s.num_tokens for s in self.samples)

    def in_finish_order(self) -> tuple[RecordedSample, ...]:
        """The samples in the order they finished when recorded."""
        return tuple(sorted(self.samples, key=lambda s: s.finish_order))


@dataclass(frozen=True)
class GroupLog:
    """A read group log: its groups, where they came from, and what reading left out or noticed."""

    groups: tuple[RecordedGroup, ...]
    sources: tuple[str, ...]
    format: str = "native"
    skipped_rows: int = 0
    skipped_groups: int = 0
    notes: tuple[str, ...] = field(default=())
    """What a reader should know (an importer's warning that the log is biased, say)."""
    duplicate_rows: int = 0
    """Rows an importer dropped as repeats of rows already read (TRL can write one batch twice)."""

    @property
    def group_size(self) -> int:
        """K: the samples of each group (0 for an empty log)."""
        return self.groups[0].size if self.groups else 0

    @property
    def samples(self) -> int:
        return sum(g.size for g in self.groups)


class GroupLogWriter:
    """Appends groups to a log directory as ``groups-NNNNN.arrows`` segments, one record batch a
    ``write``; a new writer on the same directory starts a new segment (``recorded_groups`` says
    what earlier writers finished, for resuming)."""

    def __init__(self, directory: str | os.PathLike, run_id: str = "", fsync: bool = True) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._writer = SegmentWriter(
            self.directory, GROUPS, next_segment_number(self.directory, [GROUPS.prefix]), run_id, fsync=fsync
        )

    @property
    def path(self) -> Path:
        return self._writer.path

    def write(self, groups: Sequence[RecordedGroup]) -> None:
        if groups:
            self._writer.write(group_table(groups).to_batches(max_chunksize=1 << 30)[0])

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> GroupLogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def group_table(groups: Iterable[RecordedGroup]) -> pa.Table:
    """The groups as a table of ``GROUPS.schema``, one row per sample."""
    columns: dict[str, list[Any]] = {name: [] for name in GROUPS.schema.names}
    for g in groups:
        for s in g.samples:
            columns["group_id"].append(g.group_id)
            columns["step"].append(g.step)
            columns["prompt_id"].append(g.prompt_id)
            columns["prompt_text"].append(g.prompt_text)
            columns["answer"].append(g.answer)
            columns["difficulty"].append(g.difficulty)
            columns["reference_logprob"].append(g.reference_logprob)
            columns["success_threshold"].append(g.success_threshold)
            columns["sample_index"].append(s.index)
            columns["finish_order"].append(s.finish_order)
            columns["completion_ids"].append(list(s.token_ids))
            columns["completion_text"].append(s.text)
            columns["num_tokens"].append(s.num_tokens)
            columns["reward"].append(s.reward)
            columns["finish_reason"].append(s.finish_reason.name.lower())
            columns["policy_version"].append(s.policy_version)
    return pa.table(columns, schema=GROUPS.schema)


def write_parquet(log: GroupLog | Sequence[RecordedGroup], path: str | os.PathLike) -> Path:
    """Write groups as one Parquet file with ``GROUPS``' columns (for pandas, polars, DuckDB)."""
    groups = log.groups if isinstance(log, GroupLog) else log
    path = Path(path)
    pq.write_table(group_table(groups), path)
    return path


def recorded_groups(directory: str | os.PathLike) -> list[RecordedGroup]:
    """The complete groups already in a log directory (none when it has no segments): what a
    resumed recording keeps. A torn tail is dropped with a warning, and its groups recorded again."""
    if not segment_paths(directory, GROUPS.prefix):
        return []
    return list(read_group_log(directory).groups)


@dataclass(frozen=True)
class RowOrigin:
    """Where each row of a table came from: ``files[file_of[i]]``, ``unit`` ``row_of[i]``: a
    table's row (0-based, ``unit="row"``) or a JSONL file's line (1-based, ``unit="line"``)."""

    files: tuple[str, ...]
    file_of: np.ndarray
    row_of: np.ndarray
    unit: str = "row"

    @classmethod
    def single(cls, path: str, rows: int) -> RowOrigin:
        return cls((path,), np.zeros(rows, dtype=np.int64), np.arange(rows, dtype=np.int64))

    def where(self, i: int) -> str:
        return f"{self.files[int(self.file_of[i])]} {self.unit} {int(self.row_of[i])}"


def read_group_log(path: str | os.PathLike, on_bad_row: OnBadRow = "error") -> GroupLog:
    """Read a native group log: a directory of ``groups-*.arrows`` segments, one segment, or a
    Parquet file. Raises ``GroupLogError`` (file, row, fix) on a bad log unless ``on_bad_row="skip"``."""
    path = Path(path)
    if not path.exists():
        raise GroupLogError(
            f"{path} does not exist; pass a group log directory (run.py record --out) or a .parquet file"
        )
    if path.is_dir() or path.suffix == ".arrows":
        paths = segment_paths(path, GROUPS.prefix) if path.is_dir() else [path]
        if not paths:
            raise GroupLogError(
                f"{path} holds no groups-NNNNN.arrows segments; record one with `python run.py record`, or "
                "pass a .parquet file, or --format trl|areal|verl for another framework's log"
            )
        try:
            table, reads = read_segments(paths, GROUPS, error=GroupLogError)
        except SegmentFormatError as exc:
            raise GroupLogError(str(exc)) from exc
        warn_torn(reads)
        sizes = [sum(b.num_rows for b in r.batches) for r in reads]
        origin = RowOrigin(
            tuple(str(r.path) for r in reads),
            np.repeat(np.arange(len(reads)), sizes),
            np.concatenate([np.arange(n) for n in sizes]) if sizes else np.zeros(0, dtype=np.int64),
        )
        return groups_from_table(table, origin, on_bad_row)
    if path.suffix != ".parquet":
        raise GroupLogError(
            f"{path} is neither a group log directory, a groups-*.arrows segment nor a .parquet file; "
            "for TRL, AReaL or verl logs pass --format trl|areal|verl"
        )
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise GroupLogError(
            f"{path} is not a readable Parquet file ({exc}); write it with pyarrow or pandas.to_parquet"
        ) from exc
    return groups_from_table(table, RowOrigin.single(str(path), table.num_rows), on_bad_row)


def groups_from_table(
    table: pa.Table, origin: RowOrigin, on_bad_row: OnBadRow = "error", fmt: str = "native", notes: Sequence[str] = ()
) -> GroupLog:
    """The groups of a table with ``GROUPS``' column names (the native reader and every importer
    end here, so every log is checked by the same rules). ``origin`` names each row's file and row.

    A ``reward`` column of strings (a CSV turned into Parquet, an importer's JSON values) is read
    value by value: a string that reads as a number is that number, any other one is a bad row."""
    if on_bad_row not in ("error", "skip"):
        raise GroupLogError(f"on_bad_row={on_bad_row!r} must be 'error' or 'skip'")
    where = origin.files[0] if len(origin.files) == 1 else f"{len(origin.files)} files ({origin.files[0]}, ...)"
    missing = [c for c in REQUIRED if c not in table.column_names]
    if missing:
        raise GroupLogError(
            f"{where}: missing column(s) {', '.join(missing)} (it has {', '.join(table.column_names) or 'none'}); "
            f"a group log needs {', '.join(REQUIRED)} (the module docstring of pipeline/store/grouplog.py lists every column)"
        )
    reward, not_numbers = _rewards(table, where)
    ids = {name: _whole_numbers(table, name, where) for name in ("group_id", "prompt_id", "sample_index")}
    cols = {name: _column(table, name) for name in GROUPS.schema.names}
    has_finish_order = "finish_order" in table.column_names

    bad: dict[int, str] = {}  # group id -> the first problem found in it (skip mode)
    orphan_rows = 0  # rows without a usable group id (skip mode): counted, in no group

    def problem(gid: int | None, row: int, what: str, fix: str) -> None:
        if on_bad_row == "error":
            group = f" (group {gid})" if gid is not None else ""
            raise GroupLogError(
                f"{origin.where(row)}{group}: {what}; {fix}, or pass --on-bad-row skip to leave such groups out"
            )
        if gid is not None:
            bad.setdefault(gid, what)

    rows_of: dict[int, list[int]] = {}
    for i, gid in enumerate(ids["group_id"]):
        if gid is None:
            problem(
                None,
                i,
                f"group_id is {cols['group_id'][i]!r}, not a whole number",
                "give every row the integer id of its group",
            )
            orphan_rows += 1
            continue
        rows_of.setdefault(gid, []).append(i)

    for gid, rows in rows_of.items():
        files = {int(origin.file_of[i]) for i in rows}
        if len(files) > 1:
            names = sorted(origin.files[f] for f in files)
            problem(
                gid,
                rows[0],
                f"the group is split across files {', '.join(names)}",
                "write each group's samples into one file (a log from a resumed run: merge its files)",
            )
            continue
        seen: dict[int, int] = {}
        orders: list[int] = []
        for i in rows:
            if i in not_numbers:
                problem(
                    gid,
                    i,
                    f"reward {not_numbers[i]!r} is not a number",
                    "write each sample's reward as a number",
                )
                break
            if not math.isfinite(reward[i]):
                problem(
                    gid,
                    i,
                    f"reward is {reward[i]} (not a finite number)",
                    "give every sample a numeric reward (a reward function that failed: score it 0 or drop the group)",
                )
                break
            idx = ids["sample_index"][i]
            if idx is None or ids["prompt_id"][i] is None:
                name = "sample_index" if idx is None else "prompt_id"
                problem(
                    gid,
                    i,
                    f"{name} is {cols[name][i]!r}, not a whole number",
                    f"give every row an integer {name}",
                )
                break
            if idx in seen:
                problem(
                    gid,
                    i,
                    f"sample_index {idx} appears twice (also at {origin.where(seen[idx])})",
                    "give each sample of a group its own index 0 .. K-1",
                )
                break
            n = cols["num_tokens"][i]
            if n is not None and n < 0:
                problem(gid, i, f"num_tokens is {n}", "write each sample's length in tokens (0 or more)")
                break
            seen[idx] = i
            if has_finish_order and cols["finish_order"][i] is not None:
                orders.append(int(cols["finish_order"][i]))
        else:
            if sorted(seen) != list(range(len(seen))):
                problem(
                    gid,
                    rows[0],
                    f"sample indices {sorted(seen)} are not 0 .. {len(seen) - 1}",
                    "number each group's samples 0 .. K-1 (a group cut short is not a full group: drop it)",
                )
            elif orders and sorted(orders) != list(range(len(seen))):
                problem(
                    gid,
                    rows[0],
                    f"finish_order values {sorted(orders)} are not 0 .. {len(seen) - 1}, each once",
                    "write the order each sample finished in within its group (0 .. K-1), or leave the column "
                    "out (then samples finished in index order)",
                )

    sizes = Counter(len(rows) for gid, rows in rows_of.items() if gid not in bad)
    if len(sizes) > 1:
        k, _ = sizes.most_common(1)[0]
        for gid, rows in rows_of.items():
            if gid not in bad and len(rows) != k:
                problem(
                    gid,
                    rows[0],
                    f"the group has {len(rows)} samples where most groups have {k} "
                    f"(sizes found: {dict(sorted(sizes.items()))})",
                    "record every group with the same number of samples",
                )

    groups = []
    for gid, rows in rows_of.items():
        if gid in bad:
            continue
        first = rows[0]
        samples = []
        for i in rows:
            ids_i = cols["completion_ids"][i]
            token_ids = tuple(int(t) for t in ids_i) if ids_i is not None else ()
            n = cols["num_tokens"][i]
            order = cols["finish_order"][i]
            reason = str(cols["finish_reason"][i] or "stop").lower()
            if reason not in _FINISH:
                problem(
                    gid,
                    i,
                    f"finish_reason {reason!r} is not 'stop' or 'length'",
                    "record only samples that completed (an aborted sample is not a full group's)",
                )
                break
            index = ids["sample_index"][i]
            samples.append(
                RecordedSample(
                    index=index,
                    reward=float(reward[i]),
                    num_tokens=int(n) if n is not None else len(token_ids),
                    finish_order=int(order) if order is not None else index,
                    token_ids=token_ids,
                    text=str(cols["completion_text"][i] or ""),
                    finish_reason=_FINISH[reason],
                    policy_version=int(cols["policy_version"][i] or 0),
                )
            )
        else:
            samples.sort(key=lambda s: s.index)
            groups.append(
                RecordedGroup(
                    group_id=gid,
                    prompt_id=ids["prompt_id"][first],
                    samples=tuple(samples),
                    step=int(cols["step"][first] or 0),
                    prompt_text=str(cols["prompt_text"][first] or ""),
                    answer=str(cols["answer"][first] or ""),
                    difficulty=_maybe_float(cols["difficulty"][first]),
                    reference_logprob=_maybe_float(cols["reference_logprob"][first]),
                    success_threshold=float(
                        cols["success_threshold"][first] if cols["success_threshold"][first] is not None else 0.5
                    ),
                )
            )
    skipped_rows = orphan_rows + sum(len(rows_of[g]) for g in bad)
    return GroupLog(tuple(groups), origin.files, fmt, skipped_rows, len(bad), tuple(notes))


def _rewards(table: pa.Table, where: str) -> tuple[np.ndarray, dict[int, str]]:
    """The reward column as floats (null: NaN), and the rows whose value is not a number (strings)."""
    column = table.column("reward")
    kind = column.type
    if pa.types.is_floating(kind) or pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        values = column.cast(pa.float64()).fill_null(math.nan).to_numpy(zero_copy_only=False)
        return np.asarray(values, dtype=np.float64), {}
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise GroupLogError(f"{where}: column 'reward' is {kind}, not numeric; write each sample's reward as a number")
    reward = np.full(table.num_rows, math.nan)
    not_numbers: dict[int, str] = {}
    for i, text in enumerate(column.to_pylist()):
        if text is None:
            continue
        try:
            reward[i] = float(text)
        except ValueError:
            not_numbers[i] = text
    return reward, not_numbers


def _whole_numbers(table: pa.Table, name: str, where: str) -> list[int | None]:
    """An id column as ints; None where a value is null or not a whole number (a float column
    from pandas holds ids as 3.0, and NaN where one is missing)."""
    column = table.column(name)
    kind = column.type
    if pa.types.is_integer(kind):
        return column.to_pylist()
    if not pa.types.is_floating(kind):
        raise GroupLogError(f"{where}: column {name!r} is {kind}, not integer; write {name} as whole numbers")
    return [int(v) if v is not None and math.isfinite(v) and v == int(v) else None for v in column.to_pylist()]


def _column(table: pa.Table, name: str) -> list[Any]:
    if name in table.column_names:
        return table.column(name).to_pylist()
    default = OPTIONAL.get(name)
    return [default] * table.num_rows


def _maybe_float(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value
