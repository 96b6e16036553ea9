"""The decision trace: every gate/controller decision and its later outcome, on disk.

Layout of a trace directory (see ``pipeline.store.arrowio`` for the segment rules)::

    decisions-00000.arrows   outcomes-00000.arrows     first opening of the run
    decisions-00001.arrows   outcomes-00001.arrows     a resumed run appends a new pair

Each file is an Arrow IPC stream whose schema metadata holds ``railgate.schema_version``
(``TRACE_SCHEMA_VERSION``) and ``railgate.run_id``. Columns:

* decisions: the fields of ``DecisionRecord``, in order. ``features`` is a
  ``map<string, double>`` (one entry per feature, keys in the order the decider gave them),
  ``actions`` a ``list<string>``; ids and counters are ``int64``, times and probabilities
  ``float64``, the rest ``string``.
* outcomes: ``decision_id`` int64, ``time`` float64, ``reward`` float64, ``tokens`` int64.
  A training run stamps both decisions and outcomes with the run's clock (seconds since the
  process started, or the simulator's virtual seconds).

A decision's outcome is written when its group closes. Decisions of groups still open when a
run stops (or when a killed run's checkpoint was taken) never get one: their realised gain does
not exist, and a made-up one would bias learning. Readers (``controller.rail.replay``) skip and
count decisions without an outcome.

Records are buffered and written as one record batch per ``flush_every`` records per stream
(and on ``flush``/``close``); a crash loses the buffered records and at most a torn tail, which
``read_trace`` skips and reports. ``export_parquet`` writes the same columns to Parquet.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.store.arrowio import (
    SegmentFormatError,
    SegmentKind,
    SegmentWriter,
    next_segment_number,
    read_segment,
    read_segments,
    segment_paths,
)
from pipeline.types import TRACE_SCHEMA_VERSION, DecisionRecord

FEATURES_TYPE = pa.map_(pa.string(), pa.float64())

DECISIONS = SegmentKind(
    "decisions",
    pa.schema(
        [
            ("decision_id", pa.int64()),
            ("time", pa.float64()),
            ("run_id", pa.string()),
            ("mode", pa.string()),
            ("decision_point", pa.string()),
            ("prompt_id", pa.int64()),
            ("group_id", pa.int64()),
            ("sample_index", pa.int64()),
            ("token_position", pa.int64()),
            ("features", FEATURES_TYPE),
            ("actions", pa.list_(pa.string())),
            ("chosen", pa.string()),
            ("propensity", pa.float64()),
            ("behaviour_propensity", pa.float64()),
            ("predicted_gain", pa.float64()),
            ("policy_version", pa.int64()),
        ]
    ),
    TRACE_SCHEMA_VERSION,
)
OUTCOMES = SegmentKind(
    "outcomes",
    pa.schema([("decision_id", pa.int64()), ("time", pa.float64()), ("reward", pa.float64()), ("tokens", pa.int64())]),
    TRACE_SCHEMA_VERSION,
)
_SCALARS = [f.name for f in DECISIONS.schema if f.name not in ("features", "actions")]


class TraceFormatError(SegmentFormatError):
    """A trace path that is missing, not an Arrow stream, or of an unsupported schema version."""


class TraceLog:
    """Append-only writer of decisions and outcomes (the orchestrator's ``DecisionSink``).

    Parameters
    ----------
    directory
        Trace directory; created if missing. Each opening writes a new segment pair.
    run_id
        Stored in every segment's metadata, and in the ``run_id`` column of decisions whose
        own ``run_id`` is empty.
    flush_every
        Records per written batch, per stream. A crash loses at most this many per stream.
    fsync
        Also ``fsync`` every batch (survives a power loss, not only a process crash; slower).
    clock
        The time source of outcome stamps: the run's clock, the one decisions' ``time`` comes
        from (assign ``log.clock`` when that clock is built after the log). Default: Unix time.

    One writer per directory at a time; calls may come from several threads.

    Examples
    --------
    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> with TraceLog(d, run_id="demo", flush_every=2) as log:
    ...     i = log.next_decision_id()
    ...     log.log_decision(DecisionRecord(i, 0.0, "", "live", "gate", 7, 3, 0, 0, {"p": 0.4},
    ...                                     ("commit", "abandon"), "commit", 0.9, 0.9, 0.1, 2))
    ...     log.log_outcome(i, reward=1.0, tokens=120)
    >>> trace = read_trace(d)
    >>> trace.run_ids, trace.joined().select(["decision_id", "chosen", "reward"]).to_pylist()
    (('demo',), [{'decision_id': 0, 'chosen': 'commit', 'reward': 1.0}])
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        run_id: str,
        flush_every: int = 256,
        fsync: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if flush_every < 1:
            raise ValueError(f"flush_every={flush_every} must be >= 1; use 1 to write every record at once")
        self.directory = Path(directory)
        self.run_id = run_id
        self.flush_every = flush_every
        self.fsync = fsync
        self.clock = clock
        self.directory.mkdir(parents=True, exist_ok=True)
        self._next_id = _max_decision_id(self.directory) + 1
        self._decisions: list[DecisionRecord] = []
        self._outcomes: list[tuple[int, float, float, int]] = []
        self._lock = threading.Lock()
        self._closed = False
        self._open_segments()

    def _open_segments(self) -> None:
        # Two writers racing for the same number: the exclusive create fails, take the next one.
        number = next_segment_number(self.directory, (DECISIONS.prefix, OUTCOMES.prefix))
        while True:
            try:
                self._decision_writer = SegmentWriter(self.directory, DECISIONS, number, self.run_id, self.fsync)
            except FileExistsError:
                number += 1
                continue
            try:
                self._outcome_writer = SegmentWriter(self.directory, OUTCOMES, number, self.run_id, self.fsync)
                return
            except FileExistsError:
                self._decision_writer.close()
                self._decision_writer.path.unlink()
                number += 1

    @property
    def segment_paths(self) -> tuple[Path, Path]:
        """The decisions and outcomes files this opening writes."""
        return self._decision_writer.path, self._outcome_writer.path

    def next_decision_id(self) -> int:
        """A fresh decision id: unique in this directory, increasing, continuing after reopening."""
        with self._lock:
            i = self._next_id
            self._next_id += 1
            return i

    def watermark(self) -> int:
        """The id the next decision will get: every decision logged so far has a smaller one."""
        with self._lock:
            return self._next_id

    def log_decision(self, record: DecisionRecord) -> None:
        """Buffer one decision; a full buffer is written as one record batch."""
        with self._lock:
            self._check_open()
            self._decisions.append(record)
            # Ids chosen by the caller still keep next_decision_id ahead of every logged id.
            if record.decision_id >= self._next_id:
                self._next_id = record.decision_id + 1
            if len(self._decisions) >= self.flush_every:
                self._write_decisions()

    def log_outcome(self, decision_id: int, reward: float, tokens: int) -> None:
        """Buffer the outcome of an earlier decision, stamped with ``clock()`` now."""
        with self._lock:
            self._check_open()
            self._outcomes.append((decision_id, self.clock(), reward, tokens))
            if len(self._outcomes) >= self.flush_every:
                self._write_outcomes()

    def flush(self) -> None:
        """Write whatever is buffered (one batch per stream) and hand it to the OS."""
        with self._lock:
            self._check_open()
            self._write_decisions()
            self._write_outcomes()

    def close(self) -> None:
        """Flush and close both segments (idempotent)."""
        with self._lock:
            if self._closed:
                return
            try:
                self._write_decisions()
                self._write_outcomes()
            finally:
                self._closed = True
                self._decision_writer.close()
                self._outcome_writer.close()

    def __enter__(self) -> TraceLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"TraceLog for {self.directory} is closed; open a new TraceLog to append")

    def _write_decisions(self) -> None:
        if self._decisions:
            # Built before the buffer is cleared: a malformed record raises here, and keeps raising.
            batch = decisions_batch(self._decisions, self.run_id)
            self._decisions = []
            self._decision_writer.write(batch)

    def _write_outcomes(self) -> None:
        if self._outcomes:
            columns = zip(*self._outcomes)
            arrays = [pa.array(col, type=field.type) for col, field in zip(columns, OUTCOMES.schema)]
            self._outcomes = []
            self._outcome_writer.write(pa.record_batch(arrays, schema=OUTCOMES.schema))


def decisions_batch(records: list[DecisionRecord], run_id: str = "") -> pa.RecordBatch:
    """Decision records as one record batch (column-wise; no per-record Arrow work)."""
    columns = {name: [getattr(r, name) for r in records] for name in _SCALARS}
    columns["run_id"] = [r.run_id or run_id for r in records]
    lengths = [len(r.features) for r in records]
    offsets = np.zeros(len(records) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    keys = pa.array(list(itertools.chain.from_iterable(r.features for r in records)), type=pa.string())
    values = pa.array(list(itertools.chain.from_iterable(r.features.values() for r in records)), type=pa.float64())
    features = pa.MapArray.from_arrays(pa.array(offsets), keys, values, type=FEATURES_TYPE)
    actions = pa.array([list(r.actions) for r in records], type=pa.list_(pa.string()))
    arrays = []
    for field in DECISIONS.schema:
        if field.name == "features":
            arrays.append(features)
        elif field.name == "actions":
            arrays.append(actions)
        else:
            arrays.append(pa.array(columns[field.name], type=field.type))
    return pa.record_batch(arrays, schema=DECISIONS.schema)


def _max_decision_id(directory: Path) -> int:
    """Highest decision id in the directory's decision segments (-1 when there are none)."""
    best = -1
    for path in segment_paths(directory, DECISIONS.prefix):
        for batch in read_segment(path, DECISIONS, TraceFormatError, memory_map=True).batches:
            if batch.num_rows:
                best = max(best, int(pc.max(batch.column("decision_id")).as_py()))
    return best


@dataclass(frozen=True)
class Trace:
    """A trace read back: all segments of each stream concatenated in segment order."""

    decisions: pa.Table
    outcomes: pa.Table
    torn: tuple[Path, ...]  # files whose tail was cut mid-batch (their complete batches are kept)
    run_ids: tuple[str, ...]  # distinct run ids of the segments, in segment order
    outcome_run_ids: tuple[str, ...] | None = None  # per outcome row: the run that wrote its segment
    duplicates: tuple[Path, ...] = ()  # segment files left out: the same file, or the same bytes, given twice

    def joined(self) -> pa.Table:
        """Decisions left-joined to outcomes on ``(run, decision_id)``.

        An outcome only joins a decision of the run that wrote it (decision ids of different runs
        may coincide when their segments share a directory). Decision order is kept; a decision
        with several outcomes gets one row per outcome (in logged order), one without gets
        nulls. Outcome columns: ``outcome_time``, ``reward``, ``tokens``. (Arrow's hash join
        cannot carry the map/list columns, hence numpy.)
        """
        d_ids, o_ids = self._join_keys()
        order = np.argsort(o_ids, kind="stable")
        lo = np.searchsorted(o_ids[order], d_ids, side="left")
        counts = np.searchsorted(o_ids[order], d_ids, side="right") - lo
        rows = np.maximum(counts, 1)
        d_take = np.repeat(np.arange(len(d_ids)), rows)
        within = np.arange(int(rows.sum())) - np.repeat(np.cumsum(rows) - rows, rows)
        has = np.repeat(counts > 0, rows)
        o_pos = np.where(has, np.repeat(lo, rows) + within, 0)
        o_take = pa.array(order[o_pos] if len(order) else np.zeros(len(o_pos), np.int64), mask=~has)
        left = self.decisions.take(pa.array(d_take, type=pa.int64()))
        right = self.outcomes.take(o_take)
        for name, out in (("time", "outcome_time"), ("reward", "reward"), ("tokens", "tokens")):
            left = left.append_column(out, right.column(name))
        return left

    def _join_keys(self) -> tuple[np.ndarray, np.ndarray]:
        """Integer keys of the decisions and outcomes: equal exactly when run and decision id are."""
        d_ids = self.decisions.column("decision_id").to_numpy()
        o_ids = self.outcomes.column("decision_id").to_numpy()
        if self.outcome_run_ids is None or len(self.outcome_run_ids) != len(o_ids):
            return d_ids, o_ids  # a hand-made Trace without outcome run ids: ids alone
        codes: dict[str, int] = {}
        d_runs = np.array(
            [codes.setdefault(r, len(codes)) for r in self.decisions.column("run_id").to_pylist()], np.int64
        )
        o_runs = np.array([codes.setdefault(r, len(codes)) for r in self.outcome_run_ids], np.int64)
        if len(codes) <= 1:
            return d_ids, o_ids
        pairs = np.stack([np.concatenate([d_runs, o_runs]), np.concatenate([d_ids, o_ids])], axis=1)
        _, inverse = np.unique(pairs, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        return inverse[: len(d_ids)], inverse[len(d_ids) :]


def read_trace(directory_or_file: str | os.PathLike | Sequence[str | os.PathLike]) -> Trace:
    """Read a trace directory (every segment), one segment file, or several of either.

    A segment named twice, or two files with the same bytes (a copy), is read once; the files
    left out are listed in ``Trace.duplicates``. Raises ``TraceFormatError`` naming the path for
    a missing path, a file that is not an Arrow stream, or a segment whose schema version is not
    ``TRACE_SCHEMA_VERSION``.
    """
    paths = [directory_or_file] if isinstance(directory_or_file, (str, os.PathLike)) else list(directory_or_file)
    decision_paths, outcome_paths, duplicates = [], [], []
    seen: dict[object, Path] = {}
    for path in map(Path, paths):
        for segment in trace_segment_paths(path):
            keys = (segment.resolve(), segment_digest(segment))
            if any(k in seen for k in keys):
                duplicates.append(segment)
                continue
            seen.update(dict.fromkeys(keys, segment))
            (outcome_paths if segment.name.startswith(OUTCOMES.prefix) else decision_paths).append(segment)
    decisions, d_reads = read_segments(decision_paths, DECISIONS, TraceFormatError)
    parts = [read_segments([p], OUTCOMES, TraceFormatError) for p in outcome_paths]  # per segment: its run id
    outcomes = pa.concat_tables([t for t, _ in parts]) if parts else read_segments([], OUTCOMES, TraceFormatError)[0]
    o_reads = [r for _, reads in parts for r in reads]
    outcome_run_ids = tuple(r.run_id for (t, _), r in zip(parts, o_reads) for _ in range(t.num_rows))
    reads = d_reads + o_reads
    run_ids = tuple(dict.fromkeys(r.run_id for r in reads if r.run_id))
    return Trace(
        decisions, outcomes, tuple(r.path for r in reads if r.torn), run_ids, outcome_run_ids, tuple(duplicates)
    )


def trace_segment_paths(path: Path) -> list[Path]:
    """The decision and outcome segments of a trace directory, or ``[path]`` for one segment file."""
    if path.is_dir():
        return segment_paths(path, DECISIONS.prefix) + segment_paths(path, OUTCOMES.prefix)
    if path.is_file():
        return [path]
    raise TraceFormatError(f"trace path {path} does not exist; pass a trace directory or a segment file")


def segment_digest(path: Path) -> str:
    """SHA-256 of a segment file's bytes (two copies of one segment have the same)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def export_parquet(directory: str | os.PathLike, out_dir: str | os.PathLike) -> tuple[Path, Path]:
    """Write ``decisions.parquet`` and ``outcomes.parquet`` (plain Arrow types: ints, floats,
    strings, a list of strings and a string->double map) for pandas, polars and DuckDB."""
    trace = read_trace(directory)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = out / "decisions.parquet", out / "outcomes.parquet"
    pq.write_table(trace.decisions, paths[0])
    pq.write_table(trace.outcomes, paths[1])
    return paths
